"""The runtime proven with real processes and real signals.

Every test starts `workwarden worker` and `workwarden sweeper` as OS processes
(`python -m workwarden ...`) against a real store, with a handler module the
test writes into a temporary directory. The handlers write into the test's own
database (a SQLite file, or a PostgreSQL database beside the store's),
guarded by the fencing token (`workwarden.fence.guard`), after a checkpoint;
they record what they saw there, so the test can check what the store alone
cannot: that each downstream row was applied exactly once, and what each
attempt read of the earlier attempts' checkpoints.

The processes are killed with SIGKILL, frozen with SIGSTOP past their lease,
stopped with SIGTERM while handlers run; the PostgreSQL server is restarted
under them, and their connections are ended from the server side. Each
process's log (`key=value` event lines on stderr) is kept per incarnation
and read back.

The drain under SIGKILL runs a few hundred workloads by default and the full
2,000 under the `thorough` profile (`WORKWARDEN_HYPOTHESIS_PROFILE=thorough`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis_profiles import PROFILE_ENV

import pg
from pg import postgres_url
from support import SIGNER, grant_for, request
from support import authority as make_authority
from workwarden.chaos.audit import audit_store
from workwarden.statemachine import Authority, RetryPolicy, Workload, default_spec
from workwarden.statemachine.models import DEFAULT_RETRY_ON
from workwarden.storage import Store, open_store
from workwarden.storage.pgserver import PrivateServer
from workwarden.storage.postgres import PostgresStore

THOROUGH = os.environ.get(PROFILE_ENV) == "thorough"
DRAIN_WORKLOADS = 2_000 if THOROUGH else 300

TENANT = "t"
APPLICATION = "app"

# What each mode of the handler leads to, once drained.
EXPECTED = {"ok": "SUCCEEDED", "flaky": "SUCCEEDED", "invalid": "DEAD_LETTER"}

HANDLER_MODULE = '''
"""The test's application: one handler that writes a fenced row downstream."""

import json
import os
import sqlite3
import time
from pathlib import Path

import psycopg

from workwarden import App, Fail, Retry
from workwarden.fence import guard
from workwarden.statemachine import WorkloadError

DOWNSTREAM = os.environ["FENCED_APP_DOWNSTREAM"]
CONTROL = Path(os.environ["FENCED_APP_CONTROL"])

app = App()


def wall_ms():
    return time.time_ns() // 1_000_000


def connect():
    if DOWNSTREAM.startswith("postgresql:"):
        return psycopg.connect(DOWNSTREAM, autocommit=True, connect_timeout=5)
    return sqlite3.connect(DOWNSTREAM, timeout=60)


def transaction(conn):
    return conn.transaction() if isinstance(conn, psycopg.Connection) else conn


def mark(conn):
    return "%s" if isinstance(conn, psycopg.Connection) else "?"


def record(table, *values):
    """An unguarded row of what the handler saw, in a transaction of its own."""
    conn = connect()
    try:
        with transaction(conn):
            marks = ", ".join([mark(conn)] * len(values))
            conn.execute(f"INSERT INTO {table} VALUES ({marks})", values)
    finally:
        conn.close()


def apply(job):
    """The fenced write: applied once per workload, whichever attempt gets there."""
    conn = connect()
    m = mark(conn)
    try:
        try:
            with transaction(conn):
                guard(conn, job.fence, job.workload_id)
                row = conn.execute(
                    f"SELECT token FROM applied WHERE workload_id = {m}", (job.workload_id,)
                ).fetchone()
                if row is not None:
                    return "already"
                conn.execute(
                    f"INSERT INTO applied VALUES ({m}, {m}, {m})",
                    (job.workload_id, job.fence.token, job.attempt),
                )
                conn.execute(
                    f"INSERT INTO effects VALUES ({m}, {m})", (job.workload_id, job.fence.token)
                )
                return "applied"
        except WorkloadError as exc:
            with transaction(conn):
                conn.execute(
                    f"INSERT INTO refusals VALUES ({m}, {m}, {m}, {m})",
                    (job.workload_id, job.fence.token, exc.code, int(job.lost)),
                )
            return "refused:" + exc.code
    finally:
        conn.close()


