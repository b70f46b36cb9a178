"""The robustness suite's running stack: the five services in-process, and a readiness poll."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sqlalchemy.engine import make_url
from tfagent.app import build as build_agent
from tfcommon.infra import free_port
from tfcommon.runtime import ServiceSpec
from tfcommon.settings import (
    AgentSettings,
    DatabaseSettings,
    DefragSettings,
    MetricsSettings,
    NatsSettings,
    SchedulerSettings,
    WebhookSettings,
)
from tfdefrag.app import build as build_defrag
from tfmetrics.app import build as build_metrics
from tfscheduler.app import build as build_scheduler
from tfwebhook.app import build as build_webhook

API_TOKEN = "robustness-token"
AGENT_NODE = "robust-node-a"
READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunningStack:
    """The five services, up and ready: `urls` by service name (the webhook's is HTTPS, self-signed)."""

    nats_url: str
    database_url: str
    urls: dict[str, str]
    webhook_certificate: Path
    api_token: str = API_TOKEN
    agent_node: str = AGENT_NODE


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def service_specs(nats_url: str, database_url: str, state_dir: Path) -> dict[str, ServiceSpec[Any]]:
    """The five services on free local ports, sharing one bus, one ledger and one API token."""
    shared: dict[str, Any] = {
        "nats": NatsSettings(url=nats_url),
        "database": DatabaseSettings(url=database_url, pool_size=2),
        "bind_host": "127.0.0.1",
        "api_token": SecretStr(API_TOKEN),
    }
    return {
        "webhook": build_webhook(WebhookSettings(port=free_port(), **shared), state_dir),
        "scheduler": build_scheduler(SchedulerSettings(port=free_port(), **shared)),
        "defrag-planner": build_defrag(DefragSettings(port=free_port(), **shared)),
        "node-agent": build_agent(
            AgentSettings(port=free_port(), node_name=AGENT_NODE, fake_gpus="H100:2", **shared)
        ),
        "metrics": build_metrics(MetricsSettings(port=free_port(), **shared)),
    }
