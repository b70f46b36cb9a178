"""The quality and speed benchmarks `tfctl bench` runs over code that lives elsewhere: thin wrappers.

`run_webhook` calls `tfwebhook.bench.run_admission_benchmark` with the trace's GPU shapes and a scratch
ledger and NATS; `run_placement` replays the openb trace
with each policy and seed (`tfctl.simulation.replay`) and times single placements
(`placement_latency_benchmark`); `run_defrag` calls `tfctl.commands.sim_defrag.defrag_benchmark`.
They choose the trace files, report progress through a callback and record their sizes; the figures
and decisions are made by the code they call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tfcommon.placement import DEFAULT_POLICY, POLICIES, PlacementRequest

DEFAULT_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "openb"
"""The openb trace folder next to this checkout (`../shared/traces/openb`), where `docs/benchmarks.md`
takes it from."""
NODE_LIST = "openb_node_list_gpu_node.csv"
FIRST_SEED = 42
REFERENCE_POLICY = "bestfit"
RUN_FIELDS_LEFT_OUT = ("curve", "idle_at_end")
"""Per-run detail `tfctl sim replay --json` gives and the benchmark document leaves out."""

Progress = Callable[[str], None]


class TargetError(ValueError):
    """A benchmark option is out of range or names a missing file; the message says which and the fix."""


def trace_files(traces: Path, trace: str) -> tuple[Path, Path]:
    """The node list and the pod list `openb_pod_list_<trace>.csv` in `traces`, which must exist."""
    nodes, pods = traces / NODE_LIST, traces / f"openb_pod_list_{trace}.csv"
    for path in (nodes, pods):
        if not path.is_file():
            raise TargetError(
                f"--traces/--trace: {path} does not exist; pass --traces with the folder of the Alibaba "
                "openb trace (github.com/alibaba/clusterdata, cluster-trace-gpu-v2023) and --trace with a "
                "pod list name such as default"
            )
    return nodes, pods


def gpu_shapes(traces: Path, trace: str) -> list[PlacementRequest]:
    """The GPU pods of the trace's pod list as placement requests (CPU-only pods left out)."""
    from tfctl.simulation import read_pods, to_request

    _nodes, pods_csv = trace_files(traces, trace)
    return [to_request(pod) for pod in read_pods(pods_csv) if pod.num_gpu > 0]


def run_webhook(
    requests: int = 2000,
    clients: Sequence[int] = (10, 100),
    rounds: int = 5,
    *,
    traces: Path = DEFAULT_TRACES,
    trace: str = "default",
    database_url: str | None = None,
    nats_url: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The admission benchmark: the webhook on the shortcut path (one review, cached) and on the path
    users hit (the service on a scratch ledger and NATS, distinct pods of the trace's GPU shapes),
    against a bare endpoint, at each client count."""
    if requests < 1 or rounds < 1 or not clients or min(clients) < 1:
        raise TargetError("--requests, --rounds and every --clients: each must be at least 1")
    from tfwebhook.bench import VariedLoad, run_admission_benchmark

    from tfctl.bench_servers import nats_server, postgres_server, scratch_database

    shapes = gpu_shapes(traces, trace)
    if progress is not None:
        progress(
            f"{requests} requests x {rounds} rounds at {'/'.join(map(str, clients))} clients, to the "
            f"cached, varied ({len(shapes)} GPU shapes of {trace}) and bare servers"
        )
    with (
        postgres_server(database_url) as server_url,
        scratch_database(server_url, "bench_webhook") as url,
        nats_server(nats_url) as bus_url,
    ):
        result = run_admission_benchmark(
            requests, tuple(clients), rounds, varied=VariedLoad(url, bus_url, shapes)
        )
    return {"trace": trace, **result}


def run_placement(
    *,
    traces: Path = DEFAULT_TRACES,
    trace: str = "default",
    policies: Sequence[str] = (DEFAULT_POLICY, "tfpool", REFERENCE_POLICY, "fgd"),
    seeds: int = 3,
    latency_placements: int = 2000,
    latency_nodes: int = 1000,
    online: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Allocation on the trace per policy (means over seeds 42, 43, ...) and one placement's latency on
    a synthetic cluster for the first policy; `bestfit` is the reference the speed ratios divide by.
    Each policy learns its target from the whole trace (the paper's protocol); with `online`, the first
    policy is replayed again learning it only from the pods that arrived so far, as the scheduler does."""
    from tfctl.simulation import placement_latency_benchmark, read_nodes, read_pods, replay, summarize

    unknown = [name for name in policies if name not in POLICIES]
    if unknown:
        raise TargetError(f"--policy: unknown {', '.join(unknown)}; use some of {', '.join(POLICIES)}")
    if seeds < 1 or latency_placements < 1 or latency_nodes < 1:
        raise TargetError("--seeds, --latency-placements and --latency-nodes: each must be at least 1")
    ordered = list(dict.fromkeys([*policies, REFERENCE_POLICY]))
    nodes_csv, pods_csv = trace_files(traces, trace)
    trace_nodes, pods = read_nodes(nodes_csv), read_pods(pods_csv)
    seed_list = list(range(FIRST_SEED, FIRST_SEED + seeds))
    runs: list[dict[str, Any]] = []
    replays = [(name, "trace") for name in ordered] + ([(ordered[0], "online")] if online else [])
    for name, learn in replays:
        for seed in seed_list:
            if progress is not None:
                progress(
                    f"replay {trace} with {name} ({learn} target), seed {seed} "
                    f"({len(runs) + 1}/{len(replays) * seeds})"
                )
            run = replay(trace_nodes, pods, name, seed, learn=learn).as_json()
            runs.append({key: value for key, value in run.items() if key not in RUN_FIELDS_LEFT_OUT})
    latency = {}
    for name in dict.fromkeys([ordered[0], REFERENCE_POLICY]):
        if progress is not None:
            progress(f"latency of one placement with {name} ({latency_placements} on {latency_nodes} nodes)")
        latency[name] = placement_latency_benchmark(
            nodes=latency_nodes, placements=latency_placements, policy_name=name
        )
    return {
        "benchmark": "placement-openb",
        "trace": trace,
        "pods_csv": pods_csv.name,
        "seeds": seed_list,
        "seeds_note": f"{seeds} of the paper's 10 seeds (42-51), to fit `make bench`'s time budget",
        "reference_policy": REFERENCE_POLICY,
        "replay": {"runs": runs, "summary": summarize(runs)},
        "latency": latency,
    }


def run_defrag(
    *,
    traces: Path = DEFAULT_TRACES,
    trace: str = "default",
    fill: float = 0.9,
    depart: float = 0.3,
    seed: int = 42,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Defrag campaigns on the filled trace cluster against the global CP-SAT bound (`tfctl sim defrag`)."""
    from tfctl.commands.sim_defrag import BOUND_TIME_LIMIT_S, defrag_benchmark

    if not 0 < fill <= 1:
        raise TargetError(f"--fill: {fill}; use a share of GPU capacity in (0, 1], e.g. 0.9")
    if not 0 <= depart < 1:
        raise TargetError(f"--depart: {depart}; use a share of placed pods in [0, 1), e.g. 0.3")
    nodes_csv, pods_csv = trace_files(traces, trace)
    if progress is not None:
        progress(f"fill {fill:g}, depart {depart:g}, seed {seed}, bound limit {BOUND_TIME_LIMIT_S:g} s")
    result = defrag_benchmark(nodes_csv, pods_csv, fill=fill, depart=depart, seed=seed).as_json()
    return {"benchmark": "defrag-openb", "trace": trace, "fill": fill, "depart": depart, **result}
