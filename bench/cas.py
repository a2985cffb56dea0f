"""Cost over the storage limit: full lifecycles through the authority against raw CAS writes.

For each backend, two things run alternately in the same process, each on its
own fresh file or database with the same schema:

- **raw**: the storage limit. The four writes of one lifecycle (admit, claim,
  start, complete), recorded once from a real lifecycle, are replayed under
  fresh keys with the backend's own statements and no workwarden code: a
  require-absent insert, then `UPDATE ... WHERE key = ? AND version = ?`,
  each with its audit insert, in the transaction shape the backend's store
  uses (SQLite: `BEGIN IMMEDIATE` ... `COMMIT`; PostgreSQL: one autocommit
  statement, a data-modifying CTE; memory: one critical section).
- **authority**: `admit`, `claim`, `start`, `complete` through `Authority`
  as built by default over the backend's store: the same four writes, plus
  every read and decision the authority makes. By default an authority
  remembers its latest writes and decides a worker's next call on them.
- **reading**: the same through `Authority(..., remember=0)`, which reads
  the document before every call.

It reports lifecycles per second and the ratio to the limit, raw writes per
second divided by 4 (the target is 0.5 or more on SQLite and PostgreSQL),
and then, for each authority, the CPU time of each call (admit, claim, start,
complete: the median over the repetitions of the mean over one sample's
lifecycles, on one thread), which is the Python cost per call on the memory
store.

    python -m bench.cas                        # every backend, 5 repetitions
    python -m bench.cas --backends sqlite-full,postgres --lifecycles 500
    python -m bench.cas --profile              # also a cProfile of each backend's lifecycles
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    NOW,
    Fixture,
    Quiet,
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
from bench.pgserver import Server, server
from workwarden.statemachine import Authority
from workwarden.storage import AuditRecord, IndexFields, MemoryStore, SQLiteStore, Store

# The raw writers run the stores' own statements, so the limit is the same SQL
# the stores send, without any workwarden code around it.
from workwarden.storage.postgres import _CREATE as PG_INSERT
from workwarden.storage.postgres import _UPDATE as PG_UPDATE
from workwarden.storage.sqlite import _APPEND_AUDIT as SQLITE_AUDIT
from workwarden.storage.sqlite import _INSERT as SQLITE_INSERT
from workwarden.storage.sqlite import _UPDATE as SQLITE_UPDATE

__all__ = ["main"]

BACKENDS = ("memory", "sqlite-full", "sqlite-normal", "postgres")
_LEASE_MS = 30_000


@dataclass(frozen=True)
class Write:
    """One write of the recorded lifecycle (with its fields as statement parameters)."""

    document: str
    index: IndexFields
    expected: int | None
    audit: AuditRecord
    index_values: dict[str, Any] = field(default_factory=dict)
    audit_values: dict[str, Any] = field(default_factory=dict)


class _Recorder(MemoryStore):
    """A memory store that remembers every write it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[Write] = []

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        self.writes.append(
            Write(document, index, expected_version, audit, asdict(index), asdict(audit))
        )
        return super().write(key, document, index, expected_version, audit)


def lifecycle(authority: Authority, fixture: Fixture, key: str, payload: int) -> None:
    """admit, claim, start, complete one workload: four writes."""
    admitted = authority.admit(fixture.request(key, payload), NOW)
    workload_id = admitted.workload.workload_id
    claim = authority.claim(workload_id, "worker-1", ("bench",), NOW + 1, _LEASE_MS)
    authority.start(workload_id, claim.fence, NOW + 2)
    authority.complete(workload_id, claim.fence, f"result-{key}", {"ok": True}, NOW + 3)


OPERATIONS = ("admit", "claim", "start", "complete")


def timed_lifecycle(
    authority: Authority, fixture: Fixture, key: str, payload: int, spent: dict[str, float]
) -> None:
    """`lifecycle`, adding each call's seconds (CPU time of this process) to `spent`.

    CPU time, not wall time: on a shared machine it moves less with what
    else runs, and the memory store spends no time waiting.
    """
    clock = time.process_time
    request = fixture.request(key, payload)
    started = clock()
    admitted = authority.admit(request, NOW)
    spent["admit"] += clock() - started
    workload_id = admitted.workload.workload_id
    started = clock()
    claim = authority.claim(workload_id, "worker-1", ("bench",), NOW + 1, _LEASE_MS)
    spent["claim"] += clock() - started
    fence = claim.fence
    started = clock()
    authority.start(workload_id, fence, NOW + 2)
    spent["start"] += clock() - started
    started = clock()
    authority.complete(workload_id, fence, f"result-{key}", {"ok": True}, NOW + 3)
    spent["complete"] += clock() - started


