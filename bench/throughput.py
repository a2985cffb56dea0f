"""Throughput against Procrastinate and PGQueuer: draining, admitting, and SQLite's batch limit.

Three measurements in one run, on one private PostgreSQL cluster (`fsync=on`):

1. **Drain.** `--jobs` no-op jobs are admitted first (not timed as the
   drain), then drained by `--workers` workers, and the drain is timed from
   the moment every worker is ready to the moment every worker has found
   nothing left. The sides, each on a fresh database, alternate round by
   round:

   - `procrastinate`: one process, its async worker with
     `concurrency=--workers` and a pool of `concurrency + 1` connections (what
     its docs advise for short jobs), `wait=False` so that it ends once
     caught up;
   - `pgqueuer`: `--workers` processes, each a `PgQueuer` on one asyncpg
     connection (as its docs set it up) draining with `batch_size=--batch`
     and its defaults otherwise (`mode=drain`);
   - `workwarden`: `--workers` processes, each looping `claim_next`, `start`,
     `complete(output=None)`;
   - `workwarden-claim-starts`: the same under `specs/examples/claim_starts.toml`,
     whose claim starts the attempt in its own commit (no `start` call);
   - `workwarden-batched`: `--workers` processes, each looping
     `claim_many(limit=--batch)`, one `report_many` of the starts, one of the
     completions;
   - `workwarden-batched-claim-starts`: the same under
     `specs/examples/claim_starts.toml`, whose claim starts the attempt in its
     own commit, so only the completions are reported.

   After each drain the side is checked once from its own tables: every job
   done and none twice (Procrastinate: `succeeded`, one `started` event per
   job; PGQueuer: the queue empty, one `queued`, `picked` and `successful`
   log row per job; workwarden: every document SUCCEEDED, one `complete`
   audit record per workload). Reported: jobs/s, client CPU per job (the
   worker processes' CPU time during the drain), and within each round the
   ratios workwarden / Procrastinate (target 1.5) and workwarden batched /
   PGQueuer (target 1.0).

   Before the first round every side runs once, untimed, with
   `--warmup-jobs` jobs (0: none): the server's caches and each side's
   imports are warm for every timed round alike. Without it the first side of
   the first round (Procrastinate) drained at about half its later rate.

2. **Admission.** The admission before each drain is timed too: `--jobs` in
   chunks of `--chunk` from one producer (workwarden `admit_many`,
   Procrastinate `batch_defer_async`, PGQueuer's list `enqueue`), building
   each request inside the timed part.

3. **SQLite** (`synchronous=NORMAL`, one process): batched lifecycles
   (`admit_many`, `claim_many`, `report_many` of the starts, of the
   completions, `--sqlite-batch` at a time) per second, against the raw
   compare-and-swap limit measured in the same run by `bench.cas`
   (`Backend.raw_writes_per_s` ÷ 4). Target ratio 0.5.

    python -m bench.throughput                           # 20,000 jobs, 3 rounds
    python -m bench.throughput --jobs 2000 --reps 1 --sides workwarden,pgqueuer
    python -m bench.throughput --profile                 # also profile a batched worker

Procrastinate and PGQueuer are installed by the `bench` extra.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import multiprocessing
import tempfile
import threading
import time
from collections.abc import Sequence
from functools import cache, partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo

from bench.cas import Backend, RawSQLite, record
from bench.common import (
    NOW,
    Fixture,
    Sample,
    alternate,
    base_parser,
    command_line,
    machine,
    median,
    need_matplotlib,
    quiet_from,
    save,
    save_figure,
    summary,
)
from bench.jobs import BARRIER_TIMEOUT_S, prepare_database
from bench.pgserver import Server, server
from workwarden.statemachine import Authority
from workwarden.statemachine.commands import CompleteCommand, StartCommand
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.models import ClaimReply
from workwarden.statemachine.spec import Spec, load_spec
from workwarden.storage import SQLiteStore

__all__ = ["main"]

SIDES = (
    "procrastinate",
    "pgqueuer",
    "workwarden",
    "workwarden-claim-starts",
    "workwarden-batched",
    "workwarden-batched-claim-starts",
)
SQLITE_SIDES = ("raw", "batched", "batched-claim-starts")
RATIOS = {
    "workwarden / procrastinate": ("workwarden", "procrastinate", 1.5),
    "workwarden-claim-starts / procrastinate": ("workwarden-claim-starts", "procrastinate", 1.5),
    "workwarden-batched / pgqueuer": ("workwarden-batched", "pgqueuer", 1.0),
    "workwarden-batched-claim-starts / pgqueuer": (
        "workwarden-batched-claim-starts",
        "pgqueuer",
        1.0,
    ),
}
_QUEUE = "bench"
_TASK = "noop"
_LEASE_MS = 60_000


@cache
def _spec(side: str) -> Spec | None:
    """The claim-starts example spec for the sides named after it; the shipped one otherwise."""
    if not side.endswith("claim-starts"):
        return None
    path = importlib.resources.files("workwarden.specs.examples").joinpath("claim_starts.toml")
    with importlib.resources.as_file(path) as file:
        return load_spec(file)


def _answered(outcomes: Sequence[Any], what: str) -> None:
    """Refuse a batch with a refused slot: a benchmark must not count work that was not done."""
    refused = [o for o in outcomes if isinstance(o, WorkloadError)]
    if refused:
        raise RuntimeError(f"{what}: {len(refused)} slot(s) refused, first {refused[0]}")


def _asyncpg_params(dsn: str) -> dict[str, Any]:
    """asyncpg's keyword arguments for a libpq connection string."""
    params = conninfo.conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "dbname": "database"}
    return {ours: params[theirs] for theirs, ours in names.items() if params.get(theirs)}


