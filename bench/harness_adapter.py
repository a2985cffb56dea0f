"""A workwarden adapter for the neutral PostgreSQL job-queue benchmarking harness.

The harness (hardbyte/postgresql-job-queue-benchmarking) measures job queues
through adapters: long-running processes that read their settings from the
environment and write JSON lines on stdout, following its
`CONTRIBUTING_ADAPTERS.md` ("Runtime contract"). This module is that process
for workwarden on PostgreSQL:

    DATABASE_URL=postgresql://bench:bench@localhost:15555/workwarden_bench \\
        PRODUCER_RATE=800 WORKER_COUNT=32 SAMPLE_EVERY_S=5 python -m bench.harness_adapter

What it reads (defaults as the contract and the harness's launcher give them):
`DATABASE_URL` (required), `SCENARIO` (`long_horizon`, the only one),
`PRODUCER_MODE` (`fixed` or `depth-target`: admits up to `TARGET_DEPTH` less the
last depth read and what it admitted since, in calls of up to `PRODUCER_BATCH_MAX`),
`PRODUCER_RATE` (800 jobs/s),
`PRODUCER_BATCH_MAX` (128), `PRODUCER_BATCH_MS` (25), `TARGET_DEPTH` (1000),
`WORKER_COUNT` (32), `JOB_PAYLOAD_BYTES` (256), `JOB_WORK_MS` (1),
`SAMPLE_EVERY_S` (5); and what the harness's launcher adds:
`PRODUCER_PACING` (`harness`: admit what `ENQUEUE <n>` lines on stdin ask
for; `adapter`, the default without the harness: pace itself, crediting
`PRODUCER_RATE` on the real elapsed time), `PRODUCER_RATE_CONTROL_FILE` (a
file holding the current rate, re-read every tick) and `BENCH_INSTANCE_ID`
(stamped on every line; only instance 0 reports `queue_depth`). Its own
settings: `WORKWARDEN_BATCHED` (1: `admit_many`, `claim_many` and
`report_many`; 0: one call per admission, claim, start and completion, each
job stamped and counted as its own admission is made),
`WORKWARDEN_CLAIM_BATCH` (16, the claim limit; with `JOB_WORK_MS` set, no more jobs than run
in half a lease), `WORKWARDEN_CLAIM_STARTS`
(1: the `specs/examples/claim_starts.toml` spec, whose claim starts the
attempt in its own commit), `WORKWARDEN_LEASE_MS` (30000) and
`WORKWARDEN_POLL_MS` (50, the longest an idle worker waits between looks,
besides the store's `LISTEN` wake-up). A bad value exits with status 2 and
one line naming it.

What it writes: a `descriptor` line at startup, then on every wall-clock
multiple of `SAMPLE_EVERY_S` one line per metric: `claim_p50_ms`,
`claim_p95_ms`, `claim_p99_ms` (admission to the attempt started, over the
last 30 s), `enqueue_rate` and `completion_rate` (what was counted since the previous
tick, per second of the tick's nominal length: a tick read late moves counts
to it from the next one, never adds any, so the rates add up to the totals),
`queue_depth` (claimable now), and beside them `end_to_end_p50_ms`...
(admission to the completion committed, 30 s) and `producer_target_rate`,
which the harness also records. Percentiles come from HDR histograms
(`hdrhistogram` from PyPI, 3 significant figures, 1 µs to 1 h), one per
second in a ring of 30: bounded memory (about 3 MB) however long it runs.
`WORKER_COUNT` worker threads share one authority and one store; each claims,
starts and completes its jobs, running their `JOB_WORK_MS` one after the
other, so at most `WORKER_COUNT` jobs run at once. A `Sweeper` thread
recovers leases an earlier, killed process left. SIGTERM or SIGINT stops it:
the workers claim nothing more and complete the job each runs if it ends within
4 s, and it exits 0 within 5 s (a job still running then is left to its 30 s
lease, for a later run's sweeper to recover). A reader that goes away (`| head`)
stops it too.
One process uses one core at most (the threads share the interpreter), and a
job's admission, claim and completion cost a few ms of client CPU: to offer
more than one core can take, run the harness with `--replicas N` and
`--producer-rate` divided by N (each replica is one such process).

Plugging it into the harness (a checkout of it): run
`python -m bench.harness_adapter --manifest > workwarden-bench/adapter.json`
for the static manifest, add `CREATE DATABASE workwarden_bench;` to
`init-databases.sql`, and register `"workwarden"` in
`bench_harness/adapters.py` `ADAPTERS` with a builder that installs this
checkout (`pip install -e ".[postgres,bench]"`, or a Dockerfile that does)
and a launcher returning `LaunchSpec(argv=[sys.executable, "-m",
"bench.harness_adapter"], env=_base_env(manifest, overrides), cwd=<this checkout>)`.
Then `uv run bench run --systems workwarden --fast ...`. The schema is
created by `PostgresStore` on first use; no extension is needed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.resources
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psycopg
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]  # ships no types
from psycopg import conninfo

from workwarden.runtime import Sweeper
from workwarden.runtime.signals import from_handler
from workwarden.statemachine import (
    Authority,
    Command,
    CompleteCommand,
    CreateWorkload,
    Grant,
    GrantSigner,
    GrantVerifier,
    StartCommand,
    Subject,
    errors,
)
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.models import ClaimReply
from workwarden.statemachine.spec import load_spec
from workwarden.storage import StoreError
from workwarden.storage.pg_schema import SCHEMA_VERSION
from workwarden.storage.postgres import PostgresStore

__all__ = ["SYSTEM", "HarnessAdapter", "RollingHistogram", "Settings", "main", "manifest"]

SYSTEM = "workwarden"
"""The adapter's system name in the harness (`adapter.json`, every line)."""

