"""tfcommon.kube_local.helm: the pinned Helm is built once; a later call is a no-op that says where it is,
and a changed pin is a rebuild, never a stale binary."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tfcommon.kube_local.build import BuildError, find_go
from tfcommon.kube_local.helm import _fingerprint, ensure_helm, helm_binary, helm_tools_dir, helm_version


def test_a_built_helm_is_not_built_again_and_reports_its_version() -> None:
    ensure_helm(lambda line: None)
    lines: list[str] = []
    binary = ensure_helm(lines.append)
    assert lines == [f"Helm {helm_version()} is built: {binary}"]
    assert binary == helm_binary()
    shown = subprocess.run([str(binary), "version", "--short"], capture_output=True, text=True, check=True)
    assert shown.stdout.startswith(helm_version())


def test_the_pinned_release_is_helm_4() -> None:
    assert helm_version().startswith("v4.")


def test_a_changed_pin_changes_the_fingerprint(tmp_path: Path) -> None:
    copy = tmp_path / "helm"
    shutil.copytree(helm_tools_dir(), copy)
    go = find_go()
    before = _fingerprint(go, copy)
    (copy / "go.sum").write_text((copy / "go.sum").read_text() + "\n")
    assert _fingerprint(go, copy) != before


def test_a_checkout_without_the_module_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="TF_HELM_TOOLS"):
        ensure_helm(lambda line: None, tools=tmp_path)
