"""The auth callout's decision (`tfcommon.nats_auth.node_access`) and its key and token formats: who a
connecting node agent is, and that what it is granted names its own node only."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from tfcommon import subjects
from tfcommon.nats_auth import jwt
from tfcommon.nats_auth.nkeys import KeyPair, KeyType, NkeyError, decode_public, verify
from tfcommon.nats_auth.node_access import (
    NODE_NAME_EXTRA,
    AuthorizationRequest,
    CalloutKeys,
    NodeGrant,
    NodeLogin,
    Refusal,
    authorization_response,
    check_node_token,
    check_token_review,
    node_login,
    node_permissions,
    node_token,
)

SECRET = b"s" * 48
KEYS = CalloutKeys.from_secret(SECRET)
AGENT = "system:serviceaccount:tfpool-system:tfpool-node-agent"


def test_an_nkey_seed_gives_back_the_same_key_pair_and_a_typed_public_key() -> None:
    pair = KeyPair.generate(KeyType.USER)
    again = KeyPair.from_seed(pair.seed)
    assert again.public_key == pair.public_key
    assert pair.public_key.startswith("U")
    assert pair.seed.startswith("SU")
    assert KEYS.issuer.public_key.startswith("A")
    assert decode_public(pair.public_key, KeyType.USER)
    with pytest.raises(NkeyError, match="not a account key"):
        decode_public(pair.public_key, KeyType.ACCOUNT)


def test_a_mistyped_nkey_fails_its_checksum() -> None:
    public = KeyPair.generate(KeyType.ACCOUNT).public_key
    mistyped = public[:10] + ("A" if public[10] != "A" else "B") + public[11:]
    with pytest.raises(NkeyError, match="checksum"):
        decode_public(mistyped)


def test_the_callout_keys_come_from_its_secret_alone() -> None:
    assert CalloutKeys.from_secret(SECRET).issuer.public_key == KEYS.issuer.public_key
    other = CalloutKeys.from_secret(b"t" * 48)
    assert other.issuer.public_key != KEYS.issuer.public_key
    assert node_token(other.node_token_key, "gpu-1") != node_token(KEYS.node_token_key, "gpu-1")


def test_a_token_is_signed_by_its_issuer_and_a_changed_claim_is_refused() -> None:
    token = jwt.encode({"sub": "someone", "nats": {"x": 1}}, KEYS.issuer)
    claims = jwt.decode(token)
    assert claims["iss"] == KEYS.issuer.public_key
    assert claims["sub"] == "someone"
    header, body, signature = token.split(".")
    changed = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))) | {"sub": "someone-else"}
    forged = base64.urlsafe_b64encode(json.dumps(changed).encode()).decode().rstrip("=")
    with pytest.raises(jwt.JwtError, match="signature"):
        jwt.decode(f"{header}.{forged}.{signature}")
    assert verify(
        KEYS.issuer.public_key, f"{header}.{body}".encode(), base64.urlsafe_b64decode(signature + "==")
    )


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"user": "scheduler", "pass": "x"}, "neither a service user"),
        ({"pass": "x"}, "neither a service user"),
        ({"user": "node:GPU_1", "pass": "x"}, "not a valid node name"),
        ({"user": "node:", "pass": "x"}, "not a valid node name"),
        ({"user": "node:gpu-1"}, "no password"),
    ],
)
def test_a_connection_that_names_no_node_properly_is_refused(options: dict[str, Any], reason: str) -> None:
    refusal = node_login(options)
    assert isinstance(refusal, Refusal)
    assert reason in refusal.reason


def test_a_node_token_is_good_for_its_own_node_only() -> None:
    own = NodeLogin("gpu-1.example", node_token(KEYS.node_token_key, "gpu-1.example"))
    assert check_node_token(own, KEYS.node_token_key) == NodeGrant("gpu-1.example")
    borrowed = NodeLogin("gpu-2", node_token(KEYS.node_token_key, "gpu-1.example"))
    refusal = check_node_token(borrowed, KEYS.node_token_key)
    assert isinstance(refusal, Refusal)
    assert "tfctl nats node-token gpu-2" in refusal.reason
    assert borrowed.password not in refusal.reason


def review(node: str | None = "gpu-1", user: str = AGENT, **status: Any) -> dict[str, Any]:
    extra = {NODE_NAME_EXTRA: [node]} if node else {}
    return {
        "authenticated": True,
        "audiences": ["tfpool-nats"],
        "user": {"username": user, "extra": extra},
    } | status


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (review(authenticated=False, error="token has expired"), "token has expired"),
        (review(audiences=["https://kubernetes.default.svc"]), "not for audience"),
        (review(user="system:serviceaccount:tfpool-system:tfpool-scheduler"), "not a node agent's"),
        (review(node="gpu-2"), "runs on gpu-2, not on gpu-1"),
        (review(node=None), "no node"),
        ({}, "did not accept"),
    ],
    ids=["expired", "audience", "service-account", "other-node", "unbound", "empty"],
)
def test_a_reviewed_token_that_does_not_prove_the_node_is_refused(
    status: dict[str, Any], reason: str
) -> None:
    decision = check_token_review(NodeLogin("gpu-1", "eyJ.a.b"), status, frozenset({AGENT}))
    assert isinstance(decision, Refusal)
    assert reason in decision.reason


def test_a_reviewed_token_of_the_agent_on_its_node_is_granted() -> None:
    login = NodeLogin("gpu-1", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    assert login.presents_service_account_token
    assert not NodeLogin("gpu-1", node_token(KEYS.node_token_key, "gpu-1")).presents_service_account_token
    assert check_token_review(login, review(), frozenset({AGENT})) == NodeGrant("gpu-1")


def test_a_node_is_granted_its_own_consumers_events_and_inbox_and_nothing_of_another_nodes() -> None:
    granted = node_permissions("gpu-1")
    published = granted["pub"]["allow"]
    for factory in subjects.PER_NODE_CONSUMERS:
        own, other = factory("gpu-1"), factory("gpu-2")
        assert f"$JS.API.CONSUMER.MSG.NEXT.{own.stream}.{own.durable}" in published
        assert not any(other.durable in subject for subject in published)
    assert granted["sub"]["allow"] == ["_INBOX_node:gpu-1.>"]
    wildcards = [subject for subject in published if "*" in subject or ">" in subject]
    own_durables = tuple(factory("gpu-1").durable for factory in subjects.PER_NODE_CONSUMERS)
    assert wildcards, "acknowledgements need a wildcard"
    assert all(any(durable in subject for durable in own_durables) for subject in wildcards), wildcards


def authorization_request(options: dict[str, Any]) -> AuthorizationRequest:
    user = KeyPair.generate(KeyType.USER).public_key
    return AuthorizationRequest.from_claims(
        {"nats": {"user_nkey": user, "server_id": {"id": "NSERVER"}, "connect_opts": options}}
    )


def test_the_answer_to_a_granted_node_is_a_user_jwt_for_that_node_signed_by_the_issuer() -> None:
    request = authorization_request({"user": "node:gpu-1"})
    answer = jwt.decode(authorization_response(request, NodeGrant("gpu-1"), KEYS.issuer, "$G", now=1000))
    assert answer["aud"] == "NSERVER"
    assert answer["sub"] == request.user_nkey
    user = jwt.decode(answer["nats"]["jwt"])
    assert user["iss"] == KEYS.issuer.public_key
    assert user["aud"] == "$G"
    assert user["name"] == "node:gpu-1"
    assert user["exp"] == 1000 + 3600
    assert user["nats"]["pub"] == node_permissions("gpu-1")["pub"]


def test_the_answer_to_a_refusal_carries_the_reason_and_no_jwt() -> None:
    request = authorization_request({"user": "node:gpu-1"})
    answer = jwt.decode(authorization_response(request, Refusal("why"), KEYS.issuer, "$G", now=1000))
    assert answer["nats"]["error"] == "why"
    assert "jwt" not in answer["nats"]


def test_a_request_without_its_ids_is_not_an_authorization_request() -> None:
    with pytest.raises(jwt.JwtError, match="user_nkey"):
        AuthorizationRequest.from_claims({"nats": {"connect_opts": {}}})
    with pytest.raises(jwt.JwtError, match="no nats claims"):
        AuthorizationRequest.from_claims({})
