"""The worker claims in batches and sends its reports in batches, and loses nothing by it.

`CountingStore` is a real store (SQLite on a file, or memory) behind a view
that counts every round trip the worker's authority makes and keeps the
store's batch calls (`BatchStore`); `lose_batches` (a count) and
`lose_next_claims` let a batch commit and then raise
`StoreOutcomeUnknown`, as a connection breaking after the commit would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from support import CAPS, SIGNER, authority, grant_for, request
from workwarden import App, Job, Worker
from workwarden.runtime import ManualClock
from workwarden.runtime.scope import HandledOnly, HandledOnlyBatches, handled_only
from workwarden.runtime.testing import InlineExecutor, ManualExecutor
from workwarden.statemachine import Authority, errors, load_spec
from workwarden.statemachine.errors import WorkloadError
from workwarden.storage import (
    AuditRecord,
    CandidateCursor,
    IndexFields,
    MemoryStore,
    SQLiteStore,
    Store,
    StoredDocument,
    StoreOutcomeUnknown,
)
from workwarden.storage.base import CLAIM_PAGES, BatchStore, ChooseClaims, Write, WriteOutcome
from workwarden.storage.forwarding import ForwardingStore

T0 = 10_000
CLAIM_STARTS = Path(__file__).resolve().parents[1] / "specs" / "examples" / "claim_starts.toml"


class CountingStore(ForwardingStore):
    """A batch store that counts its round trips, and can lose the reply of one batch."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        assert isinstance(inner, BatchStore)
        self.batches: BatchStore = inner
        self.calls: Counter[str] = Counter()
        self.lose_batches = 0
        self.lose_next_claims = False

    @property
    def round_trips(self) -> int:
        return sum(self.calls.values())

    def read(self, key: str) -> StoredDocument | None:
        self.calls["read"] += 1
        return super().read(key)

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        self.calls["write"] += 1
        return super().write(key, document, index, expected_version, audit)

    def find_result(self, result_id: str) -> str | None:
        self.calls["find_result"] += 1
        return super().find_result(result_id)

    def find_request(self, request_id: str) -> AuditRecord | None:
        self.calls["find_request"] += 1
        return super().find_request(request_id)

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        self.calls["claim_candidates"] += 1
        return super().claim_candidates(tenant, application, now, limit, after)

    def held_claims(
        self, tenant: str, application: str, worker_id: str
    ) -> Sequence[StoredDocument]:
        self.calls["held_claims"] += 1
        return super().held_claims(tenant, application, worker_id)

    def read_many(self, keys: Sequence[str]) -> dict[str, StoredDocument]:
        self.calls["read_many"] += 1
        return self.batches.read_many(keys)

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        self.calls["write_many"] += 1
        outcomes = self.batches.write_many(writes)
        if self.lose_batches:
            self.lose_batches -= 1
            raise StoreOutcomeUnknown("the reply of the batch was lost after the commit")
        return outcomes

    def claim_batch(
        self, tenant: str, application: str, now: int, limit: int, choose: ChooseClaims
    ) -> list[tuple[Write, WriteOutcome]]:
        self.calls["claim_batch"] += 1
        results = self.batches.claim_batch(tenant, application, now, limit, choose)
        if self.lose_next_claims and results:
            self.lose_next_claims = False
            raise StoreOutcomeUnknown("the reply of the claims was lost after the commit")
        return results


def _app() -> App:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> dict[str, int]:
        return {"id": job.input["id"]}

    return app


def _admit(auth: Authority, count: int) -> list[str]:
    replies = auth.admit_many(
        [request(idempotency_key=f"k{i}", input={"id": i}) for i in range(count)], T0
    )
    ids = []
    for reply in replies:
        assert not isinstance(reply, WorkloadError)
        ids.append(reply.workload.workload_id)
    return ids


def _drain(worker: Worker, clock: ManualClock, steps: int = 500) -> None:
    """Step the worker on its simulated clock until nothing is held or claimable."""
    for _ in range(steps):
        clock.instant = worker.step()
        if worker.idle:
            return
    pytest.fail(f"not drained after {steps} steps: {worker.counts}")


def _operations(store: Store) -> Counter[str]:
    return Counter(record.operation for record in store.audit_log())


def _completions_per_workload(store: Store) -> Counter[str]:
    return Counter(r.key for r in store.audit_log() if r.operation == "complete")


