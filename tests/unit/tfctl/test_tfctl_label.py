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
