"""`workwarden spec ...`: print the spec file's JSON Schema, validate a spec file."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the `spec` subcommands."""
    parser: argparse.ArgumentParser = subparsers.add_parser("spec", help="work with spec files")
    parser.set_defaults(handler=lambda args: parser.print_help() or 2)