def wait_for(path, seconds=60.0):
    end = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > end:
            raise Fail(kind="validation", message=f"{path.name} never appeared")
        time.sleep(0.01)


@app.handler("send", needs=("email:send",))
def send(job):
    mode = job.input["mode"]
    record(
        "seen",
        job.workload_id,
        job.attempt,
        job.fence.token,
        json.dumps(job.checkpoints, sort_keys=True),
        wall_ms(),
    )
    job.checkpoint({"attempt": job.attempt, "worker": job.fence.worker_id})
    if mode == "invalid":
        raise Fail(kind="validation")
    if mode == "flaky" and job.attempt == 1:
        raise Retry(kind="transient_connection", after_ms=10)
    if mode == "freeze" and job.fence.token == 1:
        (CONTROL / f"entered-{job.workload_id}").touch()
        wait_for(CONTROL / f"go-{job.workload_id}")
    if mode == "wait_cancel":
        (CONTROL / f"entered-{job.workload_id}").touch()
        end = time.monotonic() + 60
        while not job.cancel_requested and time.monotonic() < end:
            time.sleep(0.005)
        record("cancel_seen", job.workload_id, wall_ms(), int(job.cancel_requested))
        return {"cancel_seen": job.cancel_requested}
    # While it works past its checkpoint, the attempt is marked in flight, so that
    # a kill meant to lose a checkpointed attempt can pick a process holding one.
    working = CONTROL / f"working-{os.getpid()}-{job.workload_id}"
    working.touch()
    try:
        time.sleep(job.input.get("sleep_ms", 0) / 1000)
    finally:
        working.unlink(missing_ok=True)
    return {"downstream": apply(job)}
