"""`tfctl`'s entry point: a command imports only its own modules, `tfctl --help` lists every command with
the help its module registers, and the lazily built parser reads a command line as the full one does."""

from __future__ import annotations

import argparse
import json
import pkgutil
import subprocess
import sys

import pytest
import tfctl.commands
from tfctl.main import COMMANDS, build_parser, parser_for

HEAVY = (
    "kubernetes",
    "kubernetes_asyncio",
    "sqlalchemy",
    "alembic",
    "fastapi",
    "uvicorn",
    "nats",
    "tfwebhook",
)
"""Packages a command that only reads the scheduler's API or prints help has no use for (each costs
0.1-0.6 s to import)."""

LOADED_AFTER = """
import json, sys
from tfctl.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["get", "pools", "--scheduler-url", "http://127.0.0.1:9"],
        ["get", "workloads", "--scheduler-url", "http://127.0.0.1:9"],
        ["delete", "workload", "llm", "--scheduler-url", "http://127.0.0.1:9"],
        ["cordon", "sim-node-1", "--scheduler-url", "http://127.0.0.1:9"],
        [
            "label",
            "node",
            "sim-node-1",
            "tensor-fusion.ai/do-not-disrupt=true",
            "--scheduler-url",
            "http://127.0.0.1:9",
        ],
    ],
)
def test_help_and_the_commands_that_only_call_the_scheduler_import_nothing_heavy(argv: list[str]) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", LOADED_AFTER, *argv], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(ran.stdout.strip().splitlines()[-1]))

    assert loaded.isdisjoint(HEAVY), f"tfctl {' '.join(argv)} imported {sorted(loaded & set(HEAVY))}"


def test_every_command_module_is_in_the_table_and_registers_the_help_the_table_shows() -> None:
    modules = {info.name for info in pkgutil.iter_modules(tfctl.commands.__path__)}
    listed = [module for _help, command_modules in COMMANDS.values() for module in command_modules]
    assert sorted(listed) == sorted(modules), "add the new command module to COMMANDS in tfctl/main.py"

    registered = {action.dest: action.help for action in _subcommands(build_parser())._choices_actions}
    expected = {command: help_text for command, (help_text, _modules) in COMMANDS.items()}
    assert registered == expected, "the help in COMMANDS (tfctl/main.py) must be the one the module registers"


@pytest.mark.parametrize(
    "argv",
    [
        ["get", "workloads", "-n", "ml-serving", "--json"],
        ["delete", "workload", "llm", "other", "-n", "ml-serving", "--no-replace"],
        ["uncordon", "sim-node-1", "sim-node-2"],
        ["label", "gpunode", "sim-node-1", "tensor-fusion.ai/do-not-disrupt-"],
        ["events", "tail", "--count", "1", "--state-dir", "/tmp/state"],
        ["sim", "defrag", "--nodes", "n.csv", "--pods", "p.csv"],
        ["bench", "faults"],
    ],
)
def test_the_lazy_parser_reads_a_command_line_as_the_full_one(argv: list[str]) -> None:
    lazy = vars(parser_for(argv).parse_args(argv))
    full = vars(build_parser().parse_args(argv))

    assert lazy == full


def test_a_mistyped_command_is_refused_naming_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser_for(["cordn", "sim-node-1"]).parse_args(["cordn", "sim-node-1"])

    assert exit_info.value.code == 2
    assert "invalid choice: 'cordn'" in capsys.readouterr().err
