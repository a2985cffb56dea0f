"""Heartbeats, lost leases and cancellation: the worker keeps its lease with no handler code.

The step-driven tests hold the handler (a `ManualExecutor`) while a
simulated clock moves, so each heartbeat happens at an exact instant; one
test runs real threads on the wall clock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from support import CAPS, SIGNER, authority, grant_for, request
from workwarden import App, Job, Sweeper, Worker
from workwarden.runtime import ManualClock
from workwarden.runtime.testing import ManualExecutor
from workwarden.statemachine import Authority, WorkloadError
from workwarden.storage import MemoryStore
from workwarden.storage.forwarding import ForwardingStore

#: Batched reports and one call each are followed alike.
BOTH_MODES = pytest.mark.parametrize("batch", [True, False], ids=["batch", "one-call"])

T0 = 10_000
LEASE = 3_000


def _app(log: list[Job], outcome: Any = "done") -> App:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> Any:
        log.append(job)
        return outcome

    return app


def _worker(
    auth: Authority, app: App, clock: ManualClock, executor: ManualExecutor, batch: bool
) -> Worker:
    return Worker(
        auth,
        app,
        tenant="t",
        application="app",
        worker_id="w1",
        clock=clock,
        executor=executor,
        lease_ms=LEASE,
        batch=batch,
    )


@BOTH_MODES
def test_heartbeats_extend_the_lease_every_third_of_it_while_the_handler_runs(batch: bool) -> None:
    auth = authority(MemoryStore())
    wid = auth.admit(request(), T0).workload.workload_id
    clock, executor, log = ManualClock(T0), ManualExecutor(), []
    worker = _worker(auth, _app(log), clock, executor, batch)
    due = worker.step()
    assert due == T0 + LEASE // 3, "the first heartbeat is due a third of the lease in"
    for _ in range(6):
        clock.instant = due
        due = worker.step()
        claim = auth.get(wid).current_claim
        assert claim is not None
        assert claim.expires_at == clock.instant + LEASE
    assert worker.counts["heartbeats"] == 6
    # Far past the first lease: a sweep recovers nothing.
    assert Sweeper(auth, clock=clock).step()
    assert auth.get(wid).state in ("RUNNING",)
    executor.run_all()
    worker.step()
    assert auth.get(wid).state == "SUCCEEDED"


@BOTH_MODES
def test_a_lost_lease_sets_job_lost_and_nothing_is_reported_for_it(batch: bool) -> None:
    auth = authority(MemoryStore())
    wid = auth.admit(request(), T0).workload.workload_id
    clock, executor, log = ManualClock(T0), ManualExecutor(), []
    worker = _worker(auth, _app(log), clock, executor, batch)
    worker.step()
    # The worker stalls (no step) past its lease; the sweeper recovers the work.
    clock.advance(LEASE + 1)
    assert auth.recover_expired(clock.now()) == [wid]
    worker.step()
    assert log == []
    assert worker.held[0].lost
    lost = worker.held[0]
    executor.run_all()
    worker.step()
    assert "completed" not in worker.counts, "a lost attempt's outcome is never reported"
    # Its slot is free again: the worker claimed the recovered work afresh.
    [again] = worker.held
    assert again is not lost
    assert again.attempt == 2
    executor.run_all()
    worker.step()
    workload = auth.get(wid)
    assert workload.result is not None
    assert workload.result.attempt_id == workload.attempts[1].attempt_id
    assert workload.attempts[0].result_hash is None
    assert worker.counts["lost"] == 1
    assert worker.counts["completed"] == 1


@BOTH_MODES
def test_a_refused_heartbeat_stops_the_extensions(batch: bool) -> None:
    auth = authority(MemoryStore())
    wid = auth.admit(request(), T0).workload.workload_id
    clock, executor = ManualClock(T0), ManualExecutor()
    worker = _worker(auth, _app([]), clock, executor, batch)
    worker.step()
    clock.advance(LEASE + 1)
    auth.recover_expired(clock.now())
    # Another worker claims it under a new token.
    other = auth.claim_next("t", "app", "w2", CAPS, clock.now(), LEASE)
    assert other is not None
    worker.step()
    job = worker.held[0]
    assert job.lost
    beats = worker.counts.get("heartbeats", 0)
    for _ in range(3):
        clock.advance(LEASE // 3)
        worker.step()
    assert worker.counts.get("heartbeats", 0) == beats
    claim = auth.get(wid).current_claim
    assert claim is not None
    assert claim.worker_id == "w2"


@BOTH_MODES
def test_cancellation_is_seen_within_one_heartbeat_and_ends_cancelled(batch: bool) -> None:
    auth = authority(MemoryStore())
    wid = auth.admit(request(), T0).workload.workload_id
    clock, executor, log = ManualClock(T0), ManualExecutor(), []
    worker = _worker(auth, _app(log), clock, executor, batch)
    worker.step()
    assert auth.cancel(wid, "operator-1", clock.advance(10)) == "CANCELLATION_REQUESTED"
    job_view = worker.held[0]
    assert not job_view.cancel_requested
    clock.advance(LEASE // 3)
    worker.step()
    assert job_view.cancel_requested, "seen on the first heartbeat after the request"
    executor.run_all()
    worker.step()
    assert auth.get(wid).state == "CANCELLED"
    assert worker.counts["cancelled"] == 1


def test_on_real_threads_a_handler_longer_than_its_lease_keeps_it() -> None:
    auth = authority(MemoryStore())
    now = int(time.time() * 1000)
    grant = SIGNER.sign(grant_for(expires_at=now + 3_600_000))
    wid = auth.admit(request(authorization_snapshot=grant), now).workload.workload_id
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> str:
        time.sleep(1.2)
        return "slow but alive"

    sweeper = Sweeper(auth, poll_ms=50)
    sweeping = threading.Thread(target=sweeper.run, kwargs={"handle_signals": False})
    sweeping.start()
    try:
        Worker(auth, app, tenant="t", application="app", lease_ms=400).run_until_idle()
    finally:
        sweeper.stop()
        sweeping.join()
    assert auth.get(wid).state == "SUCCEEDED"
    assert sweeper.counts.get("recovered", 0) == 0


class _HeldCheckpoints(ForwardingStore):
    """A store whose checkpoint writes wait until the test lets them go, and are counted."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.checkpoints = 0

    def write(self, key: str, document: str, index: Any, expected: Any, audit: Any) -> int:
        if audit.operation == "checkpoint":
            self.checkpoints += 1
            self.entered.set()
            self.release.wait(10)
        return super().write(key, document, index, expected, audit)


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "one-call"])
def test_run_returns_only_once_no_abandoned_handler_is_in_a_store_call(batch: bool) -> None:
    # The command line closes the store once `run()` returns: a handler's call still in it
    # then (SQLite: a statement on a connection being closed) crashed the process.
    store = _HeldCheckpoints(MemoryStore())
    auth = authority(store)
    now = int(time.time() * 1000)
    grant = SIGNER.sign(grant_for(expires_at=now + 3_600_000))
    auth.admit(request(authorization_snapshot=grant), now)
    app = App()
    after_stop: list[Any] = []
    go_on = threading.Event()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        job.checkpoint({"step": 1})
        go_on.wait(10)
        try:
            job.checkpoint({"step": 2})
        except WorkloadError as exc:
            after_stop.append(exc)
        after_stop.append(job.lost)

    worker = Worker(
        auth, app, tenant="t", application="app", lease_ms=60_000, batch=batch, grace_s=0
    )
    runner = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    runner.start()
    assert store.entered.wait(10)
    worker.stop()
    runner.join(1)
    assert runner.is_alive(), "run() waits for the handler's call under way"
    store.release.set()
    runner.join(10)
    assert not runner.is_alive()
    go_on.set()
    deadline = time.monotonic() + 10
    while len(after_stop) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    refused, lost = after_stop
    assert isinstance(refused, WorkloadError), refused
    assert lost is True, "the abandoned attempt is lost to its handler"
    assert store.checkpoints == 1, "no call of an abandoned handler reaches the store"
