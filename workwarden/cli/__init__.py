"""The `workwarden` command line.

Each group of subcommands lives in its own module (`workwarden/cli/*.py`) and registers
itself through a `register(subparsers)` function listed in `_MODULES`. A
command returns its exit status; a `WorkloadError` reaching this level is
printed as `CODE: message` on standard error with exit status 1, never as a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from workwarden import __version__
from workwarden.statemachine.errors import WorkloadError

__all__ = ["main"]

#: Modules that add subcommands, in the order they appear in `--help`.
_MODULES = (
    "workwarden.cli.check",
    "workwarden.cli.demo",
    "workwarden.cli.spec",
    "workwarden.cli.diagram",
    "workwarden.cli.store",
    "workwarden.cli.inspect",
    "workwarden.cli.reference",
    "workwarden.cli.chaos",
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="workwarden",
        description="A formally-checked state machine toolkit for durable work.",
    )
    parser.add_argument("--version", action="version", version=f"workwarden {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except WorkloadError as exc:
        print(f"{exc.code}: {exc.message}", file=sys.stderr)
        if exc.details:
            print(json.dumps(exc.details, indent=2, sort_keys=True), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
