"""Gang scheduling, pure part (`tfscheduler.core.gang`): TensorFusion's gang annotations on a pod, the
timeout, and the verdict a waiting member gets (the gang and the numbers)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from tfcommon.cluster.model import OwnerReference, Pod
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.pod_request import PodRequestError
from tfdefrag.adapters.scheduler_api import pod_from_workload
from tfscheduler.api import workload_listing
from tfscheduler.core.gang import GangCount, gang_of, gang_reason, timed_out
from tfscheduler.submission import Gang, Submission
from tfscheduler.workloads import StoredWorkload

T0 = datetime(2026, 1, 1, tzinfo=UTC)
REPLICA_SET = OwnerReference(kind="ReplicaSet", name="train-5d8f", uid="rs-uid", controller=True)


def a_pod(annotations: dict[str, str], owners: tuple[OwnerReference, ...] = (REPLICA_SET,)) -> Pod:
    return Pod(namespace="ml", name="train-5d8f-x", annotations=annotations, owner_references=owners)


def test_a_deployment_pod_is_grouped_by_its_replica_set() -> None:
    pod = a_pod(
        {
            "tensor-fusion.ai/gang-enabled": "true",
            "tensor-fusion.ai/gang-min-members": "4",
            "tensor-fusion.ai/gang-timeout": "1m30s",
        }
    )

    assert gang_of(pod) == Gang(group_key="ml/train-5d8f", min_members=4, timeout_s=90)


def test_the_group_key_annotation_wins_and_timeout_zero_waits_indefinitely() -> None:
    pod = a_pod(
        {
            "tensor-fusion.ai/gang-enabled": "true",
            "tensor-fusion.ai/gang-min-members": "2",
            "tensor-fusion.ai/gang-timeout": "0",
            "tensor-fusion.ai/gang-group-key": "ml/job",
        },
        owners=(),
    )

    assert gang_of(pod) == Gang(group_key="ml/job", min_members=2, timeout_s=0)


def test_without_gang_enabled_there_is_no_gang() -> None:
    assert gang_of(a_pod({"tensor-fusion.ai/gang-min-members": "4"})) is None
    assert gang_of(a_pod({"tensor-fusion.ai/gang-enabled": "false"})) is None


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({"tensor-fusion.ai/gang-min-members": "four"}, "tensor-fusion.ai/gang-min-members"),
        ({}, "tensor-fusion.ai/gang-min-members"),
        (
            {"tensor-fusion.ai/gang-min-members": "4", "tensor-fusion.ai/gang-timeout": "soon"},
            "tensor-fusion.ai/gang-timeout",
        ),
    ],
)
def test_a_bad_annotation_is_named(annotations: dict[str, str], named: str) -> None:
    with pytest.raises(PodRequestError, match=re.escape(named)):
        gang_of(a_pod({"tensor-fusion.ai/gang-enabled": "true", **annotations}))


def test_a_gang_without_a_controller_or_group_key_says_what_to_set() -> None:
    pod = a_pod(
        {"tensor-fusion.ai/gang-enabled": "true", "tensor-fusion.ai/gang-min-members": "2"}, owners=()
    )

    with pytest.raises(PodRequestError, match=re.escape("tensor-fusion.ai/gang-group-key")):
        gang_of(pod)


def test_timeout_counts_from_the_oldest_waiting_member() -> None:
    gang = Gang(group_key="ml/train", min_members=4, timeout_s=30)
    waiting = [T0 + timedelta(seconds=20), T0]

    assert not timed_out(gang, waiting, T0 + timedelta(seconds=29))
    assert timed_out(gang, waiting, T0 + timedelta(seconds=30))
    assert not timed_out(Gang(group_key="ml/train", min_members=4), waiting, T0 + timedelta(days=365))


def test_the_verdict_names_the_gang_and_the_numbers() -> None:
    gang = Gang(group_key="ml/train", min_members=4, timeout_s=30)

    waiting = gang_reason(gang, GangCount(live=4, placed=0, fit=3), expired=False)
    expired = gang_reason(gang, GangCount(live=4, placed=0, fit=3), expired=True)
    too_few = gang_reason(gang, GangCount(live=2, placed=0, fit=None), expired=False)

    assert "gang ml/train" in waiting
    assert "3 of min 4 members fit" in waiting
    assert "up to 30s" in waiting
    assert expired.startswith("gang ml/train timed out after 30s: 3 of min 4 members fit")
    assert "2 of min 4 members exist" in too_few


@pytest.mark.parametrize(("raw", "seconds"), [("5m", 300), ("500ms", 1), ("0s", 0), ("", 0)])
def test_gang_timeout_is_a_go_duration_where_zero_waits_indefinitely(raw: str, seconds: int) -> None:
    pod = a_pod(
        {
            "tensor-fusion.ai/gang-enabled": "true",
            "tensor-fusion.ai/gang-min-members": "2",
            "tensor-fusion.ai/gang-timeout": raw,
        }
    )

    gang = gang_of(pod)

    assert gang is not None
    assert gang.timeout_s == seconds


def test_a_local_gang_member_is_listed_as_a_pod_with_its_gang_annotations() -> None:
    gang = Gang(group_key="ml/train", min_members=4, timeout_s=30)
    submission = Submission(
        workload=WorkloadRef(namespace="ml", name="train-0", uid="u-0", workload="train"),
        request=GpuRequest(
            pool="default",
            tflops_request_milli=10_000,
            tflops_limit_milli=10_000,
            vram_request_bytes=1 << 30,
            vram_limit_bytes=1 << 30,
        ),
        gang=gang,
    )
    stored = StoredWorkload(uuid4(), submission, "placed", None, T0)

    pod = pod_from_workload(workload_listing(stored, None))

    assert gang_of(pod) == gang
