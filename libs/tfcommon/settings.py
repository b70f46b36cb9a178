"""Settings read from the environment (prefix `TF_`), one class per service.

Every service composes the shared `NatsSettings` and `DatabaseSettings`. Nothing here is built at
import time: callers construct the class they need (`SchedulerSettings()`), so tests pass their own.
Every field is listed in the README's configuration table.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class NatsSettings(BaseSettings):
    """Where the bus is. Unset `TF_NATS_URL` means: start an embedded nats-server."""

    model_config = SettingsConfigDict(env_prefix="TF_NATS_", extra="ignore")

    url: str | None = Field(default=None, description="NATS URL, e.g. nats://127.0.0.1:4222")
    user: str | None = Field(default=None, description="NATS user name, when the server requires one")
    password: SecretStr | None = Field(default=None, description="NATS password")


class DatabaseSettings(BaseSettings):
    """Where the ledger is. Unset `TF_DATABASE_URL` means: start an embedded Postgres."""

    model_config = SettingsConfigDict(env_prefix="TF_DATABASE_", extra="ignore")

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://postgres@127.0.0.1:5432/tfpool",
    )
    pool_size: int = Field(default=10, ge=1, description="connections kept per service process")


class ServiceSettings(BaseSettings):
    """What every service shares: bus, ledger, configuration file, log level, bind address."""

    model_config = SettingsConfigDict(env_prefix="TF_", extra="ignore", env_nested_delimiter="__")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    config_file: Path | None = Field(
        default=None, description="the YAML configuration file every service reads (TF_CONFIG_FILE)"
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    bind_host: str = Field(default="0.0.0.0", description="address the HTTP server binds")
    api_token: SecretStr | None = Field(
        default=None, description="bearer token required by mutating HTTP endpoints (TF_API_TOKEN)"
    )
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP endpoint for traces and metrics; unset exports nothing"
    )


class WebhookSettings(ServiceSettings):
    port: int = Field(default=9443, description="HTTPS port of the admission webhook (TF_PORT)")
    tls_cert_file: Path | None = Field(default=None, description="PEM certificate; self-signed if unset")
    tls_key_file: Path | None = Field(default=None, description="PEM private key; self-signed if unset")


class SchedulerSettings(ServiceSettings):
    port: int = Field(default=8080, description="HTTP port of the scheduler API (TF_PORT)")


class DefragSettings(ServiceSettings):
    port: int = Field(default=8070, description="HTTP port of the defrag planner API (TF_PORT)")


class AgentSettings(ServiceSettings):
    port: int = Field(default=8001, description="HTTP port of the node agent's hypervisor API (TF_PORT)")
    node_name: str | None = Field(default=None, description="node this agent serves; host name if unset")
    fake_gpus: str | None = Field(
        default=None, description="simulate GPUs instead of NVML, e.g. H100:8,A100-80G:4"
    )


class MetricsSettings(ServiceSettings):
    port: int = Field(default=8090, description="HTTP port of metrics, billing and the dashboard (TF_PORT)")
