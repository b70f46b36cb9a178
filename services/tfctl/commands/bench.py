"""`tfctl bench TARGET`: benchmarks that run the real code paths and print their figures.

Targets: `scheduler` (placements/s and latency over real NATS and Postgres), `webhook` (admission over
HTTPS against a bare endpoint), `placement` (allocation on the openb trace per policy, and one
placement's latency), `defrag` (campaigns against the global CP-SAT bound), `ledger` (reservations/s against
a bare INSERT), `outbox` (events/s through the outbox relay against a bare `js.publish`), `faults`
(registered by `bench_faults.py`) and `kubernetes` (pods through a real API server on KWOK nodes, bound
by kube-scheduler and by our scheduler service in Kubernetes mode). Postgres and NATS are embedded ones
unless `TF_DATABASE_URL` / `TF_NATS_URL` are set; a scratch database is created and dropped on the
server either way.

`tfctl bench all --json` (`make bench`) runs every target with the sizes in `SIZES`, prints progress on
stderr and ONE JSON document on stdout: the machine once at the top, then per target its wall time,
sizes, headline figures (each speed figure with its in-run baseline and the ratio) and raw result. It
then rewrites the generated table of docs/benchmarks.md (`--no-docs` skips that). Each target alone,
`tfctl bench TARGET [--json]`, prints the same document with one target.

Adding a target: write `_register_<name>(targets)` that adds its subparser (with a handler) and puts a
no-argument runner into `RUNNERS` and its sizes into `SIZES`, and call it from `register`; give it
headline figures in `tfctl.bench_report.FIGURES`. Exit codes: 0 done, 1 a target or the docs update
failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tfctl.bench_report import MarkerError, figures_of, render_markdown, splice

FAILED, USAGE_ERROR = 1, 2
RUNNERS: dict[str, Callable[[], dict[str, Any]]] = {}
"""Each target's benchmark with the sizes `tfctl bench all` uses, in the order it runs them."""
SIZES: dict[str, dict[str, Any]] = {}
"""The sizes each `RUNNERS` entry runs with, recorded in the JSON document."""
DOCS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "benchmarks.md"
SCHEDULER_ALL: dict[str, Any] = {
    "nodes": [1000, 10000],
    "via": ["in-process", "http", "nats"],
    "gpus_per_node": 8,
    "pods": 5000,
    "concurrency": 64,
    "offered_rate": 200.0,
    "offered_pods": 500,
    "trace": "default",
}
"""A quarter of the standalone burst and offered load, so that `make bench` stays near six minutes."""

Progress = Callable[[str], None]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and print its figures", description=__doc__)
    targets = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    _register_scheduler(targets)
    _register_webhook(targets)
    _register_placement(targets)
    _register_defrag(targets)
    _register_ledger(targets)
    _register_outbox(targets)
    _register_kubernetes(targets)
    every = targets.add_parser(
        "all",
        help="every benchmark, as one JSON document; refreshes docs/benchmarks.md",
        description="Run every target with the sizes recorded in the output; progress on stderr, one "
        "JSON document on stdout; then rewrite the generated table in docs/benchmarks.md.",
    )
    every.add_argument("--json", action="store_true", help="accepted for symmetry; the output is JSON")
    every.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    every.add_argument(
        "--docs", type=Path, default=DOCS_PAGE, metavar="FILE", help=f"page to rewrite ({DOCS_PAGE.name})"
    )
    every.set_defaults(handler=_run_all)


def machine() -> dict[str, Any]:
    """The machine the figures were measured on: CPU model, cores, memory, Python, load at the start."""
    model = platform.processor() or platform.machine()
    memory_kib = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024**2, 1) if memory_kib else None,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
    }


def _progress(label: str, started: float) -> Progress:
    def say(message: str) -> None:
        elapsed = int(time.monotonic() - started)
        print(f"[{elapsed // 60}:{elapsed % 60:02d}] bench {label}: {message}", file=sys.stderr, flush=True)

    return say


def _entry(name: str, result: dict[str, Any], seconds: float, sizes: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 1),
        "sizes": dict(sizes),
        "figures": figures_of(name, result),
        "result": result,
    }


def _document(command: str, targets: dict[str, Any], started_at: datetime, seconds: float) -> dict[str, Any]:
    return {
        "machine": machine(),
        "command": command,
        "started_at": started_at.isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "targets": targets,
    }


