"""The commands a user copies from the operator guides (docs/guides/*.md), and the rule that checks each.

A command is a `$ ` line of a ```console block (the lines after it are sample output) or any line of a
```bash / ```sh block; a trailing backslash continues it, and a trailing `# exits N` comment says the
exit code the guide documents (0 otherwise). Each command is checked by exactly one rule; a command no
rule covers is a test failure naming the guide and line. This module only reads files: the tests run
the commands.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
GUIDES = REPO_ROOT / "docs" / "guides"
GUIDE_ORDER = ("migrate-existing-workloads.md", "move-workloads.md", "alerts.md", "model-cache.md")
"""The order a reader goes through them; the local-stack test runs the tfctl commands in this order."""

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
COMMAND_BLOCKS = {"console", "bash", "sh", "shell"}
EXIT_COMMENT = re.compile(r"\s+#\s*exits\s+(\d+)\s*$")

KUBECTL_PARSED_VERBS = {
    "get", "describe", "cordon", "uncordon", "drain", "delete", "exec", "logs", "rollout", "wait", "top",
}  # fmt: skip
"""Verbs that need a cluster: checked offline (verb, flags and resource types must be kubectl's)."""
KUBECTL_LOCAL_VERBS = {"label", "annotate", "patch"}
"""Verbs run for real offline, with `--local -f` on the object the command names."""

LOCAL_STACK_PORTS = {"8080": "scheduler", "8070": "defrag-planner", "8090": "metrics"}
"""`tfctl up --ports fixed` ports, by service: curl commands are run against the stack on these."""


@dataclass(frozen=True)
class GuideCommand:
    """One command of a guide: where it is, its text without the exit comment, and its exit code."""

    guide: str
    line: int
    text: str
    expected_exit: int

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def where(self) -> str:
        return f"docs/guides/{self.guide}:{self.line}: {self.text}"


def commands_in(text: str, guide: str) -> list[GuideCommand]:
    """Every command in the fenced command blocks of a guide's markdown text."""
    found: list[GuideCommand] = []
    block: str | None = None
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(raw)
        if fence:
            block = None if block is not None else fence.group(2).lower()
            continue
        if block not in COMMAND_BLOCKS:
            continue
        line = raw.strip()
        if pending is not None:
            start, joined = pending
            pending = None
        elif block == "console":
            if not line.startswith("$ "):
                continue
            start, joined = number, ""
            line = line[2:]
        else:
            if not line or line.startswith("#"):
                continue
            start, joined = number, ""
        if line.endswith("\\"):
            pending = (start, joined + line[:-1].rstrip() + " ")
            continue
        found.append(_command(guide, start, joined + line))
    return found


def _command(guide: str, line: int, text: str) -> GuideCommand:
    exit_comment = EXIT_COMMENT.search(text)
    if exit_comment is None:
        return GuideCommand(guide, line, text.strip(), 0)
    return GuideCommand(guide, line, text[: exit_comment.start()].strip(), int(exit_comment.group(1)))


def guide_commands() -> list[GuideCommand]:
    """The commands of every guide, guides in reading order."""
    paths = sorted(GUIDES.glob("*.md"), key=lambda path: (_rank(path.name), path.name))
    return [command for path in paths for command in commands_in(path.read_text(encoding="utf-8"), path.name)]


def _rank(name: str) -> int:
    return GUIDE_ORDER.index(name) if name in GUIDE_ORDER else len(GUIDE_ORDER)


def rule_for(command: GuideCommand) -> str | None:
    """The name of the rule that checks this command, or None when no rule covers it."""
    argv = command.argv
    program = Path(argv[0]).name
    if program == "tfctl":
        return "tfctl up" if argv[1:2] == ["up"] else "tfctl on the local stack"
    if program == "kubectl" and len(argv) > 1:
        verb = argv[1]
        if verb == "kustomize":
            return "kubectl kustomize"
        if verb == "apply":
            return "kubectl apply"
        if verb in KUBECTL_LOCAL_VERBS or (verb == "create" and "--dry-run=client" in argv):
            return "kubectl offline"
        if verb in KUBECTL_PARSED_VERBS:
            return "kubectl parsed"
    if program == "curl" and local_stack_port(command) is not None:
        return "curl on the local stack"
    if program == "pytest":
        return "pytest"
    return None


def local_stack_port(command: GuideCommand) -> str | None:
    """The fixed local-stack port a curl command reads, when it reads one."""
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", command.text)
    if match is None or match.group(1) not in LOCAL_STACK_PORTS:
        return None
    return match.group(1)


def of_rule(rule: str, commands: Iterable[GuideCommand] | None = None) -> list[GuideCommand]:
    """The guides' commands that one rule checks."""
    return [command for command in (commands or guide_commands()) if rule_for(command) == rule]