def _worker(auth: Authority, clock: ManualClock, **options: object) -> Worker:
    return Worker(
        auth,
        _app(),
        tenant="t",
        application="app",
        clock=clock,
        executor=InlineExecutor(),
        **options,  # type: ignore[arg-type]  # the options under test, each typed by Worker
    )


# -- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [8, 25])
def test_a_batching_worker_drains_with_a_few_round_trips_per_batch_not_per_job(
    tmp_path: Path, concurrency: int
) -> None:
    jobs = 200
    store = CountingStore(SQLiteStore(tmp_path / "work.db"))
    try:
        auth = authority(store)
        ids = _admit(auth, jobs)
        store.calls.clear()
        clock = ManualClock(T0)
        worker = _worker(auth, clock, concurrency=concurrency)
        _drain(worker, clock)
        calls = Counter(store.calls)
        assert {auth.get(wid).state for wid in ids} == {"SUCCEEDED"}
        assert worker.counts["completed"] == jobs
        # A round of `concurrency` jobs costs a claim (its replay check and the
        # batch), one batch of starts and one of completions, and each claim
        # that comes back short one more look; nothing is read per job.
        rounds = -(-jobs // concurrency)
        assert calls.total() <= 5 * rounds + 4, calls
        assert calls["read"] == 0, "a claimed workload is never read back"
        assert calls["write"] == 0, "every write went in a batch"
        assert calls.total() < jobs, calls
        print(f"batches of {concurrency}: {jobs} jobs, {calls.total()} round trips {dict(calls)}")
    finally:
        store.close()


def test_without_batching_the_same_drain_costs_round_trips_per_job(tmp_path: Path) -> None:
    jobs = 40
    store = CountingStore(SQLiteStore(tmp_path / "work.db"))
    try:
        auth = authority(store)
        _admit(auth, jobs)
        store.calls.clear()
        clock = ManualClock(T0)
        worker = _worker(auth, clock, concurrency=8, batch=False)
        assert worker.batches is None
        _drain(worker, clock)
        assert worker.counts["completed"] == jobs
        # A claim (its replay check, candidates, the write), a start and a completion.
        assert store.round_trips >= 3 * jobs, store.calls
        print(f"one call at a time: {jobs} jobs, {store.round_trips} round trips")
        assert store.calls["write_many"] == store.calls["claim_batch"] == 0
    finally:
        store.close()


def test_reports_of_attempts_that_end_apart_wait_for_the_window_and_go_together() -> None:
    store = CountingStore(MemoryStore())
    auth = authority(store)
    _admit(auth, 3)
    clock = ManualClock(T0)
    done: list[str] = []
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> str:
        done.append(job.workload_id)
        return "sent"

    executor = ManualExecutor()
    worker = Worker(
        auth,
        app,
        tenant="t",
        application="app",
        clock=clock,
        executor=executor,
        concurrency=3,
        batch_window_ms=50,
    )
    worker.step()  # three claims, their starts in one batch, three handlers waiting
    assert len(executor.pending) == 3
    executor.run(0)
    assert worker.step() == T0 + 50, "the completion waits for the window"
    assert "completed" not in worker.counts
    clock.instant = T0 + 20
    executor.run(0)
    worker.step()
    assert "completed" not in worker.counts
    store.calls.clear()
    clock.instant = T0 + 50
    worker.step()
    assert worker.counts["completed"] == 2
    assert store.calls["write_many"] == 1, "both completions in one batch"
    executor.run(0)
    worker.step()  # the last attempt held: nothing can join it, it goes at once
    assert worker.counts["completed"] == 3


# -- lost replies -----------------------------------------------------------------------------


def test_a_batch_of_reports_whose_reply_was_lost_is_repeated_and_each_job_is_done_once() -> None:
    store = CountingStore(MemoryStore())
    auth = authority(store)
    ids = _admit(auth, 30)
    clock = ManualClock(T0)
    worker = _worker(auth, clock, concurrency=10)
    # The starts of the first round, their repeat, then completions: each batch
    # commits and its reply is lost.
    store.lose_batches = 4
    _drain(worker, clock)
    assert store.lose_batches == 0
    assert worker.counts["store_error"] >= 4
    assert {auth.get(wid).state for wid in ids} == {"SUCCEEDED"}
    assert worker.counts["completed"] == 30
    assert set(_completions_per_workload(store).values()) == {1}, "the repeats wrote nothing"
    assert _operations(store)["start"] == 30


def test_a_batch_of_claims_whose_reply_was_lost_is_answered_again_by_its_request_id() -> None:
    store = CountingStore(MemoryStore())
    auth = authority(store)
    ids = _admit(auth, 12)
    clock = ManualClock(T0)
    worker = _worker(auth, clock, concurrency=4)
    store.lose_next_claims = True
    clock.instant = worker.step()
    assert worker.counts["store_error"] == 1
    assert "claimed" not in worker.counts
    _drain(worker, clock)
    assert {auth.get(wid).state for wid in ids} == {"SUCCEEDED"}
    assert _operations(store)["claim_next"] == 12, "no claim was made twice"
    assert all(len(auth.get(wid).attempts) == 1 for wid in ids)


# -- a claim that starts its attempt ---------------------------------------------------------


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "one-call"])
def test_a_claim_that_started_its_attempt_is_not_started_again(batch: bool) -> None:
    store = CountingStore(MemoryStore())
    auth = authority(store, spec=load_spec(CLAIM_STARTS))
    ids = _admit(auth, 9)
    clock = ManualClock(T0)
    worker = _worker(auth, clock, concurrency=4, batch=batch)
    _drain(worker, clock)
    assert {auth.get(wid).state for wid in ids} == {"SUCCEEDED"}
    operations = _operations(store)
    assert operations["start"] == 0
    assert (operations["claim_next"], operations["complete"]) == (9, 9)


