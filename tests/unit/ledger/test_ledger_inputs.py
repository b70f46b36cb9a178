"""Bad input to the ledger gets a clear error naming the field; results explain themselves."""

from __future__ import annotations

from uuid import uuid4

import pytest
from tfcommon.events import WorkloadRef
from tfcommon.ledger.outbox import TestPause
from tfcommon.ledger.outbox import main as relay_main
from tfcommon.ledger.records import (
    GpuSpec,
    InsufficientCapacity,
    LedgerInputError,
    NodeSpec,
    ReservationRequest,
    ShareRequest,
)
from tfcommon.ledger.urls import DatabaseUrlError, ledger_url
from tfctl.main import main as tfctl

WORKLOAD = WorkloadRef(namespace="team-a", name="pod-1")


def a_request(**overrides: object) -> ReservationRequest:
    fields: dict[str, object] = {
        "allocation_id": uuid4(),
        "workload": WORKLOAD,
        "pool": "default",
        "node": "node-a",
        "shares": (ShareRequest(gpu_uuid="gpu-1", tflops_milli=1000, vram_bytes=1024),),
    }
    fields.update(overrides)
    return ReservationRequest(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: a_request(shares=()), "shares: empty", id="no-shares"),
        pytest.param(
            lambda: a_request(
                shares=(
                    ShareRequest(gpu_uuid="gpu-1", tflops_milli=1, vram_bytes=1),
                    ShareRequest(gpu_uuid="gpu-1", tflops_milli=1, vram_bytes=1),
                )
            ),
            "shares: GPU gpu-1 appears more than once",
            id="duplicate-gpu",
        ),
        pytest.param(lambda: a_request(qos="urgent"), "qos: 'urgent' is not one of low, medium", id="qos"),
        pytest.param(lambda: a_request(isolation="full"), "isolation: 'full' is not one of", id="isolation"),
        pytest.param(lambda: a_request(pool=""), "pool: '' must be a non-empty name", id="pool"),
        pytest.param(
            lambda: ShareRequest(gpu_uuid="gpu-1", tflops_milli=-1, vram_bytes=0),
            "shares[].tflops_milli: -1 must be zero or more",
            id="negative-tflops",
        ),
        pytest.param(
            lambda: ShareRequest(gpu_uuid="gpu-1", tflops_milli=0, vram_bytes=1.5),  # type: ignore[arg-type]
            "shares[].vram_bytes: 1.5 must be an integer",
            id="float-bytes",
        ),
        pytest.param(
            lambda: ShareRequest(gpu_uuid="GPU-ABC", tflops_milli=0, vram_bytes=0),
            "shares[].gpu_uuid: 'GPU-ABC' must be lower case",
            id="upper-case-uuid",
        ),
        pytest.param(
            lambda: ShareRequest(gpu_uuid="gpu-1", tflops_milli=2000, vram_bytes=0, limit_tflops_milli=1000),
            "shares[].limit_tflops_milli: 1000 is below the request 2000",
            id="limit-below-request",
        ),
        pytest.param(
            lambda: GpuSpec(
                uuid="gpu-1",
                node="n",
                index=0,
                model="H100",
                vendor="NVIDIA",
                capacity_tflops_milli=1,
                capacity_vram_bytes=1,
                phase="Lost",  # type: ignore[arg-type]
            ),
            "gpu.phase: 'Lost' is not one of Pending, Running",
            id="gpu-phase",
        ),
        pytest.param(
            lambda: NodeSpec(name="node-a", pool="default", memory_allocatable_bytes=-5),
            "node.memory_allocatable_bytes: -5 must be zero or more",
            id="node-memory",
        ),
    ],
)
def test_bad_input_names_the_field(build: object, message: str) -> None:
    with pytest.raises(LedgerInputError) as raised:
        build()  # type: ignore[operator]
    assert message in str(raised.value)


def test_limits_default_to_requests() -> None:
    share = ShareRequest(gpu_uuid="gpu-1", tflops_milli=1500, vram_bytes=2048)
    assert (share.effective_limit_tflops_milli, share.effective_limit_vram_bytes) == (1500, 2048)


@pytest.mark.parametrize(
    ("shortfall", "message"),
    [
        pytest.param(
            InsufficientCapacity(
                gpu_uuid="gpu-1",
                resource="vram",
                requested=20 * 1024**3,
                available=8 * 1024**3,
                capacity=80 * 1024**3,
            ),
            "insufficient capacity on GPU gpu-1: VRAM requested 20Gi, free 8Gi of 80Gi",
            id="vram",
        ),
        pytest.param(
            InsufficientCapacity(
                gpu_uuid="gpu-2", resource="tflops", requested=10_500, available=0, capacity=100_000
            ),
            "insufficient capacity on GPU gpu-2: TFLOPS requested 10500m, free 0 of 100",
            id="tflops",
        ),
    ],
)
def test_insufficient_capacity_says_what_was_short(shortfall: InsufficientCapacity, message: str) -> None:
    assert shortfall.message == message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@db:5432/tfpool", "postgresql+psycopg://u:p@db:5432/tfpool"),
        ("postgres://u@db/tfpool", "postgresql+psycopg://u@db/tfpool"),
        ("postgresql+psycopg://u@db:5432/tfpool", "postgresql+psycopg://u@db:5432/tfpool"),
    ],
)
def test_postgres_urls_are_accepted_in_every_common_form(url: str, expected: str) -> None:
    assert ledger_url(url).render_as_string(hide_password=False) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "database URL: empty; set TF_DATABASE_URL"),
        ("mysql://u@db/tfpool", "scheme 'mysql' is not supported"),
        ("postgresql://u@db:5432", "no database name"),
        ("not a url", "not a URL"),
    ],
)
def test_bad_database_urls_say_what_to_set(url: str, message: str) -> None:
    with pytest.raises(DatabaseUrlError) as raised:
        ledger_url(url)
    assert message in str(raised.value)


def test_tfctl_migrate_without_a_database_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TF_DATABASE_URL", raising=False)

    assert tfctl(["migrate"]) == 2

    error = capsys.readouterr().err
    assert "pass --database-url or set TF_DATABASE_URL" in error


def test_tfctl_migrate_rejects_a_non_postgres_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert tfctl(["migrate", "--database-url", "sqlite:///ledger.db"]) == 2

    assert "scheme 'sqlite' is not supported" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--database-url", "postgresql://u@db/tfpool"], "--nats-url: unset; pass it or set TF_NATS_URL"),
        (["--nats-url", "nats://127.0.0.1:4222"], "database URL: empty; set TF_DATABASE_URL"),
    ],
)
def test_the_relay_process_says_which_url_is_missing(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TF_DATABASE_URL", raising=False)
    monkeypatch.delenv("TF_NATS_URL", raising=False)

    with pytest.raises(SystemExit) as exited:
        relay_main(argv)

    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_relay_test_hook_refuses_an_unknown_pause_point() -> None:
    with pytest.raises(ValueError, match="TF_OUTBOX_TEST_PAUSE_AT: 'later' is not before-publish"):
        TestPause.from_environment({"TF_OUTBOX_TEST_PAUSE_AT": "later", "TF_OUTBOX_TEST_PAUSE_MARKER": "/x"})
    assert TestPause.from_environment({}) is None
