"""The auth callout service: answers the NATS server's `$SYS.REQ.USER.AUTH` requests for node agents.

Run with `python -m tfcommon.nats_auth` beside NATS (any number of replicas: they share a queue group).
It connects as the server's `auth_callout` user and answers each request with a user JWT holding the
node's own permissions, or a refusal (`node_access`), logging the node and the decision, never a
password or token.

Settings (environment):
- TF_NATS_URL, TF_NATS_USER, TF_NATS_PASSWORD: the callout's own NATS user (`nats-auth`);
  TF_NATS_TLS_CA_FILE as for every service;
- TF_NATS_CALLOUT_SECRET_FILE: the callout secret (at least 32 bytes), from which the account key
  that signs the answers and the node-token key are derived;
- TF_NATS_CALLOUT_ACCOUNT: the account node agents are placed in (default `$G`, NATS's global
  account, where the services' users of `deploy/nats/nats.conf` are);
- TF_NATS_CALLOUT_SERVICE_ACCOUNTS: on Kubernetes, the node agent's service account(s),
  `<namespace>:<name>` (or `<name>` in the callout's own namespace, TF_POD_NAMESPACE) separated by
  commas; set, a node agent's projected service-account token is
  reviewed by the API server (TokenReview, in-cluster credentials or TF_KUBECONFIG). Unset, only
  node tokens are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from tfcommon.logs import configure_logging
from tfcommon.nats_auth import jwt
from tfcommon.nats_auth.node_access import (
    DEFAULT_TTL_S,
    TOKEN_AUDIENCE,
    AuthorizationRequest,
    CalloutKeys,
    NodeGrant,
    NodeLogin,
    Refusal,
    authorization_response,
    check_node_token,
    check_token_review,
    node_login,
    node_token,
    valid_node_name,
)
from tfcommon.nats_tls import NatsTlsError, client_context
from tfcommon.settings import NatsSettings

log = logging.getLogger("tfpool.nats-auth")

AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
QUEUE = "tfpool-nats-auth"
DEFAULT_ACCOUNT = "$G"
MIN_SECRET_BYTES = 32
REVIEW_TIMEOUT_S = 5.0

TokenReviewer = Callable[[str], Awaitable[Mapping[str, Any]]]
"""Asks the API server to review a service-account token for `TOKEN_AUDIENCE`; returns its status."""


class CalloutConfigError(ValueError):
    """A setting of the callout is missing or wrong; the message names it and the fix."""


@dataclass(frozen=True)
class CalloutConfig:
    """What the callout needs: its NATS connection, its keys, whom it trusts on Kubernetes."""

    nats: NatsSettings
    keys: CalloutKeys
    account: str = DEFAULT_ACCOUNT
    service_accounts: frozenset[str] = frozenset()
    ttl_s: int = DEFAULT_TTL_S

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> CalloutConfig:
        nats = NatsSettings()
        if not nats.url:
            raise CalloutConfigError("TF_NATS_URL: unset; the URL of the NATS server to answer for")
        return cls(
            nats=nats,
            keys=CalloutKeys.from_secret(read_secret(environment.get("TF_NATS_CALLOUT_SECRET_FILE"))),
            account=environment.get("TF_NATS_CALLOUT_ACCOUNT") or DEFAULT_ACCOUNT,
            service_accounts=parse_service_accounts(
                environment.get("TF_NATS_CALLOUT_SERVICE_ACCOUNTS", ""), environment.get("TF_POD_NAMESPACE")
            ),
        )


def parse_service_accounts(text: str, own_namespace: str | None = None) -> frozenset[str]:
    """`ns:name,name2` as the usernames the API server gives those service accounts; a name without a
    namespace is in `own_namespace` (the callout's own, TF_POD_NAMESPACE)."""
    accounts = set()
    for entry in filter(None, (part.strip() for part in text.split(","))):
        namespace, _, name = entry.rpartition(":")
        namespace = namespace or own_namespace or ""
        if not namespace or not name:
            raise CalloutConfigError(
                f"TF_NATS_CALLOUT_SERVICE_ACCOUNTS: {entry!r} names no namespace; write "
                "<namespace>:<service account> (e.g. tfpool-system:tfpool-node-agent), or set "
                "TF_POD_NAMESPACE for names without one"
            )
        accounts.add(f"system:serviceaccount:{namespace}:{name}")
    return frozenset(accounts)


def read_secret(path: str | None) -> bytes:
    """The callout secret in the file at `path` (at least 32 bytes)."""
    if not path:
        raise CalloutConfigError(
            "TF_NATS_CALLOUT_SECRET_FILE: unset; a file of at least 32 random bytes "
            "(head -c 48 /dev/urandom | base64 > file) that the callout's keys are derived from"
        )
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as error:
        raise CalloutConfigError(f"TF_NATS_CALLOUT_SECRET_FILE: cannot read {path}: {error}") from error
    if len(secret) < MIN_SECRET_BYTES:
        raise CalloutConfigError(
            f"TF_NATS_CALLOUT_SECRET_FILE: {path} holds {len(secret)} bytes; use at least "
            f"{MIN_SECRET_BYTES} random bytes (head -c 48 /dev/urandom | base64 > file)"
        )
    return secret


async def decide(
    config: CalloutConfig, request: AuthorizationRequest, review: TokenReviewer | None
) -> NodeGrant | Refusal:
    """The decision on one connection: a node token is checked here, a service-account token by the
    API server (only where service accounts are configured)."""
    login = node_login(request.connect_options)
    if isinstance(login, Refusal):
        return login
    if not login.presents_service_account_token:
        return check_node_token(login, config.keys.node_token_key)
    if review is None or not config.service_accounts:
        return Refusal(
            f"user node:{login.node}: a service-account token, but this callout reviews none "
            "(set TF_NATS_CALLOUT_SERVICE_ACCOUNTS); use a node token (tfctl nats node-token)"
        )
    return await _reviewed(login, config.service_accounts, review)


async def _reviewed(login: NodeLogin, accounts: frozenset[str], review: TokenReviewer) -> NodeGrant | Refusal:
    try:
        status = await asyncio.wait_for(review(login.password), REVIEW_TIMEOUT_S)
    except Exception as error:
        return Refusal(f"user node:{login.node}: the TokenReview failed ({type(error).__name__}: {error})")
    return check_token_review(login, status, accounts)


async def answer(config: CalloutConfig, message: Msg, review: TokenReviewer | None) -> None:
    """Answer one authorization request; one that cannot be read gets no answer (the server then
    refuses the connection when its callout times out)."""
    try:
        request = AuthorizationRequest.from_claims(jwt.decode(message.data.decode()))
    except (jwt.JwtError, UnicodeDecodeError) as error:
        log.warning("unreadable authorization request: %s", error, extra={"outcome": "refused"})
        return
    decision = await decide(config, request, review)
    if isinstance(decision, NodeGrant):
        log.info("node %s connected", decision.node, extra={"node": decision.node, "outcome": "allowed"})
    else:
        log.warning("connection refused: %s", decision.reason, extra={"outcome": "refused"})
    response = authorization_response(
        request, decision, config.keys.issuer, config.account, int(time.time()), config.ttl_s
    )
    await message.respond(response.encode())


def kubernetes_token_reviewer() -> TokenReviewer:
    """Reviews tokens with the API server: in-cluster credentials, else TF_KUBECONFIG or KUBECONFIG.
    The callout's service account needs `create` on `tokenreviews` (system:auth-delegator has it)."""
    from kubernetes import client, config

    kubeconfig = os.environ.get("TF_KUBECONFIG") or os.environ.get("KUBECONFIG")
    if kubeconfig:
        api_client = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        api_client = client.ApiClient()
    authentication = client.AuthenticationV1Api(api_client)

    def review_sync(token: str) -> Mapping[str, Any]:
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[TOKEN_AUDIENCE]))
        result = authentication.create_token_review(body, _request_timeout=REVIEW_TIMEOUT_S)
        return dict(api_client.sanitize_for_serialization(result.status) or {})

    async def review(token: str) -> Mapping[str, Any]:
        return await asyncio.to_thread(review_sync, token)

    return review


