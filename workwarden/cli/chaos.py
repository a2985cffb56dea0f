"""`workwarden chaos`: kill worker processes at random against a store, then audit the store.

The store (`--store`, or `WORKWARDEN_STORE`) must be one other processes can
open (SQLite or PostgreSQL) and must hold no workload; a SQLite file that
does not exist is created, since an empty store is what the run needs.

Exit status 0 when the audit found no violation and the store drained, 1
when it found any (each printed with the workload, its history and the
offending audit record) or when the run could not start (one coded line:
the store cannot be opened, is in memory, or is not empty) or lost its store
while draining and auditing it (`WORKLOAD_STORAGE_FAILURE`: nothing was
audited). The options are checked before the store is opened or created.
SIGINT (130) and SIGTERM (143) stop the run and every process it started.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any

from workwarden.cli import at_least, between, opened_store, seconds, stopped_by_sigterm
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
    import dataclasses

    from workwarden.chaos import ChaosConfig, check_config

    config = ChaosConfig(
        url="",
        workloads=args.workloads,
        seconds=args.seconds,
        seed=args.seed,
        workers=args.workers,
        drain_seconds=args.drain_seconds,
        batched_workers=args.batched_workers,
    )
    # A run that could not be made is refused before its store is created.
    check_config(config)
    with stopped_by_sigterm():
        return _chaos(dataclasses.replace(config, url=_prepared_url(args.store)))


def _chaos(config: Any) -> int:
    # A PostgreSQL store that goes away is the run's to report, in one coded
    # line: not in the connection pool's warnings as it tries again. (For the
    # run only: a caller in the same process keeps its logging as it was.)
    pool_log = logging.getLogger("psycopg.pool")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        return _drain_and_audit(config)
    finally:
        pool_log.setLevel(level)


def _drain_and_audit(config: Any) -> int:
    from workwarden.chaos import run_chaos

    # The run prints a line at the end of each phase; between them (the kill
    # phase alone lasts --seconds), a line every ten seconds says it is alive.
    started = time.monotonic()
    stop = threading.Event()
    with Progress("chaos", unit="", live=False) as progress:

        def tick() -> None:
            while not stop.wait(1.0):
                elapsed = int(time.monotonic() - started)
                progress.update(elapsed, note="workers running, the store audited at the end")

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
    from workwarden.chaos import MAX_SECONDS, MAX_WORKERS, MAX_WORKLOADS

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
    parser.add_argument(
        "--workloads",
        type=between(1, MAX_WORKLOADS),
        default=5_000,
        help=f"workloads to admit (1 to {MAX_WORKLOADS:,})",
    )
    parser.add_argument(
        "--seconds",
        type=seconds(at_most=MAX_SECONDS),
        default=60.0,
        help=f"how long to kill processes (at most {MAX_SECONDS:g})",
    )
    parser.add_argument("--seed", type=int, default=7, help="the run's random seed")
    parser.add_argument(
        "--workers",
        type=between(1, MAX_WORKERS),
        default=4,
        help=f"worker processes (1 to {MAX_WORKERS})",
    )
    parser.add_argument(
        "--batched-workers",
        type=at_least(0),
        default=None,
        metavar="N",
        help="how many of the workers claim with claim_many and report with report_many, "
        "0 to --workers (default: half of them)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=seconds(at_most=MAX_SECONDS),
        default=120.0,
        help="the longest the processes may take to drain the store once the kills stop "
        f"(at most {MAX_SECONDS:g})",
    )
    parser.set_defaults(handler=_run)
