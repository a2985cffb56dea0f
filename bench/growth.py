"""As the work grows: claim and sweep latency, and the authority's memory, against N workloads.

For each backend (SQLite with `synchronous=FULL`, PostgreSQL on a private
cluster) and each N, a store is bulk-loaded with N READY workloads, written
directly with SQL (documents and index columns, as the store itself would
write them). Then, alternating over the sizes round by round, a fresh process
(the "authority process") opens the store and measures:

- `claim_next`: the latency of one call that claims the best candidate;
- `recover_expired`: one sweep with 10 expired leases due (re-seeded each time);
- `enforce_deadlines`: one sweep with 10 deadlines due (re-seeded each time);

and its resident memory (RSS, and its peak) after them. The target: each
latency at N = 1,000,000 at most twice its value at N = 1,000 (index
queries, not scans), and memory flat in N.

    python -m bench.growth                               # 1e3 .. 1e6, both backends
    python -m bench.growth --sizes 1000,10000 --backends sqlite
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    BENCH_DIR,
    NOW,
    Fixture,
    base_parser,
    command_line,
    fsync_ms,
    load1,
    machine,
    median,
    need_matplotlib,
    quiet_from,
    save,
    save_figure,
)
from bench.pgserver import server
from workwarden.statemachine import Authority, Timeouts
from workwarden.storage import AuditRecord, IndexFields, MemoryStore, SQLiteStore, Store

__all__ = ["main"]

BACKENDS = ("sqlite", "postgres")
OPERATIONS = ("claim_next", "recover_expired", "enforce_deadlines")
IDLE = ("recover_expired_none_due", "enforce_deadlines_none_due")
"""The same sweeps with nothing due: the index query alone."""
DUE = 10
SWEEP_AT = NOW + 10_000_000
"""The instant of every measured call: every seeded lease and deadline has fallen."""
_KEY_WIDTH = 24


class _Recorder(MemoryStore):
    """A memory store that keeps the last document and index written under each key."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, tuple[str, IndexFields]] = {}

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        self.last[key] = (document, index)
        return super().write(key, document, index, expected_version, audit)


def templates() -> dict[str, tuple[str, str, IndexFields]]:
    """(workload id, document, index) of a READY, a CLAIMED and a deadline-carrying workload."""
    fixture = Fixture()
    store = _Recorder()
    authority = Authority(store, grants=fixture.verifier)
    ready = authority.admit(fixture.request("ready"), NOW).workload.workload_id
    claimed = authority.admit(fixture.request("claimed"), NOW).workload.workload_id
    authority.claim(claimed, "worker-lost", ("bench",), NOW, 30_000)
    timed = fixture.request("deadline", timeouts=Timeouts(queue_ms=1_000))
    deadline = authority.admit(timed, NOW).workload.workload_id
    return {
        name: (wid, *store.last[wid])
        for name, wid in (("ready", ready), ("lease", claimed), ("deadline", deadline))
    }


def key_for(prefix: str, i: int) -> str:
    """A workload id of the same length as a real one."""
    return f"workload_{prefix}{i:0{_KEY_WIDTH - len(prefix)}x}"


def _row(
    template: tuple[str, str, IndexFields], key: str, created_at: int | None = None
) -> tuple[Any, ...]:
    wid, document, index = template
    values = asdict(index)
    if created_at is not None:
        values["created_at"] = created_at
    return (
        key,
        1,
        document.replace(wid, key),
        values["tenant"],
        values["application"],
        values["state"],
        values["priority"],
        values["created_at"],
        values["eligible_at"],
        values["lease_expires_at"],
        values["next_deadline_at"],
        values["result_id"],
    )


def ready_rows(template: tuple[str, str, IndexFields], n: int) -> Iterator[tuple[Any, ...]]:
    """n READY rows, oldest first, each with its own id and age."""
    for i in range(n):
        yield _row(template, key_for("", i), NOW - n + i)


