"""`tfctl serve SERVICE`: run one service in the foreground, as docker-compose and Kubernetes run them.

Settings come from the environment (`TF_*`, see the README); flags override the few that differ per
instance (port, node name, ...). `TF_NATS_URL` and `TF_DATABASE_URL` are required: this command never
starts infrastructure (that is `tfctl up`). Service modules are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tfcommon.runtime import ServiceSpec
    from tfcommon.settings import ServiceSettings

SERVICES = ("webhook", "scheduler", "defrag-planner", "node-agent", "metrics")
USAGE_ERROR = 2

SettingsT = TypeVar("SettingsT", bound="ServiceSettings")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run one service in the foreground (needs TF_NATS_URL and TF_DATABASE_URL)",
        description="Run one tfpool service with settings from the environment; flags override them.",
    )
    parser.add_argument("service", choices=SERVICES, metavar="SERVICE", help=" | ".join(SERVICES))
    parser.add_argument("--port", type=int, help="listen port (default: the service's port, TF_PORT)")
    parser.add_argument("--host", help="bind address (default: TF_BIND_HOST or 0.0.0.0)")
    parser.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="TF_LOG_LEVEL")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("TF_STATE_DIR", ".tf")),
        help="local state folder; the webhook keeps its self-signed certificate in STATE_DIR/certs (.tf)",
    )
    parser.add_argument("--tls-cert-file", type=Path, help="webhook: PEM certificate (TF_TLS_CERT_FILE)")
    parser.add_argument("--tls-key-file", type=Path, help="webhook: PEM private key (TF_TLS_KEY_FILE)")
    parser.add_argument("--node-name", help="node-agent: the node it serves (TF_NODE_NAME)")
    parser.add_argument(
        "--fake-gpus", help="node-agent: simulated GPUs, e.g. H100:4,A100-80G:4 (TF_FAKE_GPUS)"
    )
    parser.set_defaults(handler=handle)


def _overrides(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    flags = {"port": args.port, "bind_host": args.host, "log_level": args.log_level}
    flags.update({name: getattr(args, name) for name in names})
    return {name: value for name, value in flags.items() if value is not None}


def _settings(settings_class: type[SettingsT], args: argparse.Namespace, *names: str) -> SettingsT:
    settings = settings_class()
    return settings.model_validate({**settings.model_dump(), **_overrides(args, *names)})


def build_spec(args: argparse.Namespace) -> ServiceSpec[Any]:
    """The `ServiceSpec` for `args.service`, with the environment's settings and the flags applied."""
    from tfcommon import settings as tf_settings

    if args.service == "webhook":
        from tfwebhook.app import build as build_webhook

        webhook = _settings(tf_settings.WebhookSettings, args, "tls_cert_file", "tls_key_file")
        return build_webhook(webhook, args.state_dir)
    if args.service == "scheduler":
        from tfscheduler.app import build as build_scheduler

        return build_scheduler(_settings(tf_settings.SchedulerSettings, args))
    if args.service == "defrag-planner":
        from tfdefrag.app import build as build_defrag

        return build_defrag(_settings(tf_settings.DefragSettings, args))
    if args.service == "node-agent":
        from tfagent.app import build as build_agent

        return build_agent(_settings(tf_settings.AgentSettings, args, "node_name", "fake_gpus"))
    from tfmetrics.app import build as build_metrics

    return build_metrics(_settings(tf_settings.MetricsSettings, args))


def handle(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from pydantic_settings import SettingsError
    from tfcommon.config import ConfigError
    from tfcommon.config_source import load_config
    from tfcommon.runtime import StartupError, required_urls, run_service

    try:
        spec = build_spec(args)
        required_urls(spec.settings, ledger=spec.needs_ledger)
        load_config(spec.settings.config_file)
    except ConfigError as error:
        print(f"tfctl serve {args.service}: TF_CONFIG_FILE: {error}", file=sys.stderr)
        return USAGE_ERROR
    except SettingsError as error:
        field = re.search(r'field "(\w+)"', str(error))
        variable = f"TF_{field.group(1).upper()}" if field else "a TF_* variable"
        print(
            f"tfctl serve {args.service}: invalid setting: {variable} is not valid JSON ({error}); "
            'give a JSON value, e.g. {"H100": "2.49"} or ["a", "b"]',
            file=sys.stderr,
        )
        return USAGE_ERROR
    except ValidationError as error:
        problems = "; ".join(
            f"TF_{'_'.join(str(part) for part in problem['loc']).upper()}: {problem['msg']}"
            for problem in error.errors()
        )
        print(f"tfctl serve {args.service}: invalid setting: {problems}", file=sys.stderr)
        return USAGE_ERROR
    except StartupError as error:
        print(f"tfctl serve {args.service}: {error}", file=sys.stderr)
        return USAGE_ERROR
    exit_code: int = run_service(spec)
    return exit_code