# -- the switch, and the authorities without batch calls ------------------------------------


class OneCallAuthority:
    """An authority with the worker's one-call methods only, as a remote one may be."""

    def __init__(self, inner: Authority) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.claim_next = inner.claim_next
        self.start = inner.start
        self.heartbeat = inner.heartbeat
        self.checkpoint = inner.checkpoint
        self.complete = inner.complete
        self.fail = inner.fail
        self.confirm_cancel = inner.confirm_cancel
        self.get = inner.get


def test_an_authority_without_batch_calls_is_called_one_call_at_a_time() -> None:
    store = CountingStore(MemoryStore())
    auth = authority(store)
    ids = _admit(auth, 6)
    store.calls.clear()
    clock = ManualClock(T0)
    remote = OneCallAuthority(auth)
    worker = Worker(
        remote,  # type: ignore[arg-type]  # what the worker calls, and nothing more
        _app(),
        tenant="t",
        application="app",
        clock=clock,
        executor=InlineExecutor(),
        concurrency=3,
    )
    assert worker.batches is None
    _drain(worker, clock)
    assert {auth.get(wid).state for wid in ids} == {"SUCCEEDED"}
    assert store.calls["write_many"] == store.calls["claim_batch"] == 0


def test_the_worker_claims_through_a_view_that_keeps_the_stores_batches() -> None:
    definitions = frozenset({"send"})
    assert isinstance(handled_only(MemoryStore(), definitions), HandledOnlyBatches)
    assert isinstance(handled_only(MemoryStore(), definitions), BatchStore)
    plain = handled_only(ForwardingStore(MemoryStore()), definitions)
    assert type(plain) is HandledOnly
    assert not isinstance(plain, BatchStore)


