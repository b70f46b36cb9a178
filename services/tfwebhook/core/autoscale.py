"""`tensor-fusion.ai/autoscale: "true"`: a new pod of a workload gets the workload's recommendation. Pure.

The recommendation comes from the metrics service through the ledger; the shell hands the webhook's
cached copy to the core in `AdmissionContext.recommendations`. `autoscale-target` picks what changes:
`compute` (TFLOPS request and limit), `vram` (VRAM request and limit) or `all` (the default). The pod
keeps its own values, and the note says why, when there is no recommendation for the workload yet, when
it rests on too few samples, when it was computed for another QoS, or (compute) when the pod sizes
compute as a percentage of the card.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcommon.pod_spec import AUTOSCALE_SOURCE as AUTOSCALE_SOURCE
from tfcommon.quantities import format_bytes, format_milli
from tfcommon.recommendations import Recommendation


@dataclass(frozen=True)
class Sizes:
    """A pod's per-GPU TFLOPS (milli) and VRAM (bytes), request and limit."""

    tflops_request: int
    tflops_limit: int
    vram_request: int
    vram_limit: int


@dataclass(frozen=True)
class Autoscaled:
    """The sizes to admit the pod with and the note written to `AUTOSCALE_SOURCE`."""

    sizes: Sizes
    note: str


def autoscale(
    workload_key: str,
    target: str,
    qos: str,
    sizes: Sizes,
    recommendation: Recommendation | None,
    *,
    compute_as_percent: bool = False,
) -> Autoscaled:
    """`sizes` with the recommended parts for `target` (`compute`, `vram` or `all`) applied, and why."""
    if recommendation is None:
        return Autoscaled(sizes, f"no recommendation for {workload_key} yet; keeping the pod's values")
    if not recommendation.sufficient:
        return Autoscaled(sizes, f"{recommendation.reason} ({workload_key})")
    if recommendation.qos != qos:
        return Autoscaled(
            sizes,
            f"the recommendation for {workload_key} was computed for QoS {recommendation.qos}, the pod "
            f"asks for {qos}; keeping the pod's values until it is recomputed",
        )
    applied: list[str] = []
    skipped = ""
    tflops_request, tflops_limit = sizes.tflops_request, sizes.tflops_limit
    vram_request, vram_limit = sizes.vram_request, sizes.vram_limit
    if target in ("compute", "all"):
        if compute_as_percent:
            skipped = "; compute is sized as a percent of the card, so it is kept"
        else:
            tflops_request = recommendation.request_tflops_milli
            tflops_limit = recommendation.limit_tflops_milli
            applied.append(f"TFLOPS {format_milli(tflops_request)}/{format_milli(tflops_limit)}")
    if target in ("vram", "all"):
        vram_request, vram_limit = recommendation.request_vram_bytes, recommendation.limit_vram_bytes
        applied.append(f"VRAM {format_bytes(vram_request)}/{format_bytes(vram_limit)}")
    what = ", ".join(applied) if applied else "nothing"
    return Autoscaled(
        Sizes(tflops_request, tflops_limit, vram_request, vram_limit),
        f"recommendation of {recommendation.computed_at.isoformat()} on {recommendation.sample_count} "
        f"samples applied: {what} (request/limit){skipped}",
    )
