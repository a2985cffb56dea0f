"""`workwarden chaos`: kill worker processes at random against a store, then audit the store.

The store (`--store`, or `WORKWARDEN_STORE`) must be one other processes can
open (SQLite or PostgreSQL) and must hold no workload; a SQLite file that
does not exist is created, since an empty store is what the run needs.

Exit status 0 when the audit found no violation and the store drained, 1
when it found any (each printed with the workload, its history and the
offending audit record) or when the run could not start (one coded line:
the store cannot be opened, is in memory, or is not empty).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from workwarden.cli import opened_store, positive_int, positive_seconds
from workwarden.cli.progress import Progress
from workwarden.storage import MemoryStore
from workwarden.storage.urls import STORE_UNUSABLE, STORE_URL_INVALID, STORE_VARIABLE

__all__ = ["register"]


def _prepared_url(url: str | None) -> str:
    """The run's store URL, checked: shareable, opened (created if absent) and empty."""
    from workwarden.statemachine.errors import WorkloadError

    resolved = url if url is not None else os.environ.get(STORE_VARIABLE)
    with opened_store(resolved, "create") as store:
        if isinstance(store, MemoryStore):
            raise WorkloadError(
                STORE_URL_INVALID,
                "a chaos run needs a store other processes can open: sqlite:///path"
                " or postgresql://..., not memory:",
            )
        if next(iter(store.scan()), None) is not None:
            raise WorkloadError(
                STORE_UNUSABLE, "a chaos run needs an empty store; this one holds workloads"
            )
    assert resolved is not None  # opened_store refused a missing URL
    return resolved


def _run(args: argparse.Namespace) -> int:
    from workwarden.chaos import ChaosConfig, run_chaos

    config = ChaosConfig(
        url=_prepared_url(args.store),
        workloads=args.workloads,
        seconds=args.seconds,
        seed=args.seed,
        workers=args.workers,
        drain_seconds=args.drain_seconds,
        batched_workers=args.batched_workers,
    )
    # The run prints a line at the end of each phase; between them (the kill
    # phase alone lasts --seconds), a line every ten seconds says it is alive.
    started = time.monotonic()
    stop = threading.Event()
    with Progress("chaos", unit="", live=False) as progress:

        def tick() -> None:
            while not stop.wait(1.0):
                seconds = int(time.monotonic() - started)
                progress.update(seconds, note="workers running, the store audited at the end")

        ticker = threading.Thread(target=tick, name="chaos-progress", daemon=True)
        ticker.start()
        try:
            report = run_chaos(config, out=sys.stdout)
        finally:
            stop.set()
            ticker.join()
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
        metavar="URL",
        help="an empty store other processes can open (created if absent): "
        f"sqlite:///path or postgresql://... (default: ${STORE_VARIABLE})",
    )
    parser.add_argument("--workloads", type=positive_int, default=5_000, help="workloads to admit")
    parser.add_argument(
        "--seconds", type=positive_seconds, default=60.0, help="how long to kill processes"
    )
    parser.add_argument("--seed", type=int, default=7, help="the run's random seed")
    parser.add_argument("--workers", type=positive_int, default=4, help="worker processes")
    parser.add_argument(
        "--batched-workers",
        type=int,
        default=None,
        metavar="N",
        help="how many of the workers claim with claim_many and report with report_many "
        "(default: half of them)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=positive_seconds,
        default=120.0,
        help="the longest the processes may take to drain the store once the kills stop",
    )
    parser.set_defaults(handler=_run)
