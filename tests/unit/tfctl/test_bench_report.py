"""The generated benchmark table: headline figures with their in-run baselines, spliced into the page
between its markers without touching the hand-written analysis around it."""

from __future__ import annotations

import pytest
from tfctl.bench_report import BEGIN_MARKER, END_MARKER, MarkerError, figures_of, render_markdown, splice

LEDGER_RESULT = {
    "concurrency": 16,
    "batch": 50,
    "modes": {
        "one_at_a_time": {"reservations_per_second": 400.0, "baseline_inserts_per_second": 500.0},
        "batched": {"reservations_per_second": 3000.0, "baseline_inserts_per_second": 6000.0},
    },
}
OUTBOX_RESULT = {
    "batch_size": 100,
    "relay": {"events_per_second": 2100.0},
    "bare_publish": {"events_per_second": 4200.0},
}
DEFRAG_RESULT = {
    "threshold_percent": 40,
    "nodes_freed": 40,
    "moves": 122,
    "stranded_pods": 0,
    "pdb_violations": 0,
    "any_node": {"nodes_freed": 500, "moves": 1100, "stranded_pods": 0, "pdb_violations": 0},
    "bound_kind": "global",
    "global_bound_nodes_freed": 525,
    "bound_best_nodes_freed": 510,
    "bound_best_pods_moved": 1000,
    "bound_gap": 0.0286,
    "per_pod": {"nodes_freed": 41, "global_bound_nodes_freed": 600},
}


def a_document() -> dict[str, object]:
    return {
        "machine": {
            "cpu_model": "AMD EPYC",
            "cores": 2,
            "memory_gib": 23.5,
            "python": "3.11.7",
            "load_average_at_start": [1.5, 2.25, 3.0],
        },
        "command": "tfctl bench all --json",
        "started_at": "2026-12-02T22:00:00+00:00",
        "seconds": 351.4,
        "targets": {
            "ledger": {
                "seconds": 20.5,
                "sizes": {"reservations": 1000, "concurrency": 16, "batch": 50},
                "figures": figures_of("ledger", LEDGER_RESULT),
            },
            "defrag": {
                "seconds": 15.2,
                "sizes": {"trace": "default", "fill": 0.9},
                "figures": figures_of("defrag", DEFRAG_RESULT),
            },
        },
    }


def test_speed_figures_carry_their_baseline_and_the_ratio() -> None:
    reserve, batched = figures_of("ledger", LEDGER_RESULT)
    (relay,) = figures_of("outbox", OUTBOX_RESULT)

    assert reserve == {
        "name": "reserve(), one at a time",
        "value": 400.0,
        "unit": "reservations/s",
        "baseline": "bare INSERT ... RETURNING, same shape",
        "baseline_value": 500.0,
        "ratio": 0.8,
    }
    assert batched["name"] == "reserve_many(), batches of 50"
    assert batched["ratio"] == 0.5
    assert relay["ratio"] == 0.5
    assert relay["unit"] == "events/s"


def test_the_table_states_the_machine_once_and_one_row_per_figure() -> None:
    table = render_markdown(a_document())

    assert table.splitlines()[0].startswith(
        "Measured by `tfctl bench all --json` on AMD EPYC, 2 cores, 23.5 GiB memory, Python 3.11.7, "
        "2026-12-02; 351 s in all."
    )
    assert table.count("AMD EPYC") == 1
    assert "Load average at the start: 1.5 / 2.25 / 3.0." in table.splitlines()[1]
    assert (
        "| ledger | reserve(), one at a time | 400.0 reservations/s | 500.0 reservations/s "
        "(bare INSERT ... RETURNING, same shape) | 0.8 |" in table
    )
    assert (
        "| ledger | reserve_many(), batches of 50 | 3,000.0 reservations/s | 6,000.0 reservations/s" in table
    )
    bound = "global bound: any node drained, each pod wherever it fits (CP-SAT)"
    assert (
        f"| defrag | nodes freed, default threshold (40%) | 40 nodes | 525 nodes ({bound}) | 0.076 |" in table
    )
    assert (
        f"| defrag | nodes freed, every node a candidate | 500 nodes | 525 nodes ({bound}) | 0.952 |" in table
    )
    assert "| defrag | global bound's gap proven (best bound vs best solution) | 2.86% | - | - |" in table
    assert (
        "| defrag | nodes freed, default threshold, one budget per pod (the old protocol) | 41 nodes" in table
    )
    assert "| defrag | stranded pods | 0 pods | - | - |" in table
    assert "| ledger | reservations 1000, concurrency 16, batch 50 | 20.5 |" in table
    assert "| defrag | trace default, fill 0.9 | 15.2 |" in table


