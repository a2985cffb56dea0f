"""A fleet of real worker processes draining one store, for the tests that race them.

`drain_with_processes` starts `count` processes of a driver script (each a
`Worker` over the store `target` names), waits until every one of `workloads`
documents is SUCCEEDED (failing with the first log if a process dies first),
then stops them with SIGTERM. `fleet_target` opens the store a kind names,
with the target string the driver is given: a SQLite file, or a private
PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pg
from workwarden.storage import SQLiteStore, Store
from workwarden.storage.postgres import PostgresStore

__all__ = ["drain_with_processes", "fleet_target"]


@contextlib.contextmanager
def fleet_target(kind: str, tmp_path: Path) -> Iterator[tuple[str, Store]]:
    """A fresh store of `kind` ("sqlite" or "postgres") and the string a driver opens it by."""
    if kind == "sqlite":
        path = str(tmp_path / "store.db")
        with SQLiteStore(path) as store:
            yield path, store
        return
    with pg.postgres_database() as dsn, contextlib.closing(PostgresStore(dsn)) as store:
        yield dsn, store


def drain_with_processes(
    driver: Path,
    arguments: Callable[[int], Sequence[str]],
    count: int,
    store: Store,
    workloads: int,
    tmp_path: Path,
    timeout_s: float = 180,
) -> None:
    """Run `count` driver processes (process n given `arguments(n)`) until the store is drained."""
    logs = [(tmp_path / f"worker{n}.log").open("wb") for n in range(count)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(driver), *arguments(n)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for n, log in enumerate(logs)
    ]
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [doc.index.state for doc in store.scan()]
            if states.count("SUCCEEDED") == workloads:
                break
            for proc in procs:
                assert proc.poll() is None, (tmp_path / "worker0.log").read_text()
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        for log in logs:
            log.close()