def _print_document(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(document, indent=2))
        return
    found = document["machine"]
    print(
        f"{found['cpu_model']}, {found['cores']} cores, {found['memory_gib']} GiB, Python {found['python']}"
    )
    for name, entry in document["targets"].items():
        print(f"{name} ({entry['seconds']} s; {', '.join(f'{k} {v}' for k, v in entry['sizes'].items())}):")
        for figure in entry["figures"]:
            line = f"  {figure['name']}: {figure['value']} {figure['unit']}"
            if "baseline" in figure:
                line += f" (baseline {figure['baseline_value']} {figure['unit']}: {figure['baseline']}; "
                line += f"ratio {figure['ratio']})"
            print(line)


def _run_all(args: argparse.Namespace) -> int:
    started_at, started = datetime.now(UTC), time.monotonic()
    targets: dict[str, Any] = {}
    failed = []
    names = list(RUNNERS)
    for position, (name, run) in enumerate(RUNNERS.items(), start=1):
        say = _progress("all", started)
        sizes = ", ".join(f"{key} {value}" for key, value in SIZES.get(name, {}).items())
        say(f"{position}/{len(names)} {name} ({sizes})")
        began = time.monotonic()
        try:
            result = run()
        except Exception as error:  # one failing target must not lose the others' figures
            failed.append(name)
            targets[name] = {
                "seconds": round(time.monotonic() - began, 1),
                "error": f"{type(error).__name__}: {error}",
            }
            say(f"{name} FAILED after {time.monotonic() - began:.1f} s: {error}")
            continue
        targets[name] = _entry(name, result, time.monotonic() - began, SIZES.get(name, {}))
        say(f"{name} done in {time.monotonic() - began:.1f} s")
    document = _document("tfctl bench all --json", targets, started_at, time.monotonic() - started)
    print(json.dumps(document, indent=2))
    if failed:
        print(f"tfctl bench all: {', '.join(failed)} failed; {args.docs} left as it was", file=sys.stderr)
        return FAILED
    if args.no_docs:
        return 0
    try:
        page = args.docs.read_text()
        args.docs.write_text(splice(page, render_markdown(document)))
    except (OSError, MarkerError) as error:
        print(f"tfctl bench all: --docs {args.docs}: {error}", file=sys.stderr)
        return FAILED
    print(f"tfctl bench all: {document['seconds']:.0f} s; table rewritten in {args.docs}", file=sys.stderr)
    return 0


def _run_one(
    name: str, args: argparse.Namespace, run: Callable[[Progress], dict[str, Any]], sizes: dict[str, Any]
) -> int:
    from tfwebhook.bench import AdmissionBenchmarkError

    from tfctl.bench_kubernetes import KubernetesBenchmarkError
    from tfctl.bench_ledger import LedgerBenchmarkError
    from tfctl.bench_outbox import OutboxBenchmarkError
    from tfctl.bench_targets import TargetError

    started_at, started = datetime.now(UTC), time.monotonic()
    try:
        result = run(_progress(name, started))
    except (
        TargetError,
        LedgerBenchmarkError,
        OutboxBenchmarkError,
        AdmissionBenchmarkError,
        KubernetesBenchmarkError,
    ) as error:
        print(f"tfctl bench {name}: {error}", file=sys.stderr)
        return USAGE_ERROR
    seconds = time.monotonic() - started
    command = f"tfctl {' '.join(sys.argv[1:])}" if sys.argv[1:2] == ["bench"] else f"tfctl bench {name}"
    _print_document(
        _document(command, {name: _entry(name, result, seconds, sizes)}, started_at, seconds), args.json
    )
    return 0


def _database_url() -> str | None:
    return os.environ.get("TF_DATABASE_URL") or None


def _nats_url() -> str | None:
    return os.environ.get("TF_NATS_URL") or None


def _scheduler_defaults() -> dict[str, Any]:
    return _scheduler(dict(SCHEDULER_ALL), _progress("scheduler", time.monotonic()))


def _scheduler(sizes: Mapping[str, Any], say: Progress) -> dict[str, Any]:
    from tfscheduler.bench import default_runs, run_scheduler_benchmark

    from tfctl.bench_servers import nats_server, postgres_server, scratch_database
    from tfctl.bench_targets import DEFAULT_TRACES, gpu_shapes

    shapes = gpu_shapes(Path(sizes.get("traces", DEFAULT_TRACES)), sizes["trace"])
    with postgres_server(_database_url()) as server_url, nats_server(_nats_url()) as bus_url:
        return run_scheduler_benchmark(
            default_runs(sizes["nodes"], sizes["via"]),
            scratch_database=lambda: scratch_database(server_url, "bench_scheduler"),
            nats_url=bus_url,
            shapes=shapes,
            gpus_per_node=int(sizes["gpus_per_node"]),
            pods=int(sizes["pods"]),
            concurrency=int(sizes["concurrency"]),
            offered_rate=float(sizes["offered_rate"]),
            offered_pods=int(sizes["offered_pods"]),
            progress=say,
        )