# -- one step of each workwarden worker -------------------------------------------


# Each takes what is claimable (one, or up to `batch`), runs it to completion, and
# answers (jobs finished, starts reported): a claim-starts spec reports no starts.


def _one_at_a_time(
    authority: Authority, fixture: Fixture, name: str, batch: int
) -> tuple[int, int]:
    claim = authority.claim_next(
        fixture.tenant, fixture.application, name, ("bench",), NOW, _LEASE_MS
    )
    if claim is None:
        return 0, 0
    started = claim.started_at is None
    if started:
        authority.start(claim.workload_id, claim.fence, NOW)
    authority.complete(claim.workload_id, claim.fence, f"result-{claim.workload_id}", None, NOW)
    return 1, int(started)


def _batched(authority: Authority, fixture: Fixture, name: str, batch: int) -> tuple[int, int]:
    claims: list[ClaimReply] = authority.claim_many(
        fixture.tenant, fixture.application, name, ("bench",), NOW, _LEASE_MS, batch
    )
    starts = [
        StartCommand(workload_id=c.workload_id, fence=c.fence)
        for c in claims
        if c.started_at is None
    ]
    if starts:
        _answered(authority.report_many(starts, NOW), "report_many(start)")
    completes = [
        CompleteCommand(
            workload_id=c.workload_id,
            fence=c.fence,
            result_id=f"result-{c.workload_id}",
            output=None,
        )
        for c in claims
    ]
    if completes:
        _answered(authority.report_many(completes, NOW), "report_many(complete)")
    return len(claims), len(starts)


# -- the drain processes ----------------------------------------------------------


def _drain_worker(
    side: str, dsn: str, worker: int, batch: int, profile: str | None, barrier: Any, out: Any
) -> None:
    """One drain process: get ready, wait for the others, drain, wait again, report CPU time."""
    starts = 0
    if side == "procrastinate":
        cpu, done = asyncio.run(_procrastinate_drain(dsn, batch, barrier))
    elif side == "pgqueuer":
        cpu, done = asyncio.run(_pgqueuer_drain(dsn, batch, barrier))
    else:
        cpu, done, starts = _workwarden_drain(side, dsn, worker, batch, profile, barrier)
    out.put({"cpu_s": cpu, "done": done, "starts": starts, "worker": worker})


