"""tfcommon.kube_local.build: the pinned control plane is built once; while the stamp matches, a later call
builds nothing and says where it is, and a changed pin is a rebuild, never a stale binary."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tfcommon.kube_local.build import (
    PROGRAMS,
    BuildError,
    _fingerprint,
    bin_dir,
    ensure_binaries,
    find_go,
    kubernetes_version,
    kwok_stages_file,
    tools_dir,
)


def test_a_second_call_with_a_matching_stamp_builds_nothing() -> None:
    built = ensure_binaries(lambda line: None)
    stamp = (built / ".stamp").read_text()
    files = [built / program for program in PROGRAMS] + [kwok_stages_file(built)]
    before = {path: path.stat().st_mtime_ns for path in files}

    lines: list[str] = []
    again = ensure_binaries(lines.append)

    assert again == built == bin_dir()
    assert lines == [f"Kubernetes {kubernetes_version()} control plane is built: {built}"]
    assert {path: path.stat().st_mtime_ns for path in files} == before, "no program written again"
    assert (built / ".stamp").read_text() == stamp
    assert stamp.strip() == _fingerprint(find_go(), tools_dir())
    shown = subprocess.run([str(built / "kube-apiserver"), "--version"], capture_output=True, text=True)
    assert shown.stdout.strip() == f"Kubernetes v{kubernetes_version()}"


def test_a_changed_pin_changes_the_fingerprint(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(tools_dir(), copy)
    go = find_go()
    before = _fingerprint(go, copy)
    (copy / "go.sum").write_text((copy / "go.sum").read_text() + "\n")
    assert _fingerprint(go, copy) != before


def test_a_checkout_without_the_module_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="TF_K8S_TOOLS"):
        ensure_binaries(lambda line: None, tools=tmp_path)
