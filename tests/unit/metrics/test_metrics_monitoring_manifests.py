"""The PrometheusRule and the Grafana dashboard in k8s/ only query series the metrics service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from tfmetrics.core.series import SERIES
from tfmetrics.exporter import SYSTEM_COUNTERS

MONITORING = Path(__file__).resolve().parents[3] / "k8s" / "base" / "monitoring"
EXPORTED = set(SERIES) | {f"{name}_total" for name in SYSTEM_COUNTERS}
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
    }
    for rule in rules:
        names = set(SERIES_NAME.findall(rule["expr"]))
        assert names, rule["alert"]
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
