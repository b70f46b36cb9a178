"""The dashboard's history: per-pool samples of allocation, stranded capacity and fragmentation, and
the JSON the page draws its time series from. Pure: snapshots and samples in, samples and mappings out.

A sample holds the figures `pool_kpis` computes for the Prometheus series (`tf_pool_allocated_*`,
`tf_pool_stranded_*`, `tf_pool_fragmentation_rate`) at one moment; the metrics service keeps the last
`HISTORY_WINDOW` of them (`tfmetrics.pool_history`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tfmetrics.core.dashboard import CampaignSummary
from tfmetrics.core.series import ClusterSnapshot, pool_kpis

HISTORY_WINDOW = timedelta(hours=24)
"""How far back the dashboard draws, and how long samples are kept."""
GIB = 1024**3


@dataclass(frozen=True)
class PoolSample:
    """One pool at one moment. TFLOPS in milli-TFLOPS, VRAM in bytes, the FGD rate 0-1."""

    pool: str
    sampled_at: datetime
    gpu_count: int
    whole_idle_gpus: int
    capacity_tflops_milli: int
    allocated_tflops_milli: int
    capacity_vram_bytes: int
    allocated_vram_bytes: int
    stranded_tflops_milli: int
    stranded_vram_bytes: int
    fragmentation_rate: float


def pool_samples(snapshot: ClusterSnapshot) -> list[PoolSample]:
    """Each pool's sample at the snapshot's moment, by pool name."""
    return [
        PoolSample(
            pool=kpis.pool,
            sampled_at=snapshot.now,
            gpu_count=kpis.gpu_count,
            whole_idle_gpus=kpis.whole_idle_gpus,
            capacity_tflops_milli=kpis.capacity_tflops_milli,
            allocated_tflops_milli=kpis.allocated_tflops_milli,
            capacity_vram_bytes=kpis.capacity_vram_bytes,
            allocated_vram_bytes=kpis.allocated_vram_bytes,
            stranded_tflops_milli=kpis.stranded_tflops_milli,
            stranded_vram_bytes=kpis.stranded_vram_bytes,
            fragmentation_rate=kpis.fragmentation_rate,
        )
        for kpis in pool_kpis(snapshot)
    ]


def _percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def _epoch_ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _pool_series(pool: str, samples: Sequence[PoolSample]) -> dict[str, Any]:
    return {
        "name": pool,
        "t": [_epoch_ms(sample.sampled_at) for sample in samples],
        "gpuCount": [sample.gpu_count for sample in samples],
        "wholeIdleGpus": [sample.whole_idle_gpus for sample in samples],
        "allocatedTflopsPercent": [
            _percent(sample.allocated_tflops_milli, sample.capacity_tflops_milli) for sample in samples
        ],
        "allocatedVramPercent": [
            _percent(sample.allocated_vram_bytes, sample.capacity_vram_bytes) for sample in samples
        ],
        "strandedTflops": [sample.stranded_tflops_milli / 1000 for sample in samples],
        "strandedVramGiB": [round(sample.stranded_vram_bytes / GIB, 2) for sample in samples],
        "strandedTflopsPercent": [
            _percent(sample.stranded_tflops_milli, sample.capacity_tflops_milli) for sample in samples
        ],
        "strandedVramPercent": [
            _percent(sample.stranded_vram_bytes, sample.capacity_vram_bytes) for sample in samples
        ],
        "fragmentationRate": [round(sample.fragmentation_rate, 4) for sample in samples],
    }


def _campaign_marker(campaign: CampaignSummary) -> dict[str, Any]:
    return {
        "pool": campaign.pool,
        "trigger": campaign.trigger,
        "running": campaign.running,
        "startedAt": campaign.started_at.isoformat(),
        "finishedAt": campaign.finished_at.isoformat() if campaign.finished_at else None,
        "outcome": campaign.outcome,
        "nodesDrained": campaign.nodes_drained,
        "podsEvicted": campaign.pods_evicted,
    }


def history_view(
    samples: Iterable[PoolSample],
    campaigns: Sequence[CampaignSummary],
    *,
    start: datetime,
    end: datetime,
    interval: timedelta,
) -> dict[str, Any]:
    """The samples taken in [start, end] as columns per pool (pools by name, samples oldest first;
    `t` in Unix milliseconds), and the defrag campaigns that overlap the window, oldest first."""
    by_pool: dict[str, list[PoolSample]] = {}
    for sample in sorted(samples, key=lambda sample: (sample.pool, sample.sampled_at)):
        if start <= sample.sampled_at <= end:
            by_pool.setdefault(sample.pool, []).append(sample)
    overlapping = [
        campaign
        for campaign in sorted(campaigns, key=lambda campaign: (campaign.started_at, campaign.pool))
        if campaign.started_at <= end and (campaign.finished_at is None or campaign.finished_at >= start)
    ]
    return {
        "windowStart": start.isoformat(),
        "windowEnd": end.isoformat(),
        "intervalS": interval.total_seconds(),
        "pools": [_pool_series(pool, pool_list) for pool, pool_list in by_pool.items()],
        "campaigns": [_campaign_marker(campaign) for campaign in overlapping],
    }
