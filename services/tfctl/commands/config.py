"""`tfctl config doc [--check]`: regenerate the README's configuration table from the settings classes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="configuration reference")
    actions = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    doc = actions.add_parser("doc", help="rewrite the configuration table in README.md")
    doc.add_argument("--readme", type=Path, default=Path("README.md"), help="README to update")
    doc.add_argument("--check", action="store_true", help="exit 1 when the README is out of date")
    doc.set_defaults(handler=write_doc)


def write_doc(args: argparse.Namespace) -> int:
    from tfctl.settings_doc import rewrite_readme  # imports every service: only when asked

    readme: Path = args.readme
    try:
        current = readme.read_text(encoding="utf-8")
        updated = rewrite_readme(current)
    except (OSError, ValueError) as error:
        print(f"tfctl config doc: {error}", file=sys.stderr)
        return 2
    if args.check:
        if updated != current:
            print(f"{readme} is out of date: run `tfctl config doc`", file=sys.stderr)
            return 1
        return 0
    readme.write_text(updated, encoding="utf-8")
    return 0