def due_rows(tpl: dict[str, tuple[str, str, IndexFields]]) -> list[tuple[Any, ...]]:
    """DUE rows with an expired lease and DUE with a fallen deadline, at version 1."""
    return [_row(tpl["lease"], key_for("a", j)) for j in range(DUE)] + [
        _row(tpl["deadline"], key_for("b", j)) for j in range(DUE)
    ]


_COLUMNS = (
    "key, version, document, tenant, application, state, priority, created_at,"
    " eligible_at, lease_expires_at, next_deadline_at, result_id"
)
_UPSERT_SET = (
    "version = excluded.version, document = excluded.document, state = excluded.state,"
    " eligible_at = excluded.eligible_at, lease_expires_at = excluded.lease_expires_at,"
    " next_deadline_at = excluded.next_deadline_at"
)


# -- loading and re-seeding, with SQL -----------------------------------------------


def load_sqlite(path: Path, template: tuple[str, str, IndexFields], n: int) -> float:
    """Create the store's schema in `path` and insert n READY rows; seconds taken."""
    SQLiteStore(path).close()
    started = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")  # loading only; the store runs at FULL
    conn.execute("BEGIN")
    conn.executemany(
        f"INSERT INTO documents ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        ready_rows(template, n),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


def seed_sqlite(path: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Put the due rows back as they were (at version 1)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        f"INSERT INTO documents ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
        f" ON CONFLICT (key) DO UPDATE SET {_UPSERT_SET}",
        rows,
    )
    conn.execute("COMMIT")
    conn.close()


def load_postgres(dsn: str, template: tuple[str, str, IndexFields], n: int) -> float:
    """Create the store's schema in `dsn` and COPY n READY rows in; seconds taken."""
    from workwarden.storage.postgres import PostgresStore

    PostgresStore(dsn, pool_size=1).close()
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY workwarden_documents ({_COLUMNS}) FROM STDIN") as copy,
        ):
            for row in ready_rows(template, n):
                copy.write_row(row)
        conn.execute("VACUUM ANALYZE workwarden_documents")
    return time.perf_counter() - started