def _workwarden_drain(
    side: str, dsn: str, worker: int, batch: int, profile: str | None, barrier: Any
) -> tuple[float, int, int]:
    from workwarden.storage.postgres import PostgresStore

    fixture = Fixture()
    store = PostgresStore(dsn, pool_size=1)
    authority = Authority(store, grants=fixture.verifier, spec=_spec(side))
    step = _batched if "batched" in side else _one_at_a_time
    name = f"worker-{worker}"
    profiler = None
    if profile is not None:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
    barrier.wait(BARRIER_TIMEOUT_S)
    if profiler is not None:
        profiler.start()
    cpu = time.process_time()
    done = starts = 0
    while True:
        taken, started = step(authority, fixture, name, batch)
        if not taken:
            break
        done += taken
        starts += started
    cpu = time.process_time() - cpu
    if profiler is not None:
        profiler.stop()
        Path(profile or "").write_text(profiler.output_text(unicode=True, show_all=False))
    barrier.wait(BARRIER_TIMEOUT_S)
    store.close()
    return cpu, done, starts


async def _wait(barrier: Any) -> None:
    await asyncio.get_running_loop().run_in_executor(None, barrier.wait, BARRIER_TIMEOUT_S)


async def _procrastinate_drain(dsn: str, concurrency: int, barrier: Any) -> tuple[float, int]:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=dsn, min_size=min(4, concurrency + 1), max_size=concurrency + 1
        )
    )
    done = 0

    @app.task(name=_TASK, queue=_QUEUE)
    async def noop(key: str) -> None:
        nonlocal done
        done += 1

    async with app.open_async():
        await _wait(barrier)
        cpu = time.process_time()
        await app.run_worker_async(
            queues=[_QUEUE],
            concurrency=concurrency,
            wait=False,
            install_signal_handlers=False,
        )
        cpu = time.process_time() - cpu
        await _wait(barrier)
    return cpu, done


async def _pgqueuer_drain(dsn: str, batch: int, barrier: Any) -> tuple[float, int]:
    import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.domain.types import QueueExecutionMode
    from pgqueuer.models import Job

    connection = await asyncpg.connect(**_asyncpg_params(dsn))
    pgq = PgQueuer(AsyncpgDriver(connection))
    done = 0

    @pgq.entrypoint(_TASK)
    async def noop(job: Job) -> None:
        nonlocal done
        done += 1

    await _wait(barrier)
    cpu = time.process_time()
    await pgq.run(batch_size=batch, mode=QueueExecutionMode.drain)
    cpu = time.process_time() - cpu
    await _wait(barrier)
    await connection.close()
    return cpu, done


# -- admission (in the harness process) and the checks ---------------------------


def _keys(run: int, jobs: int) -> list[str]:
    return [f"job-{run}-{i:08d}" for i in range(jobs)]


def _chunks(keys: list[str], chunk: int) -> list[list[str]]:
    return [keys[i : i + chunk] for i in range(0, len(keys), chunk)]


def _admit_workwarden(side: str, dsn: str, keys: list[str], chunk: int) -> float:
    from workwarden.storage.postgres import PostgresStore

    fixture = Fixture()
    store = PostgresStore(dsn, pool_size=1)
    authority = Authority(store, grants=fixture.verifier, spec=_spec(side))
    started = time.perf_counter()
    for part in _chunks(keys, chunk):
        _answered(authority.admit_many([fixture.request(k) for k in part], NOW), "admit_many")
    seconds = time.perf_counter() - started
    store.close()
    return seconds


async def _admit_procrastinate(dsn: str, keys: list[str], chunk: int) -> float:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name=_TASK, queue=_QUEUE)
    async def noop(key: str) -> None:
        return None

    async with app.open_async():
        started = time.perf_counter()
        for part in _chunks(keys, chunk):
            jobs: list[dict[str, Any]] = [{"key": k} for k in part]
            await noop.batch_defer_async(*jobs)
        return time.perf_counter() - started


