"""`tfctl label node NODE KEY=VALUE|KEY-`: the changes as kubectl writes them, and the scheduler's refusals
as one line."""

from __future__ import annotations

import pytest
from tfctl.commands.label import LabelSyntaxError, parse_changes
from tfctl.main import main
from tfctl.scheduler_client import detail_of


def test_key_equals_value_sets_and_a_trailing_dash_removes() -> None:
    assert parse_changes(["tensor-fusion.ai/do-not-disrupt=true"]) == {
        "tensor-fusion.ai/do-not-disrupt": "true"
    }
    assert parse_changes(["tensor-fusion.ai/do-not-disrupt-"]) == {"tensor-fusion.ai/do-not-disrupt": None}
    assert parse_changes(["a=x=y", "b-"]) == {"a": "x=y", "b": None}


@pytest.mark.parametrize("change", ["tensor-fusion.ai/do-not-disrupt", "=true", "-"])
def test_a_change_that_is_neither_form_is_refused_with_an_example(change: str) -> None:
    with pytest.raises(LabelSyntaxError, match=r"neither KEY=VALUE nor KEY- .*do-not-disrupt=true"):
        parse_changes([change])


def test_the_same_key_twice_is_refused() -> None:
    with pytest.raises(LabelSyntaxError, match="given twice"):
        parse_changes(["k=true", "k-"])


def test_the_command_exits_2_on_a_malformed_change_without_calling_the_scheduler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["label", "node", "sim-node-1", "do-not-disrupt", "--scheduler-url", "http://127.0.0.1:9"])

    assert code == 2
    assert "tfctl label: 'do-not-disrupt' is neither KEY=VALUE nor KEY-" in capsys.readouterr().err


def test_validation_details_become_one_line_naming_the_field() -> None:
    body = {
        "detail": [
            {
                "loc": ["body", "labels", "tensor-fusion.ai/do-not-disrupt"],
                "msg": "Input should be 'true' or 'false'",
            },
            {"loc": ["body"], "msg": "Value error, labels: 'zone' cannot be set on a node in local mode"},
        ]
    }

    assert detail_of(body) == (
        "labels.tensor-fusion.ai/do-not-disrupt: Input should be 'true' or 'false'; "
        "labels: 'zone' cannot be set on a node in local mode"
    )
    assert detail_of({"detail": "no node 'x'"}) == "no node 'x'"


def test_tfctl_get_nodes_shows_a_node_s_labels() -> None:
    from tfctl.commands.get import render_table

    node = {
        "name": "sim-node-1",
        "pool": "default",
        "schedulable": True,
        "reason": None,
        "labels": {"tensor-fusion.ai/do-not-disrupt": "true"},
        "gpus": 1,
        "available_tflops_milli": 989_400,
        "capacity_tflops_milli": 989_400,
        "available_vram_bytes": 80 * 2**30,
        "capacity_vram_bytes": 80 * 2**30,
    }
    header, labelled, bare = render_table(
        "nodes", [node, {**node, "name": "sim-node-2", "labels": {}}]
    ).splitlines()

    assert header.split()[4] == "LABELS"
    assert labelled.split()[4] == "tensor-fusion.ai/do-not-disrupt=true"
    assert bare.split()[4] == "-"
