"""The fault campaign's own JetStream requests are asked again while JetStream has no responder (503,
as right after the campaign restarts its NATS cluster), and only then: a request that got any other
answer is not repeated."""

from __future__ import annotations

import pytest
from nats.js.errors import NoStreamResponseError, NotFoundError, ServiceUnavailableError
from tfctl.fault_nats import until_jetstream_answers


class Flaky:
    """A JetStream request that gets no responder `unanswered` times, then `outcome`."""

    def __init__(self, unanswered: int, outcome: BaseException | str, no_responder: type[Exception]) -> None:
        self.unanswered = unanswered
        self.outcome = outcome
        self.no_responder = no_responder
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.unanswered:
            raise self.no_responder
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


@pytest.mark.parametrize("no_responder", [ServiceUnavailableError, NoStreamResponseError])
async def test_a_request_is_asked_again_until_jetstream_answers(no_responder: type[Exception]) -> None:
    request = Flaky(3, "stream info", no_responder)

    assert await until_jetstream_answers(request, timeout_s=10) == "stream info"
    assert request.calls == 4


async def test_any_other_error_is_raised_at_once() -> None:
    request = Flaky(1, NotFoundError(), ServiceUnavailableError)

    with pytest.raises(NotFoundError):
        await until_jetstream_answers(request, timeout_s=10)
    assert request.calls == 2


async def test_jetstream_that_never_answers_fails_after_the_timeout() -> None:
    request = Flaky(10_000, "never", ServiceUnavailableError)

    with pytest.raises(ServiceUnavailableError):
        await until_jetstream_answers(request, timeout_s=0.6)
    assert 2 <= request.calls <= 5
