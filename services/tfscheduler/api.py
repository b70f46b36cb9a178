"""The scheduler's HTTP API (`/api/v1`): reads of pools, nodes, GPUs, allocations and workloads;
submitting, evicting (the local Eviction API), deleting and simulating workloads; cordoning and
labelling nodes (`PATCH /api/v1/nodes/{name}`, what `tfctl cordon` and `tfctl label` send). Mutating endpoints
need `Authorization: Bearer <TF_API_TOKEN>`; with no token configured they are refused.
Thin: every decision is the `Scheduler`'s.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import MutableMapping
from typing import Annotated, Any, Literal
from uuid import UUID, uuid4

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from sqlalchemy.exc import OperationalError
from starlette.types import ASGIApp, Receive, Scope, Send
from tfcommon.ledger.records import OPERATOR_NODE_LABELS, AllocationRecord, NodeRecord
from tfcommon.placement import PlacementRequestError
from tfcommon.pod_request import gpu_request_annotations
from tfcommon.pod_spec import GPU_IDS
from tfcommon.runtime import DATABASE_UNAVAILABLE, FALLBACK_APP, UNAVAILABLE_RETRY_AFTER_S, request_body
from tfcommon.service_metrics import record_request_duration

from tfscheduler.core.gang import GANG_ENABLED, GANG_GROUP_KEY, GANG_MIN_MEMBERS, GANG_TIMEOUT
from tfscheduler.core.quota import with_defaults
from tfscheduler.core.refusals import (
    fits_somewhere,
    ledger_cards,
    never_fits,
    takeover_full,
    unknown_pool,
)
from tfscheduler.core.view import allocation_id_for, placement_request
from tfscheduler.engine import Scheduler, placement_mode
from tfscheduler.submission import Submission, WorkloadStatus
from tfscheduler.takeovers import TakeoverCounter
from tfscheduler.workloads import StoredWorkload

REFUSED_OR_INVALID: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "the body is invalid (`detail` lists the problems) or the request cannot be placed "
        "(`detail` is the reason)",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["detail"],
                    "properties": {
                        "detail": {
                            "anyOf": [
                                {"type": "string"},
                                {"type": "array", "items": {"$ref": "#/components/schemas/ValidationError"}},
                            ]
                        }
                    },
                }
            }
        },
    }
}


def build_router(scheduler: Scheduler, api_token: SecretStr | None) -> APIRouter:
    """The `/api/v1` routes over `scheduler`."""
    router = APIRouter(prefix="/api/v1", tags=["scheduler"])

    async def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if api_token is None:
            raise HTTPException(
                403,
                "mutating endpoints are disabled: set TF_API_TOKEN on the scheduler and send it as a "
                "bearer token (tfctl reads the same TF_API_TOKEN)",
            )
        expected = f"Bearer {api_token.get_secret_value()}".encode()
        if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
            raise HTTPException(
                401, "missing or wrong bearer token: send `Authorization: Bearer <TF_API_TOKEN>`"
            )

    authorized = [Depends(require_token)]
    takeovers = TakeoverCounter(scheduler.ledger.engine)

    @router.get("/pools")
    async def pools() -> list[dict[str, Any]]:
        gpus = await scheduler.ledger.list_gpus()
        nodes = await scheduler.ledger.list_nodes()
        pool_of = {node.name: node.pool for node in nodes}
        result = []
        for pool in await scheduler.ledger.list_pools():
            members = [gpu for gpu in gpus if pool_of.get(gpu.node) == pool.name]
            result.append(
                {
                    "name": pool.name,
                    "placement_mode": placement_mode(scheduler.config, pool.name),
                    "nodes": sum(1 for node in nodes if node.pool == pool.name),
                    "ready_nodes": sum(
                        1 for node in nodes if node.pool == pool.name and node.name not in scheduler.blocked
                    ),
                    "gpus": len(members),
                    **_totals(members),
                }
            )
        return result

    def node_listing(node: NodeRecord, gpus: list[Any]) -> dict[str, Any]:
        return {
            "name": node.name,
            "pool": node.pool,
            "schedulable": node.name not in scheduler.blocked,
            "reason": scheduler.blocked.get(node.name),
            "cordoned": node.cordoned,
            "last_heartbeat_at": node.last_heartbeat_at,
            "labels": node.labels,
            "annotations": node.annotations,
            "gpus": sum(1 for gpu in gpus if gpu.node == node.name),
            **_totals([gpu for gpu in gpus if gpu.node == node.name]),
        }

    @router.get("/nodes")
    async def nodes() -> list[dict[str, Any]]:
        gpus = await scheduler.ledger.list_gpus()
        return [node_listing(node, gpus) for node in await scheduler.ledger.list_nodes()]

    @router.patch(
        "/nodes/{name}",
        dependencies=authorized,
        responses={404: {"description": "no node of that name is registered"}, **REFUSED_OR_INVALID},
    )
    async def patch_node(name: str, change: NodePatch) -> dict[str, Any]:
        """Cordon or uncordon the node and set or remove its operator labels; answers the node."""
        known = {node.name: node for node in await scheduler.ledger.list_nodes()}
        if name not in known:
            raise HTTPException(
                404, f"no node {name!r}; registered: {', '.join(sorted(known)) or 'none'} (GET /api/v1/nodes)"
            )
        if change.cordoned is not None:
            await scheduler.ledger.set_node_cordoned(name, change.cordoned)
        for key, value in change.labels.items():
            await scheduler.ledger.set_node_label(name, key, value)
        await scheduler.node_changed(name)
        node = next(node for node in await scheduler.ledger.list_nodes() if node.name == name)
        return node_listing(node, await scheduler.ledger.list_gpus())

    @router.get("/gpus")
    async def gpus() -> list[dict[str, Any]]:
        return [
            {
                "uuid": gpu.uuid,
                "node": gpu.node,
                "index": gpu.index,
                "model": gpu.model,
                "phase": gpu.phase,
                **_totals([gpu]),
            }
            for gpu in await scheduler.ledger.list_gpus()
        ]

    @router.get("/allocations")
    async def allocations() -> list[dict[str, Any]]:
        return [
            {
                "id": str(record.allocation_id),
                "namespace": record.workload.namespace,
                "name": record.workload.name,
                "uid": record.workload.uid,
                "pool": record.pool,
                "node": record.node,
                "qos": record.qos,
                "state": record.state,
                "created_at": record.created_at,
                "shares": [
                    {"gpu_uuid": s.gpu_uuid, "tflops_milli": s.tflops_milli, "vram_bytes": s.vram_bytes}
                    for s in record.shares
                ],
            }
            for record in await scheduler.ledger.active_allocations()
        ]

    @router.post(
        "/workloads",
        dependencies=authorized,
        status_code=201,
        responses={
            200: {
                "model": WorkloadStatus,
                "description": "already submitted (same name, no uid): its status",
            },
            202: {
                "model": WorkloadStatus,
                "description": "accepted, pending: `reason` says what it waits for",
            },
            409: {
                "description": "not taken over: the workload's `takeover.limit` (enabled-replicas) pods "
                "are already live; nothing is recorded (`detail` says so)"
            },
            **REFUSED_OR_INVALID,
        },
    )
    async def submit(submission: Submission, response: Response) -> WorkloadStatus:
        """Place a workload, or keep it pending with the reason. Refused (422, nothing recorded): an
        unknown pool, or a request no node of the pool could hold even empty (the reason names the
        largest that fits)."""
        if submission.workload.uid is None:
            workload = submission.workload
            live = await scheduler.store.live_by_name(workload.namespace, workload.name)
            if live is not None:  # a name without a uid is one workload, as in Kubernetes
                response.status_code = 200
                status = await scheduler.status(live.allocation_id)
                assert status is not None
                return status
            submission = submission.model_copy(
                update={"workload": submission.workload.model_copy(update={"uid": str(uuid4())})}
            )
        await _refuse_what_never_fits(scheduler, submission)
        if submission.takeover is None:
            status = await scheduler.submit(submission)
        else:
            claim = submission.takeover
            async with takeovers.counting(
                claim.workload_key, allocation_id_for(submission.workload)
            ) as taken_over:
                full = takeover_full(claim.workload_key, claim.limit, taken_over)
                if full is not None:
                    raise HTTPException(409, full)
                status = await scheduler.submit(submission)
        response.status_code = _answer_code(status)
        return status

    @router.get("/workloads")
    async def workloads(
        state: Annotated[
            Literal["placed", "pending"] | None,
            Query(description="only placed or only pending workloads; both if unset"),
        ] = None,
    ) -> list[dict[str, Any]]:
        """Live workloads as pods: what the defrag planner's local cluster lists."""
        listed: list[dict[str, Any]] = []
        if state in (None, "placed"):
            records = {r.allocation_id: r for r in await scheduler.ledger.active_allocations()}
            stored = await scheduler.store.by_ids(list(records))
            for allocation_id, workload in stored.items():
                if workload.state == "placed":
                    listed.append(workload_listing(workload, records[allocation_id]))
        if state in (None, "pending"):
            listed += [workload_listing(workload, None) for workload in await scheduler.store.pending()]
        return sorted(listed, key=lambda item: (item["namespace"], item["name"], item["submitted_at"]))

    @router.get("/workloads/{workload_id}")
    async def get_workload(workload_id: UUID) -> WorkloadStatus:
        status = await scheduler.status(workload_id)
        if status is None:
            raise HTTPException(
                404, f"no workload with id {workload_id}; ids come from POST /api/v1/workloads"
            )
        return status

    @router.delete("/workloads/{workload_id}", dependencies=authorized)
    async def delete(workload_id: UUID) -> dict[str, Any]:
        if await scheduler.status(workload_id) is None:
            raise HTTPException(
                404, f"no workload with id {workload_id}; ids come from POST /api/v1/workloads"
            )
        released = await scheduler.release(workload_id, "workload-deleted")
        return {"id": str(workload_id), "released": released}

    @router.post("/workloads/{workload_id}/eviction", dependencies=authorized)
    async def evict(workload_id: UUID, eviction: Eviction | None = None) -> dict[str, Any]:
        eviction = eviction or Eviction()
        status = await scheduler.status(workload_id)
        if status is None:
            raise HTTPException(
                404, f"no workload with id {workload_id}; ids come from GET /api/v1/workloads"
            )
        replacement = await scheduler.evict(
            workload_id, eviction.reason, by=eviction.by, announce=eviction.announce
        )
        if replacement is None:
            raise HTTPException(
                409,
                f"workload {workload_id} is {status.state}, not placed; only a placed workload is evicted",
            )
        return {"id": str(workload_id), "evicted": True, "replacement": replacement.model_dump(mode="json")}

    @router.post("/simulate-schedule", responses=REFUSED_OR_INVALID)
    async def simulate(submission: Submission) -> dict[str, Any]:
        try:
            return scheduler.simulate(submission)
        except PlacementRequestError as error:
            raise HTTPException(422, str(error)) from error

    return router


