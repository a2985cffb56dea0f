"""The worker runtime idle and woken: CPU while idle, and admission-to-handler-start latency.

For SQLite (a file, `synchronous=FULL`) and PostgreSQL (a private cluster,
or `--server-dsn`), each in two modes:

- `wake-ups`: the store as it is: on PostgreSQL the admission's `NOTIFY`
  wakes the worker; on SQLite the worker's signal sees the commit of the
  admitting connection (`PRAGMA data_version`, every 50 ms);
- `poll`: the same store behind a `ForwardingStore`, which hides the
  optional capabilities: the worker looks for work every `poll_ms` (1 s).

Idle CPU: a `Worker` on a thread of this process, alone, over an empty
store; the process's CPU time (user + system, `resource.getrusage`) over
`--idle-s` seconds. Latency: the worker idle and asleep, the harness admits
one workload through a store of its own (another connection, as another
process would) and records the time until the handler starts; then waits a
random 50-250 ms; `--latency-n` times. Wall-clock instants throughout.

    python -m bench.runtime --idle-s 10 --latency-n 200 [--no-batch]

The worker holds one attempt at a time here, so its reports go at once
whether batched (the default) or not (`--no-batch`): the figures do not
depend on the batching default.
"""

from __future__ import annotations

import argparse
import operator
import random
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import Fixture, base_parser, command_line, machine, save
from bench.pgserver import server
from workwarden import App, Job, Worker
from workwarden.statemachine import Authority
from workwarden.storage import ForwardingStore, SQLiteStore, Store
from workwarden.storage.postgres import PostgresStore

__all__ = ["main"]

TENANT = "bench"
APPLICATION = "jobs"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class _Bench:
    def __init__(self, fixture: Fixture, *, batch: bool = True) -> None:
        self.fixture = fixture
        self.batch = batch
        self.started: dict[str, float] = {}
        self.arrived = threading.Condition()
        self.app = App()

        @self.app.handler("bench-job", needs=("bench",))
        def job(job: Job) -> None:
            at = time.perf_counter()
            with self.arrived:
                self.started[job.input["job"]] = at
                self.arrived.notify_all()

    @contextmanager
    def worker(self, store: Store) -> Iterator[Worker]:
        worker = Worker(
            Authority(store, grants=self.fixture.verifier),
            self.app,
            tenant=TENANT,
            application=APPLICATION,
            batch=self.batch,
        )
        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
        thread.start()
        try:
            yield worker
        finally:
            worker.stop(grace_s=5)
            thread.join()

    def idle_cpu(self, store: Store, seconds: float) -> float:
        with self.worker(store):
            time.sleep(1.0)  # settled: looked once, found nothing, asleep
            before = _cpu_s()
            time.sleep(seconds)
            return _cpu_s() - before

    def latencies(self, store: Store, admit_store: Store, count: int, tag: str) -> list[float]:
        admitting = Authority(admit_store, grants=self.fixture.verifier)
        rng = random.Random(7)
        out: list[float] = []
        with self.worker(store):
            time.sleep(1.0)
            for i in range(count):
                key = f"{tag}-{i}"
                now = int(time.time() * 1000)
                sent = time.perf_counter()
                admitting.admit(self.fixture.request(key), now)
                with self.arrived:
                    self.arrived.wait_for(partial(operator.contains, self.started, key), timeout=30)
                if key in self.started:
                    out.append((self.started[key] - sent) * 1000)
                time.sleep(rng.uniform(0.05, 0.25))
        return out


def _hidden(store: Store) -> Store:
    """The store without its optional capabilities: the worker falls back to polling."""
    return ForwardingStore(store)


def _measure(
    bench: _Bench,
    name: str,
    open_store: Callable[[], Store],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    rows = []
    for mode in ("wake-ups", "poll"):
        wrap = (lambda s: s) if mode == "wake-ups" else _hidden
        store, admit = open_store(), open_store()
        try:
            cpu = bench.idle_cpu(wrap(store), args.idle_s)
            lat = bench.latencies(wrap(store), admit, args.latency_n, f"{name}-{mode}")
        finally:
            store.close()
            admit.close()
        row = {
            "backend": name,
            "mode": mode,
            "batch": bench.batch,
            "idle_cpu_s": round(cpu, 3),
            "idle_s": args.idle_s,
            "latency_n": len(lat),
            "latency_ms_p50": round(statistics.median(lat), 1) if lat else None,
            "latency_ms_p99": round(_percentile(lat, 0.99), 1) if lat else None,
        }
        print(
            f"{name:10} {mode:9} idle CPU {row['idle_cpu_s']:.3f} s over {args.idle_s:g} s;"
            f" admission -> handler start p50 {row['latency_ms_p50']} ms,"
            f" p99 {row['latency_ms_p99']} ms (n={row['latency_n']})",
            flush=True,
        )
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the harness; write `results/runtime.json`."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "runtime")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle seconds measured")
    parser.add_argument("--latency-n", type=int, default=200, help="admissions timed per mode")
    parser.add_argument("--server-dsn", default=None, help="use this PostgreSQL server")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument(
        "--no-batch",
        action="store_true",
        help="workers make one call per claim and report (default: batched; one worker "
        "holding one attempt sends each report at once either way)",
    )
    args = parser.parse_args(argv)
    bench = _Bench(Fixture(TENANT, APPLICATION), batch=not args.no_batch)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="workwarden-bench-runtime-") as directory:
        path = Path(directory) / "store.db"

        def sqlite() -> Store:
            return SQLiteStore(path)

        rows += _measure(bench, "sqlite", sqlite, args)
    if not args.no_postgres:
        with server(args.server_dsn) as running:
            _, dsn = running.create_database()
            rows += _measure(bench, "postgresql", lambda: PostgresStore(dsn), args)
    result = {
        "command": command_line("bench.runtime", argv),
        "machine": machine(),
        "rows": rows,
    }
    path_out = save(args.out, args.name or "runtime", result)
    print(f"results: {path_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
