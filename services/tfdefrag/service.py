"""The planner's running parts: the per-pool tick (cron campaigns, compaction, marker TTLs), the manual
trigger, and the dry-run plan the API serves. I/O shell around `tfdefrag.core`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tfcommon.config import ConfigProvider, TfConfig
from tfcommon.events import Message, StartDefragCampaign
from tfcommon.pool_capacity import capacity_of, capacity_problems

from tfdefrag.campaign import CampaignDeps, CampaignExecutor, Trigger
from tfdefrag.core import markers
from tfdefrag.core.compaction import parse_capacity, plan_compaction
from tfdefrag.core.config import CompactionConfig, parse_node_compaction
from tfdefrag.core.planner import plan_defrag
from tfdefrag.core.window import due_window
from tfdefrag.snapshot import load_pool
from tfdefrag.store import CampaignBusyError

log = logging.getLogger("tfdefrag.service")


class UnknownPoolError(LookupError):
    """The pool is not in the configuration file; `str()` lists the known pools."""


def pool_compaction(config: TfConfig, pool: str) -> CompactionConfig:
    """The validated `nodeCompaction` of `pool`; raises `UnknownPoolError` for a pool not configured."""
    entry = config.pool(pool)
    if entry is None:
        known = ", ".join(p.name for p in config.gpu_pools) or "none"
        raise UnknownPoolError(f"pool {pool!r} is not configured (gpuPools); known pools: {known}")
    extra = entry.spec_template.node_manager_config.model_extra or {}
    return parse_node_compaction(pool, extra.get("nodeCompaction"))


def pool_spec_problems(pool: str, spec: Mapping[str, Any]) -> list[str]:
    """What is wrong in the sections of a GPUPool spec the planner reads (`nodeCompaction`,
    `capacityConfig`, `nodeSelector`): the check `tfcommon.pool_source` runs before a cluster pool's
    spec takes effect."""
    manager = spec.get("nodeManagerConfig")
    compaction = manager.get("nodeCompaction") if isinstance(manager, Mapping) else None
    return [
        *parse_node_compaction(pool, compaction).problems,
        *parse_capacity(pool, spec.get("capacityConfig"))[2],
        *capacity_problems(pool, spec),
    ]


@dataclass
class DefragService:
    """Owns the campaign tasks of this process (at most one per pool; replicas exclude each other
    through the store's lock)."""

    deps: CampaignDeps
    config: ConfigProvider
    campaigns: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    last_compaction: dict[str, datetime] = field(default_factory=dict)

    @property
    def executor(self) -> CampaignExecutor:
        return CampaignExecutor(self.deps)

    def pools(self) -> Sequence[str]:
        return [pool.name for pool in self.config.current().gpu_pools]

    async def plan(self, pool: str) -> dict[str, Any]:
        """The dry run: nodes to drain with each pod's destination, and why every other node stays."""
        compaction = pool_compaction(self.config.current(), pool)
        loaded = await load_pool(
            self.deps.ledger,
            self.deps.cluster,
            pool,
            native_gpu_resources=self.deps.settings.native_gpu_resources,
            capacity=capacity_of(self.config.current(), pool),
        )
        now = self.deps.clock()
        plan = plan_defrag(loaded.snapshot, compaction.defrag, now, profile=self.deps.profile)
        minimum, warm, capacity_problems = self._capacity(pool)
        emptied = plan_compaction(
            loaded.snapshot.nodes, now, minimum=minimum, warm=warm, maximum=self._maximum(pool)
        )
        running = await self.deps.store.running_campaign(pool)
        return {
            **plan.as_dict(),
            "defrag_enabled": compaction.defrag_enabled,
            "config_problems": [*compaction.problems, *capacity_problems],
            "running_campaign": str(running.id) if running else None,
            "compaction": {
                "mark_should_delete": list(emptied.mark),
                "kept": [
                    {"node": k.node, "reason": k.reason.value, "message": k.message} for k in emptied.kept
                ],
            },
        }

    def _capacity(self, pool: str) -> tuple[Any, Any, tuple[str, ...]]:
        entry = self.config.current().pool(pool)
        extra = (entry.spec_template.model_extra or {}) if entry else {}
        return parse_capacity(pool, extra.get("capacityConfig"))

    def _maximum(self, pool: str) -> tuple[int | None, int | None]:
        capacity = capacity_of(self.config.current(), pool)
        return capacity.max_tflops_milli, capacity.max_vram_bytes

    def start(
        self,
        pool: str,
        trigger: Trigger,
        *,
        window_start: datetime | None = None,
        deadline: datetime | None = None,
    ) -> bool:
        """Start (or resume) the pool's campaign in the background; False if one already runs here."""
        running = self.campaigns.get(pool)
        if running is not None and not running.done():
            return False
        compaction = pool_compaction(self.config.current(), pool)
        self.campaigns[pool] = asyncio.create_task(
            self._run(pool, compaction, trigger, window_start, deadline), name=f"defrag-campaign-{pool}"
        )
        return True

    async def _run(
        self,
        pool: str,
        compaction: CompactionConfig,
        trigger: Trigger,
        window_start: datetime | None,
        deadline: datetime | None,
    ) -> None:
        try:
            result = await self.executor.run(
                pool, compaction.defrag, trigger=trigger, window_start=window_start, deadline=deadline
            )
        except CampaignBusyError as busy:
            log.info(str(busy), extra={"pool": pool, "event": "defrag.campaign_busy"})
            return
        except Exception:
            log.exception("defrag campaign failed", extra={"pool": pool, "event": "defrag.campaign_failed"})
            return
        log.info(
            "defrag campaign finished",
            extra={"pool": pool, "campaign": str(result.campaign.id), "outcome": result.campaign.outcome},
        )

    async def start_from_command(self, message: Message) -> Sequence[Message]:
        """Handler of `StartDefragCampaign` (`tfctl defrag run --pool NAME --now`)."""
        assert isinstance(message, StartDefragCampaign)
        try:
            compaction = pool_compaction(self.config.current(), message.pool)
        except UnknownPoolError as error:
            log.warning(str(error), extra={"event": "defrag.unknown_pool"})
            return []
        if compaction.problems:
            log.warning("; ".join(compaction.problems), extra={"event": "defrag.config_invalid"})
            return []
        window = (
            timedelta(milliseconds=message.max_duration_ms)
            if message.max_duration_ms
            else compaction.defrag.max_duration
        )
        if not self.start(message.pool, "manual", deadline=self.deps.clock() + window):
            log.warning(
                "a defrag campaign already runs for pool %s here; the manual request starts nothing",
                message.pool,
                extra={"event": "defrag.campaign_busy", "pool": message.pool},
            )
        return []

    async def tick(self) -> None:
        """One pass over the pools: resume or start due campaigns, compact empty nodes, expire markers."""
        now = self.deps.clock()
        await self.executor.release_expired_holds()
        for pool in self.pools():
            compaction = pool_compaction(self.config.current(), pool)
            if await self.deps.store.running_campaign(pool) is not None:
                self.start(pool, "cron")
            elif compaction.defrag_enabled and compaction.defrag.timezone is not None:
                anchor = await self.deps.store.last_defrag_time(pool)
                decision = due_window(
                    compaction.defrag.schedule,
                    compaction.defrag.timezone,
                    compaction.defrag.max_duration,
                    anchor,
                    now,
                )
                if decision.advance_anchor_to is not None:
                    await self.deps.store.set_last_defrag_time(pool, decision.advance_anchor_to, now)
                if decision.window is not None:
                    self.start(
                        pool, "cron", window_start=decision.window.start, deadline=decision.window.deadline
                    )
            last = self.last_compaction.get(pool)
            if last is None or now - last >= compaction.period:
                self.last_compaction[pool] = now
                await self.compact(pool)
                await self.expire_markers(pool, compaction)

    async def compact(self, pool: str) -> list[str]:
        """Label the pool's removable empty nodes `should-delete=true`; returns their names."""
        loaded = await load_pool(
            self.deps.ledger, self.deps.cluster, pool, capacity=capacity_of(self.config.current(), pool)
        )
        minimum, warm, _problems = self._capacity(pool)
        decision = plan_compaction(
            loaded.snapshot.nodes, self.deps.clock(), minimum=minimum, warm=warm, maximum=self._maximum(pool)
        )
        for node in decision.mark:
            await self.deps.ledger.set_node_markers(node, {markers.SHOULD_DELETE: "true"}, {})
            if await self.deps.cluster.get_node(node) is not None:
                await self.deps.cluster.patch_node_metadata(node, labels={markers.SHOULD_DELETE: "true"})
        return list(decision.mark)

    async def expire_markers(self, pool: str, compaction: CompactionConfig) -> None:
        """Clear source-node and evicted-pod markers older than their TTLs (the safety sweep)."""
        now = self.deps.clock()
        running = self.campaigns.get(pool)
        active = running is not None and not running.done()
        for node in await self.deps.cluster.list_nodes(labels={markers.DEFRAG_SOURCE: "true"}):
            if node.annotations.get(markers.DEFRAG_SOURCE_POOL, pool) != pool or active:
                continue
            if markers.marker_expired(
                node.labels,
                node.annotations,
                label=markers.DEFRAG_SOURCE,
                since=markers.DEFRAG_SOURCE_SINCE,
                ttl=compaction.defrag.source_node_marker_ttl,
                now=now,
            ):
                labels, annotations = markers.clear_source_markers()
                await self.deps.cluster.patch_node_metadata(node.name, labels=labels, annotations=annotations)
                await self.deps.ledger.set_node_markers(node.name, labels, annotations)
        for pod in await self.deps.cluster.list_pods(labels={markers.DEFRAG_EVICTED: "true"}):
            if pod.annotations.get(markers.DEFRAG_EVICTED_POOL, pool) != pool:
                continue
            if markers.marker_expired(
                pod.labels,
                pod.annotations,
                label=markers.DEFRAG_EVICTED,
                since=markers.DEFRAG_EVICTED_SINCE,
                ttl=compaction.defrag.evicted_pod_marker_ttl,
                now=now,
            ):
                labels, annotations = markers.clear_evicted_markers()
                await self.deps.cluster.patch_pod_metadata(
                    pod.namespace, pod.name, labels=labels, annotations=annotations
                )

    async def stop_campaigns(self) -> None:
        """Cancel the campaigns still running (the service is stopping) and wait for them to end."""
        for task in self.campaigns.values():
            task.cancel()
        await asyncio.gather(*self.campaigns.values(), return_exceptions=True)
