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

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from tfcommon.kube_local.build import (
    BuildError,
    Progress,
    _build_one,
    _go_environment,
    _locked,
    _Target,
    find_go,
    pinned_version,
    run_build,
)

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


def _fingerprint(go: str, tools: Path) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update(name.encode())
        digest.update((tools / name).read_bytes())
    go_version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    digest.update(go_version.encode())
    environment = _go_environment()
    target = _target(tools)
    digest.update(repr((target.package, target.ldflags, environment["GOFLAGS"])).encode())
    digest.update(environment["CGO_ENABLED"].encode())
    return digest.hexdigest()


def ensure_helm(progress: Progress = print, *, tools: Path | None = None) -> Path:
    """Return the path of the pinned `helm`, building it when missing or stale.

    Concurrent callers wait for one another (a file lock in the cache). Raises `BuildError`."""
    tools = tools or helm_tools_dir()
    if not (tools / "go.mod").exists():
        raise BuildError(f"{tools}/go.mod not found: set TF_HELM_TOOLS to the checkout's tools/helm")
    version = helm_version(tools)
    binary = helm_binary(tools)
    out_dir = binary.parent
    stamp = out_dir / ".stamp"
    go = find_go()
    fingerprint = _fingerprint(go, tools)
    with _locked(out_dir.parent / ".lock"):
        if binary.exists() and stamp.exists() and stamp.read_text().strip() == fingerprint:
            progress(f"Helm {version} is built: {binary}")
            return binary
        progress(
            f"building Helm {version} ({HELM_MODULE}/cmd/helm) from {tools} into {out_dir} with {go}: "
            "the first time takes 5-10 minutes on 2 cores"
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp.unlink(missing_ok=True)
        started = time.monotonic()
        _build_one(go, _target(tools), out_dir, progress)
        stamp.write_text(fingerprint + "\n")
        progress(f"built Helm {version} in {time.monotonic() - started:.0f}s")
    return binary


def main() -> int:
    """`make helm`: build Helm when missing, a line per step; exit 1 with the error on failure."""
    return run_build("make helm", ensure_helm)


if __name__ == "__main__":
    sys.exit(main())
