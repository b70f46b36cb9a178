"""`python -m tfagent.gpu_check`: one discovery and one sampling round through the agent's probe, as JSON.

Behind `scripts/gpu-check.sh`, so the real NVML path can be checked on any GPU machine in one step.
Exit code 0 with the report on stdout; 2 with `{"error": ...}` when NVML is unavailable or input is bad.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from tfagent.adapters.nvml import NvmlGpuProbe, NvmlUnavailableError, load_pynvml
from tfagent.adapters.simulated import FakeGpuSpecError, SimulatedGpuProbe, parse_fake_gpus
from tfagent.api import device_json
from tfagent.core.usage import build_node_usage
from tfagent.ports import GpuProbe


def check(probe: GpuProbe) -> dict[str, Any]:
    """Discover, sample once, and describe both; the probe is closed afterwards."""
    try:
        started = time.perf_counter()
        inventory = probe.discover()
        discovered = time.perf_counter()
        sample = probe.sample()
        sampled = time.perf_counter()
    finally:
        probe.close()
    usage = build_node_usage(inventory.gpus, sample, (), {})
    return {
        "node": inventory.node,
        "driver_version": inventory.driver_version,
        "cuda_version": inventory.cuda_version,
        "simulated": inventory.simulated,
        "warnings": list(inventory.warnings),
        "gpus": [device_json(gpu) for gpu in inventory.gpus],
        "tf_gpu_usage": [row.model_dump() for row in usage.gpus],
        "processes": [asdict(process) for process in sample.processes],
        "elapsed_ms": {
            "discover": round((discovered - started) * 1000, 2),
            "sample": round((sampled - discovered) * 1000, 2),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
    parser.add_argument(
        "--fake-gpus", metavar="MODEL:N[,MODEL:N]", help="check simulated GPUs instead of NVML"
    )
    parser.add_argument("--node", default=socket.gethostname().lower(), help="node name to report")
    args = parser.parse_args(argv)
    try:
        probe: GpuProbe = (
            SimulatedGpuProbe(args.node, parse_fake_gpus(args.fake_gpus))
            if args.fake_gpus
            else NvmlGpuProbe(load_pynvml(), args.node)
        )
    except (NvmlUnavailableError, FakeGpuSpecError) as error:
        sys.stdout.write(json.dumps({"error": str(error)}, indent=2) + "\n")
        return 2
    sys.stdout.write(json.dumps(check(probe), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