def test_splice_replaces_only_the_generated_part() -> None:
    page = f"# Benchmarks\n\nIntro.\n\n{BEGIN_MARKER}\nold table\n{END_MARKER}\n\n## Analysis\n\nKept.\n"

    once = splice(page, "new table\n")
    twice = splice(once, "newer table\n")

    assert (
        once == f"# Benchmarks\n\nIntro.\n\n{BEGIN_MARKER}\nnew table\n{END_MARKER}\n\n## Analysis\n\nKept.\n"
    )
    assert twice == once.replace("new table", "newer table")


def test_a_page_without_markers_is_refused_with_the_markers_to_add() -> None:
    with pytest.raises(MarkerError, match="bench:begin"):
        splice("# Benchmarks\n\nno markers here\n", "table\n")
    with pytest.raises(MarkerError):
        splice(f"{END_MARKER}\n{BEGIN_MARKER}\n", "table\n")


WEBHOOK_RESULT = {
    "cached": {"c10": {"requests_per_s": 4500.0, "p99_ms": 3.5, "bare_requests_per_s": 6000.0}},
    "varied": {"c10": {"requests_per_s": 3600.0, "p99_ms": 4.0, "bare_requests_per_s": 5000.0}},
    "bare": {"c10": {"requests_per_s": 5500.0, "p99_ms": 3.0}},
}


def test_the_webhook_figures_name_the_shortcut_path_and_the_path_users_hit_each_against_its_round() -> None:
    figures = {found["name"]: found for found in figures_of("webhook", WEBHOOK_RESULT)}

    cached = figures[
        "admission, 10 clients, one cached review, discarding bus, in-memory pod index (shortcut path)"
    ]
    varied = figures["admission, 10 clients, distinct openb pods, JetStream, Postgres pod index"]
    assert (cached["ratio"], cached["baseline_value"]) == (0.75, 6000.0)
    assert (varied["ratio"], varied["baseline_value"]) == (0.72, 5000.0)
    p99 = figures["admission p99, 10 clients, distinct openb pods, JetStream, Postgres pod index"]
    assert (p99["value"], p99["baseline_value"]) == (4.0, 3.0)
    assert len(figures) == 4


def test_the_online_replay_is_reported_against_the_same_policy_learning_from_the_whole_trace() -> None:
    means = {"placements_per_second": 600.0}
    result = {
        "reference_policy": "bestfit",
        "replay": {
            "summary": {
                "tfpool-rollout": {**means, "allocated_at_130": 0.96, "unallocated_gpus_at_130": 248.9},
                "bestfit": {**means, "allocated_at_130": 0.93, "unallocated_gpus_at_130": 437.8},
                "tfpool-rollout (online)": {
                    **means,
                    "allocated_at_130": 0.955,
                    "unallocated_gpus_at_130": 280.0,
                },
            }
        },
        "latency": {},
    }

    found = {entry["name"]: entry for entry in figures_of("placement", result)}

    online = found["`tfpool-rollout`, target learned online (arrived pods only): unallocated GPUs at 130%"]
    assert (online["value"], online["baseline_value"], online["ratio"]) == (280.0, 248.9, 1.125)
    assert online["baseline"] == "target learned from the whole trace, same seeds"
    assert "`tfpool-rollout`, whole-trace target allocated at 130% arrived" in found
    assert "`bestfit` allocated at 130% arrived" in found


def a_scheduler_run(via: str, nodes: int, mixed: bool, placements: float) -> dict[str, object]:
    return {
        "via": via,
        "nodes": nodes,
        "mixed_shapes": mixed,
        "burst": {"placements_per_second": placements, "p99_ms": 180.0},
        "offered": {"rate_per_second": 200.0, "p99_ms": 35.5},
        "baseline_reserve_many": {"reservations_per_second": 2000.0, "batch_size_mean": 31.2},
    }


def test_each_scheduler_run_is_named_by_its_way_in_and_compared_with_reserve_many() -> None:
    result = {
        "runs": [
            a_scheduler_run("in-process", 1000, False, 760.0),
            a_scheduler_run("http", 10000, True, 500.0),
        ]
    }

    figures = {found["name"]: found for found in figures_of("scheduler", result)}

    shortcut = figures["burst of placements, via: in-process, one shape, 1,000 nodes (shortcut path)"]
    assert (shortcut["ratio"], shortcut["baseline"]) == (
        0.38,
        "ledger reserve_many alone, the scheduler's batch sizes (mean 31.2)",
    )
    assert figures["burst of placements, via: http, openb shapes, 10,000 nodes"]["ratio"] == 0.25
    offered = "p99 from intended send to announced at 200/s offered, via: http, openb shapes, 10,000 nodes"
    assert figures[offered]["value"] == 35.5
    assert len(figures) == 6