class NodePatch(BaseModel):
    """`PATCH /api/v1/nodes/{name}`: what to change on the node; fields left out stay as they are."""

    model_config = ConfigDict(extra="forbid")

    cordoned: bool | None = Field(
        default=None,
        description="true: no new workload is placed on the node (kubectl cordon); false: uncordon",
    )
    labels: dict[str, str | None] = Field(
        default_factory=dict,
        description="labels to set, or to remove with null; only tensor-fusion.ai/do-not-disrupt, true or "
        "false (the defrag planner and compaction leave a node labelled true alone)",
    )

    @model_validator(mode="after")
    def _operator_labels_only(self) -> NodePatch:
        for key in self.labels:
            if key not in OPERATOR_NODE_LABELS:
                raise ValueError(
                    f"labels: {key!r} cannot be set on a node in local mode; only "
                    f"{', '.join(OPERATOR_NODE_LABELS)} can (other labels would not survive the node agent "
                    "registering again)"
                )
            if self.labels[key] not in ("true", "false", None):
                raise ValueError(
                    f"labels.{key}: {self.labels[key]!r} must be true or false (or null, to remove the label)"
                )
        return self


async def _refuse_what_never_fits(scheduler: Scheduler, submission: Submission) -> None:
    refusal = await _refusal(scheduler, submission)
    if refusal is not None:
        raise HTTPException(422, f"workload refused: {refusal}")