def test_a_batch_claim_never_takes_a_definition_without_a_handler() -> None:
    store = CountingStore(MemoryStore())
    auth = authority(store)
    others = [
        auth.admit(
            request(idempotency_key=f"o{i}", definition_id="archive", priority=9), T0
        ).workload.workload_id
        for i in range(20)
    ]
    mine = _admit(auth, 5)
    clock = ManualClock(T0)
    worker = _worker(auth, clock, concurrency=10)
    _drain(worker, clock)
    assert {auth.get(wid).state for wid in mine} == {"SUCCEEDED"}
    assert {auth.get(wid).state for wid in others} == {"READY"}


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_batching_worker_claims_its_work_behind_more_work_it_cannot_run_than_a_batch_pages(
    store: Store, concurrency: int
) -> None:
    # Another fleet's definitions, and work needing a capability this worker
    # lacks, stand first: more of them than one `claim_batch` offers. The
    # worker claims past them, as it does without batching.
    auth = authority(store)
    ahead = CLAIM_PAGES * concurrency + 2
    for i in range(ahead):
        auth.admit(request(idempotency_key=f"o{i}", definition_id="archive", priority=9), T0)
        auth.admit(
            request(idempotency_key=f"c{i}", priority=9, capability_snapshot=("fax:send",)), T0
        )
    mine = _admit(auth, 3)
    clock = ManualClock(T0)
    worker = _worker(auth, clock, concurrency=concurrency)
    assert worker.batches is not None
    _drain(worker, clock)
    assert {auth.get(wid).state for wid in mine} == {"SUCCEEDED"}
    assert worker.counts["completed"] == 3
    assert {w.state for w in auth.list("t", "app") if w.workload_id not in mine} == {"READY"}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"batch_window_ms": -1}, "batch_window_ms"),
        ({"batch_window_ms": 1.5}, "batch_window_ms"),
        ({"batch_max": 0}, "batch_max"),
        ({"batch_max": 1_001}, "batch_max"),
    ],
)
def test_bad_batch_options_are_refused_with_the_field_named(
    options: dict[str, object], field: str
) -> None:
    with pytest.raises(WorkloadError) as caught:
        _worker(authority(MemoryStore()), ManualClock(T0), **options)
    assert caught.value.code == errors.INVALID
    assert field in str(caught.value)


# -- checkpoints through the loop, with real threads -----------------------------------------


def test_checkpoints_of_running_handlers_go_through_the_loops_batches() -> None:
    store = CountingStore(MemoryStore())
    auth = authority(store)
    ids = _admit(auth, 24)
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> int:
        job.checkpoint({"half": True})
        job.checkpoint({"all": True})
        return len(job.checkpoints)

    worker = Worker(auth, app, tenant="t", application="app", concurrency=8, batch_window_ms=5)
    worker.run_until_idle()
    for wid in ids:
        workload = auth.get(wid)
        assert workload.state == "SUCCEEDED"
        assert [c.state for c in workload.checkpoints] == [{"half": True}, {"all": True}]
    assert _operations(store)["checkpoint"] == 48
    assert store.calls["write"] == 0, "every checkpoint went in one of the loop's batches"


# -- a real process stopped with buffered completions ----------------------------------------

APP = textwrap.dedent(
    """
    import time
    from pathlib import Path
    from workwarden import App

    app = App()

    @app.handler("send", needs=("email:send",))
    def send(job):
        time.sleep(job.input["sleep"])
        Path(job.input["marker"]).write_text("returned")
        return {"sent": job.input["id"]}
    """
)


def test_sigterm_sends_the_buffered_completions_before_the_worker_exits(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    (tmp_path / "batched_app.py").write_text(APP)
    store = SQLiteStore(path)
    auth = authority(store)
    now = int(time.time() * 1000)
    grant = SIGNER.sign(grant_for(expires_at=now + 3_600_000))
    sleeps = [0.0, 4.0, 4.0]
    ids = [
        auth.admit(
            request(
                idempotency_key=f"k{i}",
                input={"id": i, "sleep": sleep, "marker": str(tmp_path / f"returned-{i}")},
                authorization_snapshot=grant,
            ),
            now,
        ).workload.workload_id
        for i, sleep in enumerate(sleeps)
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WORKWARDEN_STORE", None)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workwarden",
                "worker",
                "--store",
                f"sqlite:///{path}",
                "--app",
                "batched_app:app",
                "--tenant",
                "t",
                "--application",
                "app",
                "--concurrency",
                "3",
                # Longer than the test: the quick handler's completion waits for the others
                # (and the lease long enough for a heartbeat to wait that out).
                "--batch-window-ms",
                "600000",
                "--lease-ms",
                "3600000",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "returned-0").exists():
            assert time.monotonic() < deadline, log.read_text()
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        time.sleep(0.3)
        assert auth.get(ids[0]).state == "RUNNING", "the completion waits in the buffer"
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 2
        while auth.get(ids[0]).state != "SUCCEEDED":
            assert time.monotonic() < deadline, f"not sent on SIGTERM\n{log.read_text()}"
            time.sleep(0.05)
        assert not (tmp_path / "returned-1").exists(), "sent while the others still ran"
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [auth.get(wid).state for wid in ids] == ["SUCCEEDED"] * 3
    assert set(_completions_per_workload(store).values()) == {1}
    assert "batch_window_ms=600000" in log.read_text()
    store.close()
