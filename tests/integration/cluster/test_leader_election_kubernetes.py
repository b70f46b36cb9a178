"""Leader election between candidates, each with its own `KubernetesCluster` client, over HTTP against kmock:
one leader at a time, takeover after expiry when the leader dies, at once when it releases cleanly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import kmock
import pytest
from cluster_apiserver import ApiServerState, install
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.rbac import LEASE_RBAC
from tfscheduler.core.leader import ElectionTimings
from tfscheduler.leader_election import LeaderElector

pytestmark = pytest.mark.integration

NAMESPACE = "tfpool-system"
LEASE = "tfpool-scheduler"
LEASE_KEY = ("coordination.k8s.io/v1/leases", NAMESPACE, LEASE)
FAST = ElectionTimings(lease_duration_s=1, renew_deadline_s=0.6, retry_period_s=0.1)


@dataclass
class Candidate:
    elector: LeaderElector
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    terms: list[tuple[str, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.elector.identity


@dataclass
class Api:
    state: ApiServerState
    scaffold: kmock.KubernetesScaffold
    url: str
    clients: list[KubernetesCluster] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)

    def candidate(self, identity: str, timings: ElectionTimings = FAST) -> Candidate:
        client = KubernetesCluster.for_url(self.url, request_timeout_s=2)
        self.clients.append(client)
        elector = LeaderElector(client, namespace=NAMESPACE, name=LEASE, identity=identity, timings=timings)
        candidate = Candidate(elector, asyncio.Event())

        async def lead(term_over: asyncio.Event) -> None:
            candidate.terms.append(("start", time.monotonic()))
            await term_over.wait()
            candidate.terms.append(("end", time.monotonic()))

        candidate.task = asyncio.create_task(elector.run(candidate.stop, lead))
        self.candidates.append(candidate)
        return candidate

    def holder(self) -> str | None:
        lease = self.state.objects.get(LEASE_KEY)
        return None if lease is None else lease["spec"].get("holderIdentity")


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        install(scaffold, state)
        running = Api(state, scaffold, str(server.url).rstrip("/"))
        yield running
        for candidate in running.candidates:
            candidate.stop.set()
        await asyncio.gather(*(c.task for c in running.candidates if c.task), return_exceptions=True)
        state.stopping = True
        for client in running.clients:
            client.close()


async def until(condition: Callable[[], bool], within: float = 5.0) -> float:
    """Poll `condition` until it holds; returns the monotonic time it first held."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.monotonic()


def leaders(candidates: list[Candidate]) -> list[str]:
    return [c.name for c in candidates if c.elector.is_leader]


async def test_of_two_candidates_on_one_lease_exactly_one_leads(api: Api) -> None:
    pair = [api.candidate("scheduler-a"), api.candidate("scheduler-b")]

    await until(lambda: len(leaders(pair)) == 1)
    (leader,) = leaders(pair)
    watched_until = time.monotonic() + 3 * FAST.lease_duration_s
    while time.monotonic() < watched_until:
        assert leaders(pair) == [leader]
        await asyncio.sleep(0.02)

    assert api.holder() == leader
    assert [len(c.terms) for c in pair if c.name == leader] == [1]
    assert [c.terms for c in pair if c.name != leader] == [[]]


async def test_when_the_leader_dies_the_other_takes_over_after_the_lease_expires(api: Api) -> None:
    first = api.candidate("scheduler-a")
    await until(lambda: first.elector.is_leader)
    second = api.candidate("scheduler-b")
    await asyncio.sleep(0.3)
    assert not second.elector.is_leader

    assert first.task is not None
    first.task.cancel()
    died = time.monotonic()
    took_over = await until(lambda: second.elector.is_leader)

    assert took_over - died >= FAST.lease_duration_s - FAST.retry_period_s - 0.05
    assert api.holder() == "scheduler-b"
    assert api.state.objects[LEASE_KEY]["spec"]["leaseTransitions"] == 1


async def test_a_clean_stop_releases_the_lease_after_the_work_ends_and_the_other_takes_over_at_once(
    api: Api,
) -> None:
    slow_expiry = ElectionTimings(lease_duration_s=5, renew_deadline_s=3, retry_period_s=0.1)
    first = api.candidate("scheduler-a", slow_expiry)
    await until(lambda: first.elector.is_leader)
    second = api.candidate("scheduler-b", slow_expiry)

    first.stop.set()
    stopped = time.monotonic()
    took_over = await until(lambda: second.elector.is_leader)

    assert took_over - stopped < 1.0  # the lease had 5 s left: only a release explains this
    assert first.task is not None
    await first.task
    await until(lambda: len(second.terms) == 1)
    assert [event for event, _ in first.terms] == ["start", "end"]
    assert first.terms[1][1] <= second.terms[0][1]
    assert api.holder() == "scheduler-b"


async def test_a_leader_whose_lease_is_taken_stops_its_work_at_once_and_campaigns_again(api: Api) -> None:
    patient = ElectionTimings(lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.1)
    first = api.candidate("scheduler-a", patient)
    await until(lambda: first.elector.is_leader)
    lease = api.state.objects[LEASE_KEY]
    lease["spec"]["holderIdentity"] = "intruder"
    lease["spec"]["leaseDurationSeconds"] = 1
    api.state.put(LEASE_KEY[0], lease)  # another writer took it, as of a's last renewal
    taken = time.monotonic()

    stepped_down = await until(lambda: not first.elector.is_leader)
    assert stepped_down - taken < 1.0  # at the next renewal, not after the 2 s renew deadline
    assert [event for event, _ in first.terms] == ["start", "end"]
    await until(lambda: first.elector.is_leader, within=5)  # the intruder never renews: expiry

    await until(lambda: len(first.terms) == 3)
    assert [event for event, _ in first.terms] == ["start", "end", "start"]


async def test_an_election_term_uses_exactly_the_lease_verbs_granted_to_the_scheduler(api: Api) -> None:
    only = api.candidate("scheduler-a")
    await until(lambda: only.elector.is_leader)
    await until(lambda: api.state.objects[LEASE_KEY]["metadata"]["resourceVersion"] != "1")  # renewed
    only.stop.set()
    assert only.task is not None
    await only.task

    verbs = {"GET": "get", "POST": "create", "PUT": "update"}
    made = {("coordination.k8s.io", "leases", verbs[str(r.method.value)]) for r in api.scaffold}
    granted = {
        (rule.api_group, resource, verb)
        for rule in LEASE_RBAC["scheduler"]
        for resource in rule.resources
        for verb in rule.verbs
    }
    assert made == granted
    assert {r.url.path for r in api.scaffold} == {
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases",
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}",
    }
    assert api.holder() == ""