def _register_scheduler(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfscheduler.bench import VIAS

    parser = targets.add_parser(
        "scheduler",
        help="placements/s and p50/p99 from submission to the announced allocation, in-process, over "
        "HTTP and over NATS, against reserve_many in the same batch sizes",
        description="Place PODS pods on simulated nodes (in-process with one shape; through the "
        "scheduler service's HTTP API and its NATS consumer with the trace's GPU shapes), then offer "
        "--offered-pods at --offered-rate per second, latency counted from each intended send time. The "
        "baseline: the ledger's reserve_many making the same reservations in the scheduler's batch sizes.",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        action="append",
        help="simulated nodes, repeatable: every --via at the first count, http at the others (1000, 10000)",
    )
    parser.add_argument(
        "--via", action="append", choices=VIAS, help="how pods are submitted, repeatable (all three)"
    )
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node, 100 TFLOPS / 80 GiB (8)")
    parser.add_argument("--pods", type=int, default=20_000, help="pods in the burst (20000)")
    parser.add_argument("--concurrency", type=int, default=64, help="submissions in flight in the burst (64)")
    parser.add_argument(
        "--offered-rate", type=float, default=200.0, help="submissions per second offered (200)"
    )
    parser.add_argument(
        "--offered-pods", type=int, default=2_000, help="pods offered at that rate; 0 skips (2000)"
    )
    _trace_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=_run_scheduler, nodes=None, via=None)
    RUNNERS["scheduler"] = _scheduler_defaults
    SIZES["scheduler"] = SCHEDULER_ALL


def _run_scheduler(args: argparse.Namespace) -> int:
    from tfscheduler.bench import BenchmarkError

    from tfctl.bench_targets import TargetError

    sizes = {
        "nodes": args.nodes or SCHEDULER_ALL["nodes"],
        "via": args.via or SCHEDULER_ALL["via"],
        "gpus_per_node": args.gpus_per_node,
        "pods": args.pods,
        "concurrency": args.concurrency,
        "offered_rate": args.offered_rate,
        "offered_pods": args.offered_pods,
        "traces": str(args.traces),
        "trace": args.trace,
    }
    try:
        return _run_one("scheduler", args, lambda say: _scheduler(sizes, say), sizes)
    except (BenchmarkError, TargetError) as error:
        print(f"tfctl bench scheduler: {error}", file=sys.stderr)
        return USAGE_ERROR


