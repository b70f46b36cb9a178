"""Pools from GPUPool objects on a real API server (`tfcommon.pool_source`): an edit is in force in each
service's reading of the pool within 2 seconds, an invalid spec keeps the last good one and says why in
the pool's status and as an Event, and the configuration file supplies defaults.

The edit -> effect time is measured from the `kubectl patch` returning to the service's own function
(`admit`, `placement_mode`, `pool_compaction`, `pool_pricing`) giving the new answer, and printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_control_plane import kubectl
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.config import TfConfig
from tfcommon.config_source import ConfigSource
from tfcommon.kube_local import LocalKubernetes
from tfcommon.pool_source import DEFAULT_POOL_ANNOTATION, ClusterPoolSource, PoolCheck, follow_gpu_pools
from tfdefrag.service import pool_compaction, pool_spec_problems
from tfmetrics.billing_api import pool_pricing
from tfmetrics.core.pricing import pricing_problems
from tfscheduler.engine import placement_mode, placement_problems
from tfwebhook.core.admission import AdmissionContext, Admitted, admit
from tfwebhook.testing import a_pod, apply, opted_in

pytestmark = pytest.mark.integration

EFFECT_WITHIN_S = 2.0


@dataclass
class Pools:
    control_plane: LocalKubernetes
    source: ClusterPoolSource
    name: str

    def patch(self, spec: dict[str, Any]) -> float:
        """Merge `spec` into the pool; returns when kubectl returned (monotonic)."""
        body = json.dumps({"spec": spec})
        kubectl(
            self.control_plane, "patch", "gpupool.tensor-fusion.ai", self.name, "--type=merge", "-p", body
        )
        return time.monotonic()

    def stored(self) -> dict[str, Any]:
        out = kubectl(self.control_plane, "get", "gpupool.tensor-fusion.ai", self.name, "-o", "json")
        found: dict[str, Any] = json.loads(out)
        return found

    def condition(self) -> dict[str, Any] | None:
        conditions = self.stored().get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == self.source.condition_type), None)


async def until(check: Callable[[], bool], *, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {within_s}s")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def watched_pool(
    control_plane: LocalKubernetes,
    tmp_path: Path,
    *,
    spec: dict[str, Any],
    service: str,
    checks: Sequence[PoolCheck] = (),
    file_text: str = "",
    annotations: dict[str, str] | None = None,
    report: bool = True,
) -> AsyncIterator[Pools]:
    name = f"watched-{uuid.uuid4().hex[:8]}"
    file = tmp_path / "config.yaml"
    file.write_text(file_text.replace("POOL", name))
    source = ClusterPoolSource(ConfigSource(file), service=service, checks=checks)
    metadata: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    manifest = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "metadata": metadata, "spec": spec}
    kubectl(control_plane, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(manifest))
    cluster = KubernetesCluster.from_environment(kubeconfig=str(control_plane.kubeconfig), watch_timeout_s=5)
    stop = asyncio.Event()
    follower = asyncio.create_task(follow_gpu_pools(source, cluster, stop, report=report))
    try:
        await asyncio.wait_for(source.synced.wait(), timeout=10)
        await until(lambda: source.current().pool(name) is not None, within_s=10, what="the pool")
        yield Pools(control_plane, source, name)
    finally:
        stop.set()
        await asyncio.wait_for(follower, timeout=10)
        cluster.close()
        kubectl(control_plane, "delete", "gpupool.tensor-fusion.ai", name, "--wait=false")


def admitted_qos(config: TfConfig, pool: str) -> str:
    pod = a_pod(
        labels={"tensor-fusion.ai/enabled": "true"},
        annotations={
            **opted_in(tflops_request="1", tflops_limit="2", vram_request="2Gi", vram_limit="4Gi"),
            "tensor-fusion.ai/gpupool": pool,
        },
    )
    verdict = admit(pod, AdmissionContext(config, "default"))
    assert isinstance(verdict, Admitted), verdict
    return str(apply(pod, verdict.patch)["metadata"]["annotations"]["tensor-fusion.ai/qos"])


async def measure(pools: Pools, spec: dict[str, Any], effect: Callable[[], bool], what: str) -> float:
    edited = pools.patch(spec)
    await until(effect, within_s=EFFECT_WITHIN_S, what=what)
    elapsed = time.monotonic() - edited
    print(f"GPUPool edit -> {what}: {elapsed * 1000:.0f} ms")
    return elapsed


async def test_an_edit_takes_effect_in_each_service_within_two_seconds(
    local_kubernetes: LocalKubernetes, tmp_path: Path
) -> None:
    spec = {
        "qosConfig": {"defaultQoS": "low"},
        "placement": {"mode": "CompactFirst"},
        "nodeManagerConfig": {"nodeCompaction": {"period": "5m"}},
    }
    async with watched_pool(local_kubernetes, tmp_path, spec=spec, service="webhook") as pools:
        source, name = pools.source, pools.name
        assert admitted_qos(source.current(), name) == "low"
        assert placement_mode(source.current(), name) == "CompactFirst"

        await measure(
            pools,
            {"qosConfig": {"defaultQoS": "high"}},
            lambda: admitted_qos(source.current(), name) == "high",
            "webhook default QoS",
        )
        await measure(
            pools,
            {"placement": {"mode": "LowLoadFirst"}},
            lambda: placement_mode(source.current(), name) == "LowLoadFirst",
            "scheduler placement mode",
        )
        await measure(
            pools,
            {"nodeManagerConfig": {"nodeCompaction": {"period": "7m"}}},
            lambda: pool_compaction(source.current(), name).period.total_seconds() == 420,
            "defrag compaction period",
        )
        price = {"qos": "high", "requests": {"perFP16TFlopsPerHour": "$0.5", "perGBOfVRAMPerHour": "$0.1"}}

        def high_price() -> str:
            book = pool_pricing(source.current(), {name})[name].books[-1][1]
            return str(book.prices["high"].per_tflops_hour)

        await measure(
            pools, {"qosConfig": {"pricing": [price]}}, lambda: high_price() == "0.5", "billing price"
        )
        await until(
            lambda: (pools.condition() or {}).get("status") == "True",
            within_s=5,
            what="WebhookSpecValid=True",
        )


async def test_an_invalid_spec_keeps_the_last_good_one_and_says_why(
    local_kubernetes: LocalKubernetes, tmp_path: Path
) -> None:
    spec = {"placement": {"mode": "CompactFirst"}}
    async with watched_pool(
        local_kubernetes, tmp_path, spec=spec, service="scheduler", checks=[placement_problems]
    ) as pools:
        source, name = pools.source, pools.name
        pools.patch({"placement": {"mode": "NoSuchPolicy"}})
        await until(
            lambda: (pools.condition() or {}).get("status") == "False",
            within_s=5,
            what="SchedulerSpecValid=False",
        )
        assert placement_mode(source.current(), name) == "CompactFirst"
        condition = pools.condition()
        assert condition is not None
        assert condition["reason"] == "InvalidPoolSpec"
        assert "spec.placement.mode: unknown policy 'NoSuchPolicy'" in condition["message"]
        assert "keeps the last good spec" in condition["message"]

        def events() -> list[dict[str, Any]]:
            listed = kubectl(
                local_kubernetes,
                *("get", "events", "-n", "default", "-o", "json"),
                f"--field-selector=involvedObject.name={name},reason=InvalidPoolSpec",
            )
            items: list[dict[str, Any]] = json.loads(listed)["items"]
            return items

        await until(lambda: len(events()) == 1, within_s=5, what="the InvalidPoolSpec Event")
        (event,) = events()
        assert event["type"] == "Warning"
        assert "NoSuchPolicy" in event["message"]

        await measure(
            pools,
            {"placement": {"mode": "LowLoadFirst"}},
            lambda: placement_mode(source.current(), name) == "LowLoadFirst",
            "fixed placement mode",
        )
        await until(
            lambda: (pools.condition() or {}).get("status") == "True",
            within_s=5,
            what="SchedulerSpecValid=True",
        )


async def test_defrag_says_why_it_keeps_the_last_good_spec(
    local_kubernetes: LocalKubernetes, tmp_path: Path
) -> None:
    spec = {"nodeManagerConfig": {"nodeCompaction": {"period": "5m"}}}
    async with watched_pool(
        local_kubernetes, tmp_path, spec=spec, service="defrag-planner", checks=[pool_spec_problems]
    ) as pools:
        pools.patch(
            {
                "nodeManagerConfig": {
                    "nodeCompaction": {
                        "period": "9m",
                        "defrag": {"enabled": True, "timezone": "Mars/Olympus"},
                    }
                }
            }
        )
        await until(
            lambda: (pools.condition() or {}).get("status") == "False", within_s=5, what="SpecValid=False"
        )
        assert pools.source.condition_type == "DefragPlannerSpecValid"
        assert "defrag.timezone is 'Mars/Olympus'" in (pools.condition() or {})["message"]
        assert pool_compaction(pools.source.current(), pools.name).period.total_seconds() == 300


async def test_metrics_keeps_the_last_good_prices_and_writes_nothing(
    local_kubernetes: LocalKubernetes, tmp_path: Path
) -> None:
    async with watched_pool(
        local_kubernetes, tmp_path, spec={}, service="metrics", checks=[pricing_problems], report=False
    ) as pools:
        kept = pools.source.current().pool(pools.name)
        pools.patch({"qosConfig": {"pricing": [{"qos": "low", "requests": {"perGBOfVRAMPerHour": "lots"}}]}})
        await until(
            lambda: any(v.problems for v in pools.source.verdicts if v.pool.name == pools.name),
            within_s=EFFECT_WITHIN_S,
            what="the refused price",
        )
        assert pools.source.current().pool(pools.name) == kept
        assert (
            "perGBOfVRAMPerHour"
            in next(v for v in pools.source.verdicts if v.pool.name == pools.name).problems[0]
        )
        assert pools.condition() is None  # the metrics account only reads


async def test_the_file_gives_defaults_and_the_annotation_the_default_pool(
    local_kubernetes: LocalKubernetes, tmp_path: Path
) -> None:
    file_text = """
gpuPools:
  - name: from-file
    isDefault: true
  - name: POOL
    specTemplate:
      nodeManagerConfig: {defaultIsolationMode: hard}
      qosConfig: {defaultQoS: medium}
"""
    async with watched_pool(
        local_kubernetes,
        tmp_path,
        spec={"qosConfig": {"defaultQoS": "critical"}},
        service="webhook",
        file_text=file_text,
        annotations={DEFAULT_POOL_ANNOTATION: "true"},
    ) as pools:
        config = pools.source.current()
        pool = config.pool(pools.name)
        assert pool is not None
        assert pool.spec_template.node_manager_config.default_isolation_mode == "hard"
        assert pool.spec_template.qos_config.default_qos == "critical"
        default = config.default_pool()
        assert default is not None
        assert default.name == pools.name
        assert config.pool("from-file") is not None
