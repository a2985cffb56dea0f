"""The harness adapter (`bench.harness_adapter`) run as the harness runs it, held to its contract.

Each run is a real process on the suite's private PostgreSQL, given the
contract's environment for a few seconds and then SIGTERM; every line it
printed is checked against hardbyte/postgresql-job-queue-benchmarking's
`CONTRIBUTING_ADAPTERS.md`: a descriptor first, then on each wall-clock
multiple of `SAMPLE_EVERY_S` one record of each required metric, with the
fields, windows and ordered percentiles the contract names. What it says it
did is checked against the database.
"""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.harness_adapter import WINDOW_S, RollingHistogram
from pg import postgres_database

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = (
    "claim_p50_ms",
    "claim_p95_ms",
    "claim_p99_ms",
    "enqueue_rate",
    "completion_rate",
    "queue_depth",
)
DESCRIPTOR_FIELDS = (
    "kind",
    "system",
    "event_tables",
    "extensions",
    "version",
    "schema_version",
    "db_name",
    "started_at",
)
SAMPLE_FIELDS = ("t", "system", "kind", "subject_kind", "subject", "metric", "value", "window_s")
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@dataclass
class Run:
    """What one run of the adapter printed, how it ended, and what it said it did."""

    lines: list[str]
    stderr: str
    returncode: int
    exit_s: float
    runtime_s: float

    def counts(self) -> dict[str, int]:
        """The enqueued / completed / refused counts of its last log line."""
        found = re.search(r"stopped: enqueued=(\d+) completed=(\d+) refused=(\d+)", self.stderr)
        assert found is not None, self.stderr
        return dict(
            zip(("enqueued", "completed", "refused"), map(int, found.groups()), strict=True)
        )


@pytest.fixture
def dsn() -> Iterator[str]:
    """An empty database on the suite's private server."""
    with postgres_database() as name:
        yield name


def _run(dsn: str, ticks: int, env: Mapping[str, str], stdin_text: str | None = None) -> Run:
    """Run the adapter until it has sampled `ticks` times (at most a minute), then SIGTERM it."""
    environment = {
        **os.environ,
        "DATABASE_URL": dsn,
        "SCENARIO": "long_horizon",
        "PRODUCER_MODE": "fixed",
        "SAMPLE_EVERY_S": "1",
        "JOB_PAYLOAD_BYTES": "256",
        "JOB_WORK_MS": "1",
        **env,
    }
    launched = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.harness_adapter"],
        cwd=ROOT,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    if stdin_text is not None:
        proc.stdin.write(stdin_text)
        proc.stdin.flush()
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    lines: list[str] = []
    stamps: set[str] = set()
    give_up = time.monotonic() + 60
    while len(stamps) < ticks and time.monotonic() < give_up:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        stamp = json.loads(line).get("t")
        if stamp is not None:
            stamps.add(stamp)
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    returncode = proc.wait(30)
    exit_s = time.monotonic() - stopped
    drain.join(10)
    runtime_s = stopped - launched
    return Run(lines + rest.splitlines(), "".join(err), returncode, exit_s, runtime_s)


