"""Build the pinned Helm release from its Go module, once, into a cache outside git.

The version lives in `tools/helm/go.mod` and its `go.sum` (a module of its own, so that changing Helm
never rebuilds the Kubernetes control plane of `tools/kubernetes`). `ensure_helm()` builds
`helm.sh/helm/v4/cmd/helm` into `$TF_HELM_CACHE/<helm version>/bin/helm` (default
`~/.cache/tfpool/helm`) with the same Go settings as the control plane (`GOFLAGS=-mod=readonly`,
`CGO_ENABLED=0`), stamped with its release version, and writes a stamp holding the hash of the pins, the
Go version and the flags; while the stamp matches, it returns at once. A failed build raises
`BuildError` with the command and Go's output.

`python -m tfcommon.kube_local.helm` is what `make helm` runs; it prints a line per step.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tfcommon.kube_local.build import Progress, _Target, pinned_version, run_build
from tfcommon.kube_local.go_tool import PinnedGoTool, ensure_go_tool, fingerprint, require_module

HELM_MODULE = "helm.sh/helm/v4"


def helm_tools_dir() -> Path:
    """`tools/helm` of this checkout, or `$TF_HELM_TOOLS`."""
    configured = os.environ.get("TF_HELM_TOOLS")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "tools" / "helm"


def helm_cache_root() -> Path:
    """Where built Helm releases live: `$TF_HELM_CACHE`, else `~/.cache/tfpool/helm`."""
    configured = os.environ.get("TF_HELM_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tfpool" / "helm"


def helm_version(tools: Path | None = None) -> str:
    """The pinned Helm release, with its `v` (e.g. `v4.3.2`)."""
    return pinned_version(HELM_MODULE, (tools or helm_tools_dir()) / "go.mod")


def helm_binary(tools: Path | None = None) -> Path:
    """Where `ensure_helm` puts the `helm` program of the pinned release."""
    return helm_cache_root() / helm_version(tools).removeprefix("v") / "bin" / "helm"


def _target(tools: Path) -> _Target:
    stamp = f"-s -w -X {HELM_MODULE}/internal/version.version={helm_version(tools)}"
    stamp += f" -X {HELM_MODULE}/internal/version.gitTreeState=clean"
    return _Target("helm", tools, f"{HELM_MODULE}/cmd/helm", stamp)


def _tool(tools: Path) -> PinnedGoTool:
    return PinnedGoTool(
        label=f"Helm {helm_version(tools)}",
        tools=tools,
        binary=helm_binary(tools),
        target=_target(tools),
        first_build="5-10 minutes",
    )


def _fingerprint(go: str, tools: Path) -> str:
    return fingerprint(go, _tool(tools))


def ensure_helm(progress: Progress = print, *, tools: Path | None = None) -> Path:
    """Return the path of the pinned `helm`, building it when missing or stale.

    Concurrent callers wait for one another (a file lock in the cache). Raises `BuildError`."""
    tools = tools or helm_tools_dir()
    require_module(tools, "TF_HELM_TOOLS", "tools/helm")
    return ensure_go_tool(_tool(tools), progress)


def main() -> int:
    """`make helm`: build Helm when missing, a line per step; exit 1 with the error on failure."""
    return run_build("make helm", ensure_helm)


if __name__ == "__main__":
    sys.exit(main())
