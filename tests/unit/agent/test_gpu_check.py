"""`gpu-check`: one discovery and one sampling round as JSON, and a clear error when it cannot run."""

from __future__ import annotations

import json

import pytest
from fake_nvml import FakeDriver, FakeGpu, fake_pynvml
from tfagent.adapters.nvml import NvmlGpuProbe
from tfagent.gpu_check import check, main


def test_reports_devices_usage_and_processes_from_nvml_and_closes_it() -> None:
    driver = FakeDriver(gpus=[FakeGpu(uuid="GPU-AAAA", utilization=30, processes=[(77, 1024)])])
    module = fake_pynvml(driver)
    module.nvmlInit()

    report = check(NvmlGpuProbe(module, "gpu-host"))

    assert (report["node"], report["driver_version"], report["simulated"]) == ("gpu-host", "570.86.15", False)
    assert [gpu["uuid"] for gpu in report["gpus"]] == ["gpu-aaaa"]
    assert report["tf_gpu_usage"][0]["compute_percentage"] == 30.0
    assert report["processes"] == [
        {"gpu_uuid": "gpu-aaaa", "pid": 77, "memory_used_bytes": 1024, "compute_percent": None}
    ]
    assert set(report["elapsed_ms"]) == {"discover", "sample"}
    assert driver.shutdowns == 1
    json.dumps(report)


def test_simulated_gpus_print_json_marked_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fake-gpus", "L4:2", "--node", "laptop"]) == 0

    report = json.loads(capsys.readouterr().out)
    assert report["simulated"] is True
    assert [gpu["model"] for gpu in report["gpus"]] == ["L4", "L4"]


def test_a_bad_fake_gpus_value_prints_an_error_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fake-gpus", "L4"]) == 2

    assert "MODEL:COUNT" in json.loads(capsys.readouterr().out)["error"]
