"""The default alert rules pass Prometheus's own checks, and the availability alerts fire on an outage and
stay quiet otherwise: `promtool check rules` and `promtool test rules` (the pinned Prometheus of
tools/promtool, built by `make promtool`) on k8s/base/monitoring/prometheusrule.yaml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tfcommon.kube_local.promtool import ensure_promtool

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS_RULE = REPO_ROOT / "k8s" / "base" / "monitoring" / "prometheusrule.yaml"
CASES = Path(__file__).resolve().parent / "promtool"


@pytest.fixture(scope="module")
def promtool() -> str:
    return str(ensure_promtool(lambda line: print(line, file=sys.stderr, flush=True)))


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The PrometheusRule's spec as a plain rules file, rules.yaml, next to copies of the test files."""
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False), encoding="utf-8")
    for case in CASES.glob("*_test.yaml"):
        shutil.copy(case, tmp_path / case.name)
    return tmp_path


def run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def availability_alerts() -> set[str]:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    return {
        entry["alert"]
        for group in rule["spec"]["groups"]
        if group["name"] == "tfpool.availability"
        for entry in group["rules"]
    }


def test_promtool_accepts_every_rule(promtool: str, rules_dir: Path) -> None:
    checked = run(promtool, "check", "rules", "rules.yaml", cwd=rules_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_each_availability_alert_fires_on_an_outage_and_not_otherwise(promtool: str, rules_dir: Path) -> None:
    files = sorted(path.name for path in rules_dir.glob("*_test.yaml"))
    assert files
    tested = run(promtool, "test", "rules", *files, cwd=rules_dir)
    assert tested.returncode == 0, tested.stdout + tested.stderr

    firing: set[str] = set()
    quiet: set[str] = set()
    for name in files:
        suite: dict[str, Any] = yaml.safe_load((rules_dir / name).read_text(encoding="utf-8"))
        for case in suite["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = availability_alerts()
    assert alerts == {
        "TfpoolWebhookDown",
        "TfpoolSchedulerLeaderMissing",
        "TfpoolNodeAgentDown",
        "TfpoolWebhookLatencyNearTimeout",
        "TfpoolConsumerLag",
    }
    assert alerts <= firing, f"no case fires {sorted(alerts - firing)}"
    assert alerts <= quiet, f"no case keeps {sorted(alerts - quiet)} quiet"


def test_promtool_test_rules_fails_when_an_alert_does_not_fire(promtool: str, rules_dir: Path) -> None:
    # The cases are not vacuous: with the webhook alert waiting an hour, past the test's horizon, its
    # firing cases fail.
    spec = yaml.safe_load((rules_dir / "rules.yaml").read_text(encoding="utf-8"))
    webhook_down = next(
        entry
        for group in spec["groups"]
        for entry in group["rules"]
        if entry.get("alert") == "TfpoolWebhookDown"
    )
    webhook_down["for"] = "1h"
    (rules_dir / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    tested = run(promtool, "test", "rules", "availability_test.yaml", cwd=rules_dir)
    assert tested.returncode != 0
    assert "TfpoolWebhookDown" in tested.stdout + tested.stderr
