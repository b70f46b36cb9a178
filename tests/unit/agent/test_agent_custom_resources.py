"""What the node agent writes on its GPUNode and GPU objects: a pure function of the inventory."""

from __future__ import annotations

from dataclasses import replace

from tfagent.core.custom_resources import desired_objects
from tfagent.core.inventory import GpuDevice, GpuPhase, NodeInventory

GIB = 1024**3


def a_gpu(index: int, phase: GpuPhase = GpuPhase.RUNNING) -> GpuDevice:
    return GpuDevice(
        uuid=f"GPU-{index:04d}",
        index=index,
        model="H100",
        product_name="NVIDIA H100 80GB HBM3",
        tflops_milli=989_400,
        vram_bytes=80 * GIB,
        pci_bus_id=f"00000000:{index:02x}:00.0",
        numa_node=None,
        nvlink_peers=(),
        mig_enabled=False,
        capacity_source="table",
        phase=phase,
    )


def test_a_missing_gpu_is_unknown_keeps_its_figures_and_leaves_the_node_totals() -> None:
    inventory = NodeInventory("node-a", "550", "12.4", (a_gpu(0), a_gpu(1, GpuPhase.UNKNOWN)))

    desired = desired_objects(inventory, "training", previously_managed=["gpu-0000", "gpu-0001", "GPU-0007"])

    assert desired.node.labels == {"tensor-fusion.ai/gpupool": "training", "kubernetes.io/hostname": "node-a"}
    present, missing = desired.gpus["gpu-0000"].status, desired.gpus["gpu-0001"].status
    assert (present["phase"], present["message"], present["uuid"]) == ("Running", None, "gpu-0000")
    assert (present["model"], present["gpuModel"], present["numaNode"]) == (
        "NVIDIA H100 80GB HBM3",
        "H100",
        -1,
    )
    assert missing["phase"] == "Unknown"
    assert "node-a" in missing["message"]
    assert missing["capacity"] == present["capacity"] == {"tflops": "989400m", "vram": "80Gi"}
    assert desired.node.status == {
        "totalTFlops": "989400m",
        "totalVRAM": "80Gi",
        "totalGPUs": 1,
        "managedGPUs": 1,
        "managedGPUDeviceIDs": ["gpu-0000"],
        "hypervisorStatus": {"hypervisorVersion": "unknown"},
    }
    assert set(desired.vanished) == {"gpu-0007"}
    assert desired.vanished["gpu-0007"]["phase"] == "Unknown"


def test_a_gpu_back_after_going_missing_is_running_again_and_its_message_is_cleared() -> None:
    gpu = replace(a_gpu(0), phase=GpuPhase.RUNNING)

    desired = desired_objects(NodeInventory("node-a", "550", "12.4", (gpu,)), "default", ["gpu-0000"])

    assert desired.gpus["gpu-0000"].status["phase"] == "Running"
    assert desired.gpus["gpu-0000"].status["message"] is None
    assert desired.vanished == {}