def record(fixture: Fixture, payload: int) -> list[Write]:
    """The four writes of one lifecycle, as the authority asks the store for them."""
    store = _Recorder()
    lifecycle(Authority(store, grants=fixture.verifier), fixture, "template", payload)
    assert len(store.writes) == 4, [w.audit.operation for w in store.writes]
    return store.writes


# -- the raw writers: the backend's own statements, no workwarden code ------------


class RawMemory:
    """A dict compare-and-swap and an audit list, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[str, tuple[int, str, IndexFields, str | None]] = {}
        self._audit: list[tuple[str, int, AuditRecord]] = []

    def write(self, key: str, w: Write, result_id: str | None) -> None:
        with self._lock:
            current = self._docs.get(key)
            if w.expected is None:
                if current is not None:
                    raise RuntimeError("exists")
                version = 1
            else:
                if current is None or current[0] != w.expected:
                    raise RuntimeError("conflict")
                version = current[0] + 1
            self._docs[key] = (version, w.document, w.index, result_id)
            self._audit.append((key, version, w.audit))

    def close(self) -> None:
        pass


class RawSQLite:
    """`BEGIN IMMEDIATE`, the CAS statement, the audit insert, `COMMIT`, on a WAL file."""

    def __init__(self, path: Path, synchronous: str) -> None:
        SQLiteStore(path, synchronous="FULL").close()  # the same schema and indexes
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA busy_timeout = 10000")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")

    def write(self, key: str, w: Write, result_id: str | None) -> None:
        conn = self.conn
        version = 1 if w.expected is None else w.expected + 1
        values = {
            **w.index_values,
            "result_id": result_id,
            "key": key,
            "document": w.document,
            "version": version,
            "expected": w.expected,
        }
        audit = {**w.audit_values, "key": key, "version": version}
        conn.execute("BEGIN IMMEDIATE")
        try:
            if w.expected is None:
                conn.execute(SQLITE_INSERT, values)
            elif conn.execute(SQLITE_UPDATE, values).rowcount != 1:
                raise RuntimeError("conflict")
            conn.execute(SQLITE_AUDIT, audit)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.conn.close()


class RawPostgres:
    """The one-statement CAS and audit insert, one autocommit connection per thread."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._local = threading.local()
        self._all: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = psycopg.connect(self.dsn, autocommit=True)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def write(self, key: str, w: Write, result_id: str | None) -> None:
        audit = w.audit_values
        values = {
            **w.index_values,
            "result_id": result_id,
            "key": key,
            "document": w.document,
            "expected": w.expected,
            "tx": audit["transaction_id"],
            "audit_key": key,
            "actor": audit["actor"],
            "operation": audit["operation"],
            "audit_tenant": audit["tenant"],
            "audit_application": audit["application"],
            "at": audit["at"],
            "digest": audit["digest"],
            "worker": audit["worker"],
            "attempt": audit["attempt"],
            "result": audit["result"],
            "fencing_token": audit["fencing_token"],
            "request_id": audit.get("request_id"),
        }
        query = PG_INSERT if w.expected is None else PG_UPDATE
        row = self._conn().execute(query, values)
        if row.fetchone() is None:
            raise RuntimeError("conflict")

    def close(self) -> None:
        for conn in self._all:
            conn.close()


# -- one backend: its three sides -------------------------------------------------

SIDES = ("raw", "authority", "reading")
"""raw writes; the authority as built by default (it remembers its latest writes); the
authority with `remember=0`, which reads before every call."""