def _add_target(
    targets: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    defaults: dict[str, Any],
    run: Callable[[dict[str, Any], Progress], dict[str, Any]],
    add_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """A target whose options are exactly the keys of `defaults` (its `tfctl bench all` sizes)."""
    parser = targets.add_parser(name, help=help_text, description=help_text)
    add_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def handler(args: argparse.Namespace) -> int:
        sizes = {key: getattr(args, key) for key in defaults}
        return _run_one(name, args, lambda say: run(sizes, say), sizes)

    parser.set_defaults(handler=handler)
    RUNNERS[name] = lambda: run(dict(defaults), _progress(name, time.monotonic()))
    SIZES[name] = defaults


def _register_webhook(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfctl.bench_targets import DEFAULT_TRACES

    defaults: dict[str, Any] = {
        "requests": 2000,
        "clients": [10, 100],
        "rounds": 5,
        "traces": str(DEFAULT_TRACES),
        "trace": "default",
    }

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--requests", type=int, default=2000, help="requests per run (2000)")
        parser.add_argument(
            "--clients",
            type=int,
            action="append",
            help="concurrent keep-alive clients, repeatable (10 and 100)",
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=5,
            help="rounds per client count, each running every server in turn; median-ratio round kept (5)",
        )
        _trace_options(parser)
        parser.set_defaults(clients=None)

    def run(sizes: dict[str, Any], say: Progress) -> dict[str, Any]:
        from tfctl.bench_targets import run_webhook

        sizes["clients"] = sizes["clients"] or defaults["clients"]
        result = run_webhook(
            sizes["requests"],
            sizes["clients"],
            sizes["rounds"],
            traces=Path(sizes["traces"]),
            trace=sizes["trace"],
            database_url=_database_url(),
            nats_url=_nats_url(),
            progress=say,
        )
        sizes["traces"] = str(sizes["traces"])
        return result

    _add_target(
        targets,
        "webhook",
        "admission requests/s and p99 at 10 and 100 clients against a bare uvicorn endpoint, over HTTPS: "
        "one cached review (the shortcut path) and distinct openb pods through the service on a real "
        "ledger and NATS",
        defaults,
        run,
        options,
    )


def _trace_options(parser: argparse.ArgumentParser) -> None:
    from tfctl.bench_targets import DEFAULT_TRACES

    parser.add_argument(
        "--traces", type=Path, default=DEFAULT_TRACES, help=f"openb trace folder ({DEFAULT_TRACES})"
    )
    parser.add_argument("--trace", default="default", help="pod list openb_pod_list_TRACE.csv (default)")


def _register_placement(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfcommon.placement import DEFAULT_POLICY

    from tfctl.bench_targets import DEFAULT_TRACES

    defaults: dict[str, Any] = {
        "traces": str(DEFAULT_TRACES),
        "trace": "default",
        "policies": [DEFAULT_POLICY, "tfpool", "bestfit", "fgd"],
        "seeds": 3,
        "latency_placements": 2000,
        "online": True,
    }

    def options(parser: argparse.ArgumentParser) -> None:
        _trace_options(parser)
        parser.add_argument(
            "--policy",
            dest="policies",
            action="append",
            help=f"repeatable ({DEFAULT_POLICY}, tfpool, bestfit, fgd); bestfit is added; the first is timed",
        )
        parser.add_argument(
            "--seeds", type=int, default=3, help="seeds 42, 43, ...: how many (3; the paper uses 10)"
        )
        parser.add_argument(
            "--latency-placements",
            type=int,
            default=2000,
            help="timed placements on 1,000 nodes, first policy and bestfit (2000)",
        )
        parser.add_argument(
            "--no-online",
            dest="online",
            action="store_false",
            help="skip replaying the first policy with its target learned online (arrived pods only)",
        )
        parser.set_defaults(policies=None)

    def run(sizes: dict[str, Any], say: Progress) -> dict[str, Any]:
        from tfctl.bench_targets import run_placement

        sizes["policies"] = sizes["policies"] or defaults["policies"]
        result = run_placement(
            traces=Path(sizes["traces"]),
            trace=sizes["trace"],
            policies=sizes["policies"],
            seeds=sizes["seeds"],
            latency_placements=sizes["latency_placements"],
            online=sizes["online"],
            progress=say,
        )
        sizes["traces"] = str(sizes["traces"])
        return result

    _add_target(
        targets,
        "placement",
        "allocation on the openb trace per policy (1.3x capacity arrived), the first policy also with its "
        "target learned online; one placement's latency",
        defaults,
        run,
        options,
    )


def _register_defrag(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfctl.bench_targets import DEFAULT_TRACES

    defaults: dict[str, Any] = {
        "traces": str(DEFAULT_TRACES),
        "trace": "default",
        "fill": 0.9,
        "depart": 0.3,
        "seed": 42,
    }

    def options(parser: argparse.ArgumentParser) -> None:
        _trace_options(parser)
        parser.add_argument("--fill", type=float, default=0.9, help="share of GPU capacity requested (0.9)")
        parser.add_argument("--depart", type=float, default=0.3, help="share of placed pods that leave (0.3)")
        parser.add_argument("--seed", type=int, default=42, help="seed of the shuffle and departures (42)")

    def run(sizes: dict[str, Any], say: Progress) -> dict[str, Any]:
        from tfctl.bench_targets import run_defrag

        result = run_defrag(
            traces=Path(sizes["traces"]),
            trace=sizes["trace"],
            fill=sizes["fill"],
            depart=sizes["depart"],
            seed=sizes["seed"],
            progress=say,
        )
        sizes["traces"] = str(sizes["traces"])
        return result

    _add_target(
        targets,
        "defrag",
        "nodes freed, moves, stranded pods and PDB violations of defrag campaigns, against the global "
        "CP-SAT bound (any node drained, each pod wherever it fits)",
        defaults,
        run,
        options,
    )


def _register_ledger(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfctl.bench_ledger import DEFAULT_BATCH, DEFAULT_CONCURRENCY, DEFAULT_RESERVATIONS

    defaults: dict[str, Any] = {
        "reservations": DEFAULT_RESERVATIONS,
        "concurrency": DEFAULT_CONCURRENCY,
        "batch": DEFAULT_BATCH,
    }

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--reservations",
            type=int,
            default=DEFAULT_RESERVATIONS,
            help=f"per mode ({DEFAULT_RESERVATIONS})",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=DEFAULT_CONCURRENCY,
            help=f"callers at once ({DEFAULT_CONCURRENCY})",
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=DEFAULT_BATCH,
            help=f"reservations per reserve_many() ({DEFAULT_BATCH})",
        )

    def run(sizes: dict[str, Any], say: Progress) -> dict[str, Any]:
        from tfctl.bench_ledger import run_ledger_benchmark

        say(f"{sizes['reservations']} reservations per mode, each after its bare-INSERT baseline")
        return run_ledger_benchmark(
            sizes["reservations"],
            concurrency=sizes["concurrency"],
            batch=sizes["batch"],
            database_url=_database_url(),
        )

    _add_target(
        targets,
        "ledger",
        "SqlLedger reservations/s (one at a time, concurrent, batched) against a bare INSERT ... RETURNING",
        defaults,
        run,
        options,
    )


def _register_outbox(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfctl.bench_outbox import DEFAULT_BATCH_SIZE, DEFAULT_EVENTS

    defaults: dict[str, Any] = {"events": DEFAULT_EVENTS, "batch_size": DEFAULT_BATCH_SIZE}

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--events", type=int, default=DEFAULT_EVENTS, help=f"events relayed ({DEFAULT_EVENTS})"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"events per relay pass ({DEFAULT_BATCH_SIZE})",
        )

    def run(sizes: dict[str, Any], say: Progress) -> dict[str, Any]:
        from tfctl.bench_outbox import run_outbox_benchmark

        say(f"{sizes['events']} events through the relay, and bare js.publish of the same payloads")
        return run_outbox_benchmark(
            sizes["events"],
            batch_size=sizes["batch_size"],
            database_url=_database_url(),
            nats_url=_nats_url(),
        )

    _add_target(
        targets,
        "outbox",
        "events/s through the ledger outbox relay to JetStream against bare js.publish of the same payloads",
        defaults,
        run,
        options,
    )


def _register_kubernetes(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfctl import bench_kubernetes as kube

    defaults: dict[str, Any] = {
        "pods": kube.DEFAULT_PODS,
        "nodes": kube.DEFAULT_NODES,
        "gpus_per_node": kube.DEFAULT_GPUS_PER_NODE,
        "create_concurrency": kube.DEFAULT_CREATE_CONCURRENCY,
        "kube_scheduler_qps": kube.KUBE_SCHEDULER_QPS,
        "fractional": True,
    }

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--pods", type=int, default=kube.DEFAULT_PODS, help=f"pods per phase ({kube.DEFAULT_PODS})"
        )
        parser.add_argument(
            "--nodes", type=int, default=kube.DEFAULT_NODES, help=f"KWOK nodes ({kube.DEFAULT_NODES})"
        )
        parser.add_argument(
            "--gpus-per-node",
            type=int,
            default=kube.DEFAULT_GPUS_PER_NODE,
            help=f"nvidia.com/gpu per node, H100s in the ledger ({kube.DEFAULT_GPUS_PER_NODE})",
        )
        parser.add_argument(
            "--create-concurrency",
            type=int,
            default=kube.DEFAULT_CREATE_CONCURRENCY,
            help=f"pod creations in flight ({kube.DEFAULT_CREATE_CONCURRENCY})",
        )
        parser.add_argument(
            "--kube-scheduler-qps",
            type=int,
            default=kube.KUBE_SCHEDULER_QPS,
            help=f"kube-scheduler's --kube-api-qps and --kube-api-burst ({kube.KUBE_SCHEDULER_QPS}, as in "
            "its perf tests; its default is 50 / 100)",
        )
        parser.add_argument(
            "--no-fractional",
            dest="fractional",
            action="store_false",
            help="skip the fractional-GPU phase (ours only)",
        )

    def run(sizes: dict[str, Any], say: Progress) -> dict[str, Any]:
        return kube.run_kubernetes_benchmark(
            **sizes, database_url=_database_url(), nats_url=_nats_url(), progress=say
        )

    _add_target(
        targets,
        "kubernetes",
        "pods/s and p99 from creation to bound through a real API server on KWOK nodes: whole-GPU pods "
        "(nvidia.com/gpu: 1) by kube-scheduler and by our scheduler service in Kubernetes mode, then "
        "fractional pods (ours only); ratio ours / kube-scheduler",
        defaults,
        run,
        options,
    )
