"""`tfctl serve` with a broken configuration file or bad settings: every service exits with code 2 within
seconds and one clear line naming the field and the fix, never a traceback and never a hang. The matrix
runs the command in-process (a subprocess costs seconds of imports); one case runs the real process.

NATS and Postgres point at closed ports: a service that went on to connect instead of refusing its
configuration would wait for them and fail the time limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tfctl.main import main as tfctl_main

SERVICES = ("webhook", "scheduler", "defrag-planner", "node-agent", "metrics")
DEADLINE_S = 15.0
UNREACHABLE = {
    "TF_NATS_URL": "nats://127.0.0.1:9",
    "TF_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:9/tfpool",
}
BROKEN_CONFIGS = {
    "invalid YAML": ("gpuPools: [\n  - name: a\n", "not valid YAML"),
    "top level a list": ("- gpuPools\n", "top level must be a mapping"),
    "wrong type": ("webhook:\n  takeoverFullCacheSeconds: soon\n", "webhook.takeoverFullCacheSeconds"),
    "unknown pool field": ("gpuPools:\n  - name: a\n    colour: red\n", "gpuPools[0].colour"),
    "bad pool name": ("gpuPools:\n  - name: 'GPU pool!'\n", "not a valid pool name"),
    "bad resource name": ("nativeGpuResourceNames: [gpus]\n", "device-plugin resource name"),
}
BAD_SETTINGS = {
    "port not a number": ({"TF_PORT": "eighty"}, "TF_PORT"),
    "database URL not a URL": ({"TF_DATABASE_URL": "localhost:5432"}, "TF_DATABASE_URL"),
    "pool size zero": ({"TF_DATABASE__POOL_SIZE": "0"}, "TF_DATABASE_POOL_SIZE"),
    "price list not JSON": ({"TF_GPU_COST_PER_HOUR": "{H100: 2.49"}, "TF_GPU_COST_PER_HOUR"),
    "agent models not JSON": ({"TF_GPU_MODELS": "[{name: X9"}, "TF_GPU_MODELS"),
}
SETTINGS_SERVICE = {"price list not JSON": "metrics", "agent models not JSON": "node-agent"}


@dataclass(frozen=True)
class Refusal:
    exit_code: int
    stderr: str
    elapsed_s: float


def serve_in_process(
    service: str, tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> Refusal:
    """`tfctl serve SERVICE` in this process with exactly `env` as its TF_* settings."""
    for key in [key for key in os.environ if key.startswith("TF_")]:
        monkeypatch.delenv(key)
    for key, value in {**UNREACHABLE, "TF_NODE_NAME": "robust-node", "TF_FAKE_GPUS": "H100:1", **env}.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    exit_code = tfctl_main(["serve", service, "--state-dir", str(tmp_path / "state")])
    return Refusal(exit_code, capsys.readouterr().err, time.monotonic() - started)


def assert_refused(refusal: Refusal, names: str) -> None:
    assert refusal.exit_code == 2, refusal.stderr
    assert names in refusal.stderr
    assert refusal.elapsed_s < DEADLINE_S


@pytest.mark.parametrize(
    ("service", "case"),
    [(service, "invalid YAML") for service in SERVICES]
    + [(SERVICES[index % len(SERVICES)], case) for index, case in enumerate(BROKEN_CONFIGS) if index],
)
def test_a_broken_configuration_file_is_refused_naming_the_field(
    service: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    text, names = BROKEN_CONFIGS[case]
    config_file = tmp_path / "tfpool.yaml"
    config_file.write_text(text)

    refusal = serve_in_process(service, tmp_path, {"TF_CONFIG_FILE": str(config_file)}, monkeypatch, capsys)

    assert_refused(refusal, names)
    assert "TF_CONFIG_FILE" in refusal.stderr
    assert str(config_file) in refusal.stderr


def test_a_missing_configuration_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    env = {"TF_CONFIG_FILE": str(tmp_path / "absent.yaml")}

    refusal = serve_in_process("scheduler", tmp_path, env, monkeypatch, capsys)

    assert_refused(refusal, "cannot read the configuration file")


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_a_bad_setting_is_refused_naming_the_variable(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    env, names = BAD_SETTINGS[case]

    refusal = serve_in_process(SETTINGS_SERVICE.get(case, "scheduler"), tmp_path, env, monkeypatch, capsys)

    assert_refused(refusal, names)


def test_the_process_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    config_file = tmp_path / "tfpool.yaml"
    config_file.write_text("gpuPools:\n  - name: a\n    colour: red\n")
    clean = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
    started = time.monotonic()

    finished = subprocess.run(
        [sys.executable, "-m", "tfctl.main", "serve", "webhook", "--state-dir", str(tmp_path / "state")],
        env={**clean, **UNREACHABLE, "TF_CONFIG_FILE": str(config_file)},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S + 5,
        check=False,
    )

    assert finished.returncode == 2
    assert "Traceback" not in finished.stdout + finished.stderr
    expected = f"TF_CONFIG_FILE: {config_file}: gpuPools[0].colour: Extra inputs are not permitted"
    assert finished.stderr.strip().splitlines() == [f"tfctl serve webhook: {expected}"]
    assert time.monotonic() - started < DEADLINE_S