class Backend:
    """One backend's raw writer and two authorities, each on its own store."""

    def __init__(
        self,
        name: str,
        raw: Any,
        stores: tuple[Store, Store],
        fixture: Fixture,
        writes: Sequence[Write],
        payload: int,
        threads: int,
        cleanup: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.raw = raw
        self.stores = stores
        self.authorities = {
            "authority": Authority(stores[0], grants=fixture.verifier),
            "reading": Authority(stores[1], grants=fixture.verifier, remember=0),
        }
        self.fixture = fixture
        self.writes = writes
        self.payload = payload
        self.threads = threads
        self._cleanup = cleanup
        self._batch = 0

    def _in_threads(self, n: int, one: Callable[[str], None]) -> float:
        """Run `one(key)` for n fresh keys on `threads` threads; seconds taken."""
        self._batch += 1
        keys = [f"{self.name}-{self._batch}-{i:08d}" for i in range(n)]
        if self.threads == 1:
            started = time.perf_counter()
            for key in keys:
                one(key)
            return time.perf_counter() - started
        shares = [keys[t :: self.threads] for t in range(self.threads)]
        failures: list[BaseException] = []

        def work(share: list[str]) -> None:
            try:
                for key in share:
                    one(key)
            except BaseException as exc:  # noqa: BLE001 - re-raised once the threads end
                failures.append(exc)

        workers = [threading.Thread(target=work, args=(share,)) for share in shares]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if failures:
            raise failures[0]
        return time.perf_counter() - started

    def raw_writes_per_s(self, n: int) -> float:
        """Replay n lifecycles' writes raw; writes per second."""

        def one(key: str) -> None:
            for w in self.writes:
                result = f"result-{key}" if w.index.result_id is not None else None
                self.raw.write(key, w, result)

        return 4 * n / self._in_threads(n, one)

    def lifecycles_per_s(self, side: str, n: int) -> float:
        """n lifecycles through one of the authorities; lifecycles per second."""
        authority = self.authorities[side]
        return n / self._in_threads(
            n, lambda key: lifecycle(authority, self.fixture, key, self.payload)
        )

    def run(self, side: str, n: int) -> float:
        """One sample of `side`: raw writes/s, or lifecycles/s."""
        if side == "raw":
            return self.raw_writes_per_s(n)
        return self.lifecycles_per_s(side, n)

    def per_operation_us(self, side: str, n: int) -> dict[str, float]:
        """Mean CPU µs of each call over n lifecycles through one authority, on one thread."""
        authority = self.authorities[side]
        self._batch += 1
        spent = dict.fromkeys(OPERATIONS, 0.0)
        for i in range(n):
            key = f"{self.name}-{self._batch}-{i:08d}"
            timed_lifecycle(authority, self.fixture, key, self.payload, spent)
        return {op: round(spent[op] / n * 1e6, 1) for op in OPERATIONS}

    def profile(self, side: str, n: int) -> str:
        """A cProfile of n lifecycles through one authority (top functions by own time)."""
        profiler = cProfile.Profile()
        self.threads, threads = 1, self.threads
        try:
            profiler.runcall(self.lifecycles_per_s, side, n)
        finally:
            self.threads = threads
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)
        return text.getvalue()

    def close(self) -> None:
        self.raw.close()
        for store in self.stores:
            store.close()
        self._cleanup()


