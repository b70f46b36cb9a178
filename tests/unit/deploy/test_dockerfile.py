"""The Dockerfile: hadolint-clean, slim and pinned, non-root, no build tools at run time, `tfctl` entry."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from deploy_support import REPO_ROOT, VENV_BIN

DOCKERFILE = REPO_ROOT / "Dockerfile"
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "clang", "libpq-dev", "python3-dev", "git")


@dataclass
class Stage:
    """One `FROM` block: its base, its name and its instructions as (KEYWORD, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def arguments(self, keyword: str) -> list[str]:
        return [arguments for found, arguments in self.instructions if found == keyword]


def logical_lines(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def build_args() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in logical_lines(DOCKERFILE.read_text()):
        if line.startswith("FROM"):
            break
        match = re.fullmatch(r"ARG (\w+)=(\S+)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def stages() -> list[Stage]:
    arguments = build_args()
    parsed: list[Stage] = []
    for line in logical_lines(DOCKERFILE.read_text()):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), flags=re.IGNORECASE)
            assert match, line
            base = re.sub(r"\$\{(\w+)\}", lambda m: arguments[m.group(1)], match.group(1))
            parsed.append(Stage(base=base, name=match.group(2)))
        elif parsed:
            parsed[-1].instructions.append((keyword.upper(), rest.strip()))
    return parsed


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "hadolint"), "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hadolint_finds_nothing() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_an_unpinned_root_image(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\n")
    result = hadolint(careless)
    assert result.returncode != 0
    assert "DL3007" in result.stdout


def test_is_multi_stage_on_a_pinned_slim_python_311_base() -> None:
    parsed = stages()
    assert len(parsed) >= 2
    for stage in parsed:
        assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", stage.base), stage.base


def test_final_stage_runs_tfctl_as_an_unprivileged_user() -> None:
    final = stages()[-1]
    (user,) = final.arguments("USER")
    assert user.split(":")[0] not in ("root", "0")
    assert int(user.split(":")[0]) >= 1000
    assert json.loads(final.arguments("ENTRYPOINT")[-1]) == ["tfctl"]


def test_final_stage_has_no_build_tools_and_installs_nothing_itself() -> None:
    final = stages()[-1]
    commands = " ".join(final.arguments("RUN")).lower()
    for tool in BUILD_TOOLS:
        assert not re.search(rf"\b{re.escape(tool)}\b", commands), tool
    assert "pip install" not in commands
    assert "apt-get install" not in commands
    copies = final.arguments("COPY")
    assert copies
    assert all(copy.startswith("--from=") for copy in copies), "the final stage copies only built output"


def test_builder_installs_the_locked_runtime_requirements_then_the_project() -> None:
    builder = stages()[0]
    runs = builder.arguments("RUN")
    lock_step = next(i for i, run in enumerate(runs) if "--constraint requirements.lock" in run)
    project_step = next(i for i, run in enumerate(runs) if re.search(r"pip install --no-deps \.", run))
    assert lock_step < project_step


def test_runtime_section_of_requirements_is_fully_pinned_by_the_lock() -> None:
    text = (REPO_ROOT / "requirements.in").read_text()
    section = re.search(r"^# runtime\n(.*?)^# tests", text, flags=re.DOTALL | re.MULTILINE)
    assert section, "requirements.in needs the '# runtime' and '# tests' markers the Dockerfile relies on"
    runtime = [re.split(r"[\[=<>;]", line)[0] for line in section.group(1).splitlines() if line.strip()]
    pinned = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (REPO_ROOT / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    assert runtime
    assert [name for name in runtime if name.lower().replace("_", "-") not in pinned] == []
    assert "pytest" not in [name.lower() for name in runtime]


def test_build_context_leaves_out_local_state_and_secrets() -> None:
    rules = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "**", "exclude everything, then allow what the build needs"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "requirements.in",
        "requirements.lock",
        "libs",
        "services",
    }


def docker_context_paths() -> list[str]:
    rules = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    return [rule[1:].rstrip("/") for rule in rules if rule.startswith("!")]


def test_build_context_installs_into_a_wheel_with_every_module_and_data_file(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache", "*.egg-info")
    for relative in docker_context_paths():
        source = REPO_ROOT / relative
        if source.is_dir():
            shutil.copytree(source, context / relative, ignore=skip)
        else:
            shutil.copy2(source, context / relative)
    result = subprocess.run(
        [str(VENV_BIN / "pip"), "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", str(context), "--wheel-dir", str(tmp_path / "wheels")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("tfpool-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packaged = set(archive.namelist())
        entry_points = next(name for name in packaged if name.endswith(".dist-info/entry_points.txt"))
        assert "tfctl = tfctl.main:main" in archive.read(entry_points).decode()
    shipped = {
        str(path.relative_to(context / root))
        for root in ("libs", "services")
        for path in (context / root).rglob("*")
        if path.is_file() and path.suffix != ".pyi"
    }
    assert shipped - packaged == set(), "files the image would lack (package-data in pyproject.toml)"
