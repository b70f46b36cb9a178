"""ProviderConfig objects on a real API server, read the way the services read them: TensorFusion's
sample NVIDIA ProviderConfig, applied as it is, gives the node agent's model table its FP16 TFLOPS (a
simulated H100 is 989 TFLOPS, not our built-in 989.4; `TF_GPU_MODELS` still wins) and billing its
dedicated-GPU prices through the metrics service's watch, where an edit of `costPerHour` is in force
within a second (the time is printed, from `kubectl patch` starting and from it returning) and
`TF_GPU_COST_PER_HOUR` still wins."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest
from cluster_control_plane import kubectl
from tfagent.adapters.simulated import SimulatedGpuProbe, parse_fake_gpus
from tfagent.app import model_catalog
from tfagent.providers import provider_model_table
from tfcommon.cluster.custom_watch import watch_custom_objects
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.model import CustomResource
from tfcommon.kube_local import LocalKubernetes
from tfcommon.settings import AgentSettings, GpuModelOverride
from tfmetrics.prices import LivePrices

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "tensorfusion_samples" / "provider-nvidia.yaml"


@pytest.fixture
async def nvidia_provider(local_kubernetes: LocalKubernetes) -> AsyncIterator[KubernetesCluster]:
    await asyncio.to_thread(kubectl, local_kubernetes, "apply", "--validate=strict", "-f", str(SAMPLE))
    cluster = KubernetesCluster.from_environment(kubeconfig=str(local_kubernetes.kubeconfig))
    try:
        yield cluster
    finally:
        cluster.close()
        await asyncio.to_thread(kubectl, local_kubernetes, "delete", "--wait=false", "-f", str(SAMPLE))


async def test_the_agent_model_table_takes_the_sample_tflops_under_its_settings(
    nvidia_provider: KubernetesCluster,
) -> None:
    providers = await provider_model_table(nvidia_provider)
    assert {spec.name: spec.fp16_tflops_milli for spec in providers}["H100"] == 989_000
    settings = AgentSettings(fake_gpus="H100:1,T4:1")
    probe = SimulatedGpuProbe(
        "node-a", parse_fake_gpus("H100:1,T4:1"), catalog=model_catalog(settings, providers)
    )
    devices = {device.model: device for device in probe.discover().gpus}
    assert devices["H100"].tflops_milli == 989_000
    assert "ProviderConfig nvidia-provider" in devices["H100"].capacity_source
    assert devices["T4"].tflops_milli == 65_000  # T4 is not in the sample: the built-in figure
    override = GpuModelOverride(name="H100", fp16_tflops_milli=950_000)
    configured = model_catalog(AgentSettings(gpu_models=(override,)), providers)
    assert configured.capacity_of("NVIDIA H100 80GB HBM3").tflops_milli == 950_000


async def test_billing_prices_follow_an_edit_of_the_sample_within_a_second(
    local_kubernetes: LocalKubernetes, nvidia_provider: KubernetesCluster
) -> None:
    prices = LivePrices({"A100-80G": Decimal("1.60")})
    stop = asyncio.Event()
    watch = asyncio.create_task(
        watch_custom_objects(nvidia_provider, CustomResource.PROVIDER_CONFIG, prices.observe, stop)
    )
    try:
        await asyncio.wait_for(prices.synced.wait(), timeout=10)
        assert prices["H100"] == Decimal("2.99")
        assert prices["A100-80G"] == Decimal("1.60")  # TF_GPU_COST_PER_HOUR wins over the sample's 1.89
        index = next(
            i
            for i, entry in enumerate(json.loads(await asyncio.to_thread(
                kubectl, local_kubernetes, "get", "providerconfig", "nvidia-provider", "-o", "json"
            ))["spec"]["hardwareMetadata"])
            if entry["fullModelName"] == "NVIDIA H100 80GB HBM3"
        )  # fmt: skip
        edit = [{"op": "replace", "path": f"/spec/hardwareMetadata/{index}/costPerHour", "value": "3.50"}]
        edited = time.monotonic()
        await asyncio.to_thread(
            kubectl, local_kubernetes, "patch", "providerconfig", "nvidia-provider", "--type=json",
            "-p", json.dumps(edit),
        )  # fmt: skip
        returned = time.monotonic()
        while prices.get("H100") != Decimal("3.50"):
            assert time.monotonic() - edited < 1.0, "the edited price not in force within a second"
            await asyncio.sleep(0.001)
        done = time.monotonic()
        print(
            f"ProviderConfig edit -> billing price: {(done - edited) * 1000:.0f} ms from kubectl patch "
            f"started, {(done - returned) * 1000:.0f} ms from it returning"
        )
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(watch, timeout=10)
