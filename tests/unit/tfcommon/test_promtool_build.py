"""tfcommon.kube_local.promtool: the pinned promtool is built once, stamped with its module version; a
changed pin means a rebuild, and a checkout without tools/promtool gets an error naming the fix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tfcommon.kube_local.build import BuildError, find_go, pinned_version
from tfcommon.kube_local.promtool import (
    PROMETHEUS_MODULE,
    _stamp_of,
    ensure_promtool,
    promtool_binary,
    promtool_tools_dir,
)


def test_a_built_promtool_is_reused_and_reports_the_pinned_version() -> None:
    first = ensure_promtool(lambda line: None)
    said: list[str] = []
    assert ensure_promtool(said.append) == first == promtool_binary()
    pinned = pinned_version(PROMETHEUS_MODULE, promtool_tools_dir() / "go.mod")
    assert said == [f"promtool {pinned} is built: {first}"]
    version = pinned.removeprefix("v")
    assert first.parent.parent.name == version
    shown = subprocess.run([str(first), "--version"], capture_output=True, text=True, check=True)
    assert f"promtool, version {version} " in shown.stdout + shown.stderr


def test_editing_the_pins_invalidates_the_stamp(tmp_path: Path) -> None:
    module = tmp_path / "promtool"
    shutil.copytree(promtool_tools_dir(), module)
    go = find_go()
    stamped = _stamp_of(go, module)
    (module / "go.sum").write_text((module / "go.sum").read_text() + "\n")
    assert _stamp_of(go, module) != stamped


def test_without_the_module_the_error_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="TF_PROMTOOL_TOOLS"):
        ensure_promtool(lambda line: None, tools=tmp_path)
