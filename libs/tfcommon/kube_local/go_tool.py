"""Build one pinned Go program (Helm, promtool) from a module of its own under `tools/`, once, into a cache.

`ensure_go_tool(tool)` builds `tool.target` into `tool.binary`'s folder with the control plane's Go
settings (`tfcommon.kube_local.build`) and writes a stamp there: the hash of the module's `go.mod` and
`go.sum`, the Go version, the package, the link flags, `GOFLAGS` and `CGO_ENABLED`. While the stamp
matches it returns at once; a changed pin is a rebuild, never a stale binary. Concurrent callers wait
for one another on a file lock in the cache. A failed build raises `BuildError`.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tfcommon.kube_local.build import (
    BuildError,
    Progress,
    _build_one,
    _go_environment,
    _locked,
    _Target,
    find_go,
)


@dataclass(frozen=True)
class PinnedGoTool:
    """A program built from `tools` (its `go.mod` pins the release) into `binary`.

    `label` names it in progress lines ("Helm v4.3.2"); `first_build` says how long the first build
    takes, for the user."""

    label: str
    tools: Path
    binary: Path
    target: _Target
    first_build: str


def fingerprint(go: str, tool: PinnedGoTool) -> str:
    """What the stamp holds: a changed pin, Go release or build flag gives another value."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update(name.encode())
        digest.update((tool.tools / name).read_bytes())
    go_version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    digest.update(go_version.encode())
    environment = _go_environment()
    digest.update(repr((tool.target.package, tool.target.ldflags, environment["GOFLAGS"])).encode())
    digest.update(environment["CGO_ENABLED"].encode())
    return digest.hexdigest()


def require_module(tools: Path, setting: str, checkout_path: str) -> None:
    """Raise `BuildError` naming `setting` (which points at the checkout's `checkout_path`) when `tools`
    holds no Go module."""
    if not (tools / "go.mod").exists():
        raise BuildError(f"{tools}/go.mod not found: set {setting} to the checkout's {checkout_path}")


def ensure_go_tool(tool: PinnedGoTool, progress: Progress = print) -> Path:
    """Return `tool.binary`, building it when missing or stale. Raises `BuildError`."""
    out_dir = tool.binary.parent
    stamp = out_dir / ".stamp"
    go = find_go()
    wanted = fingerprint(go, tool)
    with _locked(out_dir.parent / ".lock"):
        if tool.binary.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
            progress(f"{tool.label} is built: {tool.binary}")
            return tool.binary
        progress(
            f"building {tool.label} ({tool.target.package}) from {tool.tools} into {out_dir} with {go}: "
            f"the first time takes {tool.first_build} on 2 cores"
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp.unlink(missing_ok=True)
        started = time.monotonic()
        _build_one(go, tool.target, out_dir, progress)
        stamp.write_text(wanted + "\n")
        progress(f"built {tool.label} in {time.monotonic() - started:.0f}s")
    return tool.binary
