"""The defrag planner sizes a worker as the scheduler sized it: from the pod's request (GPU count, per-GPU
TFLOPS or compute percent, VRAM), not from the largest share the ledger holds for it. `placed_request` is
what the planner's pool snapshot (`tfdefrag.snapshot.load_pool`) sizes each worker with."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from tfcommon.cluster.model import Pod
from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import AllocationRecord, ShareRecord
from tfcommon.placement import Gpu, PlacementRequest
from tfcommon.placement.from_ledger import placed_request
from tfscheduler.core.binding import pod_work
from tfscheduler.core.view import placement_request

GIB = 1 << 30
NOW = datetime(2026, 6, 1, 3, 30, tzinfo=UTC)
A100 = Gpu(uuid="gpu-a100", index=0, model="A100", tflops_milli=312_000, vram_bytes=80 * GIB)
H100 = Gpu(uuid="gpu-h100", index=0, model="H100", tflops_milli=989_000, vram_bytes=80 * GIB)
L4 = Gpu(uuid="gpu-l4", index=0, model="L4", tflops_milli=121_000, vram_bytes=24 * GIB)


def a_pod(annotations: dict[str, str]) -> Pod:
    return Pod(
        namespace="ml",
        name="trainer",
        uid="uid-trainer",
        node_name="source",
        phase="Running",
        annotations={"tensor-fusion.ai/gpupool": "default", **annotations},
    )


def an_allocation(*shares: tuple[int, int]) -> AllocationRecord:
    return AllocationRecord(
        allocation_id=uuid4(),
        workload=WorkloadRef(namespace="ml", name="trainer", uid="uid-trainer"),
        pool="default",
        node="source",
        qos="medium",
        isolation="soft",
        state="committed",
        shares=tuple(
            ShareRecord(
                gpu_uuid=f"gpu-source-{index}",
                tflops_milli=tflops,
                vram_bytes=vram,
                limit_tflops_milli=tflops,
                limit_vram_bytes=vram,
            )
            for index, (tflops, vram) in enumerate(shares)
        ),
        created_at=NOW,
        committed_at=NOW,
        released_at=None,
        release_reason=None,
    )


def scheduler_request(pod: Pod) -> PlacementRequest:
    return placement_request(f"{pod.namespace}/{pod.name}", pod_work(pod).submission.request)


def assert_same_size(defrag: PlacementRequest, scheduler: PlacementRequest) -> None:
    assert defrag.gpu_count == scheduler.gpu_count
    assert defrag.compute_percent == scheduler.compute_percent
    assert defrag.isolation is scheduler.isolation
    assert defrag.gpu_models == scheduler.gpu_models
    for gpu in (A100, H100, L4):
        assert (defrag.tflops_on(gpu), defrag.vram_on(gpu)) == (
            scheduler.tflops_on(gpu),
            scheduler.vram_on(gpu),
        ), gpu.model


def test_a_compute_percent_worker_is_sized_in_percent_of_the_target_card() -> None:
    """50 % of an A100 is 156 TFLOPS in the ledger; on an L4 the scheduler asks 50 % of 121 TFLOPS (60),
    so the worker fits there, while 156 TFLOPS would not fit at all."""
    pod = a_pod(
        {
            "tensor-fusion.ai/compute-percent-request": "50",
            "tensor-fusion.ai/vram-request": "10Gi",
            "tensor-fusion.ai/gpu-count": "2",
        }
    )
    allocation = an_allocation((156_000, 10 * GIB), (156_000, 10 * GIB))
    defrag = placed_request(allocation, pod)
    assert_same_size(defrag, scheduler_request(pod))
    assert defrag.tflops_on(L4) == 60_000


def test_a_multi_gpu_worker_with_unequal_shares_is_not_sized_by_its_largest_share() -> None:
    """A 30 % worker holding a share on an A100 (93 TFLOPS) and one on an H100 (296 TFLOPS) asks 30 % of
    each card it moves to, not 296 TFLOPS on each."""
    pod = a_pod(
        {
            "tensor-fusion.ai/compute-percent-request": "30",
            "tensor-fusion.ai/vram-request": "8Gi",
            "tensor-fusion.ai/gpu-count": "2",
        }
    )
    allocation = an_allocation((93_000, 8 * GIB), (296_000, 8 * GIB))
    assert_same_size(placed_request(allocation, pod), scheduler_request(pod))


def test_a_tflops_worker_keeps_its_requested_size_and_gpu_model() -> None:
    pod = a_pod(
        {
            "tensor-fusion.ai/tflops-request": "40",
            "tensor-fusion.ai/tflops-limit": "80",
            "tensor-fusion.ai/vram-request": "12Gi",
            "tensor-fusion.ai/gpu-count": "2",
            "tensor-fusion.ai/gpu-model": "H100|A100",
        }
    )
    allocation = an_allocation((40_000, 12 * GIB), (40_000, 12 * GIB))
    assert_same_size(placed_request(allocation, pod), scheduler_request(pod))


def test_a_worker_whose_pod_is_gone_is_sized_from_its_ledger_shares() -> None:
    """Without the pod (or with annotations that cannot be read) the ledger's shares are all there is:
    each GPU asks the largest share, so the move never takes less than the worker holds."""
    allocation = an_allocation((93_000, 8 * GIB), (296_000, 6 * GIB))
    for pod in (None, a_pod({"tensor-fusion.ai/gpu-count": "many"})):
        request = placed_request(allocation, pod)
        assert (request.gpu_count, request.compute_percent) == (2, None)
        assert (request.tflops_on(H100), request.vram_on(H100)) == (296_000, 8 * GIB)


def test_an_amount_the_pod_leaves_at_zero_is_what_the_scheduler_filled_from_the_quota_defaults() -> None:
    """The scheduler fills a zero request from the namespace quota's defaults; the planner has no quota,
    so it takes that amount from the shares rather than moving the worker as if it asked for nothing."""
    pod = a_pod({"tensor-fusion.ai/compute-percent-request": "25"})
    request = placed_request(an_allocation((78_000, 6 * GIB)), pod)
    assert (request.compute_percent, request.tflops_on(H100), request.vram_on(H100)) == (25, 247_000, 6 * GIB)
