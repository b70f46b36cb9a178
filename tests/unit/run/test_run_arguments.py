"""`tfctl run` arguments: bad input gets exit code 2 and a message naming the flag and the fix;
the agent of the chosen node is found from the flags, `TF_AGENT_URLS` or `tfctl up`'s endpoints file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tfctl.commands.run import RunError, agent_url_for, plan_from_args
from tfctl.main import build_parser, main


def _plan_args(*argv: str) -> list[str]:
    return ["run", "--tflops", "20", "--vram", "16Gi", *argv]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["run", "--tflops", "lots", "--vram", "16Gi", "--", "true"], "--tflops", id="tflops"),
        pytest.param(["run", "--tflops", "20", "--vram", "16 gigs", "--", "true"], "--vram", id="vram"),
        pytest.param(_plan_args("--gpus", "0", "--", "true"), "--gpus 0", id="gpus"),
        pytest.param(_plan_args(), "no command given", id="no command"),
        pytest.param(_plan_args("--tflops-limit", "10", "--", "true"), "--tflops-limit", id="limit below"),
        pytest.param(_plan_args("--agent-url", "http://x:8001", "--", "true"), "NODE=URL", id="agent url"),
        pytest.param(_plan_args("-e", "NOVALUE", "--", "true"), "NAME=VALUE", id="env"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_submission_carries_the_request_and_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_API_TOKEN", "secret")
    monkeypatch.setenv("SOME_SETTING", "kept")
    args = build_parser().parse_args(
        _plan_args(
            "--gpus", "2", "--qos", "high", "--isolation", "hard", "--", "python", "train.py", "--lr", "1"
        )
    )

    plan = plan_from_args(args)

    assert plan.argv == ("python", "train.py", "--lr", "1")
    assert plan.submission["request"] == {
        "pool": "default",
        "gpu_count": 2,
        "tflops_request_milli": 20_000,
        "tflops_limit_milli": 20_000,
        "vram_request_bytes": 16 * 1024**3,
        "vram_limit_bytes": 16 * 1024**3,
        "qos": "high",
        "isolation": "hard",
    }
    assert plan.env["SOME_SETTING"] == "kept"
    assert "TF_API_TOKEN" not in plan.env
    assert plan.token == "secret"


def test_the_agent_url_comes_from_flags_first_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_AGENT_URLS", "node-a=http://a:1/, node-b=http://b:2")
    args = build_parser().parse_args(_plan_args("--agent-url", "node-b=http://flag:3", "--", "true"))

    plan = plan_from_args(args)

    assert agent_url_for("node-a", plan) == "http://a:1"
    assert agent_url_for("node-b", plan) == "http://flag:3"


def test_the_agent_url_of_a_tfctl_up_stack_comes_from_its_endpoints_file(tmp_path: Path) -> None:
    services = [
        {"name": "scheduler", "service": "scheduler", "url": "http://127.0.0.1:8080", "node": None},
        {
            "name": "node-agent-sim-node-2",
            "service": "node-agent",
            "url": "http://127.0.0.1:8002",
            "node": "sim-node-2",
        },
    ]
    (tmp_path / "endpoints.json").write_text(json.dumps({"services": services}))
    plan = plan_from_args(build_parser().parse_args(_plan_args("--state-dir", str(tmp_path), "--", "true")))

    assert agent_url_for("sim-node-2", plan) == "http://127.0.0.1:8002"
    with pytest.raises(
        RunError, match=r"no agent URL known for node sim-node-9: pass --agent-url sim-node-9="
    ):
        agent_url_for("sim-node-9", plan)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--vram", "8"], "tfctl run: --vram 8: give a unit, e.g. 8Gi\n", id="vram"),
        pytest.param(
            ["--vram", "8Gi", "--vram-limit", "16"],
            "tfctl run: --vram-limit 16: give a unit, e.g. 16Gi\n",
            id="limit",
        ),
    ],
)
def test_a_vram_without_unit_exits_2_asking_for_one(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--tflops", "20", *argv, "--", "true"]) == 2
    assert capsys.readouterr().err == message