def _backend(
    name: str,
    workdir: Path,
    pg: Server | None,
    fixture: Fixture,
    writes: Sequence[Write],
    payload: int,
    threads: int,
) -> Backend:
    args = (fixture, writes, payload, threads)
    if name == "memory":
        return Backend(name, RawMemory(), (MemoryStore(), MemoryStore()), *args)
    if name in ("sqlite-full", "sqlite-normal"):
        level: Any = "FULL" if name == "sqlite-full" else "NORMAL"
        raw = RawSQLite(workdir / f"{name}-raw.sqlite3", level)
        stores = (
            SQLiteStore(workdir / f"{name}-authority.sqlite3", synchronous=level),
            SQLiteStore(workdir / f"{name}-reading.sqlite3", synchronous=level),
        )
        return Backend(name, raw, stores, *args)
    if name.startswith("postgres"):
        from workwarden.storage.postgres import PostgresStore

        assert pg is not None
        made = [pg.create_database() for _ in SIDES]
        PostgresStore(made[0][1], pool_size=1).close()  # the same schema and indexes
        pool = max(threads, 1)
        stores = (
            PostgresStore(made[1][1], pool_size=pool),
            PostgresStore(made[2][1], pool_size=pool),
        )

        def drop() -> None:
            for db, _ in made:
                pg.drop_database(db)

        return Backend(name, RawPostgres(made[0][1]), stores, *args, cleanup=drop)
    raise SystemExit(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")


def _plot(path: Path, rows: list[dict[str, Any]]) -> None:
    plt = need_matplotlib()
    names = [row["backend"] for row in rows]
    limit = [row["limit_lifecycles_per_s"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    width = 0.38
    colours = {"authority": "#4878a8", "reading": "#7aa6d0"}
    titles = {"authority": "authority (default)", "reading": "authority, remember=0"}
    for offset, side in ((-width / 2, "authority"), (width / 2, "reading")):
        xs = [x + offset for x in range(len(names))]
        left.bar(
            xs,
            [row[side]["lifecycles_per_s"]["median"] for row in rows],
            width,
            color=colours[side],
            label=titles[side],
        )
        ratios = [row[side]["ratio"] for row in rows]
        right.bar(xs, ratios, width, color=colours[side], label=titles[side])
        for x, r in zip(xs, ratios, strict=True):
            right.text(x, r + 0.02, f"{r:.2f}", ha="center", fontsize=8)
    for x, value in enumerate(limit):
        left.hlines(value, x - 0.45, x + 0.45, colors="#c03030", linewidth=2.5)
        left.hlines(value / 2, x - 0.45, x + 0.45, colors="#c03030", linestyles="dotted")
    left.plot([], [], color="#c03030", linewidth=2.5, label="limit: raw writes/s ÷ 4")
    left.plot([], [], color="#c03030", linestyle="dotted", label="target: half the limit")
    left.set_yscale("log")
    left.set_xticks(list(range(len(names))), names, rotation=15)
    left.set_ylabel("lifecycles per second (log)")
    left.set_title("Lifecycles (admit, claim, start, complete) against the limit", fontsize=10)
    left.legend(fontsize=7)
    right.axhline(0.5, color="#c03030", linestyle="dotted", label="target 0.5")
    right.axhline(1.0, color="#c03030", linewidth=1, label="the limit")
    right.set_xticks(list(range(len(names))), names, rotation=15)
    right.set_ylabel("ratio to the limit")
    top = max([1.1] + [row[s]["ratio"] + 0.15 for row in rows for s in ("authority", "reading")])
    right.set_ylim(0, top)
    right.set_title("lifecycles/s ÷ (raw writes/s ÷ 4)", fontsize=10)
    right.legend(fontsize=7)
    save_figure(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the harness; print and save the figures; return them."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "bench.cas")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: memory, sqlite-full, sqlite-normal, postgres",
    )
    parser.add_argument("--lifecycles", type=int, default=1000, help="lifecycles per sample")
    parser.add_argument(
        "--memory-lifecycles", type=int, default=0, help="for memory (default: --lifecycles)"
    )
    parser.add_argument("--payload", type=int, default=1500, help="bytes of input per workload")
    parser.add_argument(
        "--pg-threads",
        default="1",
        help="comma-separated thread counts for PostgreSQL (each a row, e.g. 1,8)",
    )
    parser.add_argument("--pg-fsync", choices=("on", "off"), default="on")
    parser.add_argument("--server-dsn", default=None, help="use this server, not a private one")
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go")
    parser.add_argument("--profile", action="store_true", help="also profile each backend")
    args = parser.parse_args(argv)
    quiet = quiet_from(args)
    fixture = Fixture()
    writes = record(fixture, args.payload)
    sizes = [len(w.document.encode()) for w in writes]
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    print(f"document sizes of one lifecycle's writes: {sizes} bytes", flush=True)
    rows: list[dict[str, Any]] = []
    profiles: dict[str, str] = {}
    settings: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cas-", dir=args.dir) as tmp:
        needs_pg = any(n.startswith("postgres") for n in names)
        pg_cm = server(args.server_dsn, fsync=args.pg_fsync == "on") if needs_pg else None
        pg = pg_cm.__enter__() if pg_cm is not None else None
        try:
            if pg is not None:
                settings = pg.settings()
            plan: list[tuple[str, int]] = []
            for name in names:
                if name == "postgres":
                    plan += [(name, int(t)) for t in args.pg_threads.split(",")]
                else:
                    plan.append((name, 1))
            for name, threads in plan:
                label = name if threads == 1 else f"{name} x{threads}"
                n = args.lifecycles
                if name == "memory" and args.memory_lifecycles:
                    n = args.memory_lifecycles
                print(f"{label}: {n} lifecycles per sample, {args.reps} repetitions", flush=True)
                backend = _backend(name, Path(tmp), pg, fixture, writes, args.payload, threads)
                try:
                    for side in SIDES:  # warm every side up
                        backend.run(side, max(n // 10, 5))
                    samples = alternate(
                        args.reps,
                        {side: partial(backend.run, side, n) for side in SIDES},
                        quiet,
                        log=print,
                    )
                    per_op = _per_operation(backend, n, args.reps, quiet)
                    if args.profile:
                        for side in SIDES[1:]:
                            profiles[f"{label} {side}"] = backend.profile(side, max(n // 2, 5))
                finally:
                    backend.close()
                rows.append(_row(label, threads, n, samples))
                rows[-1]["per_operation_us"] = per_op
        finally:
            if pg_cm is not None:
                pg_cm.__exit__(None, None, None)
    result = {
        "command": command_line("bench.cas", argv),
        "machine": machine(),
        "document_bytes": sizes,
        "payload_bytes": args.payload,
        "postgres": settings,
        "rows": rows,
    }
    _print(rows)
    name = args.name or "cas"
    save(args.out, name, result)
    for label, text in profiles.items():
        slug = label.replace(" ", "")
        path = args.out / "results" / f"cas-profile-{slug}.txt"
        path.write_text(text)
        print(f"profile of {label}: {path}")
    if not args.no_plot:
        _plot(args.out / "plots" / f"{name}.png", rows)
    return result


def _per_operation(
    backend: Backend, n: int, reps: int, quiet: Quiet
) -> dict[str, dict[str, float]]:
    """Per side, each call's CPU µs: the median over `reps` runs of n lifecycles each."""
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES[1:]}
    for _ in range(reps):
        quiet.wait()
        for side in SIDES[1:]:
            runs[side].append(backend.per_operation_us(side, n))
    out: dict[str, dict[str, float]] = {}
    for side, got in runs.items():
        out[side] = {op: round(median([run[op] for run in got]), 1) for op in OPERATIONS}
        out[side]["lifecycle"] = round(sum(out[side][op] for op in OPERATIONS), 1)
        print(f"  {side}: CPU µs per call {out[side]}", flush=True)
    return out


def _row(label: str, threads: int, n: int, samples: dict[str, list[Sample]]) -> dict[str, Any]:
    raw = summary(samples["raw"])
    limit = raw["median"] / 4
    row: dict[str, Any] = {
        "backend": label,
        "threads": threads,
        "lifecycles_per_sample": n,
        "raw_writes_per_s": raw,
        "limit_lifecycles_per_s": round(limit, 1),
    }
    for side in SIDES[1:]:
        got = summary(samples[side])
        # The ratio of each round's pair, too: both halves ran back to back.
        paired = [
            a.value / (r.value / 4) for a, r in zip(samples[side], samples["raw"], strict=True)
        ]
        row[side] = {
            "lifecycles_per_s": got,
            "ratio": round(got["median"] / limit, 3) if limit else 0.0,
            "ratio_per_round": [round(r, 3) for r in paired],
        }
    return row


def _print(rows: list[dict[str, Any]]) -> None:
    print()
    print(
        "| backend | raw writes/s | limit (÷4) | lifecycles/s | ratio"
        " | lifecycles/s, remember=0 | ratio | load (median/max) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        raw, plain, fast = row["raw_writes_per_s"], row["authority"], row["reading"]
        loads = [raw, plain["lifecycles_per_s"], fast["lifecycles_per_s"]]
        low = median([s["load_median"] for s in loads])
        load = f"{low:.2f}/{max(s['load_max'] for s in loads):.2f}"
        print(
            f"| {row['backend']} | {raw['median']:,.0f} | {row['limit_lifecycles_per_s']:,.0f}"
            f" | {plain['lifecycles_per_s']['median']:,.0f} | {plain['ratio']:.2f}"
            f" | {fast['lifecycles_per_s']['median']:,.0f} | {fast['ratio']:.2f} | {load} |"
        )


if __name__ == "__main__":
    main()
