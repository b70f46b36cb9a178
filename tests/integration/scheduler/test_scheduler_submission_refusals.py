"""Submissions refused at once rather than left pending forever, and `enabled-replicas` in local mode:
`tfctl serve scheduler` processes over real HTTP, Postgres and NATS, driven by the API and `tfctl submit`."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from scheduler_builders import GIB, a_submission, register_named_node, register_nodes
from scheduler_service import TOKEN, private_nats, run_tfctl, scheduler_processes, service_environment
from tfcommon.ledger.sql import SqlLedger
from tfctl.commands.submit import submission_for

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def own_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_nats(tmp_path_factory.mktemp("scheduler-refusals-nats")) as url:
        yield url


def _environment(database_url: str, nats_url: str) -> dict[str, str]:
    return service_environment(database_url, nats_url, TF_SCHEDULER_HEARTBEAT_TIMEOUT_S="3600")


def _replica(
    name: str, *, replica_set: str, enabled_replicas: str, vram: str = "16Gi", uid: str | None = None
) -> dict[str, Any]:
    """A pod of the ReplicaSet `replica_set` (template hash 7d9), as its controller creates it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            **({"uid": uid} if uid else {}),
            "labels": {"tensor-fusion.ai/enabled": "true", "pod-template-hash": "7d9"},
            "annotations": {
                "tensor-fusion.ai/tflops-request": "10",
                "tensor-fusion.ai/vram-request": vram,
                "tensor-fusion.ai/enabled-replicas": enabled_replicas,
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{replica_set}-7d9",
                    "uid": f"uid-{replica_set}",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
    }


async def _workloads(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    answer = await client.get(f"{url}/api/v1/workloads")
    assert answer.status_code == 200, answer.text
    listed: list[dict[str, Any]] = answer.json()
    return listed


async def test_a_request_no_node_could_ever_hold_is_refused_at_once_with_the_largest_that_fits(
    tmp_path: Path, database_url: str, ledger: SqlLedger, own_nats_url: str
) -> None:
    await register_nodes(ledger, nodes=2, gpus=4)  # 80Gi, 100 TFLOPS each
    environment = _environment(database_url, own_nats_url)
    async with (
        scheduler_processes(1, environment, tmp_path) as [url],
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        refusals = {
            "vram-request 200Gi exceeds every GPU of pool default (largest: 80Gi)": a_submission(
                vram_bytes=200 * GIB
            ),
            "tflops-request 150 exceeds every GPU of pool default (largest: 100 TFLOPS)": a_submission(
                tflops_milli=150_000
            ),
            "gpu-count 6 exceeds every node of pool default (largest: 4 GPUs on one node)": a_submission(
                gpu_count=6
            ),
        }
        for reason, submission in refusals.items():
            answer = await client.post(
                "/api/v1/workloads", json=submission.model_dump(mode="json"), headers=AUTH
            )
            assert answer.status_code == 422, answer.text
            assert answer.json()["detail"] == f"workload refused: {reason}"
        unknown = a_submission().model_dump(mode="json")
        unknown["request"]["pool"] = "nosuch"
        answer = await client.post("/api/v1/workloads", json=unknown, headers=AUTH)
        assert answer.status_code == 422
        assert answer.json()["detail"] == (
            "workload refused: request.pool: unknown pool 'nosuch'; known pools: default"
        )
        assert await _workloads(client, url) == []  # nothing recorded, nothing left pending

        # The view may lag behind the ledger: a node registered since is counted before refusing.
        await register_named_node(ledger, "late-node", 8)
        answer = await client.post(
            "/api/v1/workloads", json=a_submission(gpu_count=6).model_dump(mode="json"), headers=AUTH
        )
        assert answer.status_code in (201, 202), answer.text

        # `tfctl submit` shows the refusal and exits 1.
        pod = tmp_path / "big.yaml"
        pod.write_text(yaml.safe_dump(_replica("big", replica_set="big", enabled_replicas="4", vram="200Gi")))
        code, out, err = await run_tfctl(
            "submit", "-f", str(pod), environment={**environment, "TF_SCHEDULER_URL": url}
        )
        assert (code, out) == (1, "")
        assert "vram-request 200Gi exceeds every GPU of pool default (largest: 80Gi)" in err


async def test_enabled_replicas_takes_over_only_that_many_pods_of_a_workload(
    tmp_path: Path, database_url: str, ledger: SqlLedger, own_nats_url: str
) -> None:
    await register_nodes(ledger, nodes=2, gpus=4)
    environment = _environment(database_url, own_nats_url)
    async with (
        scheduler_processes(2, environment, tmp_path) as (first, second),
        httpx.AsyncClient(timeout=30) as client,
    ):
        submit_environment = {**environment, "TF_SCHEDULER_URL": first}
        manifests = []
        for name in ("web-1", "web-2", "web-3"):
            manifests.append(tmp_path / f"{name}.yaml")
            manifests[-1].write_text(yaml.safe_dump(_replica(name, replica_set="web", enabled_replicas="1")))
        outputs = [
            await run_tfctl("submit", "-f", str(path), environment=submit_environment) for path in manifests
        ]
        assert [code for code, _out, _err in outputs] == [0, 0, 0]
        assert outputs[0][1].startswith("placed team-a/web-1 on ")
        for (_code, out, _err), name in zip(outputs[1:], ("web-2", "web-3"), strict=True):
            assert out.startswith(f"not taken over team-a/{name}: enabled-replicas 1: 1 pod(s) of workload ")
        [taken] = await _workloads(client, first)
        assert taken["name"] == "web-1"

        # Deleting the pod taken over frees its place for the next pod of the workload.
        deleted = await client.delete(f"{first}/api/v1/workloads/{taken['id']}", headers=AUTH)
        assert deleted.status_code == 200
        code, out, err = await run_tfctl("submit", "-f", str(manifests[2]), environment=submit_environment)
        assert code == 0, err
        assert out.startswith("placed team-a/web-3 on ")

        # Six pods of another workload, capped at 2, each submitted at once to both scheduler processes.
        bodies = [
            submission_for(
                _replica(f"api-{n}", replica_set="api", enabled_replicas="2", uid=f"uid-api-{n}"),
                "team-a",
                None,
            )
            for n in range(6)
        ]
        answers = await asyncio.gather(
            *(
                client.post(f"{url}/api/v1/workloads", json=body, headers=AUTH)
                for body in bodies
                for url in (first, second)
            )
        )
        by_pod: dict[str, set[int]] = {}
        for body, answer in zip([body for body in bodies for _url in (first, second)], answers, strict=True):
            assert isinstance(body, dict)
            by_pod.setdefault(body["workload"]["name"], set()).add(answer.status_code)
        taken_over = sorted(name for name, codes in by_pod.items() if codes & {200, 201, 202})
        assert len(taken_over) == 2, by_pod
        assert Counter(frozenset(codes) for codes in by_pod.values())[frozenset({409})] == 4, by_pod
        live = {w["name"] for w in await _workloads(client, first) if w["name"].startswith("api-")}
        assert sorted(live) == taken_over
