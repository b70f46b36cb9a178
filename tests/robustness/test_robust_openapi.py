"""Every service's OpenAPI document, fuzzed with schemathesis against the running service (real NATS and
Postgres): no answer is a 5xx, every answer matches the documented schema and content type, and every
mutating endpoint a service documents refuses a request without the bearer token with 401."""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from robust_stack import RunningStack
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 12
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]
SERVICES = ("webhook", "scheduler", "defrag-planner", "node-agent", "metrics")

HTTP_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "POST", "PUT", "PATCH", "DELETE"})
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
NO_SUCH_OBJECT = "00000000-0000-4000-8000-000000000001"
"""What fills every path parameter: a well-formed id that names no workload, worker or GPU."""
PATH_PARAMETER = re.compile(r"\{[^}/]+\}")

WITHOUT_CHECKPOINT_BACKEND = (
    "the stack's agent has no checkpoint backend, so it changes nothing and answers 501 (404 for an "
    "unknown worker) whatever the token, as TensorFusion's does; with a backend the token is required"
)
UNAUTHENTICATED_BY_DESIGN = {
    ("scheduler", "POST", "/api/v1/simulate-schedule"): "a what-if answer: it places and stores nothing",
    ("node-agent", "POST", "/api/v1/workers/{worker_id}/snapshot"): WITHOUT_CHECKPOINT_BACKEND,
    ("node-agent", "POST", "/api/v1/workers/{worker_id}/resume"): WITHOUT_CHECKPOINT_BACKEND,
}
"""Documented mutating operations that take no bearer token on purpose, with the reason. The webhook's
`POST /mutate-v1-pod` (authenticated by the API server's TLS) is not here: it is a raw route, outside
the OpenAPI document."""


@dataclass(frozen=True)
class Target:
    base_url: str
    verify: str | bool
    token: str


def _fuzz(document: dict[str, Any], target: Target) -> list[str]:
    """Run every operation of `document` in both generation modes; returns one line per failed case.

    An operation that takes no input has no invalid request to generate (hypothesis reports it as
    unsatisfiable in negative mode).
    """
    schema = schemathesis.openapi.from_dict(document)
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the OpenAPI document is invalid: {result.err()}"
        operations.append(result.ok())
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def run(case: schemathesis.Case[Any]) -> None:
                try:
                    case.call_and_validate(
                        base_url=target.base_url,
                        headers={"Authorization": f"Bearer {target.token}"},
                        checks=CHECKS,
                        verify=target.verify,
                        timeout=10,
                    )
                except* AssertionError as group:
                    failures.extend(
                        f"{case.method} {case.formatted_path}: {_summary(failure)} (body {case.body!r:.300})"
                        for failure in group.exceptions
                    )

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, f"no valid request for {operation.label}"
    return failures


def _summary(failure: BaseException) -> str:
    title = getattr(failure, "title", type(failure).__name__)
    message = str(getattr(failure, "message", failure)).strip().replace("\n", " ")
    return f"{title}: {message[:400]}"


# schemathesis 4.32's negative-mode strategies draw from `random`, which hypothesis 6.170 deprecates.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@pytest.mark.parametrize("service", SERVICES)
async def test_no_fuzzed_request_gets_a_5xx_or_an_undocumented_answer(
    stack: RunningStack, service: str
) -> None:
    base_url = stack.urls[service]
    verify: str | bool = str(stack.webhook_certificate) if service == "webhook" else True
    context = ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
    async with httpx.AsyncClient(verify=context, timeout=10) as client:
        document = (await client.get(f"{base_url}/openapi.json")).raise_for_status().json()
    assert document["paths"], f"{service} documents no operation"

    failures = await asyncio.to_thread(_fuzz, document, Target(base_url, verify, stack.api_token))

    assert not failures, "\n".join(failures)
    async with httpx.AsyncClient(verify=context, timeout=10) as client:
        assert (await client.get(f"{base_url}/readyz")).status_code == 200


def _documented_operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    """Every operation of an OpenAPI document as (METHOD, path template)."""
    return {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
        if method.upper() in HTTP_METHODS
    }


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", "robustness-token", "Basic eDp5"])
async def test_every_documented_mutating_endpoint_answers_401_without_the_bearer_token(
    stack: RunningStack, service: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    failures = []
    async with httpx.AsyncClient(
        base_url=stack.urls[service], verify=_verify(stack, service), timeout=10
    ) as client:
        documented = _documented_operations((await client.get("/openapi.json")).raise_for_status().json())
        allowed = {(method, path) for owner, method, path in UNAUTHENTICATED_BY_DESIGN if owner == service}
        assert allowed <= documented, f"allow-listed but not documented by {service}: {allowed - documented}"
        for method, template in sorted(documented - allowed):
            if method not in MUTATING_METHODS:
                continue
            path = PATH_PARAMETER.sub(NO_SUCH_OBJECT, template)
            response = await client.request(method, path, headers=headers, json={})
            if response.status_code != 401 or "TF_API_TOKEN" not in response.text:
                failures.append(f"{method} {path}: {response.status_code} {response.text[:300]}")

    assert not failures, f"{service} mutating endpoints not refused with 401:\n" + "\n".join(failures)


def _verify(stack: RunningStack, service: str) -> ssl.SSLContext | bool:
    """TLS verification for `service`: the webhook serves HTTPS with the stack's self-signed certificate."""
    return ssl.create_default_context(cafile=str(stack.webhook_certificate)) if service == "webhook" else True


REQUEST = {
    "pool": "default",
    "tflops_request_milli": 1000,
    "tflops_limit_milli": 1000,
    "vram_request_bytes": 1024,
    "vram_limit_bytes": 1024,
}


@pytest.mark.parametrize(
    ("submission", "field"),
    [
        ({"workload": {"namespace": "ml", "name": "a\u0000b"}, "request": REQUEST}, "workload.name"),
        (
            {
                "workload": {"namespace": "ml", "name": "big"},
                "request": {**REQUEST, "vram_request_bytes": 2**64},
            },
            "request.vram_request_bytes",
        ),
        (
            {"workload": {"namespace": "ml", "name": "urgent"}, "request": REQUEST, "priority": 2**40},
            "priority",
        ),
    ],
    ids=["NUL in a name", "VRAM beyond bigint", "priority beyond int32"],
)
async def test_a_submission_the_ledger_cannot_store_is_a_422_naming_the_field(
    stack: RunningStack, submission: dict[str, Any], field: str
) -> None:
    headers = {"Authorization": f"Bearer {stack.api_token}"}
    async with httpx.AsyncClient(base_url=stack.urls["scheduler"], timeout=10) as client:
        for path in ("/api/v1/workloads", "/api/v1/simulate-schedule"):
            response = await client.post(path, json=submission, headers=headers)

            assert response.status_code == 422, response.text
            assert field.split(".")[-1] in response.text
