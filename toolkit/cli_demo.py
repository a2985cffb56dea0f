"""`workwarden demo`: the toolkit at work, on an embedded SQLite file by default."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from workwarden.demo import main_demo

    return main_demo(args.store, args.seed, args.workloads, args.workers)


def register(subparsers: Any) -> None:
    """Add the `demo` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run a fleet of simulated workers against an embedded store",
        description=(
            "Admit a few hundred workloads for two tenants, run workers that crash, "
            "lose leases and fail against them on a simulated clock, then check every "
            "committed history against the spec."
        ),
    )
    parser.add_argument(
        "--store", default=None, help="store URL (default: a fresh temporary SQLite file)"
    )
    parser.add_argument("--seed", type=int, default=7, help="the run's random seed (default 7)")
    parser.add_argument("--workloads", type=int, default=300, help="workloads to admit")
    parser.add_argument("--workers", type=int, default=6, help="simulated workers")
    parser.set_defaults(handler=_run)
