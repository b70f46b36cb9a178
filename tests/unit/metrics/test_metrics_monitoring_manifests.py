"""The PrometheusRule and the Grafana dashboard in k8s/ only query series tfpool exports, and every
service's /metrics is scraped."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from tfmetrics.core.series import SERIES
from tfmetrics.exporter import SYSTEM_COUNTERS

MONITORING = Path(__file__).resolve().parents[3] / "k8s" / "base" / "monitoring"
# Every service's operational series (tfcommon.service_metrics, the scheduler's leader gauge).
OPERATIONAL = {
    "tf_http_request_duration_seconds_bucket",
    "tf_consumer_pending_messages",
    "tf_leader_election_leader",
}
EXPORTED = set(SERIES) | {f"{name}_total" for name in SYSTEM_COUNTERS} | OPERATIONAL
SERIES_NAME = re.compile(r"\btf_[a-z_]+\b")


def alert_rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text(encoding="utf-8"))
    return [rule for group in rule["spec"]["groups"] for rule in group["rules"]]


def test_every_alert_queries_exported_series() -> None:
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} >= {
        "GPUVRAMFull",
        "GPUTFlopsFull",
        "GPUTemperatureHigh",
        "PoolTFlopsAllocationCritical",
        "PoolTFlopsAllocationWarning",
        "IdleGPU",
        "WorkerAllocationFailed",
        "NodeHeartbeatLost",
        "GPUDriftDetected",
        "TfpoolWebhookDown",
        "TfpoolSchedulerLeaderMissing",
        "TfpoolNodeAgentDown",
        "TfpoolWebhookLatencyNearTimeout",
        "TfpoolConsumerLag",
    }
    for rule in rules:
        names = set(SERIES_NAME.findall(rule["expr"]))
        assert names or 'up{job="tfpool-' in rule["expr"], rule["alert"]
        assert names <= EXPORTED, f"{rule['alert']} queries {sorted(names - EXPORTED)}"


def test_every_dashboard_panel_queries_exported_series() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = set(SERIES_NAME.findall(target["expr"]))
            assert names, panel["title"]
            assert names <= EXPORTED, f"{panel['title']}: {sorted(names - EXPORTED)}"


def test_the_kustomization_lists_files_that_exist() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text(encoding="utf-8"))
    files = list(kustomization["resources"])
    files += [entry.split("=")[1] for gen in kustomization["configMapGenerator"] for entry in gen["files"]]
    assert all((MONITORING / name).is_file() for name in files)


def test_every_service_with_a_metrics_port_is_scraped() -> None:
    monitors = list(yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text(encoding="utf-8")))
    scraped = {
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] for monitor in monitors
    }
    assert scraped == {"metrics", "scheduler", "defrag-planner", "node-agent", "webhook"}
    assert all(
        monitor["metadata"]["name"]
        == f"tfpool-{monitor['spec']['selector']['matchLabels']['app.kubernetes.io/component']}"
        for monitor in monitors
    )
    assert all(
        endpoint["path"] == "/metrics" for monitor in monitors for endpoint in monitor["spec"]["endpoints"]
    )


def test_the_availability_alerts_select_jobs_that_are_scraped() -> None:
    monitors = yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text(encoding="utf-8"))
    # The Prometheus Operator names a ServiceMonitor's job after the Service, tfpool-<component>.
    jobs = {f"tfpool-{m['spec']['selector']['matchLabels']['app.kubernetes.io/component']}" for m in monitors}
    selected = {job for rule in alert_rules() for job in re.findall(r'job="([^"]+)"', rule["expr"])}
    assert selected
    assert selected <= jobs, sorted(selected - jobs)