async def serve(config: CalloutConfig, stop: asyncio.Event, review: TokenReviewer | None = None) -> None:
    """Answer requests until `stop` is set."""
    nats = config.nats
    if nats.url is None:
        raise CalloutConfigError("TF_NATS_URL: unset; the URL of the NATS server to answer for")
    client = Client()
    await client.connect(
        nats.url,
        name="tfpool-nats-auth",
        user=nats.user,
        password=nats.password.get_secret_value() if nats.password else None,
        tls=client_context(nats),
        max_reconnect_attempts=-1,
    )
    try:

        async def on_request(message: Msg) -> None:
            await answer(config, message, review)

        await client.subscribe(AUTH_SUBJECT, queue=QUEUE, cb=on_request)
        await client.flush()
        log.info(
            "answering %s for account %s (issuer %s; service-account tokens %s)",
            AUTH_SUBJECT,
            config.account,
            config.keys.issuer.public_key,
            "reviewed" if review is not None else "not accepted",
        )
        await stop.wait()
    finally:
        await client.drain()


def secret_keys(path: str | None) -> CalloutKeys:
    """The callout's keys from the secret file at `path` (default TF_NATS_CALLOUT_SECRET_FILE)."""
    return CalloutKeys.from_secret(read_secret(path or os.environ.get("TF_NATS_CALLOUT_SECRET_FILE")))