def seed_postgres(dsn: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Put the due rows back as they were (at version 1)."""
    marks = ",".join(["%s"] * 12)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO workwarden_documents ({_COLUMNS}) VALUES ({marks})"
            f" ON CONFLICT (key) DO UPDATE SET {_UPSERT_SET}",
            rows,
        )


# -- the authority process ------------------------------------------------------


def _rss_kib() -> dict[str, int]:
    found: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                found[line.split(":")[0]] = int(line.split()[1])
    return {"rss_kib": found.get("VmRSS", 0), "peak_kib": found.get("VmHWM", 0)}


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in the authority process: open the store, time the calls, report RSS."""
    backend, where, claims, sweeps = spec["backend"], spec["where"], spec["claims"], spec["sweeps"]
    rows = due_rows(templates())
    store: Store
    if backend == "sqlite":
        store = SQLiteStore(where)

        def seed() -> None:
            seed_sqlite(where, rows)
    else:
        from workwarden.storage.postgres import PostgresStore

        store = PostgresStore(where, pool_size=2)

        def seed() -> None:
            seed_postgres(where, rows)

    fixture = Fixture()
    authority = Authority(store, grants=fixture.verifier)
    tenant, app = fixture.tenant, fixture.application
    # Warm up: one call of each kind, so that connections and caches exist.
    authority.claim_next(tenant, app, "worker-1", ("bench",), SWEEP_AT, 30_000)
    seed()
    authority.recover_expired(SWEEP_AT)
    seed()
    authority.enforce_deadlines(SWEEP_AT)
    before = _rss_kib()
    timings: dict[str, list[float]] = {name: [] for name in OPERATIONS + IDLE}
    for i in range(claims):
        started = time.perf_counter()
        claim = authority.claim_next(tenant, app, f"worker-{i}", ("bench",), SWEEP_AT, 30_000)
        timings["claim_next"].append(time.perf_counter() - started)
        assert claim is not None
    for _ in range(sweeps):
        for name in ("recover_expired", "enforce_deadlines"):
            seed()
            sweep = getattr(authority, name)
            started = time.perf_counter()
            changed = sweep(SWEEP_AT)
            timings[name].append(time.perf_counter() - started)
            assert len(changed) == DUE, (name, len(changed))
            started = time.perf_counter()
            changed = sweep(SWEEP_AT)
            timings[f"{name}_none_due"].append(time.perf_counter() - started)
            assert not changed, (name, changed)
    after = _rss_kib()
    store.close()
    return {
        "ms": {name: statistics.median(v) * 1000 for name, v in timings.items()},
        "rss_before_kib": before["rss_kib"],
        "rss_after_kib": after["rss_kib"],
        "peak_kib": after["peak_kib"],
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def _run_probe(spec: dict[str, Any]) -> dict[str, Any]:
    root = str(BENCH_DIR.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "bench.growth", "--probe", json.dumps(spec)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the authority process failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the harness -------------------------------------------------------------------


def _plot(path: Path, result: dict[str, Any]) -> None:
    plt = need_matplotlib()
    fig, axes = plt.subplots(1, 4, figsize=(15, 4))
    styles = {"sqlite": ("#4878a8", "o"), "postgres": ("#d08030", "s")}
    for backend, per_size in result["series"].items():
        sizes = sorted(int(n) for n in per_size)
        colour, marker = styles.get(backend, ("#555555", "x"))
        for ax, name in zip(axes[:3], OPERATIONS, strict=True):
            values = [per_size[str(n)]["ms"][name]["median"] for n in sizes]
            ax.plot(sizes, values, marker=marker, color=colour, label=backend)
            ax.plot(sizes, [values[0] * 2] * len(sizes), linestyle="dotted", color=colour)
            idle = f"{name}_none_due"
            if idle in IDLE:
                quiet = [per_size[str(n)]["ms"][idle]["median"] for n in sizes]
                ax.plot(
                    sizes,
                    quiet,
                    marker=marker,
                    color=colour,
                    linestyle="--",
                    alpha=0.6,
                    label=f"{backend}, none due",
                )
        rss = [per_size[str(n)]["rss_after_mib"]["median"] for n in sizes]
        axes[3].plot(sizes, rss, marker=marker, color=colour, label=backend)
    for ax, name in zip(axes[:3], OPERATIONS, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("READY workloads (log)")
        ax.set_ylabel("ms per call (median, log)")
        ax.set_title(f"{name} ({DUE} due)" if name != "claim_next" else name, fontsize=10)
        ax.plot([], [], linestyle="dotted", color="#555555", label="target: 2 x at smallest N")
        ax.legend(fontsize=7)
    axes[3].set_xscale("log")
    axes[3].set_ylim(0, max([1.0] + [line.get_ydata().max() for line in axes[3].lines]) * 1.25)
    axes[3].set_xlabel("READY workloads (log)")
    axes[3].set_ylabel("MiB")
    axes[3].set_title("authority process RSS after the calls", fontsize=10)
    axes[3].legend(fontsize=7)
    save_figure(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the harness; print and save the figures; return them."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "bench.growth")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--claims", type=int, default=20, help="claim_next calls per probe")
    parser.add_argument("--sweeps", type=int, default=3, help="sweeps of each kind per probe")
    parser.add_argument("--pg-fsync", choices=("on", "off"), default="on")
    parser.add_argument("--server-dsn", default=None, help="use this server, not a private one")
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go")
    parser.add_argument("--probe", default=None, help=argparse_hidden())
    args = parser.parse_args(argv)
    if args.probe is not None:
        print(json.dumps(probe(json.loads(args.probe))))
        return {}
    quiet = quiet_from(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    tpl = templates()
    loads: dict[str, dict[str, float]] = {b: {} for b in backends}
    where: dict[tuple[str, int], str] = {}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {
        b: {str(n): [] for n in sizes} for b in backends
    }
    settings: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-growth-", dir=args.dir) as tmp:
        pg_cm = (
            server(args.server_dsn, fsync=args.pg_fsync == "on") if "postgres" in backends else None
        )
        pg = pg_cm.__enter__() if pg_cm is not None else None
        try:
            if pg is not None:
                settings = pg.settings()
            for backend in backends:
                for n in sizes:
                    print(f"{backend}: loading {n:,} READY workloads", flush=True)
                    if backend == "sqlite":
                        path = Path(tmp) / f"growth-{n}.sqlite3"
                        seconds = load_sqlite(path, tpl["ready"], n)
                        where[(backend, n)] = str(path)
                    else:
                        assert pg is not None
                        _, dsn = pg.create_database()
                        seconds = load_postgres(dsn, tpl["ready"], n)
                        where[(backend, n)] = dsn
                    loads[backend][str(n)] = round(seconds, 1)
                    print(f"  loaded in {seconds:.1f} s", flush=True)
            for rep in range(args.reps):
                for n in sizes:
                    for backend in backends:
                        load = quiet.wait()
                        flush = fsync_ms(args.dir)
                        got = _run_probe(
                            {
                                "backend": backend,
                                "where": where[(backend, n)],
                                "claims": args.claims,
                                "sweeps": args.sweeps,
                            }
                        )
                        got["load"] = round(load, 2)
                        got["fsync_ms"] = flush
                        raw[backend][str(n)].append(got)
                        ms = ", ".join(f"{k} {v:.2f} ms" for k, v in got["ms"].items())
                        print(
                            f"  rep {rep + 1}/{args.reps} {backend} N={n:,}: {ms};"
                            f" RSS {got['rss_after_kib'] / 1024:.1f} MiB"
                            f" (load {load:.2f}, fsync {flush:.2f} ms)",
                            flush=True,
                        )
        finally:
            if pg_cm is not None:
                pg_cm.__exit__(None, None, None)
    series = {b: {n: _summary(runs) for n, runs in per.items()} for b, per in raw.items()}
    result = {
        "command": command_line("bench.growth", argv),
        "machine": machine(),
        "postgres": settings,
        "due": DUE,
        "load_seconds": loads,
        "series": series,
        "growth": {
            b: {
                name: round(
                    per[str(sizes[-1])]["ms"][name]["median"]
                    / per[str(sizes[0])]["ms"][name]["median"],
                    2,
                )
                for name in OPERATIONS + IDLE
            }
            for b, per in series.items()
        },
        "runs": raw,
        "load_at_end": round(load1(), 2),
    }
    _print(result, sizes)
    name = args.name or "growth"
    save(args.out, name, result)
    if not args.no_plot:
        _plot(args.out / "plots" / f"{name}.png", result)
    return result


def argparse_hidden() -> str:
    """The help text of the option the harness uses to start its authority process."""
    return "internal: run one authority process with this JSON spec"


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, Any]:
        return {
            "median": round(median(values), 3),
            "samples": [round(v, 3) for v in values],
        }

    return {
        "ms": {name: stats([r["ms"][name] for r in runs]) for name in OPERATIONS + IDLE},
        "rss_after_mib": stats([r["rss_after_kib"] / 1024 for r in runs]),
        "peak_mib": stats([r["peak_kib"] / 1024 for r in runs]),
        "load": stats([r["load"] for r in runs]),
        "fsync_ms": stats([r["fsync_ms"] for r in runs]),
    }


def _print(result: dict[str, Any], sizes: list[int]) -> None:
    print()
    print(
        "| backend | N | claim_next ms | recover_expired ms | enforce_deadlines ms"
        " | recover, none due | enforce, none due | RSS MiB (peak) | load |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for backend, per in result["series"].items():
        for n in sizes:
            s = per[str(n)]
            ms = " | ".join(f"{s['ms'][name]['median']:.2f}" for name in OPERATIONS + IDLE)
            print(
                f"| {backend} | {n:,} | {ms} | {s['rss_after_mib']['median']:.1f}"
                f" ({s['peak_mib']['median']:.1f}) | {s['load']['median']:.2f} |"
            )
    for backend, growth in result["growth"].items():
        text = ", ".join(f"{name} x{value:.2f}" for name, value in growth.items())
        print(f"{backend}: largest N over smallest N: {text}")


if __name__ == "__main__":
    main()
