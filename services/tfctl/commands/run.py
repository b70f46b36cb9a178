"""`tfctl run --tflops 20 --vram 16Gi [--gpus N] [--qos high] -- CMD ARGS`: run a command on pooled GPUs.

Submits the request through the scheduler's API and waits for placement (a progress line on stderr);
the node agent of the chosen node then starts CMD with `CUDA_VISIBLE_DEVICES` set to the allocated GPU
UUIDs and the limit variables set, streams its output back, and releases the allocation when CMD ends.
SIGINT and SIGTERM are forwarded to CMD. If `tfctl run` itself dies, the agent sees the connection
drop, stops CMD and releases. Exit codes: CMD's own (128 + N when a signal N killed it; 126 cannot be
run; 127 not found), 2 bad arguments, 3 not placed (refused, or still unschedulable after `--wait`),
125 the scheduler or the agent failed or could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
from tfcommon.pod_spec import DEFAULT_ISOLATION, DEFAULT_QOS, QOS_LEVELS
from tfcommon.pod_spec import ISOLATION_MODES as POD_ISOLATION_MODES
from tfcommon.quantities import (
    MissingUnitError,
    QuantityError,
    format_bytes,
    format_milli,
    parse_bytes,
    parse_milli,
)

from tfctl.commands.get import scheduler_url
from tfctl.local_state import TOKEN_ENV, api_token, token_path

EXIT_USAGE, EXIT_NOT_PLACED, EXIT_CONTROL_PLANE = 2, 3, 125
ISOLATION_MODES = tuple(mode for mode in POD_ISOLATION_MODES if mode != "partitioned")
"""The pod contract's isolation modes but `partitioned`, which needs a partition template."""
PLACEMENT_POLL_S = 0.5
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ENDPOINTS_FILE = "endpoints.json"
UNFORWARDED_ENV = ("TF_API_TOKEN",)


