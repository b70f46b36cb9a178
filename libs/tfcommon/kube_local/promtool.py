"""Build the pinned Prometheus `promtool` from its Go module, once, into a cache outside git.

The version lives in `tools/promtool/go.mod` and its `go.sum` (a module of its own: changing it rebuilds
neither Kubernetes nor Helm). `ensure_promtool()` builds `github.com/prometheus/prometheus/cmd/promtool`
into `$TF_PROMTOOL_CACHE/<version>/bin/promtool` (default `~/.cache/tfpool/promtool`) with the control
plane's Go settings (`GOFLAGS=-mod=readonly`, `CGO_ENABLED=0`), stamped with the module version, and
writes a stamp holding the hash of the pins, the Go version and the flags; while the stamp matches it
returns at once. The alert rules' unit tests (`promtool test rules`) run it. A failed build raises
`BuildError` with the command and Go's output.

`python -m tfcommon.kube_local.promtool` is what `make promtool` runs; it prints a line per step.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tfcommon.kube_local.build import Progress, _Target, pinned_version, run_build
from tfcommon.kube_local.go_tool import PinnedGoTool, ensure_go_tool, fingerprint, require_module

PROMETHEUS_MODULE = "github.com/prometheus/prometheus"


def promtool_tools_dir() -> Path:
    """`tools/promtool` of this checkout, or `$TF_PROMTOOL_TOOLS`."""
    configured = os.environ.get("TF_PROMTOOL_TOOLS")
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / "tools" / "promtool"


def promtool_binary(tools: Path | None = None) -> Path:
    """Where `ensure_promtool` puts `promtool` of the pinned release (`$TF_PROMTOOL_CACHE` or
    `~/.cache/tfpool/promtool`, then `<version>/bin`)."""
    configured = os.environ.get("TF_PROMTOOL_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "tfpool" / "promtool"
    version = pinned_version(PROMETHEUS_MODULE, (tools or promtool_tools_dir()) / "go.mod")
    return root / version.removeprefix("v") / "bin" / "promtool"


def _target(tools: Path) -> _Target:
    version = pinned_version(PROMETHEUS_MODULE, tools / "go.mod")
    stamp = f"-s -w -X github.com/prometheus/common/version.Version={version.removeprefix('v')}"
    return _Target("promtool", tools, f"{PROMETHEUS_MODULE}/cmd/promtool", stamp)


def _tool(tools: Path) -> PinnedGoTool:
    version = pinned_version(PROMETHEUS_MODULE, tools / "go.mod")
    return PinnedGoTool(
        label=f"promtool {version}",
        tools=tools,
        binary=promtool_binary(tools),
        target=_target(tools),
        first_build="about 10 minutes",
    )


def _stamp_of(go: str, tools: Path) -> str:
    return fingerprint(go, _tool(tools))


def ensure_promtool(progress: Progress = print, *, tools: Path | None = None) -> Path:
    """Return the path of the pinned `promtool`, building it when missing or stale (concurrent callers
    wait for one another on a file lock in the cache). Raises `BuildError`."""
    tools = tools or promtool_tools_dir()
    require_module(tools, "TF_PROMTOOL_TOOLS", "tools/promtool")
    return ensure_go_tool(_tool(tools), progress)


def main() -> int:
    """`make promtool`: build promtool when missing, a line per step; exit 1 with the error on failure."""
    return run_build("make promtool", ensure_promtool)


if __name__ == "__main__":
    sys.exit(main())