def _answer_code(status: WorkloadStatus) -> int:
    """201 placed, 202 pending; a workload the scheduler refused is a 422 naming the reason."""
    if status.state == "refused":
        raise HTTPException(422, f"workload refused: {status.reason}")
    return 201 if status.state == "placed" else 202


SUBMIT_PATH = "/api/v1/workloads"
_JSON_HEADERS = [(b"content-type", b"application/json")]


class SubmitEndpoint:
    """`POST /api/v1/workloads` as a raw ASGI handler ahead of FastAPI (`Components.front_routes`).

    A request with the right bearer token, a JSON body that is a valid `Submission` with a
    `workload.uid` and no `takeover` is answered here, as the FastAPI route answers it (201, 202, 422
    with the same `detail`, 503 while the database is unreachable), without FastAPI's dependency,
    validation, telemetry and middleware layers, whose CPU time per request was more than the
    scheduler's own; its latency is still recorded in `tf_http_request_duration_seconds`. Any other
    request (no or a wrong token, no token configured, an invalid body, no uid, a takeover) goes to
    the FastAPI route with its body, which answers exactly as before.
    """

    def __init__(self, scheduler: Scheduler, api_token: SecretStr | None, service: str) -> None:
        self.scheduler = scheduler
        self.service = service
        self._expected = f"Bearer {api_token.get_secret_value()}".encode() if api_token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        body = await request_body(receive)
        submission = self._fast(scope, body)
        if submission is None:
            await scope[FALLBACK_APP](scope, _replaying(body, receive), send)
            return
        code, answer = await self._answer(submission)
        await send({"type": "http.response.start", "status": code, "headers": _headers(answer, code)})
        await send({"type": "http.response.body", "body": answer})
        record_request_duration(self.service, "POST", SUBMIT_PATH, code, time.perf_counter() - started)

    def _fast(self, scope: Scope, body: bytes) -> Submission | None:
        """The submission when this handler answers the request itself, else None."""
        if self._expected is None:
            return None
        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization")
        if authorization is None or not hmac.compare_digest(authorization, self._expected):
            return None
        if headers.get(b"content-type", b"").split(b";")[0].strip() != b"application/json":
            return None
        try:
            submission = Submission.model_validate_json(body)
        except ValueError:
            return None
        if submission.workload.uid is None or submission.takeover is not None:
            return None
        return submission

    async def _answer(self, submission: Submission) -> tuple[int, bytes]:
        try:
            await _refuse_what_never_fits(self.scheduler, submission)
            status = await self.scheduler.submit(submission)
            return _answer_code(status), status.model_dump_json().encode()
        except HTTPException as refused:
            return refused.status_code, orjson.dumps({"detail": refused.detail})
        except OperationalError:
            return 503, orjson.dumps({"detail": DATABASE_UNAVAILABLE})


