"""Pure checks of the self-signed certificate files and of `tfctl up`'s node options."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from tfcommon.tls import ensure_self_signed
from tfctl.stack import StackOptions, child_environment, parse_fake_gpus, plan_children


def test_self_signed_pair_is_generated_once_then_reused(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path / "certs")
    certificate = first.cert_file.read_bytes()

    again = ensure_self_signed(tmp_path / "certs")

    assert again == first
    assert again.cert_file.read_bytes() == certificate
    assert stat.S_IMODE(first.key_file.stat().st_mode) == 0o600
    names = x509.load_pem_x509_certificate(certificate).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert "localhost" in names.value.get_values_for_type(x509.DNSName)


def test_a_certificate_missing_a_requested_name_is_replaced(tmp_path: Path) -> None:
    old = ensure_self_signed(tmp_path, names=("localhost",)).cert_file.read_bytes()

    new = ensure_self_signed(tmp_path, names=("localhost", "webhook.example.svc")).cert_file.read_bytes()

    assert new != old
    san = x509.load_pem_x509_certificate(new).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "webhook.example.svc" in san.value.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("H100", "'H100' is not MODEL:N", id="no-count"),
        pytest.param("H100:0", "count '0' for H100 must be a whole number from 1 to 64", id="zero"),
        pytest.param("H100:two", "count 'two' for H100", id="not-a-number"),
        pytest.param("X9000:8", "unknown GPU model 'X9000'; known models: ", id="unknown-model"),
        pytest.param("H100:4,", "'' is not MODEL:N", id="trailing-comma"),
    ],
)
def test_bad_fake_gpus_name_the_bad_part(value: str, message: str) -> None:
    with pytest.raises(ValueError, match="--fake-gpus") as error:
        parse_fake_gpus(value)
    assert message in str(error.value)


def test_each_fake_gpus_value_becomes_one_node_agent_with_its_own_port(tmp_path: Path) -> None:
    nodes = [parse_fake_gpus("H100:4"), parse_fake_gpus(" A100-80G:2 , L4:1 ")]
    children = plan_children(StackOptions(state_dir=tmp_path, nodes=nodes))

    agents = [child for child in children if child.service == "node-agent"]
    assert [agent.node for agent in agents] == ["sim-node-1", "sim-node-2"]
    assert [agent.url for agent in agents] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert agents[1].argv[-4:] == ["--node-name", "sim-node-2", "--fake-gpus", "A100-80G:2,L4:1"]
    webhook = next(child for child in children if child.service == "webhook")
    assert webhook.url == "https://127.0.0.1:9443"


def test_node_agents_get_no_database_url_and_every_other_service_the_stacks(tmp_path: Path) -> None:
    children = plan_children(StackOptions(state_dir=tmp_path, nodes=[parse_fake_gpus("H100:1")]))
    user = {"TF_DATABASE_URL": "postgresql+psycopg://user:secret@db/tfpool", "HOME": "/home/user"}

    environments = {
        child.service: child_environment(
            user,
            child,
            nats_url="nats://127.0.0.1:4222",
            database_url="postgresql+psycopg://postgres@127.0.0.1:5432/tfpool",
            api_token="token",
            agent_state_dir=tmp_path / "agent",
        )
        for child in children
    }

    assert "TF_DATABASE_URL" not in environments["node-agent"]
    assert environments["node-agent"]["TF_NATS_URL"] == "nats://127.0.0.1:4222"
    assert environments["node-agent"]["HOME"] == "/home/user"
    for service in ("webhook", "scheduler", "defrag-planner", "metrics"):
        assert environments[service]["TF_DATABASE_URL"].endswith("@127.0.0.1:5432/tfpool"), service
