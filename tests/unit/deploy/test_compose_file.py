"""docker-compose.yml and docker-compose.gpu.yml: valid Compose files that match the code they run."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from deploy_support import (
    ONE_SHOT_SETTINGS,
    REPO_ROOT,
    SERVICE_SETTINGS,
    ComposeReset,
    load_documents,
    settings_env_names,
    tfctl_rejection,
    without_resets,
)
from tfctl.compose_env import REQUIRED_VARIABLE, main, required_variables

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
GPU_OVERRIDE_FILE = REPO_ROOT / "docker-compose.gpu.yml"
NATS_CONFIG = REPO_ROOT / "deploy" / "nats" / "nats.conf"
TFPOOL_STEPS = {**SERVICE_SETTINGS, **ONE_SHOT_SETTINGS}


def compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    (document,) = load_documents(path)
    return document


def compose_schema_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((REPO_ROOT / "tests/unit/deploy/schemas/compose-spec.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def environment(service: dict[str, Any]) -> dict[str, Any]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "write environment as a mapping so overrides merge by name"
    return env


@pytest.mark.parametrize("path", [COMPOSE_FILE, GPU_OVERRIDE_FILE], ids=lambda p: p.name)
def test_file_follows_the_compose_specification(path: Path) -> None:
    errors = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in compose_schema_validator().iter_errors(without_resets(compose(path)))
    ]
    assert errors == []


def test_schema_check_catches_a_misspelt_key() -> None:
    broken = compose()
    broken["services"]["scheduler"]["depends_onn"] = broken["services"]["scheduler"].pop("depends_on")
    assert not compose_schema_validator().is_valid(without_resets(broken))


def test_runs_the_five_services_and_the_migrate_step_from_one_image() -> None:
    services = compose()["services"]
    assert set(TFPOOL_STEPS) <= set(services)
    images = {services[name]["image"] for name in TFPOOL_STEPS}
    assert len(images) == 1
    assert all(services[name]["build"]["context"] == "." for name in TFPOOL_STEPS)


@pytest.mark.parametrize("name", sorted(TFPOOL_STEPS))
def test_command_is_a_real_tfctl_subcommand(name: str) -> None:
    command = compose()["services"][name]["command"]
    expected = ["migrate"] if name == "migrate" else ["serve", name]
    assert command == expected
    assert tfctl_rejection(command) is None


@pytest.mark.parametrize("name", sorted(SERVICE_SETTINGS))
def test_published_port_is_the_service_default(name: str) -> None:
    default_port = SERVICE_SETTINGS[name].model_fields["port"].default
    (mapping,) = compose()["services"][name]["ports"]
    _, host_port, container_port = str(mapping).split(":")
    assert int(container_port) == default_port
    assert int(host_port) == default_port
    assert str(default_port) in json.dumps(compose()["services"][name]["healthcheck"]["test"])


@pytest.mark.parametrize("name", sorted(set(compose()["services"])))
def test_every_published_port_listens_on_the_loopback_address_only(name: str) -> None:
    for mapping in compose()["services"][name].get("ports", []):
        parts = str(mapping).split(":")
        assert len(parts) == 3, f"{name} publishes {mapping!r} on every interface: write 127.0.0.1:{mapping}"
        assert parts[0] == "127.0.0.1", f"{name} publishes {mapping!r} beyond this machine"


def secret_values(service: dict[str, Any]) -> dict[str, str]:
    """Each secret a service is given: its PASSWORD / TOKEN / SECRET variables (a `_FILE` names where one
    is, not the secret), and the password in a database URL."""
    env = environment(service)
    secrets = {
        key: str(value)
        for key, value in env.items()
        if re.search("PASSWORD|TOKEN|SECRET", key) and not key.endswith("_FILE")
    }
    for key, value in environment(service).items():
        if key.endswith("DATABASE_URL"):
            password = re.fullmatch(r"[\w+]+://[^:/@]+:(.*)@[^@]+", str(value))
            secrets[f"{key} password"] = password.group(1) if password else ""
    return secrets


@pytest.mark.parametrize("name", sorted(set(compose()["services"])))
def test_no_secret_has_a_default_value(name: str) -> None:
    for key, value in secret_values(compose()["services"][name]).items():
        assert REQUIRED_VARIABLE.fullmatch(value), (
            f"{name}: {key} is {value!r}; write ${{VARIABLE:?...}} so compose refuses to start without it"
        )


def test_the_whole_file_has_no_defaulted_secret() -> None:
    defaulted = re.findall(r"\$\{(\w*(?:PASSWORD|TOKEN)\w*):?-", COMPOSE_FILE.read_text())
    assert defaulted == []


def test_compose_env_writes_a_private_env_file_with_every_required_secret(tmp_path: Path) -> None:
    output = tmp_path / ".env"
    assert main(["--compose-file", str(COMPOSE_FILE), "--output", str(output)]) == 0
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    written = dict(
        line.split("=", 1) for line in output.read_text().splitlines() if line and not line.startswith("#")
    )
    required = set(required_variables(COMPOSE_FILE.read_text()))
    assert set(written) == required
    assert {"POSTGRES_PASSWORD", "TFPOOL_APP_PASSWORD", "TF_API_TOKEN", "NATS_READONLY_PASSWORD"} <= required
    assert len(set(written.values())) == len(written), "every secret is drawn on its own"
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{32}", value) for value in written.values())


def test_compose_env_never_replaces_an_existing_env_file(tmp_path: Path) -> None:
    output = tmp_path / ".env"
    output.write_text("POSTGRES_PASSWORD=chosen-by-the-user\n")
    assert main(["--compose-file", str(COMPOSE_FILE), "--output", str(output)]) == 1
    assert output.read_text() == "POSTGRES_PASSWORD=chosen-by-the-user\n"


def test_env_file_is_not_committed() -> None:
    assert ".env" in (REPO_ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("name", sorted(TFPOOL_STEPS))
def test_every_tf_variable_is_a_setting_of_that_service(name: str) -> None:
    known = settings_env_names(TFPOOL_STEPS[name])
    used = {key for key in environment(compose()["services"][name]) if key.startswith("TF_")}
    assert used, f"{name} sets no TF_ variable"
    assert used - known == set(), f"not in {TFPOOL_STEPS[name].__name__}: {sorted(used - known)}"


def test_settings_walk_knows_nested_and_service_specific_variables() -> None:
    agent = settings_env_names(SERVICE_SETTINGS["node-agent"])
    assert {"TF_NATS_URL", "TF_NATS__URL", "TF_DATABASE_URL", "TF_FAKE_GPUS", "TF_PORT"} <= agent
    assert "TF_FAKE_GPUS" not in settings_env_names(SERVICE_SETTINGS["scheduler"])


@pytest.mark.parametrize("name", sorted(set(SERVICE_SETTINGS) - {"node-agent"}))
def test_service_waits_for_healthy_infrastructure_and_a_finished_migration(name: str) -> None:
    service = compose()["services"][name]
    assert service["depends_on"] == {
        "nats": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    assert service["healthcheck"]["test"][0] == "CMD"


def test_migrate_runs_once_as_the_schema_owner_after_postgres_is_healthy() -> None:
    services = compose()["services"]
    migrate = services["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert "tfpool_migrate:" in environment(migrate)["TF_DATABASE_URL"]
    for name in set(SERVICE_SETTINGS) - {"node-agent"}:
        assert "tfpool_app:" in environment(services[name])["TF_DATABASE_URL"], name


def test_the_node_agent_holds_no_database_credential_and_waits_for_nats_only() -> None:
    agent = compose()["services"]["node-agent"]
    assert not any("DATABASE" in key for key in environment(agent))
    assert agent["depends_on"] == {"nats": {"condition": "service_healthy"}}
    assert agent["healthcheck"]["test"][0] == "CMD"


def test_nats_runs_jetstream_from_the_shared_config_with_a_volume_and_health_check() -> None:
    nats = compose()["services"]["nats"]
    assert nats["command"] == ["--config", "/etc/nats/nats.conf", "--store_dir", "/data/jetstream"]
    sources = {volume["source"]: volume["target"] for volume in nats["volumes"]}
    assert sources["./deploy/nats/nats.conf"] == "/etc/nats/nats.conf"
    assert sources["nats-data"] == "/data"
    assert "js-enabled-only=true" in " ".join(nats["healthcheck"]["test"])
    assert "nats-data" in compose()["volumes"]


def test_postgres_keeps_its_data_in_a_volume_and_creates_the_two_roles() -> None:
    postgres = compose()["services"]["postgres"]
    targets = {volume["target"]: volume["source"] for volume in postgres["volumes"]}
    assert targets["/var/lib/postgresql/data"] == "postgres-data"
    assert targets["/docker-entrypoint-initdb.d/10-tfpool-roles.sh"] == "./deploy/postgres/init-roles.sh"
    assert targets["/opt/tfpool/roles.sql"] == "./deploy/postgres/roles.sql"
    assert {"TFPOOL_MIGRATE_PASSWORD", "TFPOOL_APP_PASSWORD"} <= set(environment(postgres))
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]


def test_every_bind_mounted_file_exists() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert (REPO_ROOT / volume["source"]).is_file(), f"{name}: {volume['source']}"


def test_every_nats_password_the_config_reads_is_given_to_the_nats_container() -> None:
    read_by_config = set(re.findall(r"password:\s*\$(\w+)", NATS_CONFIG.read_text()))
    assert read_by_config == set(environment(compose()["services"]["nats"]))
    assert "NATS_CALLOUT_ISSUER" in " ".join(compose()["services"]["nats"]["entrypoint"]), (
        "from nats-credentials"
    )


def test_the_node_agent_logs_in_as_its_node_with_its_own_token_and_no_shared_password() -> None:
    services = compose()["services"]
    agent = environment(services["node-agent"])
    assert agent["TF_NATS_USER"] == f"node:{agent['TF_NODE_NAME']}"
    assert "TF_NATS_PASSWORD" not in agent
    token_volume = next(
        v["source"]
        for v in services["node-agent"]["volumes"]
        if isinstance(v, dict) and v.get("target") == "/run/node-token"
    )
    assert agent["TF_NATS_PASSWORD_FILE"].startswith("/run/node-token/")
    credentials = services["nats-credentials"]
    assert f"node-token {agent['TF_NODE_NAME']}" in " ".join(credentials["command"])
    assert any(v["source"] == token_volume for v in credentials["volumes"])
    callout = environment(services["nats-auth"])
    assert callout["TF_NATS_USER"] == "nats-auth"
    assert callout["TF_NATS_PASSWORD"] == environment(services["nats"])["NATS_NATS_AUTH_PASSWORD"]
    secret_users = [
        name for name, service in services.items() if "NATS_CALLOUT_SECRET" in environment(service)
    ]
    assert sorted(secret_users) == ["nats-auth", "nats-credentials"], "the callout secret reaches no service"


@pytest.mark.parametrize("name", sorted(set(SERVICE_SETTINGS) - {"node-agent"}))
def test_service_logs_in_to_nats_as_its_own_user_with_the_password_nats_expects(name: str) -> None:
    services = compose()["services"]
    env = environment(services[name])
    users = re.findall(r"user:\s*(\S+)\s+password:\s*\$(\w+)", NATS_CONFIG.read_text())
    password_variable = dict(users)[name]
    assert env["TF_NATS_USER"] == name
    assert env["TF_NATS_PASSWORD"] == environment(services["nats"])[password_variable]


def test_node_agent_simulates_gpus_by_default() -> None:
    assert environment(compose()["services"]["node-agent"])["TF_FAKE_GPUS"]


def test_gpu_override_runs_the_node_agent_on_real_gpus() -> None:
    override = compose(GPU_OVERRIDE_FILE)
    assert set(override["services"]) == {"node-agent"}
    agent = override["services"]["node-agent"]
    assert isinstance(environment(agent)["TF_FAKE_GPUS"], ComposeReset)
    (device,) = agent["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert device["count"] == "all"