async def _admit_pgqueuer(dsn: str, keys: list[str], chunk: int) -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(**_asyncpg_params(dsn))
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        started = time.perf_counter()
        for part in _chunks(keys, chunk):
            await queries.enqueue([_TASK] * len(part), [k.encode() for k in part], [0] * len(part))
        return time.perf_counter() - started
    finally:
        await connection.close()


_CHECKS = {
    # (rows, done, once): jobs in the table, jobs finished, jobs recorded finished exactly once.
    "procrastinate": """
        SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'),
               count(*) FILTER (WHERE started = 1 AND succeeded = 1)
        FROM (SELECT j.id, j.status,
                     count(e.id) FILTER (WHERE e.type = 'started') AS started,
                     count(e.id) FILTER (WHERE e.type = 'succeeded') AS succeeded
              FROM procrastinate_jobs j LEFT JOIN procrastinate_events e ON e.job_id = j.id
              GROUP BY j.id, j.status) AS per_job
    """,
    "pgqueuer": """
        SELECT count(*) + (SELECT count(*) FROM pgqueuer),
               count(*) FILTER (WHERE successful >= 1),
               count(*) FILTER (WHERE queued = 1 AND picked = 1 AND successful = 1)
        FROM (SELECT job_id,
                     count(*) FILTER (WHERE status = 'queued') AS queued,
                     count(*) FILTER (WHERE status = 'picked') AS picked,
                     count(*) FILTER (WHERE status = 'successful') AS successful
              FROM pgqueuer_log GROUP BY job_id) AS per_job
    """,
    "workwarden": """
        SELECT count(*), count(*) FILTER (WHERE d.state = 'SUCCEEDED'),
               count(*) FILTER (WHERE a.completes = 1)
        FROM workwarden_documents d
        LEFT JOIN (SELECT key, count(*) FILTER (WHERE operation = 'complete') AS completes
                   FROM workwarden_audit GROUP BY key) AS a ON a.key = d.key
    """,
}


