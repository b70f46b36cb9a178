"""The auth callout's decision, without I/O: who a connecting node agent is, and what it may do.

A node agent connects with user `node:<node name>` and one of two passwords:
- on Kubernetes, its pod's service-account token (audience `tfpool-nats`, bound to the pod): the
  callout asks the API server to review it (TokenReview) and grants the node only when the token is
  the node agent's service account's and the API server says the pod runs on that node
  (`check_token_review`); nothing per node is distributed, and a stolen token is good for its node only;
- on a plain GPU server, the node token `tfn1.` + base64url(HMAC-SHA256(key, "tfpool-node:" + node))
  (`node_token`), which the operator makes with `tfctl nats node-token NODE` and puts on that server.
Both keys, the node-token key and the account key that signs the callout's answers, are derived from
one callout secret (`CalloutKeys.from_secret`), so the NATS configuration needs only the account's
public key (`tfctl nats issuer`). Anything else is refused with a reason the server logs (the client
sees "Authorization Violation").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfcommon import node_allocations, subjects
from tfcommon.nats_auth import jwt
from tfcommon.nats_auth.nkeys import KeyPair, KeyType

NODE_USER_PREFIX = "node:"
"""The NATS user of a node agent: `node:<node name>`."""
TOKEN_PREFIX = "tfn1."
DEFAULT_TTL_S = 3600
"""How long a user JWT the callout issues lasts; the server then disconnects the client, which
reconnects and is asked for again (a rotated secret takes effect within this time)."""
NODE_EVENTS = (
    subjects.NODE_REGISTERED,
    subjects.NODE_HEARTBEAT_SENT,
    subjects.GPU_DISCOVERED,
    subjects.GPU_DISAPPEARED,
    subjects.GPU_USAGE_REPORTED,
    subjects.GPU_DRIFT_DETECTED,
)
"""What a node agent publishes."""
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def node_token(token_key: bytes, node: str) -> str:
    """The credential of `node`'s agent on a plain server, under the callout's `token_key`."""
    digest = hmac.new(token_key, f"tfpool-node:{node}".encode(), hashlib.sha256).digest()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def node_user(node: str) -> str:
    return f"{NODE_USER_PREFIX}{node}"


def valid_node_name(node: str) -> bool:
    """A Kubernetes node name: an RFC 1123 subdomain of at most 253 characters."""
    return 0 < len(node) <= 253 and _NODE_NAME.match(node) is not None


def node_permissions(node: str) -> dict[str, Any]:
    """What `node`'s agent may publish and subscribe to: the streams' info and provisioning (as every
    service), its own two durable consumers (created with its own filter, fetched from and acknowledged),
    its events, its own node's two requests to the scheduler (its allocations, a release), the dead
    letters of its own two consumers (`tfcommon.deadletter`) and its own inbox. Not another node's
    consumer, not any other durable, not a message read by sequence, not the commands stream's
    messages except through its own consumer."""
    commands = subjects.node_agent_run_commands(node)
    allocations = subjects.node_agent_track_allocations(node)
    streams = (subjects.EVENTS_STREAM, subjects.COMMANDS_STREAM)
    publish = ["$JS.API.INFO"]
    for stream in streams:
        publish += [
            f"$JS.API.STREAM.CREATE.{stream}",
            f"$JS.API.STREAM.UPDATE.{stream}",
            f"$JS.API.STREAM.INFO.{stream}",
        ]
    (command_filter,) = commands.filter_subjects
    publish += [
        f"$JS.API.CONSUMER.CREATE.{commands.stream}.{commands.durable}.{command_filter}",
        f"$JS.API.CONSUMER.CREATE.{allocations.stream}.{allocations.durable}",
    ]
    for consumer in (commands, allocations):
        publish += [
            f"$JS.API.CONSUMER.INFO.{consumer.stream}.{consumer.durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.{consumer.stream}.{consumer.durable}",
            f"$JS.ACK.{consumer.stream}.{consumer.durable}.>",
            f"{subjects.DEADLETTER_PREFIX}.{subjects.PER_NODE_SERVICE}.{consumer.durable}",
        ]
    publish += list(NODE_EVENTS)
    publish += [node_allocations.node_allocations_subject(node), subjects.release_allocation(node)]
    return {"pub": {"allow": publish}, "sub": {"allow": [f"{node_inbox_prefix(node)}.>"]}}


def node_inbox_prefix(node: str) -> str:
    """The reply prefix of `node`'s agent (`tfcommon.bus.inbox_prefix_for` of its user)."""
    return f"_INBOX_node:{node.replace('.', '_')}"


@dataclass(frozen=True)
class NodeGrant:
    """The connection is `node`'s agent."""

    node: str


@dataclass(frozen=True)
class Refusal:
    """The connection is refused; `reason` goes to the server's log, never the password."""

    reason: str


@dataclass(frozen=True)
class NodeLogin:
    """A connection that names a node: `node:<node>` with its password."""

    node: str
    password: str

    @property
    def presents_service_account_token(self) -> bool:
        """Whether the password is a Kubernetes service-account token (a JWT) rather than a node token."""
        return self.password.startswith("eyJ") and self.password.count(".") == 2


