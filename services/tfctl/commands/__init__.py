"""Subcommands of `tfctl`: each module here defines `register(subparsers)` and is found automatically."""
