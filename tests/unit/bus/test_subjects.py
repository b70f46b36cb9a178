"""Stream and consumer declarations: names, backoff schedule and the JetStream configuration they produce."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tfcommon import subjects


def test_consumer_names_are_service_then_handler() -> None:
    for spec in subjects.CONSUMERS:
        assert spec.durable.startswith(f"{spec.service}-"), spec.durable
    assert len({spec.durable for spec in subjects.CONSUMERS}) == len(subjects.CONSUMERS)


def test_per_node_consumer_names_are_valid_for_dotted_node_names() -> None:
    spec = subjects.node_agent_run_commands("ip-10-0-0-7.ec2.internal")

    assert spec.durable == "node-agent-run-commands-ip-10-0-0-7_ec2_internal"
    assert spec.filter_subjects == ("tf.cmd.node-agent.*.ip-10-0-0-7.ec2.internal",)


@pytest.mark.parametrize(("delivered", "delay"), [(1, 1.0), (2, 5.0), (3, 15.0), (4, 30.0), (9, 30.0)])
def test_redelivery_delay_follows_the_backoff_then_repeats_its_last_step(
    delivered: int, delay: float
) -> None:
    assert subjects.SCHEDULER_SCHEDULE_WORKLOAD.redelivery_delay_s(delivered) == delay


def test_jetstream_config_keeps_backoff_shorter_than_max_deliver() -> None:
    spec = replace(subjects.SCHEDULER_SCHEDULE_WORKLOAD, max_deliver=3)

    config = spec.config()
    assert config.backoff == [1.0, 5.0]
    assert config.filter_subject == "tf.evt.workload.submitted"
    assert config.filter_subjects is None
    assert spec.effective_ack_wait_s == 1.0


def test_multi_subject_consumer_uses_filter_subjects() -> None:
    config = subjects.SCHEDULER_TRACK_NODES.config()

    assert config.filter_subject is None
    assert config.filter_subjects == list(subjects.SCHEDULER_TRACK_NODES.filter_subjects)


def test_streams_split_facts_and_commands() -> None:
    events, commands = subjects.EVENTS.config(), subjects.COMMANDS.config()

    assert (events.subjects, events.retention, events.storage) == (["tf.evt.>"], "limits", "file")
    assert events.duplicate_window >= 120
    assert (commands.subjects, commands.retention) == (["tf.cmd.>"], "workqueue")
