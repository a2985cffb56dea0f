"""`workwarden chaos`: kill worker processes at random against a store, then audit the store.

Exit status 0 when the audit found no violation, 1 when it found any (each
printed with the workload, its history and the offending audit record), 2
when the run could not start (the store cannot be opened, or is not empty).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def _run(args: argparse.Namespace) -> int:
    from workwarden.chaos import ChaosConfig, run_chaos
    from workwarden.storage import StoreError

    config = ChaosConfig(
        url=args.store,
        workloads=args.workloads,
        seconds=args.seconds,
        seed=args.seed,
        workers=args.workers,
        drain_seconds=args.drain_seconds,
    )
    try:
        report = run_chaos(config, out=sys.stdout)
    except (ValueError, StoreError) as exc:
        print(f"workwarden chaos: {exc}", file=sys.stderr)
        return 2
    return 1 if report.violations or not report.drained else 0


def register(subparsers: Any) -> None:
    """Add the `chaos` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "chaos",
        help="kill worker processes at random against a store, then audit the store",
        description=(
            "Admit workloads into an empty store, run worker processes and a sweeper "
            "against it while killing one with SIGKILL every few hundred milliseconds, "
            "let them drain the store, then check every document and the whole audit "
            "log. Exit status 1 on any violation."
        ),
    )
    parser.add_argument(
        "--store",
        required=True,
        metavar="URL",
        help="an empty store: sqlite:///path or postgresql://...",
    )
    parser.add_argument(
        "--workloads", type=_positive_int, default=5_000, help="workloads to admit (default 5000)"
    )
    parser.add_argument(
        "--seconds",
        type=_seconds,
        default=60.0,
        help="how long to kill processes (default 60)",
    )
    parser.add_argument("--seed", type=int, default=7, help="the run's random seed (default 7)")
    parser.add_argument(
        "--workers", type=_positive_int, default=4, help="worker processes (default 4)"
    )
    parser.add_argument(
        "--drain-seconds",
        type=_seconds,
        default=120.0,
        help="the longest the processes may take to drain the store once the kills stop"
        " (default 120)",
    )
    parser.set_defaults(handler=_run)
