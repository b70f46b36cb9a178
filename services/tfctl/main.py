"""`tfctl` entry point: builds the argument parser from every module in `tfctl.commands`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import tfctl.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfctl", description="GPU pooling control plane")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(tfctl.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tfctl.commands.{module_info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; its return value is the exit code."""
    args = build_parser().parse_args(argv)
    exit_code: int = args.handler(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