@dataclass(frozen=True)
class CalloutKeys:
    """The two keys of the callout, both derived from its one secret."""

    issuer: KeyPair
    node_token_key: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> CalloutKeys:
        issuer_seed = hmac.new(secret, b"tfpool-nats-callout-issuer", hashlib.sha256).digest()
        token_key = hmac.new(secret, b"tfpool-nats-node-token", hashlib.sha256).digest()
        return cls(KeyPair.from_raw_seed(KeyType.ACCOUNT, issuer_seed), token_key)


@dataclass(frozen=True)
class AuthorizationRequest:
    """What the callout reads of a server's `authorization_request` claims."""

    user_nkey: str
    server_id: str
    connect_options: Mapping[str, Any]

    @classmethod
    def from_claims(cls, claims: Mapping[str, Any]) -> AuthorizationRequest:
        nats = claims.get("nats")
        if not isinstance(nats, Mapping):
            raise jwt.JwtError("not an authorization request: no nats claims")
        user_nkey = nats.get("user_nkey")
        server = nats.get("server_id")
        server_id = server.get("id") if isinstance(server, Mapping) else None
        if not isinstance(user_nkey, str) or not isinstance(server_id, str):
            raise jwt.JwtError("the authorization request names no user_nkey or server_id")
        options = nats.get("connect_opts")
        return cls(user_nkey, server_id, options if isinstance(options, Mapping) else {})


def node_login(connect_options: Mapping[str, Any]) -> NodeLogin | Refusal:
    """The node a connection's `user` names, with its password; a refusal for any other user."""
    user = connect_options.get("user")
    password = connect_options.get("pass")
    if not isinstance(user, str) or not user.startswith(NODE_USER_PREFIX):
        return Refusal(f"user {user!r} is neither a service user nor node:<node name>")
    node = user.removeprefix(NODE_USER_PREFIX)
    if not valid_node_name(node):
        return Refusal(f"user {user!r}: {node!r} is not a valid node name (RFC 1123 subdomain)")
    if not isinstance(password, str) or not password:
        return Refusal(f"user {user!r}: no password (a node token or the pod's service-account token)")
    return NodeLogin(node, password)


def check_node_token(login: NodeLogin, token_key: bytes) -> NodeGrant | Refusal:
    """Whether `login`'s password is its node's token under `token_key`."""
    if hmac.compare_digest(login.password, node_token(token_key, login.node)):
        return NodeGrant(login.node)
    return Refusal(
        f"user {node_user(login.node)!r}: the password is not this node's token "
        f"(tfctl nats node-token {login.node})"
    )


NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The TokenReview `user.extra` key under which the API server names the node of a pod-bound token."""
TOKEN_AUDIENCE = "tfpool-nats"
"""The audience a node agent's projected service-account token is made for."""


def check_token_review(
    login: NodeLogin, review_status: Mapping[str, Any], service_accounts: frozenset[str]
) -> NodeGrant | Refusal:
    """Whether the API server's TokenReview `status` of `login`'s password proves the node: the token
    is authenticated for `TOKEN_AUDIENCE`, belongs to one of `service_accounts`
    (`system:serviceaccount:<namespace>:<name>`), and is bound to a pod on `login.node`."""
    who = f"user {node_user(login.node)!r}"
    if review_status.get("authenticated") is not True:
        error = review_status.get("error") or "not authenticated"
        return Refusal(f"{who}: the API server did not accept the service-account token ({error})")
    audiences = review_status.get("audiences") or []
    if TOKEN_AUDIENCE not in audiences:
        return Refusal(f"{who}: the token is not for audience {TOKEN_AUDIENCE!r}")
    user = review_status.get("user")
    user = user if isinstance(user, Mapping) else {}
    username = user.get("username")
    if username not in service_accounts:
        return Refusal(
            f"{who}: the token is {username!r}'s, not a node agent's ({', '.join(sorted(service_accounts))})"
        )
    extra = user.get("extra")
    extra = extra if isinstance(extra, Mapping) else {}
    nodes = extra.get(NODE_NAME_EXTRA) or []
    if list(nodes) != [login.node]:
        bound = ", ".join(nodes) if nodes else "no node (bind the token to the agent's pod)"
        return Refusal(f"{who}: the token's pod runs on {bound}, not on {login.node}")
    return NodeGrant(login.node)


def authorization_response(
    request: AuthorizationRequest,
    decision: NodeGrant | Refusal,
    issuer: KeyPair,
    account: str,
    now: int,
    ttl_s: int = DEFAULT_TTL_S,
) -> str:
    """The signed `authorization_response` to `request`: a user JWT with the node's permissions,
    placed in `account` and valid `ttl_s`, or the refusal's reason."""
    answer: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if isinstance(decision, NodeGrant):
        user_claims = {
            "sub": request.user_nkey,
            "aud": account,
            "name": node_user(decision.node),
            "iat": now,
            "exp": now + ttl_s,
            "nats": node_permissions(decision.node) | {"type": "user", "version": 2},
        }
        answer["jwt"] = jwt.encode(user_claims, issuer)
    else:
        answer["error"] = decision.reason
    claims = {"sub": request.user_nkey, "aud": request.server_id, "iat": now, "nats": answer}
    return jwt.encode(claims, issuer)