class RunError(Exception):
    """`tfctl run` cannot go on; the message says why and what to do, `exit_code` is what it returns."""

    def __init__(self, message: str, exit_code: int = EXIT_CONTROL_PLANE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a command on pooled GPUs (allocate, start with CUDA_VISIBLE_DEVICES, release on exit)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tflops", required=True, help="TFLOPS reserved per GPU, e.g. 20 or 500m")
    parser.add_argument("--vram", required=True, help="VRAM reserved per GPU, e.g. 16Gi")
    parser.add_argument("--tflops-limit", help="compute limit per GPU (default: --tflops)")
    parser.add_argument("--vram-limit", help="VRAM limit per GPU (default: --vram)")
    parser.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    parser.add_argument("--gpu-model", help="required GPU model, e.g. H100 (default: any)")
    parser.add_argument("--pool", default="default", help="GPU pool (default: default)")
    parser.add_argument(
        "--qos", choices=QOS_LEVELS, default=DEFAULT_QOS, help=f"QoS class (default {DEFAULT_QOS})"
    )
    parser.add_argument(
        "--isolation",
        choices=ISOLATION_MODES,
        default=DEFAULT_ISOLATION,
        help=f"how limits are enforced (default {DEFAULT_ISOLATION})",
    )
    parser.add_argument("--namespace", default="default", help="namespace the workload counts against")
    parser.add_argument("--name", help="workload name (default: run-<command>-<random>)")
    parser.add_argument(
        "-e", "--env", action="append", default=[], metavar="NAME=VALUE", help="extra variable for CMD"
    )
    parser.add_argument(
        "--no-inherit-env", action="store_true", help="do not pass this shell's environment to CMD"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for placement while unschedulable (default 300; 0: do not wait)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="SIGTERM to SIGKILL wait when stopping CMD",
    )
    parser.add_argument("--scheduler-url", help="scheduler API base URL ($TF_SCHEDULER_URL)")
    parser.add_argument(
        "--agent-url",
        action="append",
        default=[],
        metavar="NODE=URL",
        help="node agent URL of NODE ($TF_AGENT_URLS, comma-separated; default: STATE_DIR/endpoints.json)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("TF_STATE_DIR", ".tf")),
        help="state folder of `tfctl up`, whose endpoints.json names the agents (default .tf, TF_STATE_DIR)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command to run")
    parser.set_defaults(handler=handler)


@dataclass(frozen=True)
class RunPlan:
    """A checked `tfctl run` invocation: what to submit and what to start where it lands."""

    submission: dict[str, Any]
    argv: tuple[str, ...]
    env: dict[str, str]
    working_dir: str
    scheduler_url: str
    agent_urls: dict[str, str]
    state_dir: Path
    wait_s: float
    grace_s: float
    token: str | None = field(repr=False)


def _say(message: str) -> None:
    print(f"tfctl run: {message}", file=sys.stderr, flush=True)


def _quantity(parse: Any, text: str, flag: str, example: str) -> int:
    try:
        value: int = parse(text, what=flag)
    except MissingUnitError as error:
        raise RunError(str(error), EXIT_USAGE) from None
    except QuantityError as error:
        raise RunError(f"{error} (e.g. {flag} {example})", EXIT_USAGE) from None
    return value


def _parse_size(text: str, *, what: str) -> int:
    """A `--vram` size: bytes, with a unit (a bare `8` is refused rather than read as 8 bytes)."""
    return parse_bytes(text, what=what, unit_required=True)


def _pairs(values: Sequence[str], flag: str, example: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        name, separator, rest = value.partition("=")
        if not separator or not name.strip() or not rest.strip():
            raise RunError(f"{flag} {value!r}: expected {example}", EXIT_USAGE)
        pairs[name.strip()] = rest.strip()
    return pairs


def _default_name(argv: Sequence[str]) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", Path(argv[0]).name.lower()).strip("-")[:30] or "cmd"
    return f"run-{base}-{uuid4().hex[:6]}"


def plan_from_args(args: argparse.Namespace) -> RunPlan:
    """Check the arguments; every error names the flag and the fix (exit code 2)."""
    argv = tuple(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not argv:
        raise RunError(
            "no command given: put it after `--`, e.g. tfctl run --tflops 20 --vram 16Gi -- python train.py",
            EXIT_USAGE,
        )
    if args.gpus < 1:
        raise RunError(f"--gpus {args.gpus}: must be 1 or more", EXIT_USAGE)
    if args.wait < 0 or args.grace < 0:
        raise RunError("--wait and --grace must be 0 or more seconds", EXIT_USAGE)
    tflops = _quantity(parse_milli, args.tflops, "--tflops", "20")
    vram = _quantity(_parse_size, args.vram, "--vram", "16Gi")
    tflops_limit = (
        tflops
        if args.tflops_limit is None
        else _quantity(parse_milli, args.tflops_limit, "--tflops-limit", "40")
    )
    vram_limit = (
        vram if args.vram_limit is None else _quantity(_parse_size, args.vram_limit, "--vram-limit", "24Gi")
    )
    if tflops_limit < tflops or vram_limit < vram:
        raise RunError("--tflops-limit and --vram-limit must be at least --tflops and --vram", EXIT_USAGE)
    agent_urls = _pairs(
        [item for item in os.environ.get("TF_AGENT_URLS", "").split(",") if item.strip()],
        "TF_AGENT_URLS entry",
        "NODE=URL, e.g. sim-node-1=http://127.0.0.1:8001",
    )
    agent_urls.update(
        _pairs(args.agent_url, "--agent-url", "NODE=URL, e.g. sim-node-1=http://127.0.0.1:8001")
    )
    inherited = (
        {} if args.no_inherit_env else {k: v for k, v in os.environ.items() if k not in UNFORWARDED_ENV}
    )
    request: dict[str, Any] = {
        "pool": args.pool,
        "gpu_count": args.gpus,
        "tflops_request_milli": tflops,
        "tflops_limit_milli": tflops_limit,
        "vram_request_bytes": vram,
        "vram_limit_bytes": vram_limit,
        "qos": args.qos,
        "isolation": args.isolation,
    }
    if args.gpu_model:
        request["gpu_model"] = args.gpu_model
    workload = {"namespace": args.namespace, "name": args.name or _default_name(argv), "uid": str(uuid4())}
    return RunPlan(
        submission={"workload": workload, "request": request},
        argv=argv,
        env={**inherited, **_pairs(args.env, "--env", "NAME=VALUE")},
        working_dir=os.getcwd(),
        scheduler_url=scheduler_url(args.scheduler_url),
        agent_urls={node: url.rstrip("/") for node, url in agent_urls.items()},
        state_dir=args.state_dir,
        wait_s=args.wait,
        grace_s=args.grace,
        token=api_token(args.state_dir),
    )


def agent_url_for(node: str, plan: RunPlan) -> str:
    """The agent of `node`: `--agent-url` / `TF_AGENT_URLS`, else the endpoints `tfctl up` recorded."""
    if node in plan.agent_urls:
        return plan.agent_urls[node]
    endpoints = plan.state_dir / ENDPOINTS_FILE
    try:
        services = json.loads(endpoints.read_text())["services"]
    except (OSError, ValueError, KeyError, TypeError):
        services = []
    for service in services:
        if (
            isinstance(service, dict)
            and service.get("service") == "node-agent"
            and service.get("node") == node
        ):
            return str(service["url"]).rstrip("/")
    raise RunError(
        f"no agent URL known for node {node}: pass --agent-url {node}=http://HOST:PORT (or TF_AGENT_URLS), "
        f"or run from the folder where `tfctl up` keeps its state ({endpoints} has no such node)"
    )


def _error_text(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.text.strip()[:300] or f"HTTP {answer.status_code}"
    detail = body.get("detail") or body.get("error") or body if isinstance(body, dict) else body
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(part) for part in item.get('loc', ())[1:])}: {item.get('msg')}"
            if isinstance(item, dict)
            else str(item)
            for item in detail
        )
    return str(detail)


class Run:
    """One `tfctl run`: submit, wait for placement, stream the worker, forward signals, release."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.headers = {} if plan.token is None else {"Authorization": f"Bearer {plan.token}"}
        self.signals: asyncio.Queue[int] = asyncio.Queue()
        self.allocation_id: str | None = None

    async def execute(self) -> int:
        loop = asyncio.get_running_loop()
        for number in FORWARDED_SIGNALS:
            loop.add_signal_handler(number, self.signals.put_nowait, int(number))
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as client:
                try:
                    return await self._run(client)
                finally:
                    if self.allocation_id is not None:
                        await self._release(client)
        finally:
            for number in FORWARDED_SIGNALS:
                loop.remove_signal_handler(number)

    async def _run(self, client: httpx.AsyncClient) -> int:
        status = await self._submit(client)
        node = str(status["node"])
        gpu_uuids = [str(uuid) for uuid in status["gpu_uuids"]]
        _say(f"placed on {node} ({', '.join(gpu_uuids)}); starting {self.plan.argv[0]}")
        return await self._stream(client, agent_url_for(node, self.plan), gpu_uuids)

    async def _submit(self, client: httpx.AsyncClient) -> dict[str, Any]:
        base = self.plan.scheduler_url
        try:
            answer = await client.post(
                f"{base}/api/v1/workloads", json=self.plan.submission, headers=self.headers
            )
        except httpx.HTTPError as error:
            raise RunError(
                f"cannot reach the scheduler at {base} ({error}); is `tfctl up` running?"
            ) from None
        if answer.status_code == 422:
            raise RunError(f"not placed: {_error_text(answer)}", EXIT_NOT_PLACED)
        if answer.status_code not in (200, 201, 202):
            raise RunError(f"the scheduler answered {answer.status_code}: {_error_text(answer)}")
        status: dict[str, Any] = answer.json()
        self.allocation_id = str(status["id"])
        workload = self.plan.submission["workload"]
        request = self.plan.submission["request"]
        tflops = format_milli(request["tflops_request_milli"])
        vram = format_bytes(request["vram_request_bytes"])
        _say(
            f"submitted {workload['namespace']}/{workload['name']} as allocation {self.allocation_id} "
            f"({request['gpu_count']} GPU x {tflops} TFLOPS, {vram})"
        )
        return await self._until_placed(client, status)

    async def _until_placed(self, client: httpx.AsyncClient, status: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        shown_reason: str | None = None
        while status["state"] == "pending":
            waited = time.monotonic() - started
            if waited >= self.plan.wait_s:
                raise RunError(
                    f"unschedulable after {waited:.0f}s: {status.get('reason')} "
                    "(free capacity, ask for less, or wait longer with --wait SECONDS)",
                    EXIT_NOT_PLACED,
                )
            if status.get("reason") != shown_reason:
                shown_reason = status.get("reason")
                _say(f"waiting for placement (up to {self.plan.wait_s:.0f}s): {shown_reason}")
            try:
                signal_number = await asyncio.wait_for(self.signals.get(), timeout=PLACEMENT_POLL_S)
            except TimeoutError:
                pass
            else:
                raise RunError("interrupted while waiting for placement", 128 + signal_number)
            answer = await client.get(f"{self.plan.scheduler_url}/api/v1/workloads/{self.allocation_id}")
            if answer.status_code != 200:
                raise RunError(f"the scheduler answered {answer.status_code}: {_error_text(answer)}")
            status = answer.json()
        if status["state"] != "placed":
            raise RunError(f"not placed: {status['state']}: {status.get('reason')}", EXIT_NOT_PLACED)
        return status

    async def _stream(self, client: httpx.AsyncClient, agent_url: str, gpu_uuids: list[str]) -> int:
        request = self.plan.submission["request"]
        body = {
            "allocation_id": self.allocation_id,
            "gpu_uuids": gpu_uuids,
            "argv": list(self.plan.argv),
            "env": self.plan.env,
            "working_dir": self.plan.working_dir,
            "tflops_limit_milli": request["tflops_limit_milli"],
            "vram_limit_bytes": request["vram_limit_bytes"],
            "isolation": request["isolation"],
            "scheduler_url": self.plan.scheduler_url,
            "grace_s": self.plan.grace_s,
        }
        forwarding = asyncio.create_task(self._forward_signals(client, agent_url))
        try:
            async with client.stream(
                "POST", f"{agent_url}/api/v1/workers", json=body, headers=self.headers
            ) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                    payload = (
                        answer.json() if answer.headers.get("content-type") == "application/json" else {}
                    )
                    code = payload.get("exit_code") if isinstance(payload, dict) else None
                    raise RunError(
                        f"the agent at {agent_url} refused: {_error_text(answer)}",
                        code if isinstance(code, int) else EXIT_CONTROL_PLANE,
                    )
                async for line in answer.aiter_lines():
                    if line.strip() and (exit_code := self._show(json.loads(line))) is not None:
                        return exit_code
        except httpx.HTTPError as error:
            raise RunError(
                f"lost the agent at {agent_url} ({error}); the command may still be running"
            ) from None
        finally:
            forwarding.cancel()
        raise RunError(f"the agent at {agent_url} closed the stream before the command ended")

    def _show(self, frame: dict[str, Any]) -> int | None:
        event = frame.get("event")
        if event == "output":
            target = sys.stdout if frame.get("stream") == "stdout" else sys.stderr
            target.buffer.write(base64.b64decode(frame["data"]))
            target.buffer.flush()
        elif event == "exited":
            exit_code = int(frame["exit_code"])
            if frame.get("reason"):
                _say(f"the agent stopped {self.plan.argv[0]}: {frame['reason']}")
            if frame.get("signal"):
                _say(f"{self.plan.argv[0]} was killed by signal {frame['signal']}")
            return exit_code
        return None

    async def _forward_signals(self, client: httpx.AsyncClient, agent_url: str) -> None:
        while True:
            number = await self.signals.get()
            _say(f"forwarding {signal.Signals(number).name} to {self.plan.argv[0]}")
            try:
                await client.post(
                    f"{agent_url}/api/v1/workers/{self.allocation_id}/signal",
                    json={"signal": number},
                    headers=self.headers,
                )
            except httpx.HTTPError as error:
                _say(f"could not forward {signal.Signals(number).name}: {error}")

    async def _release(self, client: httpx.AsyncClient) -> None:
        url = f"{self.plan.scheduler_url}/api/v1/workloads/{self.allocation_id}"
        try:
            answer = await client.delete(url, headers=self.headers)
        except httpx.HTTPError as error:
            _say(
                f"could not release allocation {self.allocation_id} ({error}); once the scheduler answers, "
                f"run: {release_command(url, self.plan.state_dir)}"
            )
            return
        if answer.status_code not in (200, 404):
            _say(
                f"could not release allocation {self.allocation_id}: {_error_text(answer)}; "
                f"run: {release_command(url, self.plan.state_dir)}"
            )


def release_command(url: str, state_dir: Path) -> str:
    """A shell command that releases the allocation at `url` by hand, with the token `tfctl run` used
    (named, never printed: `$TF_API_TOKEN`, or read from the stack's token file)."""
    if os.environ.get(TOKEN_ENV, "").strip():
        token = f"${TOKEN_ENV}"
    else:
        token = f"$(cat {shlex.quote(str(token_path(state_dir).resolve()))})"
    return f'curl -fsS -X DELETE -H "Authorization: Bearer {token}" {shlex.quote(url)}'


def handler(args: argparse.Namespace) -> int:
    try:
        plan = plan_from_args(args)
        return asyncio.run(Run(plan).execute())
    except RunError as error:
        _say(str(error))
        return error.exit_code