'''

DOWNSTREAM_TABLES = (
    "CREATE TABLE seen (workload_id TEXT, attempt INTEGER, token INTEGER,"
    " checkpoints TEXT, at BIGINT)",
    "CREATE TABLE applied (workload_id TEXT PRIMARY KEY, token INTEGER, attempt INTEGER)",
    "CREATE TABLE effects (workload_id TEXT, token INTEGER)",
    "CREATE TABLE refusals (workload_id TEXT, token INTEGER, code TEXT, lost INTEGER)",
    "CREATE TABLE cancel_seen (workload_id TEXT, at BIGINT, seen INTEGER)",
)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# --- the test's own database ------------------------------------------------------------------


class Downstream:
    """The database the handlers write to: a SQLite file or a PostgreSQL database."""

    def __init__(self, url: str) -> None:
        self.url = url
        with contextlib.closing(self._connect()) as conn:
            if isinstance(conn, sqlite3.Connection):
                conn.execute("PRAGMA journal_mode=WAL")
            for statement in DOWNSTREAM_TABLES:
                conn.execute(statement)
            if isinstance(conn, sqlite3.Connection):
                conn.commit()

    def _connect(self) -> Any:
        if self.url.startswith("postgresql:"):
            return psycopg.connect(self.url, autocommit=True)
        return sqlite3.connect(self.url, timeout=60)

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        with contextlib.closing(self._connect()) as conn:
            return [tuple(row) for row in conn.execute(query).fetchall()]


# --- processes and their logs -----------------------------------------------------------------


def parse_event(line: str) -> tuple[str, dict[str, str]] | None:
    """One `event key=value ...` log line, or None for a line of another shape."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    if not words or "=" in words[0]:
        return None
    fields = dict(word.split("=", 1) for word in words[1:] if "=" in word)
    return words[0], fields


@dataclass
class Proc:
    """One OS process of the fleet, one incarnation: its command, its log, its exit."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def events(self) -> list[tuple[str, dict[str, str]]]:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return [event for event in map(parse_event, lines) if event is not None]

    def named(self, event: str) -> list[dict[str, str]]:
        return [fields for name, fields in self.events() if name == event]

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)


@dataclass
class Fleet:
    """The worker and sweeper processes of a test, started in `workdir` against `store_url`."""

    workdir: Path
    store_url: str
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)
    _seq: Counter[str] = field(default_factory=Counter)

    def _start(self, role: str, name: str, args: Sequence[str]) -> Proc:
        self._seq[name] += 1
        log = self.workdir / "logs" / f"{name}.{self._seq[name]}.log"
        log.parent.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "workwarden", role, "--store", self.store_url, *args]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, role, popen, log)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *args: str, lease_ms: int = 1_000, concurrency: int = 2) -> Proc:
        worker_id = f"{name}-{self._seq[name] + 1}"
        return self._start(
            "worker",
            name,
            [
                "--app",
                "fenced_app:app",
                "--tenant",
                TENANT,
                "--application",
                APPLICATION,
                "--worker-id",
                worker_id,
                "--lease-ms",
                str(lease_ms),
                "--concurrency",
                str(concurrency),
                *args,
            ],
        )

    def sweeper(self, *args: str) -> Proc:
        return self._start(
            "sweeper", "sweeper", ["--tenant", TENANT, "--application", APPLICATION, *args]
        )

    def alive(self, name: str | None = None) -> list[Proc]:
        return [
            p for p in self.procs if p.popen.poll() is None and (name is None or p.name == name)
        ]

    def events(self, event: str, role: str | None = None) -> list[dict[str, str]]:
        return [
            fields
            for proc in self.procs
            if role is None or proc.role == role
            for fields in proc.named(event)
        ]

    def logs(self, last: int = 8) -> str:
        """The end of the last few processes' logs, for a failure's message."""
        return "\n".join(
            f"--- {p.log.name} (exit {p.popen.poll()})\n{p.log.read_text(errors='replace')[-1500:]}"
            for p in self.procs[-last:]
        )

    def stop(self, timeout_s: float = 60.0) -> dict[str, int | None]:
        """SIGTERM to every live process, and their exit statuses (None: had to be killed).

        A process still starting (its `started` line not yet logged) has not yet
        installed its signal handlers; it is given the time to.
        """
        live = self.alive()
        end = time.monotonic() + timeout_s
        for proc in live:
            while not proc.named("started") and proc.popen.poll() is None:
                if time.monotonic() > end:
                    break
                time.sleep(0.05)
        for proc in live:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        statuses: dict[str, int | None] = {}
        for proc in live:
            try:
                statuses[proc.log.name] = proc.popen.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                statuses[proc.log.name] = None
                proc.popen.kill()
                proc.popen.wait()
        return statuses

    def kill_all(self) -> None:
        for proc in self.alive():
            proc.signal(signal.SIGCONT)
            proc.popen.kill()
            proc.popen.wait()


@contextlib.contextmanager
def fleet(tmp_path: Path, store_url: str, downstream_url: str) -> Iterator[Fleet]:
    workdir = tmp_path / "fleet"
    (workdir / "control").mkdir(parents=True)
    (workdir / "fenced_app.py").write_text(textwrap.dedent(HANDLER_MODULE))
    env = {
        **os.environ,
        "FENCED_APP_DOWNSTREAM": downstream_url,
        "FENCED_APP_CONTROL": str(workdir / "control"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("WORKWARDEN_STORE", None)
    running = Fleet(workdir, store_url, env)
    try:
        yield running
    finally:
        running.kill_all()


# --- the stores -------------------------------------------------------------------------------


@dataclass
class Backend:
    """A store the processes share, the test's own database, and how to count states."""

    kind: str
    store_url: str
    downstream: Downstream
    count_states: Any


def _sqlite_states(path: Path) -> Any:
    def count() -> Counter[str]:
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as conn:
            return Counter(
                dict(conn.execute("SELECT state, count(*) FROM documents GROUP BY state"))
            )

    return count


def _postgres_states(dsn: str) -> Any:
    def count() -> Counter[str]:
        # The test's own reads ride out the restarts and terminations it causes.
        end = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                    rows = conn.execute(
                        "SELECT state, count(*) FROM workwarden_documents GROUP BY state"
                    ).fetchall()
                    return Counter({str(row[0]): int(row[1]) for row in rows})
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)

    return count


@contextlib.contextmanager
def backend(kind: str, tmp_path: Path) -> Iterator[Backend]:
    if kind == "sqlite":
        path = tmp_path / "store.sqlite3"
        open_store(f"sqlite:///{path}", mode="create").close()
        down = Downstream(str(tmp_path / "downstream.sqlite3"))
        yield Backend(kind, f"sqlite:///{path}", down, _sqlite_states(path))
        return
    with pg.postgres_database() as dsn, pg.postgres_database(schema=False) as down_dsn:
        yield Backend(
            kind, postgres_url(dsn), Downstream(postgres_url(down_dsn)), _postgres_states(dsn)
        )


BACKEND_KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


# --- admitting, waiting, checking -------------------------------------------------------------


def admit(
    authority: Authority, modes: Sequence[str], *, sleep_ms: int = 0, max_attempts: int = 40
) -> dict[str, str]:
    """Admit one workload per mode; returns workload id -> mode."""
    policy = RetryPolicy(
        max_attempts=max_attempts,
        initial_delay_ms=20,
        max_delay_ms=200,
        retry_on=DEFAULT_RETRY_ON,
    )
    # Admitted at the wall clock's instant: a grant that lasts.
    snapshot = SIGNER.sign(grant_for(expires_at=2**53 - 1))
    admitted: dict[str, str] = {}
    for i, mode in enumerate(modes):
        req = request(
            idempotency_key=f"k{i}",
            authorization_snapshot=snapshot,
            input={"n": i, "mode": mode, "sleep_ms": sleep_ms},
            retry_policy=policy,
        )
        reply = authority.admit(req, wall_ms())
        admitted[reply.workload.workload_id] = mode
    return admitted


def wait_until(predicate: Any, timeout_s: float, what: str, fleet_: Fleet | None = None) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            logs = fleet_.logs() if fleet_ is not None else ""
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{logs}")
        time.sleep(0.05)


def terminal_count(count_states: Any) -> int:
    terminal = default_spec().terminal_states
    return sum(n for state, n in count_states().items() if state in terminal)


def workloads(store: Store) -> dict[str, Workload]:
    return {doc.key: Workload.model_validate_json(doc.document) for doc in store.scan()}


def attempt_number(attempt_id: str) -> int:
    return int(attempt_id.rsplit("_", 1)[1])


def check_drained(store: Store, down: Downstream, admitted: dict[str, str]) -> dict[str, int]:
    """Everything the drain must leave behind; returns figures for the report."""
    figures, violations = audit_store(store, default_spec(), admitted)
    assert violations == [], violations[:3]
    docs = workloads(store)
    states = {wid: docs[wid].state for wid in admitted}
    wrong = {wid: (admitted[wid], s) for wid, s in states.items() if s != EXPECTED[admitted[wid]]}
    assert wrong == {}, f"{len(wrong)} workloads ended elsewhere: {list(wrong.items())[:5]}"

    effects = Counter(wid for (wid, _token) in down.rows("SELECT * FROM effects"))
    applied = {wid: token for (wid, token, _attempt) in down.rows("SELECT * FROM applied")}
    for wid, mode in admitted.items():
        if EXPECTED[mode] == "SUCCEEDED":
            assert effects[wid] == 1, (wid, effects[wid])
            winner = [a for a in docs[wid].attempts if a.status == "SUCCEEDED"]
            assert len(winner) == 1
            # The row was applied by the attempt that succeeded or by an earlier one.
            assert applied[wid] <= winner[0].fencing_token
        else:
            assert effects[wid] == 0, (wid, effects[wid])

    # What each attempt saw at its start is every checkpoint the earlier attempts
    # recorded, in order: those of attempts that failed, and of those whose worker
    # was lost (killed, or its lease lapsed) with the work in hand.
    resumed = 0
    saw_lost = 0
    for wid, attempt, token, checkpoints, _at in down.rows("SELECT * FROM seen"):
        earlier = [c for c in docs[wid].checkpoints if attempt_number(c.attempt_id) < attempt]
        assert json.loads(checkpoints) == [c.state for c in earlier], (wid, attempt, token)
        if attempt > 1:
            resumed += 1
            lost = {a.attempt_id for a in docs[wid].attempts if a.status == "WORKER_LOST"}
            if any(c.attempt_id in lost for c in earlier):
                saw_lost += 1
    return {
        "workloads": len(admitted),
        "documents": figures.documents,
        "resumed_attempts": resumed,
        "resumed_after_a_lost_attempt": saw_lost,
        "refused_downstream": len(down.rows("SELECT * FROM refusals")),
    }


# --- 1. a drain while workers are killed ------------------------------------------------------


def _chaos_drain(
    tmp_path: Path,
    kind: str,
    count: int,
    *,
    workers: int = 4,
    worker_args: Sequence[str] = (),
) -> tuple[dict[str, int], Fleet]:
    rng = random.Random(2026)
    modes = ["flaky" if i % 10 == 0 else "invalid" if i % 25 == 1 else "ok" for i in range(count)]
    with backend(kind, tmp_path) as be, fleet(tmp_path, be.store_url, be.downstream.url) as f:
        store = open_store(be.store_url)
        try:
            # Each handler works 25 ms after its checkpoint: a kill lands on a
            # checkpointed attempt whose work another worker then resumes.
            admitted = admit(make_authority(store), modes, sleep_ms=25)
            names = [f"w{i}" for i in range(workers)]
            for name in names:
                f.worker(name, *worker_args)
            f.sweeper()
            kills = 0
            started = time.monotonic()
            # Every few hundred ms, kill a random worker that holds an attempt past its
            # checkpoint (so the kill loses one, which another worker resumes) and start
            # another in its place, until nine tenths are done (and at least one was
            # killed, however fast the drain); the rest drains in peace.
            control = f.workdir / "control"
            done, progress_at = 0, time.monotonic()
            while done < 0.9 * count or (kills == 0 and done < count):
                if time.monotonic() - progress_at > 120:
                    pytest.fail(f"no workload ended for 120 s, at {done}\n{f.logs()}")
                if (now_done := terminal_count(be.count_states)) > done:
                    done, progress_at = now_done, time.monotonic()
                time.sleep(rng.uniform(0.2, 0.6))
                ripe = [
                    p
                    for p in f.alive()
                    if p.role == "worker" and any(control.glob(f"working-{p.popen.pid}-*"))
                ]
                if not ripe:
                    continue
                victim = rng.choice(ripe)
                victim.signal(signal.SIGKILL)
                victim.popen.wait()
                kills += 1
                f.worker(victim.name, *worker_args)
            wait_until(lambda: terminal_count(be.count_states) == count, 300, "the drain", f)
            elapsed = time.monotonic() - started
            statuses = f.stop()
            assert set(statuses.values()) == {0}, f"{statuses}\n{f.logs()}"
            figures = check_drained(store, be.downstream, admitted)
            figures |= {
                "kills": kills,
                "seconds": round(elapsed),
                "claimed": len(f.events("claimed")),
                "completed": len(f.events("completed")),
                "lost": len(f.events("lost")),
                "recovered": len(f.events("recovered")),
                "store_error": len(f.events("store_error")),
            }
            return figures, f
        finally:
            store.close()


@pytest.mark.parametrize("mode", ["--batch", "--no-batch"])
@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_workers_killed_at_random_drain_every_workload_once(
    tmp_path: Path, kind: str, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    figures, _ = _chaos_drain(tmp_path, kind, DRAIN_WORKLOADS, worker_args=[mode])
    with capsys.disabled():
        print(f"\n[{kind} {mode}] drain under SIGKILL: {json.dumps(figures, sort_keys=True)}")
    assert figures["kills"] > 0
    # Retried work read its first attempt's checkpoint, and work taken over from a
    # killed worker read the lost attempt's.
    assert figures["resumed_attempts"] >= DRAIN_WORKLOADS // 10
    assert figures["resumed_after_a_lost_attempt"] > 0


# --- 2. a worker frozen past its lease --------------------------------------------------------


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_a_worker_frozen_past_its_lease_is_refused_downstream_and_upstream(
    tmp_path: Path, kind: str
) -> None:
    with backend(kind, tmp_path) as be, fleet(tmp_path, be.store_url, be.downstream.url) as f:
        store = open_store(be.store_url)
        try:
            (wid,) = admit(make_authority(store), ["freeze"])
            frozen = f.worker("frozen", lease_ms=600, concurrency=1)
            control = f.workdir / "control"
            wait_until((control / f"entered-{wid}").exists, 60, "the handler to start", f)
            frozen.signal(signal.SIGSTOP)
            f.sweeper()
            taker = f.worker("taker", lease_ms=600, concurrency=1)
            wait_until(lambda: workloads(store)[wid].state == "SUCCEEDED", 60, "the takeover", f)
            # The frozen worker wakes up, its handler goes on and tries to write.
            (control / f"go-{wid}").touch()
            frozen.signal(signal.SIGCONT)
            wait_until(
                lambda: len(be.downstream.rows("SELECT * FROM refusals")) == 1,
                30,
                "the frozen handler's write",
                f,
            )
            wait_until(lambda: frozen.named("lost"), 30, "the frozen worker's report", f)
            statuses = f.stop()
            assert set(statuses.values()) == {0}, f"{statuses}\n{f.logs()}"

            doc = workloads(store)[wid]
            assert doc.state == "SUCCEEDED"
            ((_, token, code, _lost),) = be.downstream.rows("SELECT * FROM refusals")
            assert (token, code) == (1, "WORKLOAD_STALE_FENCE")
            assert be.downstream.rows("SELECT * FROM effects") == [(wid, 2)]
            assert [a.status for a in doc.attempts].count("SUCCEEDED") == 1
            assert [(a.worker_id, a.fencing_token, a.status) for a in doc.attempts] == [
                ("frozen-1", 1, "WORKER_LOST"),
                ("taker-1", 2, "SUCCEEDED"),
            ]
            assert not [e for e in frozen.named("completed") if e.get("workload") == wid]
            assert [e for e in frozen.named("lost") if e.get("workload") == wid]
            assert [e for e in taker.named("completed") if e.get("workload") == wid]
            _, violations = audit_store(store, default_spec(), [wid])
            assert violations == []
        finally:
            store.close()


# --- 3. SIGTERM with handlers in flight -------------------------------------------------------


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_sigterm_lets_in_flight_handlers_finish_and_claims_nothing_new(
    tmp_path: Path, kind: str
) -> None:
    with backend(kind, tmp_path) as be, fleet(tmp_path, be.store_url, be.downstream.url) as f:
        store = open_store(be.store_url)
        try:
            admitted = admit(make_authority(store), ["ok"] * 5, sleep_ms=1_500)
            proc = f.worker("w", "--grace-s", "20", lease_ms=1_000, concurrency=2)
            wait_until(
                lambda: len(be.downstream.rows("SELECT * FROM seen")) == 2,
                60,
                "two handlers in flight",
                f,
            )
            proc.signal(signal.SIGTERM)
            status = proc.popen.wait(60)
            assert status == 0, f.logs()

            in_flight = {wid for (wid, *_rest) in be.downstream.rows("SELECT * FROM seen")}
            docs = workloads(store)
            assert {wid for wid in admitted if docs[wid].state == "SUCCEEDED"} == in_flight
            assert {docs[wid].state for wid in set(admitted) - in_flight} == {"READY"}
            assert all(not docs[wid].attempts for wid in set(admitted) - in_flight)
            assert {e["workload"] for e in proc.named("claimed")} == in_flight
            assert {e["workload"] for e in proc.named("completed")} == in_flight
            assert proc.named("stopping")
            assert proc.named("stopped")
            assert sorted(wid for (wid, _t) in be.downstream.rows("SELECT * FROM effects")) == (
                sorted(in_flight)
            )
        finally:
            store.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_until_idle_stops_gracefully_on_a_signal_too(tmp_path: Path, sig: int) -> None:
    # `--until-idle` is how batch jobs run: a signal must let the handler finish and
    # report, exactly as it does for a worker that runs until stopped.
    with backend("sqlite", tmp_path) as be, fleet(tmp_path, be.store_url, be.downstream.url) as f:
        store = open_store(be.store_url)
        try:
            [wid, *rest] = admit(make_authority(store), ["ok"] * 3, sleep_ms=1_500)
            proc = f.worker("w", "--grace-s", "20", "--until-idle", concurrency=1)
            wait_until(
                lambda: len(be.downstream.rows("SELECT * FROM seen")) == 1,
                60,
                "the handler in flight",
                f,
            )
            proc.signal(sig)
            assert proc.popen.wait(60) == 0, f.logs()
            assert proc.named("stopping")
            assert proc.named("stopped")[-1].get("abandoned") == "0"
            docs = workloads(store)
            [(ran, *_)] = be.downstream.rows("SELECT * FROM seen")
            assert docs[ran].state == "SUCCEEDED"
            assert {docs[other].state for other in {wid, *rest} - {ran}} == {"READY"}
        finally:
            store.close()


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_exits_at_once(tmp_path: Path, sig: int, status: int) -> None:
    with backend("sqlite", tmp_path) as be, fleet(tmp_path, be.store_url, be.downstream.url) as f:
        store = open_store(be.store_url)
        try:
            admit(make_authority(store), ["ok"], sleep_ms=30_000)
            proc = f.worker("w", "--grace-s", "60", lease_ms=1_000, concurrency=1)
            wait_until(
                lambda: len(be.downstream.rows("SELECT * FROM seen")) == 1,
                60,
                "the handler in flight",
                f,
            )
            proc.signal(sig)
            wait_until(lambda: proc.named("stopping"), 30, "the first signal's effect", f)
            proc.signal(sig)
            # Well before the handler's 30 s or the 60 s grace.
            assert proc.popen.wait(15) == status, f.logs()
        finally:
            store.close()


# --- 4. PostgreSQL restarted, and connections ended by the server -----------------------------


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """A PostgreSQL server of this test's own, so restarting it disturbs no other test."""
    with pg.own_server() as server:
        yield server


@pytest.mark.postgres
def test_workers_ride_out_a_server_restart_and_killed_connections(
    tmp_path: Path, private_server: PrivateServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(private_server.dsn("postgres"), autocommit=True) as admin:
        admin.execute("CREATE DATABASE store")
        admin.execute("CREATE DATABASE downstream")
    store_dsn = private_server.dsn("store")
    PostgresStore(store_dsn, pool_size=1).close()
    down = Downstream(postgres_url(private_server.dsn("downstream")))
    count = DRAIN_WORKLOADS
    modes = ["flaky" if i % 10 == 0 else "invalid" if i % 25 == 1 else "ok" for i in range(count)]
    counts = _postgres_states(store_dsn)
    terminations = 0
    restarts = 0
    with fleet(tmp_path, postgres_url(store_dsn), down.url) as f:
        store = PostgresStore(store_dsn, pool_size=2)
        try:
            admitted = admit(make_authority(store), modes, sleep_ms=5)
            for name in ("w0", "w1", "w2", "w3"):
                f.worker(name)
            f.sweeper()
            stop = threading.Event()

            def terminate_backends() -> None:
                nonlocal terminations
                while not stop.wait(0.25):
                    try:
                        with psycopg.connect(
                            private_server.dsn("postgres"), autocommit=True, connect_timeout=2
                        ) as conn:
                            ended = conn.execute(
                                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                " WHERE datname IN ('store', 'downstream')"
                                " AND pid <> pg_backend_pid()"
                            ).fetchone()
                            terminations += ended[0] if ended else 0
                    except psycopg.OperationalError:
                        continue  # the server is restarting

            killer = threading.Thread(target=terminate_backends, daemon=True)
            wait_until(lambda: terminal_count(counts) >= count // 4, 300, "a quarter", f)
            killer.start()
            wait_until(lambda: terminal_count(counts) >= count // 2, 300, "half", f)
            private_server.restart(down_s=1.0)
            restarts += 1
            wait_until(lambda: terminal_count(counts) >= 3 * count // 4, 300, "3/4", f)
            stop.set()
            killer.join()
            wait_until(lambda: terminal_count(counts) == count, 300, "the drain", f)
            statuses = f.stop()
            assert set(statuses.values()) == {0}, f"{statuses}\n{f.logs()}"
            figures = check_drained(store, down, admitted)
        finally:
            store.close()
    errors = Counter(f"{e.get('call')}:{e.get('code')}" for e in f.events("store_error"))
    lost = Counter(e.get("reason") for e in f.events("lost"))
    reconnects = sum(
        p.log.read_text(errors="replace").count("error connecting in") for p in f.procs
    )
    figures |= {
        "restarts": restarts,
        "backends_terminated": terminations,
        "store_error_lines": sum(errors.values()),
        "pool_connect_errors": reconnects,
        "retried": len(f.events("retried")),
        "lost": sum(lost.values()),
    }
    with capsys.disabled():
        print(f"\n[postgres] restart + pg_terminate_backend: {json.dumps(figures, sort_keys=True)}")
        print(f"  store_error by call:code: {dict(errors.most_common())}")
        print(f"  lost by reason: {dict(lost.most_common())}")
    assert terminations > 0
    assert figures["store_error_lines"] > 0


# --- 5. cancellation while the handler runs ---------------------------------------------------


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_a_cancellation_reaches_the_running_handler_within_a_heartbeat(
    tmp_path: Path, kind: str
) -> None:
    lease_ms = 3_000
    heartbeat_ms = lease_ms // 3  # the worker's default heartbeat_fraction
    with backend(kind, tmp_path) as be, fleet(tmp_path, be.store_url, be.downstream.url) as f:
        store = open_store(be.store_url)
        try:
            authority = make_authority(store)
            (wid,) = admit(authority, ["wait_cancel"])
            proc = f.worker("w", lease_ms=lease_ms, concurrency=1)
            control = f.workdir / "control"
            wait_until((control / f"entered-{wid}").exists, 60, "the handler to start", f)
            asked_at = wall_ms()
            authority.cancel(wid, "ops", asked_at)
            wait_until(
                lambda: workloads(store)[wid].state == "CANCELLED", 30, "the cancellation", f
            )
            ((_, seen_at, seen),) = be.downstream.rows("SELECT * FROM cancel_seen")
            assert seen == 1
            # One heartbeat interval, and the slack of two processes sharing two cores.
            assert seen_at - asked_at <= heartbeat_ms + 300, (seen_at - asked_at, heartbeat_ms)
            assert [e for e in proc.named("cancelled") if e.get("workload") == wid]
            statuses = f.stop()
            assert set(statuses.values()) == {0}, f"{statuses}\n{f.logs()}"
            assert be.downstream.rows("SELECT * FROM effects") == []
        finally:
            store.close()