def _check(side: str, dsn: str, jobs: int) -> dict[str, int]:
    """Count, from the side's own tables, the jobs there, done, and done exactly once."""
    query = _CHECKS.get(side, _CHECKS["workwarden"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    counts = {"rows": int(row[0]), "done": int(row[1]), "once": int(row[2])}
    if any(value != jobs for value in counts.values()):
        raise RuntimeError(f"{side}: of {jobs} jobs the tables show {counts}")
    return counts


# -- the runs ---------------------------------------------------------------------


class Drains:
    """Admit then drain the jobs of one side on a fresh database of one server."""

    def __init__(self, pg: Server, jobs: int, workers: int, batch: int, chunk: int) -> None:
        self.pg = pg
        self.jobs = jobs
        self.workers = workers
        self.batch = batch
        self.chunk = chunk
        self.details: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        self._context = multiprocessing.get_context("spawn")
        self._run = 0
        self._starts = 0

    def run(self, side: str, profile: Path | None = None) -> float:
        """One admission and drain of `side`; drained jobs per second."""
        return self._once(side, self.jobs, profile, record=profile is None)

    def warm(self, side: str, jobs: int) -> float:
        """One untimed admission and drain of `jobs` jobs (checked, not recorded)."""
        return self._once(side, jobs, None, record=False)

    def _once(self, side: str, jobs: int, profile: Path | None, *, record: bool) -> float:
        self._run += 1
        db, dsn = self.pg.create_database()
        try:
            keys = _keys(self._run, jobs)
            admitted = self._admit(side, dsn, keys)
            drained, cpu = self._drain(side, dsn, profile, jobs)
            checked = _check(side, dsn, jobs)
        finally:
            self.pg.drop_database(db)
        if record:
            self.details[side].append(
                {
                    "admission_per_s": round(jobs / admitted, 1),
                    "drain_per_s": round(jobs / drained, 1),
                    "drain_seconds": round(drained, 2),
                    "client_cpu_ms_per_job": round(1000 * cpu / jobs, 3),
                    "checked": checked,
                    "starts_reported": self._starts,
                }
            )
        return jobs / drained

    def _admit(self, side: str, dsn: str, keys: list[str]) -> float:
        if side == "procrastinate":
            prepare_database("procrastinate", dsn)
            return asyncio.run(_admit_procrastinate(dsn, keys, self.chunk))
        if side == "pgqueuer":
            return asyncio.run(_admit_pgqueuer(dsn, keys, self.chunk))
        prepare_database("workwarden", dsn)
        return _admit_workwarden(side, dsn, keys, self.chunk)

    def _drain(self, side: str, dsn: str, profile: Path | None, jobs: int) -> tuple[float, float]:
        processes = 1 if side == "procrastinate" else self.workers
        batch = self.workers if side == "procrastinate" else self.batch
        barrier = self._context.Barrier(processes + 1)
        out = self._context.Queue()
        workers = [
            self._context.Process(
                target=_drain_worker,
                args=(
                    side,
                    dsn,
                    w,
                    batch,
                    str(profile) if profile is not None and w == 0 else None,
                    barrier,
                    out,
                ),
            )
            for w in range(processes)
        ]
        for process in workers:
            process.start()
        _meet(barrier, workers, side)  # every worker is ready
        started = time.perf_counter()
        _meet(barrier, workers, side)  # every worker found nothing left
        seconds = time.perf_counter() - started
        reports = [out.get(timeout=120) for _ in workers]
        for process in workers:
            process.join(120)
        failed = [p.exitcode for p in workers if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"{side}: worker processes failed: {failed}")
        done = sum(r["done"] for r in reports)
        if done != jobs:
            raise RuntimeError(f"{side}: the workers ran {done} of {jobs} jobs")
        self._starts = sum(r["starts"] for r in reports)
        return seconds, sum(r["cpu_s"] for r in reports)


def _meet(barrier: Any, processes: list[Any], side: str) -> None:
    """Wait at `barrier` with the workers; break it, and raise, if one of them has died."""
    waiting = threading.Thread(target=barrier.wait, args=(BARRIER_TIMEOUT_S,), daemon=True)
    waiting.start()
    while waiting.is_alive():
        waiting.join(0.2)
        dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
        if dead:
            barrier.abort()
            for process in processes:
                process.join(10)
            raise RuntimeError(f"{side}: worker processes failed: {dead}")


class SQLiteRuns:
    """Batched lifecycles on SQLite (`synchronous=NORMAL`) and the raw limit beside them."""

    def __init__(self, workdir: Path, lifecycles: int, batch: int) -> None:
        self.workdir = workdir
        self.lifecycles = lifecycles
        self.batch = batch
        self.fixture = Fixture()
        self.writes = record(self.fixture, 0)
        self._run = 0

    def run(self, side: str) -> float:
        """One run of `side` on a fresh file: lifecycles per second."""
        self._run += 1
        path = self.workdir / f"sqlite-{self._run}-{side}.sqlite3"
        if side == "raw":
            return self._raw(path)
        store = SQLiteStore(path, synchronous="NORMAL")
        try:
            return self._batched(Authority(store, grants=self.fixture.verifier, spec=_spec(side)))
        finally:
            store.close()

    def _raw(self, path: Path) -> float:
        # bench.cas's own raw side (owned there): four single-write commits per lifecycle.
        stores = (
            SQLiteStore(path.with_suffix(".unused-1"), synchronous="NORMAL"),
            SQLiteStore(path.with_suffix(".unused-2"), synchronous="NORMAL"),
        )
        backend = Backend(
            "sqlite-normal",
            RawSQLite(path, "NORMAL"),
            stores,
            self.fixture,
            self.writes,
            0,
            1,
        )
        try:
            return backend.raw_writes_per_s(self.lifecycles) / 4
        finally:
            backend.close()

    def _batched(self, authority: Authority) -> float:
        fixture = self.fixture
        keys = _keys(self._run, self.lifecycles)
        started = time.perf_counter()
        for part in _chunks(keys, self.batch):
            _answered(authority.admit_many([fixture.request(k) for k in part], NOW), "admit_many")
            done = 0
            while done < len(part):
                taken, _ = _batched(authority, fixture, "worker-1", len(part) - done)
                if not taken:
                    raise RuntimeError("claim_many found nothing to claim")
                done += taken
        return self.lifecycles / (time.perf_counter() - started)


# -- results ------------------------------------------------------------------------


def _per_round(samples: dict[str, list[Sample]], top: str, bottom: str) -> list[float]:
    return [
        round(a.value / b.value, 3)
        for a, b in zip(samples.get(top, []), samples.get(bottom, []), strict=False)
        if b.value
    ]


def _result(
    args: Any,
    argv: Sequence[str] | None,
    settings: dict[str, str],
    drains: Drains | None,
    drain_samples: dict[str, list[Sample]],
    sqlite_samples: dict[str, list[Sample]],
) -> dict[str, Any]:
    sides: dict[str, Any] = {}
    for side, samples in drain_samples.items():
        details = drains.details[side] if drains is not None else []

        def of(field: str, details: list[dict[str, Any]] = details) -> dict[str, Any]:
            return summary([Sample(d[field], 0.0) for d in details])

        sides[side] = {
            "drain_per_s": summary(samples),
            "admission_per_s": of("admission_per_s"),
            "client_cpu_ms_per_job": of("client_cpu_ms_per_job"),
            "runs": details,
        }
    ratios: dict[str, Any] = {}
    for name, (top, bottom, target) in RATIOS.items():
        rounds = _per_round(drain_samples, top, bottom)
        if rounds:
            ratios[name] = {"per_round": rounds, "median": median(rounds), "target": target}
    sqlite: dict[str, Any] = {name: summary(s) for name, s in sqlite_samples.items()}
    for side in SQLITE_SIDES[1:]:
        rounds = _per_round(sqlite_samples, side, "raw")
        if rounds:
            sqlite[f"{side} / raw"] = {"per_round": rounds, "median": median(rounds), "target": 0.5}
    return {
        "command": command_line("bench.throughput", argv),
        "machine": machine(),
        "postgres": settings,
        "versions": _versions(),
        "jobs": args.jobs,
        "workers": args.workers,
        "batch": args.batch,
        "chunk": args.chunk,
        "warmup_jobs": args.warmup_jobs,
        "drain": sides,
        "ratios": ratios,
        "sqlite": {"lifecycles": args.sqlite_lifecycles, "batch": args.sqlite_batch, **sqlite},
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in ("procrastinate", "pgqueuer", "asyncpg", "psycopg"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def _print(result: dict[str, Any]) -> None:
    print()
    print("| side | drain jobs/s | admission jobs/s | client CPU ms/job | load (median/max) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for side, s in result["drain"].items():
        d = s["drain_per_s"]
        print(
            f"| {side} | {d['median']:,.0f} | {s['admission_per_s']['median']:,.0f}"
            f" | {s['client_cpu_ms_per_job']['median']:.2f}"
            f" | {d['load_median']:.2f}/{d['load_max']:.2f} |"
        )
    for name, ratio in result["ratios"].items():
        rounds = ", ".join(f"{r:.2f}" for r in ratio["per_round"])
        print(f"{name}: median {ratio['median']:.2f} (rounds {rounds}; target {ratio['target']})")
    sqlite = result["sqlite"]
    for side in SQLITE_SIDES:
        if side in sqlite:
            print(f"sqlite {side}: {sqlite[side]['median']:,.0f} lifecycles/s")
        if f"{side} / raw" in sqlite:
            print(f"sqlite {side} / raw: median {sqlite[f'{side} / raw']['median']:.2f}")


def _plot(path: Path, result: dict[str, Any]) -> None:
    plt = need_matplotlib()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    panels: list[tuple[str, dict[str, float]]] = [
        ("drain jobs/s", {s: v["drain_per_s"]["median"] for s, v in result["drain"].items()}),
        (
            "admission jobs/s (chunks)",
            {s: v["admission_per_s"]["median"] for s, v in result["drain"].items()},
        ),
        (
            "SQLite lifecycles/s",
            {s: result["sqlite"][s]["median"] for s in SQLITE_SIDES if s in result["sqlite"]},
        ),
    ]
    colours = {"procrastinate": "#d08030", "pgqueuer": "#60a060", "raw": "#999999"}
    for ax, (title, values) in zip(axes, panels, strict=True):
        names = list(values)
        ax.bar(
            range(len(names)),
            list(values.values()),
            color=[colours.get(n, "#4878a8") for n in names],
        )
        for x, value in enumerate(values.values()):
            ax.text(x, value * 1.01, f"{value:,.0f}", ha="center", fontsize=8)
        ax.set_xticks(range(len(names)), [n.replace("workwarden", "ww") for n in names])
        ax.tick_params(axis="x", labelrotation=25, labelsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(
        f"{result['jobs']:,} no-op jobs, {result['workers']} workers, batch {result['batch']},"
        " one PostgreSQL (fsync=on); SQLite synchronous=NORMAL",
        fontsize=10,
    )
    save_figure(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the harness; print and save the figures; return them."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "bench.throughput")
    parser.set_defaults(reps=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=10, help="claim / dequeue batch size")
    parser.add_argument("--chunk", type=int, default=1000, help="admission chunk size")
    parser.add_argument(
        "--warmup-jobs",
        type=int,
        default=2000,
        help="jobs of one untimed run of every side before the first round (0: none)",
    )
    parser.add_argument("--sides", default=",".join(SIDES), help=", ".join(SIDES))
    parser.add_argument("--sqlite-lifecycles", type=int, default=5000)
    parser.add_argument("--sqlite-batch", type=int, default=100)
    parser.add_argument("--pg-fsync", choices=("on", "off"), default="on")
    parser.add_argument("--server-dsn", default=None, help="use this server, not a private one")
    parser.add_argument(
        "--profile", action="store_true", help="profile one workwarden-batched worker afterwards"
    )
    args = parser.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        raise SystemExit(f"unknown sides {unknown}; known: {', '.join(SIDES)}")
    for peer, module in (("procrastinate", "procrastinate"), ("pgqueuer", "asyncpg")):
        if peer in sides:
            try:
                __import__(module)
                __import__(peer)
            except ImportError:
                raise SystemExit(
                    f'{peer} is not installed: pip install -e ".[bench]"'
                    " (or leave it out of --sides)"
                ) from None
    quiet = quiet_from(args)
    name = args.name or "throughput"
    drains: Drains | None = None
    drain_samples: dict[str, list[Sample]] = {}
    with server(args.server_dsn, fsync=args.pg_fsync == "on") as pg:
        settings = pg.settings()
        if sides:
            drains = Drains(pg, args.jobs, args.workers, args.batch, args.chunk)
            runs = {s: partial(drains.run, s) for s in sides}
            if args.warmup_jobs > 0:
                for side in sides:
                    rate = drains.warm(side, args.warmup_jobs)
                    print(f"  warm-up {side}: {rate:,.1f} (not counted)")
            drain_samples = alternate(args.reps, runs, quiet, log=print)
            if args.profile:
                profile = args.out / "results" / f"{name}-profile.txt"
                profile.parent.mkdir(parents=True, exist_ok=True)
                drains.run("workwarden-batched", profile=profile)
                print(f"profile of one workwarden-batched worker: {profile}")
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as workdir:
        sqlite = SQLiteRuns(Path(workdir), args.sqlite_lifecycles, args.sqlite_batch)
        sqlite_samples = alternate(
            args.reps, {s: partial(sqlite.run, s) for s in SQLITE_SIDES}, quiet, log=print
        )
    result = _result(args, argv, settings, drains, drain_samples, sqlite_samples)
    _print(result)
    save(args.out, name, result)
    if not args.no_plot:
        _plot(args.out / "plots" / f"{name}.png", result)
    return result


if __name__ == "__main__":
    main()