def _headers(body: bytes, code: int) -> list[tuple[bytes, bytes]]:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if code == 503:
        headers.append((b"retry-after", str(UNAVAILABLE_RETRY_AFTER_S).encode()))
    return headers


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` that hands out `body` (already read) first."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> MutableMapping[str, Any]:
        return pending.pop() if pending else await receive()

    return replay


def front_routes(
    scheduler: Scheduler, api_token: SecretStr | None, service: str
) -> dict[tuple[str, str], ASGIApp]:
    """`POST /api/v1/workloads` served ahead of FastAPI (`SubmitEndpoint`)."""
    return {("POST", SUBMIT_PATH): SubmitEndpoint(scheduler, api_token, service)}


async def _refusal(scheduler: Scheduler, submission: Submission) -> str | None:
    """Why `submission` is refused before it is recorded (`tfscheduler.core.refusals`), or None. The
    view answers when the pool is known and the request fits a node; a refusal is decided on the
    ledger, which the view may lag behind."""
    pool = submission.request.pool
    nodes = scheduler.view.nodes.values()
    if scheduler.config.pool(pool) is None and not any(node.pool == pool for node in nodes):
        known = {p.name for p in scheduler.config.gpu_pools}
        refused = unknown_pool(pool, known | {record.name for record in await scheduler.ledger.list_pools()})
        if refused is not None:
            return refused
    workload = submission.workload
    try:
        wanted = placement_request(
            f"{workload.namespace}/{workload.name}",
            with_defaults(scheduler.quotas.get(workload.namespace), submission.request),
        )
    except PlacementRequestError:
        return None  # the scheduler refuses it with the reason
    if fits_somewhere(wanted, (node.gpus for node in nodes if node.pool == pool)):
        return None
    node_pools = {node.name: node.pool for node in await scheduler.ledger.list_nodes()}
    return never_fits(wanted, ledger_cards(node_pools, await scheduler.ledger.list_gpus(), pool))


class Eviction(BaseModel):
    """`POST /api/v1/workloads/{id}/eviction`: why, and who announces it (`tf.evt.pod.evicted`)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="evicted through the scheduler API", min_length=1, max_length=1024)
    by: Literal["defrag", "preemption", "drain"] = Field(default="drain", description="what evicts it")
    announce: bool = Field(
        default=True, description="publish tf.evt.pod.evicted; false when the caller announces it itself"
    )


def workload_listing(workload: StoredWorkload, record: AllocationRecord | None) -> dict[str, Any]:
    """One entry of `GET /api/v1/workloads`: the workload as the pod a controller would have made, its
    request written as the pod contract's annotations (`gpu_request_annotations`, which the defrag
    planner reads back with `gpu_request_of`, as from a pod in Kubernetes) plus `gpu-ids` once placed, and a
    gang member's `gang-*` annotations."""
    submission = workload.submission
    annotations = gpu_request_annotations(submission.request)
    if submission.gang is not None:  # the local defrag planner leaves gang members alone, as in Kubernetes
        annotations |= {
            GANG_ENABLED: "true",
            GANG_GROUP_KEY: submission.gang.group_key,
            GANG_MIN_MEMBERS: str(submission.gang.min_members),
            GANG_TIMEOUT: f"{submission.gang.timeout_s}s" if submission.gang.timeout_s else "0",
        }
    if record is not None:
        annotations[GPU_IDS] = ",".join(share.gpu_uuid for share in record.shares)
    return {
        "id": str(workload.allocation_id),
        "namespace": submission.workload.namespace,
        "name": submission.workload.name,
        "uid": submission.workload.uid,
        "owner": submission.workload.workload,
        "state": workload.state,
        "pool": submission.request.pool,
        "node": record.node if record is not None else None,
        "gpu_uuids": [share.gpu_uuid for share in record.shares] if record is not None else [],
        "gpu_count": submission.request.gpu_count,
        "labels": submission.labels,
        "annotations": annotations,
        "node_selector": submission.node_selector,
        "tolerations": list(submission.tolerations),
        "submitted_at": workload.submitted_at,
        "placed_at": record.created_at if record is not None else None,
        "reason": workload.reason,
    }


def _totals(gpus: list[Any]) -> dict[str, int]:
    capacity_tflops = sum(gpu.capacity_tflops_milli for gpu in gpus)
    capacity_vram = sum(gpu.capacity_vram_bytes for gpu in gpus)
    return {
        "capacity_tflops_milli": capacity_tflops,
        "capacity_vram_bytes": capacity_vram,
        "available_tflops_milli": capacity_tflops - sum(gpu.used_tflops_milli for gpu in gpus),
        "available_vram_bytes": capacity_vram - sum(gpu.used_vram_bytes for gpu in gpus),
    }