def _contract(run: Run, sample_every_s: int) -> dict[str, list[dict[str, Any]]]:
    """Check every line against the contract; return the samples by tick stamp."""
    assert run.returncode == 0, run.stderr
    assert run.exit_s < 5.0, "the contract allows 5 s from SIGTERM to exit"
    assert "Traceback" not in run.stderr, run.stderr
    records = [json.loads(line) for line in run.lines]
    descriptor, samples = records[0], records[1:]
    assert descriptor["kind"] == "descriptor"
    assert all(field in descriptor for field in DESCRIPTOR_FIELDS), descriptor
    assert descriptor["system"] == "workwarden"
    assert {"public.workwarden_documents", "public.workwarden_audit"} <= set(
        descriptor["event_tables"]
    )
    assert descriptor["extensions"] == []
    assert _ISO.match(descriptor["started_at"])
    # "<sha-or-tag>": this checkout's commit, so a run names the code it measured.
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", descriptor["version"]), descriptor["version"]
    ticks: dict[str, list[dict[str, Any]]] = {}
    for sample in samples:
        assert all(field in sample for field in SAMPLE_FIELDS), sample
        assert (sample["kind"], sample["subject_kind"]) == ("adapter", "adapter")
        assert (sample["system"], sample["subject"]) == ("workwarden", "")
        assert _ISO.match(sample["t"]), sample
        value = sample["value"]
        assert isinstance(value, int | float), sample
        assert math.isfinite(value), sample
        assert value >= 0, sample
        ticks.setdefault(sample["t"], []).append(sample)
    stamps = list(ticks)
    assert stamps == sorted(stamps), "sample timestamps go forward"
    assert len(stamps) >= 2, f"only {len(stamps)} ticks in the run"
    seconds = [dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")) for stamp in stamps]
    for moment in seconds:
        assert (moment.microsecond, moment.second % sample_every_s) == (0, 0), moment
    for earlier, later in itertools.pairwise(seconds):
        assert (later - earlier).total_seconds() == sample_every_s, "one tick per boundary"
    for stamp, group in ticks.items():
        metrics = [s["metric"] for s in group]
        assert sorted(m for m in metrics if m in REQUIRED) == sorted(REQUIRED), stamp
        assert len(metrics) == len(set(metrics)), f"a metric twice at {stamp}"
        value = {s["metric"]: s["value"] for s in group}
        window = {s["metric"]: s["window_s"] for s in group}
        assert value["claim_p50_ms"] <= value["claim_p95_ms"] <= value["claim_p99_ms"], group
        assert value["end_to_end_p50_ms"] <= value["end_to_end_p99_ms"], group
        assert (window["claim_p99_ms"], window["queue_depth"]) == (WINDOW_S, 0)
        assert window["enqueue_rate"] == window["completion_rate"] == sample_every_s
    return ticks


def _database(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        documents = conn.execute("SELECT count(*) FROM workwarden_documents").fetchone()
        rows = conn.execute(
            "SELECT operation, count(*) FROM workwarden_audit GROUP BY operation"
        ).fetchall()
    assert documents is not None
    return {"documents": int(documents[0]), **{str(op): int(n) for op, n in rows}}


def _series(ticks: dict[str, list[dict[str, Any]]], metric: str) -> list[float]:
    return [s["value"] for group in ticks.values() for s in group if s["metric"] == metric]


@pytest.mark.postgres
def test_a_batched_run_keeps_to_the_contract_and_reports_what_it_did(dsn: str) -> None:
    run = _run(dsn, 6, {"PRODUCER_RATE": "150", "WORKER_COUNT": "4"})
    ticks = _contract(run, 1)
    counts, stored = run.counts(), _database(dsn)
    assert counts["refused"] == 0, run.stderr
    assert stored["documents"] == stored["admit"] == counts["enqueued"]
    assert stored["complete"] == counts["completed"] > 0
    # The claim started each attempt in its own commit: no start was reported.
    assert "start" not in stored
    # The rates are what was counted: one-second ticks add up to at most every admission.
    counted = sum(_series(ticks, "enqueue_rate"))
    assert counted <= counts["enqueued"] + 1
    # Paced on the real elapsed time: never more than was asked since launch (and one
    # batch), and on a starved machine still a good part of it.
    assert counts["enqueued"] <= 150 * run.runtime_s + 128
    assert counted >= 0.25 * 150 * (len(ticks) - 1), _series(ticks, "enqueue_rate")
    assert max(_series(ticks, "claim_p99_ms")) > 0
    assert set(_series(ticks, "producer_target_rate")) == {150.0}


@pytest.mark.postgres
def test_one_call_at_a_time_admits_exactly_the_harness_tokens(dsn: str) -> None:
    tokens = "".join("ENQUEUE 20\n" for _ in range(6)) + "ENQUEUE 0\nnoise\n"
    run = _run(
        dsn,
        4,
        {
            "PRODUCER_PACING": "harness",
            "PRODUCER_RATE": "100",
            "WORKER_COUNT": "3",
            "WORKWARDEN_BATCHED": "0",
            "WORKWARDEN_CLAIM_STARTS": "0",
        },
        tokens,
    )
    _contract(run, 1)
    counts, stored = run.counts(), _database(dsn)
    assert counts["enqueued"] == stored["documents"] == 120
    assert stored["complete"] == counts["completed"] > 0
    # Under the shipped spec every completed attempt was started by its own report.
    assert stored["start"] >= stored["complete"]


@pytest.mark.postgres
@pytest.mark.parametrize("batch_max", [10, 1], ids=["batches", "one-job-per-call"])
def test_depth_target_mode_keeps_the_queue_near_the_target(dsn: str, batch_max: int) -> None:
    # With PRODUCER_BATCH_MAX=1 (a row-by-row run) too: the producer is not held to
    # one admission per look at the depth.
    env = {
        "PRODUCER_MODE": "depth-target",
        "TARGET_DEPTH": "40",
        "PRODUCER_BATCH_MAX": str(batch_max),
        "WORKER_COUNT": "1",
        # Jobs slow enough that the producer outpaces the worker even on a loaded
        # machine: the depth then rises to the target and is held there.
        "JOB_WORK_MS": "100",
        "WORKWARDEN_CLAIM_BATCH": "2",
    }
    run = _run(dsn, 5, env)
    ticks = _contract(run, 1)
    depths = _series(ticks, "queue_depth")
    assert max(depths) <= 40 + batch_max, depths
    assert max(depths[2:]) >= 20, "the producer refills the queue as it drains"
    assert set(_series(ticks, "producer_target_rate")) == {0.0}
    assert run.counts()["completed"] > 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PRODUCER_MODE", "bursty"),
        ("WORKER_COUNT", "0"),
        ("SAMPLE_EVERY_S", "five"),
        ("SCENARIO", "pickup_latency"),
    ],
)
def test_a_bad_setting_exits_2_naming_it_without_a_traceback(name: str, value: str) -> None:
    env = {**os.environ, "DATABASE_URL": "postgresql:///never-used", name: value}
    done = subprocess.run(
        [sys.executable, "-m", "bench.harness_adapter"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert name in done.stderr
    assert "Traceback" not in done.stderr


def test_the_manifest_names_what_the_descriptor_names() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.harness_adapter", "--manifest"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    manifest = json.loads(done.stdout)
    assert manifest["system"] == "workwarden"
    assert set(manifest) >= {"system", "db_name", "event_tables", "event_indexes", "extensions"}


def test_the_rolling_histogram_keeps_three_figures_and_forgets_after_the_window() -> None:
    histogram = RollingHistogram()
    at = 1_800_000_000.0
    for ms in range(1, 1001):  # 1 ms ... 1000 ms, one each
        histogram.record(float(ms), at)
    p50, p95, p99 = histogram.percentiles(at, (50, 95, 99))
    for got, exact in ((p50, 500), (p95, 950), (p99, 990)):
        assert abs(got - exact) <= exact * 0.001 + 0.001, (got, exact)
    histogram.record(5000.0, at + WINDOW_S - 1)
    assert histogram.percentiles(at + WINDOW_S - 1, (100,)) == [pytest.approx(5000, rel=1e-3)]
    # Thirty seconds on, the first second's values have left the window.
    assert histogram.percentiles(at + WINDOW_S, (50,)) == [pytest.approx(5000, rel=1e-3)]
    assert histogram.percentiles(at + 2 * WINDOW_S, (50, 99)) == [0.0, 0.0]


@pytest.mark.postgres
def test_one_call_at_a_time_stamps_each_job_when_it_is_admitted(dsn: str) -> None:
    # A claim latency runs from the job's insert: a job admitted after others of its
    # chunk must not carry the time the chunk began as its enqueue time.
    from bench.harness_adapter import HarnessAdapter, Settings

    settings = Settings.from_env({"DATABASE_URL": dsn, "WORKWARDEN_BATCHED": "0"})
    adapter = HarnessAdapter(settings, out=sys.stdout, log=sys.stderr)
    lags_ms: list[float] = []
    admit = adapter.authority.admit

    def slow_admit(request: Any, now: int) -> Any:
        lags_ms.append(time.time() * 1000 - request.input["enqueued_us"] / 1000)
        time.sleep(0.02)
        return admit(request, now)

    try:
        adapter.authority.admit = slow_admit  # type: ignore[method-assign]
        assert adapter.admit(10, 0) == 10
        assert adapter.enqueued.value == 10
    finally:
        adapter.store.close()
    assert max(lags_ms) < 15, lags_ms


@pytest.mark.postgres
def test_one_call_at_a_time_counts_the_admissions_made_before_a_failure(dsn: str) -> None:
    # Each admission that committed is enqueued (and will be completed): a store
    # failure later in its chunk must not drop it from enqueue_rate.
    from bench.harness_adapter import HarnessAdapter, Settings
    from workwarden.storage import StoreError

    settings = Settings.from_env({"DATABASE_URL": dsn, "WORKWARDEN_BATCHED": "0"})
    adapter = HarnessAdapter(settings, out=sys.stdout, log=io.StringIO())
    admit, calls = adapter.authority.admit, itertools.count()

    def failing_admit(request: Any, now: int) -> Any:
        if next(calls) == 4:
            raise StoreError("the server went away")
        return admit(request, now)

    try:
        adapter.authority.admit = failing_admit  # type: ignore[method-assign]
        assert adapter.admit(10, 0) == 4
        assert adapter.enqueued.value == 4 == _database(dsn)["documents"]
    finally:
        adapter.store.close()


def _adapter(dsn: str, **env: str) -> Any:
    from bench.harness_adapter import HarnessAdapter, Settings

    settings = Settings.from_env({"DATABASE_URL": dsn, **env})
    return HarnessAdapter(settings, out=io.StringIO(), log=io.StringIO())


@pytest.mark.postgres
def test_a_long_jobs_completion_is_reported_as_it_finishes_not_with_its_batch(dsn: str) -> None:
    # Completions wait at most REPORT_WINDOW_S for others: with 100 ms jobs each goes
    # as it finishes, so completion_rate does not wait for the whole claimed batch.
    adapter = _adapter(dsn, JOB_WORK_MS="100", WORKWARDEN_CLAIM_BATCH="16")
    sent: list[int] = []
    report = adapter.report

    def counted(commands: Any) -> Any:
        sent.append(len(commands))
        return report(commands)

    try:
        assert adapter.admit(3, 0) == 3
        claims = adapter._claim("w1")
        assert len(claims) == 3
        adapter.report = counted
        adapter._run(claims)
        assert adapter.completed.value == 3
    finally:
        adapter.store.close()
    assert sent == [1, 1, 1]


@pytest.mark.postgres
def test_a_claim_takes_no_more_long_jobs_than_run_in_half_a_lease(dsn: str) -> None:
    adapter = _adapter(dsn, JOB_WORK_MS="5000", WORKWARDEN_LEASE_MS="30000")
    try:
        assert adapter.settings.claim_limit == 3
        assert adapter.admit(10, 0) == 10
        assert len(adapter._claim("w1")) == 3
    finally:
        adapter.store.close()


@pytest.mark.postgres
def test_a_completion_whose_outcome_was_lost_is_sent_again_and_counted_once(dsn: str) -> None:
    # The store committed the completions but the answer was lost: sent again, the
    # same commands are replays, each counted completed once and none refused.
    from workwarden.statemachine import errors
    from workwarden.statemachine.errors import WorkloadError

    adapter = _adapter(dsn, JOB_WORK_MS="0")
    report_many, calls = adapter.authority.report_many, itertools.count()

    def lost_once(commands: Any, now: int) -> Any:
        replies = report_many(commands, now)
        if next(calls) == 0:  # the claims started the attempts: the first is the completions'
            return [WorkloadError(errors.OUTCOME_UNKNOWN, "lost") for _ in replies]
        return replies

    try:
        assert adapter.admit(4, 0) == 4
        claims = adapter._claim("w1")
        adapter.authority.report_many = lost_once  # type: ignore[method-assign]
        adapter._run(claims)
        assert (adapter.completed.value, adapter.refused.value) == (4, 0)
    finally:
        adapter.store.close()
    assert _database(dsn)["complete"] == 4