def run() -> int:
    """Answer authorization requests until SIGTERM/SIGINT; 2 on a configuration error."""
    configure_logging("nats-auth", os.environ.get("TF_LOG_LEVEL", "INFO"))
    try:
        config = CalloutConfig.from_environment(os.environ)
        client_context(config.nats)
    except (CalloutConfigError, NatsTlsError, ValueError) as error:
        sys.stderr.write(f"tfpool nats-auth: {error}\n")
        return 2

    async def answer_until_stopped() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        review = kubernetes_token_reviewer() if config.service_accounts else None
        await serve(config, stop, review)

    asyncio.run(answer_until_stopped())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`serve` (the default), `issuer [--secret-file F] [--output F]`, `node-token NODE [--secret-file F]`:
    what `tfctl nats callout|issuer|node-token` run."""
    parser = argparse.ArgumentParser(prog="python -m tfcommon.nats_auth", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="answer the NATS server's authorization requests (the default)")
    add_key_commands(commands)
    args = parser.parse_args(argv)
    if args.command in (None, "serve"):
        return run()
    return run_key_command(args)


def add_key_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `issuer` and `node-token` subcommands, shared with `tfctl nats`."""
    issuer = commands.add_parser("issuer", help="print the account public key for NATS's auth_callout.issuer")
    issuer.add_argument("--secret-file", help="the callout secret (default TF_NATS_CALLOUT_SECRET_FILE)")
    issuer.add_argument("--output", help="write it to this file instead (an init container beside NATS)")
    token = commands.add_parser(
        "node-token", help="print the NATS password of NODE's agent on a plain server"
    )
    token.add_argument("node", help="the node's name, as its agent's TF_NODE_NAME")
    token.add_argument("--secret-file", help="the callout secret (default TF_NATS_CALLOUT_SECRET_FILE)")


def run_key_command(args: argparse.Namespace) -> int:
    """Print (or write) what `args` asks for; 2 with the reason when the secret is missing or short."""
    try:
        keys = secret_keys(args.secret_file)
    except CalloutConfigError as error:
        sys.stderr.write(f"{error}\n")
        return 2
    if args.command == "issuer":
        if args.output:
            Path(args.output).write_text(keys.issuer.public_key, encoding="utf-8")
        else:
            sys.stdout.write(keys.issuer.public_key + "\n")
        return 0
    if not valid_node_name(args.node):
        sys.stderr.write(f"{args.node!r} is not a node name (a lower-case RFC 1123 subdomain)\n")
        return 2
    sys.stdout.write(node_token(keys.node_token_key, args.node) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
