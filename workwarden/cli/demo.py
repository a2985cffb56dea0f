"""`workwarden demo`: the toolkit at work, on an embedded SQLite file by default."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from workwarden.cli import between, stopped_by_sigterm

__all__ = ["register"]


def _check_out_dir(path: str) -> None:
    """Refuse (`WORKWARDEN_OUTPUT_UNWRITABLE`), before any work, an `--out-dir` no diagram
    could be written into: not a folder, or in none that can be written. Nothing is
    made: the diagram's folders are made when it is written, at the end of the run."""
    from workwarden.cli import OUTPUT_UNWRITABLE
    from workwarden.statemachine.errors import WorkloadError

    folder = Path(os.path.abspath(path))
    existing = next(f for f in (folder, *folder.parents) if f.exists())
    reason = None
    if not existing.is_dir():
        reason = "it is a file" if existing == folder else "a part of the path is a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = "permission denied"
    if reason is not None:
        raise WorkloadError(
            OUTPUT_UNWRITABLE,
            f"cannot write into diagram directory {path}: {reason}",
            {"path": path},
        )


def _run(args: argparse.Namespace) -> int:
    from workwarden.demo import main_demo

    if args.out_dir is not None:
        # Refused before any work is admitted, not after the run.
        _check_out_dir(args.out_dir)
    with stopped_by_sigterm():
        return main_demo(args.store, args.seed, args.workloads, args.workers, args.out_dir)


def register(subparsers: Any) -> None:
    """Add the `demo` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run a fleet of worker threads against an embedded store",
        description=(
            "Admit a few hundred workloads for two tenants, run a fleet of runtime workers "
            "(workwarden.runtime, each on a thread) whose handlers crash, stall past their "
            "lease and fail, on a simulated clock, with an operator who cancels, times out "
            "and re-arms and a sweeper; then check every committed history against the spec "
            "and write the diagram with each edge's observed count. The same --seed gives "
            "the same summary."
        ),
    )
    parser.add_argument(
        "--store", default=None, help="store URL (default: a fresh temporary SQLite file)"
    )
    parser.add_argument("--seed", type=int, default=7, help="the run's random seed")
    # Bounded as `chaos` bounds them: a fleet of 100,000 threads cannot be started.
    parser.add_argument(
        "--workloads",
        type=between(1, 1_000_000),
        default=300,
        help="workloads to admit, 1 to 1,000,000",
    )
    parser.add_argument("--workers", type=between(1, 64), default=6, help="worker threads, 1 to 64")
    parser.add_argument(
        "--out-dir",
        default=None,
        metavar="DIR",
        help="where to write the diagram (default: beside the temporary store)",
    )
    parser.set_defaults(handler=_run)
