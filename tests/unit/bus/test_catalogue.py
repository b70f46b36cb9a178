"""The generated event catalogue: `docs/events.md` matches the code, and `tfctl events doc` keeps it so."""

from __future__ import annotations

from pathlib import Path

import pytest
from tfcommon.catalogue import consumers_of, filter_matches, render_catalogue
from tfcommon.events import MESSAGE_TYPES, GpuUsageReported, StopWorker, WorkloadSubmitted
from tfctl.main import main

CATALOGUE = Path(__file__).resolve().parents[3] / "docs" / "events.md"


def test_committed_catalogue_is_up_to_date() -> None:
    assert CATALOGUE.read_text(encoding="utf-8") == render_catalogue(), (
        "docs/events.md is stale: run `tfctl events doc` and commit it"
    )


def test_catalogue_documents_every_message() -> None:
    text = render_catalogue()

    for subject, message_type in MESSAGE_TYPES.items():
        assert f"### `{subject}" in text
        assert message_type.__name__ in text


def test_check_fails_on_a_stale_file_and_doc_repairs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "events.md"
    target.write_text("# hand-edited\n", encoding="utf-8")

    assert main(["events", "doc", "--check", "--output", str(target)]) == 1
    assert "stale: run `tfctl events doc`" in capsys.readouterr().err
    assert main(["events", "doc", "--output", str(target)]) == 0
    assert main(["events", "doc", "--check", "--output", str(target)]) == 0


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("tf.evt.>", "tf.evt.pod.admitted", True),
        ("tf.evt.>", "tf.evt", False),
        ("tf.cmd.node-agent.*.n1", "tf.cmd.node-agent.stop-worker.n1", True),
        ("tf.cmd.node-agent.*.n1", "tf.cmd.node-agent.stop-worker.n2", False),
        ("tf.cmd.node-agent.*.n1", "tf.cmd.node-agent.stop-worker.n1.x", False),
        ("tf.evt.pod.admitted", "tf.evt.pod.admitted", True),
        ("tf.evt.pod.*", "tf.evt.node.drained", False),
    ],
)
def test_subject_patterns_match_like_nats(pattern: str, subject: str, matches: bool) -> None:
    assert filter_matches(pattern, subject) is matches


def test_consumers_are_derived_from_the_declared_filters() -> None:
    assert [spec.durable for spec in consumers_of(WorkloadSubmitted)] == ["scheduler-schedule-workload"]
    assert [spec.durable for spec in consumers_of(GpuUsageReported)] == ["metrics-record-usage"]
    assert [spec.durable for spec in consumers_of(StopWorker)] == ["node-agent-run-commands-NODE"]