TENANT, APPLICATION = "bench", "harness"
WINDOW_S = 30

#: How long a report that met a store failure is sent again before it counts as refused.
REPORT_RETRY_S = 30.0

#: The longest a batched worker holds a finished job's completion to send it with others.
REPORT_WINDOW_S = 0.025

#: The answers a report is sent again after (the same command: a replay if it committed).
_SEND_AGAIN = frozenset({errors.STORAGE_FAILURE, errors.OUTCOME_UNKNOWN})
"""The window of the latency percentiles, as the contract asks."""

_EVENT_TABLES = ("public.workwarden_audit", "public.workwarden_documents")
_EVENT_INDEXES = (
    "public.workwarden_documents_by_scope",
    "public.workwarden_documents_claimable",
    "public.workwarden_documents_leases",
    "public.workwarden_documents_deadlines",
)
_HIGHEST_US = 3_600_000_000
# Claimable now: only claimable rows carry eligible_at (see storage/pg_schema.py).
_DEPTH = (
    "SELECT count(*) FROM workwarden_documents WHERE tenant = %s AND application = %s"
    " AND eligible_at IS NOT NULL AND eligible_at <= %s"
)


def manifest() -> dict[str, Any]:
    """The harness's static `adapter.json` for this adapter."""
    return {
        "system": SYSTEM,
        "db_name": "workwarden_bench",
        "event_tables": list(_EVENT_TABLES),
        "event_indexes": list(_EVENT_INDEXES),
        "extensions": [],
        "display_name": "workwarden (Python, PostgreSQL)",
    }


def _revision() -> str:
    """The code under test, as the contract's `version` asks ("<sha-or-tag>").

    The commit of the checkout the package runs from (with `+dirty` when it has
    uncommitted changes), or else `v` and the installed package's version.
    """
    here = str(Path(__file__).resolve().parent)

    def git(*args: str) -> str:
        run = subprocess.run(
            ["git", "-C", here, *args], capture_output=True, text=True, timeout=5, check=True
        )
        return run.stdout.strip()

    try:
        sha = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        sha = ""
    if not sha:
        return "v" + metadata.version("workwarden")
    return sha + ("+dirty" if dirty else "")


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- settings ---------------------------------------------------------------


