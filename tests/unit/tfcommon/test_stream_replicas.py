"""`stream_replicas`: a new stream gets the configured replicas; an existing one never fewer than it has."""

from __future__ import annotations

import pytest
from tfcommon.settings import NatsSettings
from tfcommon.subjects import EVENTS, stream_replicas


@pytest.mark.parametrize(
    ("wanted", "existing", "applied"),
    [
        (1, None, 1),  # created locally with the default
        (3, None, 3),  # created by a service of the chart (TF_NATS_STREAM_REPLICAS=3)
        (3, 1, 3),  # raised
        (1, 3, 3),  # an operator's 3 kept by a service started with the default
        (3, 5, 5),
    ],
)
def test_replicas_are_raised_or_kept_never_lowered(wanted: int, existing: int | None, applied: int) -> None:
    assert stream_replicas(wanted, existing) == applied


def test_zero_replicas_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="TF_NATS_STREAM_REPLICAS"):
        stream_replicas(0, None)


def test_the_setting_defaults_to_one_and_reaches_the_stream_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NatsSettings().stream_replicas == 1
    monkeypatch.setenv("TF_NATS_STREAM_REPLICAS", "3")
    replicas = NatsSettings().stream_replicas
    assert EVENTS.config(replicas).num_replicas == 3