def _int(env: Mapping[str, str], name: str, default: int, least: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.bad_argument(name, f"{name} must be a whole number, not {raw!r}") from None
    if value < least:
        raise errors.bad_argument(name, f"{name} must be at least {least}, not {value}")
    return value


def _choice(env: Mapping[str, str], name: str, default: str, allowed: Sequence[str]) -> str:
    value = env.get(name, "").strip() or default
    if value not in allowed:
        raise errors.bad_argument(name, f"{name} must be one of {', '.join(allowed)}: {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """What the environment asks of the adapter (see the module docstring for each)."""

    database_url: str
    producer_mode: str = "fixed"
    producer_rate: int = 800
    producer_batch_max: int = 128
    producer_batch_ms: int = 25
    producer_pacing: str = "adapter"
    rate_control_file: str | None = None
    target_depth: int = 1000
    worker_count: int = 32
    job_payload_bytes: int = 256
    job_work_ms: int = 1
    sample_every_s: int = 5
    instance_id: int = 0
    batched: bool = True
    claim_batch: int = 16
    claim_starts: bool = True
    lease_ms: int = 30_000
    poll_ms: int = 50

    @property
    def claim_limit(self) -> int:
        """How many jobs one claim takes: `claim_batch`, fewer when the jobs are long.

        A batch's jobs run one after another under leases taken together, so at
        most as many as run in half a lease are claimed at once; the rest stay
        claimable by other workers.
        """
        if self.job_work_ms <= 0:
            return self.claim_batch
        return max(1, min(self.claim_batch, self.lease_ms // (2 * self.job_work_ms)))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read and check the settings; a missing or bad one is `WORKLOAD_INVALID`, naming it."""
        url = env.get("DATABASE_URL", "").strip()
        if not url:
            raise errors.bad_argument("DATABASE_URL", "DATABASE_URL must be set")
        _choice(env, "SCENARIO", "long_horizon", ("long_horizon",))
        return cls(
            database_url=url,
            producer_mode=_choice(env, "PRODUCER_MODE", "fixed", ("fixed", "depth-target")),
            producer_rate=_int(env, "PRODUCER_RATE", 800, 0),
            producer_batch_max=_int(env, "PRODUCER_BATCH_MAX", 128, 1),
            producer_batch_ms=_int(env, "PRODUCER_BATCH_MS", 25, 1),
            producer_pacing=_choice(env, "PRODUCER_PACING", "adapter", ("adapter", "harness")),
            rate_control_file=env.get("PRODUCER_RATE_CONTROL_FILE") or None,
            target_depth=_int(env, "TARGET_DEPTH", 1000, 0),
            worker_count=_int(env, "WORKER_COUNT", 32, 1),
            job_payload_bytes=_int(env, "JOB_PAYLOAD_BYTES", 256, 0),
            job_work_ms=_int(env, "JOB_WORK_MS", 1, 0),
            sample_every_s=_int(env, "SAMPLE_EVERY_S", 5, 1),
            instance_id=_int(env, "BENCH_INSTANCE_ID", 0, 0),
            batched=_choice(env, "WORKWARDEN_BATCHED", "1", ("0", "1")) == "1",
            claim_batch=min(_int(env, "WORKWARDEN_CLAIM_BATCH", 16, 1), 1000),
            claim_starts=_choice(env, "WORKWARDEN_CLAIM_STARTS", "1", ("0", "1")) == "1",
            lease_ms=_int(env, "WORKWARDEN_LEASE_MS", 30_000, 1000),
            poll_ms=_int(env, "WORKWARDEN_POLL_MS", 50, 1),
        )


# -- measuring --------------------------------------------------------------


class RollingHistogram:
    """Latencies of the last `window_s` seconds: one HDR histogram per second, in a ring.

    Values are kept in microseconds to 3 significant figures, from 1 µs to
    an hour (longer ones count as an hour). Memory is fixed when it is built.
    Thread-safe.
    """

    def __init__(self, window_s: int = WINDOW_S) -> None:
        self._slots = [self._histogram() for _ in range(window_s)]
        self._seconds = [-1] * window_s
        self._merged = self._histogram()
        self._lock = threading.Lock()

    @staticmethod
    def _histogram() -> Any:
        return HdrHistogram(1, _HIGHEST_US, 3, word_size=4)

    def record(self, latency_ms: float, at: float) -> None:
        """Count one latency observed at `at` (seconds since the epoch)."""
        second = int(at)
        slot = second % len(self._slots)
        value = min(max(1, round(latency_ms * 1000)), _HIGHEST_US)
        with self._lock:
            if self._seconds[slot] != second:
                self._slots[slot].reset()
                self._seconds[slot] = second
            self._slots[slot].record_value(value)

    def percentiles(self, at: float, quantiles: Sequence[float]) -> list[float]:
        """The `quantiles` (percent) in ms of the window ending at `at`; 0.0 for an empty one."""
        second = int(at)
        with self._lock:
            self._merged.reset()
            for slot, seen in zip(self._slots, self._seconds, strict=True):
                if second - len(self._slots) < seen <= second:
                    self._merged.add(slot)
            if self._merged.get_total_count() == 0:
                return [0.0 for _ in quantiles]
            return [self._merged.get_value_at_percentile(q) / 1000 for q in quantiles]


class _Counter:
    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        """Count `count` more."""
        with self._lock:
            self.value += count


class _Wake:
    """Idle workers wait here; the store's work signal (or a full claim) wakes one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    def nudge(self) -> None:
        """Wake one waiting worker; a worker not waiting yet sees the new generation."""
        with self._cond:
            self._generation += 1
            self._cond.notify()

    def wait(self, seen: int, timeout_s: float) -> int:
        """Wait up to `timeout_s` unless nudged since generation `seen`; the generation now."""
        with self._cond:
            if self._generation == seen:
                self._cond.wait(timeout_s)
            return self._generation


# -- the adapter ------------------------------------------------------------


class HarnessAdapter:
    """The producer, the workers, the depth poller and the sampler, over one PostgreSQL store."""

    def __init__(
        self, settings: Settings, out: IO[str] = sys.stdout, log: IO[str] = sys.stderr
    ) -> None:
        self.settings = settings
        self._out, self._log = out, log
        self._write_lock = threading.Lock()
        self.stop = threading.Event()
        self.store = PostgresStore(settings.database_url, pool_size=settings.worker_count + 4)
        self.authority = Authority(
            self.store, grants=GrantVerifier.without_signatures(), spec=self._spec()
        )
        self.claims = RollingHistogram()
        self.end_to_end = RollingHistogram()
        self.enqueued, self.completed, self.refused = _Counter(), _Counter(), _Counter()
        self.queue_depth = 0
        # The last depth read and how many this process had admitted when it began: what
        # was admitted since is not in it yet (one assignment, so read as one pair).
        self._depth_reading = (0, 0)
        self.target_rate = float(settings.producer_rate)
        self._tokens: queue.Queue[int] = queue.Queue(maxsize=4096)
        self._wake = _Wake()
        self._run_id = f"{settings.instance_id}-{time.time_ns():x}"
        self._payload = "x" * settings.job_payload_bytes
        self._requester = Subject(kind="service", id="bench-harness")
        self._grant = GrantSigner("bench", b"an unchecked harness key").sign(
            Grant(
                id="grant-harness",
                issuer=Subject(kind="human", id="ops"),
                subject=self._requester,
                tenant_id=TENANT,
                application_id=APPLICATION,
                issued_at=0,
                expires_at=4_000_000_000_000,
            )
        )
        self._sweeper = Sweeper(self.authority, tenant=TENANT, application=APPLICATION)

    def _spec(self) -> Any:
        if not self.settings.claim_starts:
            return None
        path = importlib.resources.files("workwarden.specs.examples") / "claim_starts.toml"
        with importlib.resources.as_file(path) as file:
            return load_spec(file)

    def say(self, text: str) -> None:
        """One log line on stderr."""
        print(f"[{SYSTEM}] {text}", file=self._log, flush=True)

    def emit(self, record: dict[str, Any]) -> None:
        """One JSON line on stdout, stamped with the instance id."""
        record.setdefault("instance_id", self.settings.instance_id)
        line = json.dumps(record)
        with self._write_lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except BrokenPipeError:
                # The reader went away (`| head`): nobody is left to report to.
                self.stop.set()

    def descriptor(self) -> dict[str, Any]:
        """The startup descriptor record."""
        params = conninfo.conninfo_to_dict(self.settings.database_url)
        return {
            "kind": "descriptor",
            "system": SYSTEM,
            "event_tables": list(_EVENT_TABLES),
            "event_indexes": list(_EVENT_INDEXES),
            "extensions": [],
            "version": _revision(),
            "schema_version": str(SCHEMA_VERSION),
            "db_name": str(params.get("dbname") or ""),
            "started_at": _iso(time.time()),
            "batched": self.settings.batched,
            "claim_starts": self.settings.claim_starts,
        }

    # -- producing ----------------------------------------------------------

    def _request(self, seq: int) -> CreateWorkload:
        return CreateWorkload(
            tenant_id=TENANT,
            application_id=APPLICATION,
            environment="production",
            definition_id="harness-job",
            definition_revision="r1",
            trigger="api",
            input={"seq": seq, "enqueued_us": time.time_ns() // 1000, "payload": self._payload},
            requested_by=self._requester,
            authorization_snapshot=self._grant,
            capability_snapshot=("bench",),
            idempotency_key=f"{self._run_id}-{seq}",
        )

    def admit(self, count: int, seq: int) -> int:
        """Admit `count` jobs numbered from `seq` (chunks of `PRODUCER_BATCH_MAX`); how many did."""
        done = 0
        while done < count and not self.stop.is_set():
            chunk = min(count - done, self.settings.producer_batch_max)
            try:
                if self.settings.batched and chunk > 1:
                    requests = [self._request(seq + done + i) for i in range(chunk)]
                    replies = self.authority.admit_many(requests, _now_ms())
                    refused = [r for r in replies if isinstance(r, WorkloadError)]
                else:
                    for _ in range(chunk):
                        # Stamped as it is sent, not when its chunk began; counted as it commits.
                        self.authority.admit(self._request(seq + done), _now_ms())
                        self.enqueued.add(1)
                        done += 1
                    continue
            except (WorkloadError, StoreError) as exc:
                self.say(f"admission failed: {exc}")
                self.stop.wait(0.1)
                return done
            for refusal in refused[:1]:
                self.say(f"admission refused: {refusal}")
            self.enqueued.add(chunk - len(refused))
            done += chunk
        return done

    def _rate(self) -> int:
        path = self.settings.rate_control_file
        if path is None:
            return self.settings.producer_rate
        try:
            with open(path, encoding="utf-8") as control:
                return max(0, int(float(control.read().strip())))
        except (OSError, ValueError):
            return self.settings.producer_rate

    def produce(self) -> None:
        """The producer: paced by itself, by the harness's tokens, or to a target depth."""
        settings, seq = self.settings, 0
        period_s = settings.producer_batch_ms / 1000
        credit, last = 0.0, time.monotonic()
        while not self.stop.is_set():
            if settings.producer_mode == "depth-target":
                self.target_rate = 0.0
                depth, admitted_before = self._depth_reading
                unseen = self.enqueued.value - admitted_before  # admitted after that read began
                wanted = settings.target_depth - depth - unseen
                if wanted <= 0:
                    self.stop.wait(0.05)
                    continue
                seq += self.admit(min(wanted, settings.producer_batch_max), seq)
            elif settings.producer_pacing == "harness":
                self.target_rate = float(self._rate())
                try:
                    count = self._tokens.get(timeout=0.25)
                except queue.Empty:
                    continue
                seq += self.admit(count, seq)
            else:
                self.stop.wait(max(0.0, period_s - (time.monotonic() - last)))
                rate = self._rate()
                self.target_rate = float(rate)
                now = time.monotonic()
                credit += rate * (now - last)  # credited on the real elapsed time
                last = now
                whole = int(credit)
                if whole >= 1:
                    credit -= whole
                    seq += self.admit(whole, seq)

    def read_tokens(self, stdin: IO[str]) -> None:
        """Queue the `ENQUEUE <n>` lines the harness's pacer writes on stdin."""
        for line in stdin:
            word, _, count = line.strip().partition(" ")
            if word == "ENQUEUE" and count.isdigit() and int(count) > 0:
                self._tokens.put(int(count))
            if self.stop.is_set():
                return

    # -- working ------------------------------------------------------------

    def _claim(self, worker: str) -> list[ClaimReply]:
        settings, now = self.settings, _now_ms()
        if settings.batched:
            return self.authority.claim_many(
                TENANT,
                APPLICATION,
                worker,
                ("bench",),
                now,
                settings.lease_ms,
                settings.claim_limit,
            )
        claim = self.authority.claim_next(
            TENANT, APPLICATION, worker, ("bench",), now, settings.lease_ms
        )
        return [] if claim is None else [claim]

    def report(self, commands: Sequence[Command]) -> list[Any]:
        """Report `commands` (batched, or one call each), until each is answered.

        A lost race (`WORKLOAD_CONFLICT`) is decided again at once, up to
        twice more. A store failure or an unknown outcome is sent again, the
        same command, after a backoff (0.1 s doubling to 2 s) for up to
        `REPORT_RETRY_S` or until the adapter stops: the replay rules make a
        report that did commit answer as it did, so a completion made during
        an outage is counted once, not as refused.
        """
        answers: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        races, pause = 0, 0.1
        deadline = time.monotonic() + REPORT_RETRY_S
        while todo:
            batch = [commands[i] for i in todo]
            replies: list[Any]
            if self.settings.batched and len(batch) > 1:
                replies = self.authority.report_many(batch, _now_ms())
            else:
                replies = [self._one(command) for command in batch]
            for i, reply in zip(todo, replies, strict=True):
                answers[i] = reply
            codes = {i: getattr(answers[i], "code", None) for i in todo}
            raced = [i for i in todo if codes[i] == errors.CONFLICT]
            failed = [i for i in todo if codes[i] in _SEND_AGAIN]
            if raced and races < 2:
                races += 1
            else:
                raced = []
            if failed and (self.stop.is_set() or time.monotonic() >= deadline):
                failed = []
            if failed and not raced:
                self.stop.wait(pause)
                pause = min(pause * 2, 2.0)
            todo = sorted(raced + failed)
        return answers

    def _one(self, command: Command) -> Any:
        try:
            return self.authority.execute(command, _now_ms())
        except WorkloadError as exc:
            return exc

    def _refused(self, reply: Any, what: str) -> bool:
        if not isinstance(reply, WorkloadError):
            return False
        self.refused.add(1)
        self.say(f"{what} refused: {reply}")
        return True

    def _observe(self, histogram: RollingHistogram, claim: ClaimReply) -> None:
        body = claim.input
        sent = body.get("enqueued_us") if isinstance(body, dict) else None
        if isinstance(sent, int):
            now = time.time()
            histogram.record(max(0.0, now * 1000 - sent / 1000), now)

    def work(self, worker: str) -> None:
        """One worker: claim, start, run each job's `JOB_WORK_MS`, complete; until stopped."""
        seen, pause = 0, 0.1
        while not self.stop.is_set():
            try:
                claims = self._claim(worker)
            except (WorkloadError, StoreError) as exc:
                self.say(f"{worker}: claim failed ({exc}); backing off {pause:.1f} s")
                self.stop.wait(pause)
                pause = min(pause * 2, 2.0)
                continue
            pause = 0.1
            if not claims:
                seen = self._wake.wait(seen, self.settings.poll_ms / 1000)
                continue
            if len(claims) == self.settings.claim_limit:
                self._wake.nudge()  # there may be more: let another idle worker look
            self._run(claims)

    def _run(self, claims: list[ClaimReply]) -> None:
        unstarted = [c for c in claims if c.started_at is None]
        for claim in claims:
            if claim.started_at is not None:
                self._observe(self.claims, claim)
        if unstarted:
            starts = [StartCommand(workload_id=c.workload_id, fence=c.fence) for c in unstarted]
            for claim, reply in zip(unstarted, self.report(starts), strict=True):
                if self._refused(reply, "start"):
                    claims.remove(claim)
                else:
                    self._observe(self.claims, claim)
        # Batched, a finished job's completion waits at most REPORT_WINDOW_S for others
        # to be sent with: short jobs go together, a long one as it finishes.
        held: list[tuple[ClaimReply, Command]] = []
        since, work_s = 0.0, self.settings.job_work_ms / 1000
        for claim in claims:
            if held and time.monotonic() - since + work_s >= REPORT_WINDOW_S:
                self._flush(held)  # they would wait past the window for this job
            if work_s:
                time.sleep(work_s)
            completion = CompleteCommand(
                workload_id=claim.workload_id,
                fence=claim.fence,
                result_id=f"result-{claim.workload_id}",
                output=None,
            )
            if not self.settings.batched:
                self._completed([claim], self.report([completion]))
                continue
            if not held:
                since = time.monotonic()
            held.append((claim, completion))
        self._flush(held)

    def _flush(self, held: list[tuple[ClaimReply, Command]]) -> None:
        """Report the completions `held` (emptied)."""
        if held:
            done, held[:] = list(held), []
            self._completed([c for c, _ in done], self.report([m for _, m in done]))

    def _completed(self, claims: Sequence[ClaimReply], replies: Sequence[Any]) -> None:
        done = 0
        for claim, reply in zip(claims, replies, strict=True):
            if not self._refused(reply, "completion"):
                self._observe(self.end_to_end, claim)
                done += 1
        self.completed.add(done)

    # -- observing ----------------------------------------------------------

    def poll_depth(self) -> None:
        """Keep `queue_depth` fresh: the scope's claimable workloads, every 200 ms."""
        while not self.stop.is_set():
            try:
                admitted = self.enqueued.value
                with self.store.connection() as conn:
                    row = conn.execute(_DEPTH, (TENANT, APPLICATION, _now_ms())).fetchone()
                self.queue_depth = int(row[0]) if row else 0
                self._depth_reading = (self.queue_depth, admitted)
            except (StoreError, psycopg.Error) as exc:  # reported, and tried again
                self.say(f"queue depth unavailable: {exc}")
            self.stop.wait(0.2)

    def listen(self) -> None:
        """Wake one idle worker each time the store says work may have become claimable."""
        signal_ = self.store.work_signal(TENANT, APPLICATION)
        try:
            while not self.stop.is_set():
                if signal_.wait(0.5):
                    self._wake.nudge()
        finally:
            signal_.close()

    def sample(self, at: float, last: tuple[float, int, int]) -> tuple[float, int, int]:
        """Emit one tick's records, stamped `at`; return what the next tick's rates start from."""
        settings = self.settings
        _, enqueued, completed = last
        # Per second of the nominal tick, not of the time between two reads: the first
        # tick counts from launch (a partial window), a late one takes counts from the
        # next, and either way the rates times the tick add up to what was counted.
        span = float(settings.sample_every_s)
        claim = self.claims.percentiles(at, (50, 95, 99))
        end = self.end_to_end.percentiles(at, (50, 95, 99))
        now_enqueued, now_completed = self.enqueued.value, self.completed.value
        tick = float(settings.sample_every_s)
        records: list[tuple[str, float, float]] = [
            ("claim_p50_ms", claim[0], WINDOW_S),
            ("claim_p95_ms", claim[1], WINDOW_S),
            ("claim_p99_ms", claim[2], WINDOW_S),
            ("enqueue_rate", (now_enqueued - enqueued) / span, tick),
            ("completion_rate", (now_completed - completed) / span, tick),
            ("end_to_end_p50_ms", end[0], WINDOW_S),
            ("end_to_end_p95_ms", end[1], WINDOW_S),
            ("end_to_end_p99_ms", end[2], WINDOW_S),
        ]
        if settings.instance_id == 0:  # observations of the whole queue: one instance reports
            records += [
                ("queue_depth", float(self.queue_depth), 0.0),
                ("producer_target_rate", self.target_rate, 0.0),
            ]
        stamp = _iso(at)
        for metric, value, window in records:
            self.emit(
                {
                    "t": stamp,
                    "system": SYSTEM,
                    "kind": "adapter",
                    "subject_kind": "adapter",
                    "subject": "",
                    "metric": metric,
                    "value": round(value, 3),
                    "window_s": float(window),
                }
            )
        return at, now_enqueued, now_completed

    def run(self, stdin: IO[str] | None = None) -> None:
        """Emit the descriptor, run until `stop` is set, then stop within a few seconds."""
        settings = self.settings
        self.emit(self.descriptor())
        threads: list[threading.Thread] = []

        def start(name: str, target: Callable[..., None], *args: Any) -> None:
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            thread.start()
            threads.append(thread)

        for n in range(settings.worker_count):
            start(f"worker-{n}", self.work, f"{self._run_id}-worker-{n}")
        start("producer", self.produce)
        start("depth", self.poll_depth)
        start("listen", self.listen)
        start("sweeper", lambda: self._sweeper.run(handle_signals=False))
        if settings.producer_pacing == "harness" and stdin is not None:
            # Not joined: it blocks reading stdin until the harness closes it.
            threading.Thread(target=self.read_tokens, args=(stdin,), daemon=True).start()
        shown = {k: v for k, v in vars(settings).items() if k != "database_url"}
        self.say(f"running: {shown}")
        last = (time.time(), 0, 0)
        every = settings.sample_every_s
        # Every wall-clock boundary from the next one on, each once: a late tick (a
        # starved process) is emitted as soon as it can be, never skipped.
        tick = (int(time.time()) // every + 1) * every
        while not self.stop.is_set():
            while not self.stop.is_set() and time.time() < tick:
                self.stop.wait(min(0.25, max(0.0, tick - time.time())))
            if not self.stop.is_set():
                last = self.sample(float(tick), last)
                tick += every
        self._sweeper.stop()
        deadline = time.monotonic() + 4.0
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        cpu_ms = time.process_time() * 1000
        jobs = max(1, self.completed.value)
        self.say(
            f"stopped: enqueued={self.enqueued.value} completed={self.completed.value}"
            f" refused={self.refused.value} cpu_ms_per_job={cpu_ms / jobs:.2f}"
        )
        try:
            self._out.flush()
        except BrokenPipeError:
            # Nothing more reaches the reader; keep the interpreter's last flush quiet.
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), self._out.fileno())
        self.store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the adapter with the environment's settings (`--manifest`: print adapter.json)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--manifest"]:
        print(json.dumps(manifest(), indent=2, sort_keys=True))
        return 0
    if args:
        print(f"usage: python -m bench.harness_adapter [--manifest] (not {args})", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env(os.environ)
        adapter = HarnessAdapter(settings)
    except (WorkloadError, StoreError) as exc:
        print(f"[{SYSTEM}] {exc}", file=sys.stderr)
        return 2

    def on_signal(number: int, frame: FrameType | None) -> None:
        # Not `adapter.stop.set()` here: the main thread may hold the event's lock.
        from_handler(adapter.stop.set)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    adapter.run(sys.stdin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
