"""Wake-ups: an idle worker sleeps until work may exist, and an admission wakes it.

On PostgreSQL the admitting write sends a `NOTIFY` in its own statement, so
a worker listening through another connection (another store, as another
process would have) is woken when it commits. The worker's own poll is set
to a minute: finishing within seconds proves the notification woke it.
"""

from __future__ import annotations

import threading
import time

from pg import postgres_database
from support import CAPS, SIGNER, authority, grant_for, request
from workwarden import App, Job, Worker
from workwarden.runtime.arguments import MAX_LEASE_MS
from workwarden.statemachine import CreateWorkload
from workwarden.storage import MemoryStore, Store
from workwarden.storage.postgres import PostgresStore


def _request(key: str, now: int) -> CreateWorkload:
    grant = SIGNER.sign(grant_for(expires_at=now + 3_600_000))
    return request(idempotency_key=key, authorization_snapshot=grant)


def test_an_admission_on_another_connection_notifies_a_listening_signal() -> None:
    with postgres_database() as dsn:
        listener, writer = PostgresStore(dsn), PostgresStore(dsn)
        try:
            signal = listener.work_signal("t", "app")
            other = listener.work_signal("t", "another-app")
            try:
                assert not signal.wait(0.1)
                now = int(time.time() * 1000)
                authority(writer).admit(_request("one", now), now)
                started = time.monotonic()
                assert signal.wait(10.0)
                assert time.monotonic() - started < 5.0
                assert not other.wait(0.2), "another scope's signal stays asleep"
            finally:
                signal.close()
                other.close()
        finally:
            listener.close()
            writer.close()


def _run_idle_worker_then_admit(worker_store: Store, admit_store: Store) -> float:
    started: list[float] = []
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> str:
        started.append(time.monotonic())
        return "sent"

    worker = Worker(authority(worker_store), app, tenant="t", application="app", poll_ms=60_000)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        time.sleep(0.5)  # the worker looked, found nothing, and sleeps
        assert worker.idle
        now = int(time.time() * 1000)
        admitted = time.monotonic()
        authority(admit_store).admit(_request("one", now), now)
        deadline = time.monotonic() + 10
        while not started and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop(grace_s=5)
        thread.join()
    assert started, "the admission did not wake the idle worker"
    return started[0] - admitted


def test_an_idle_worker_on_postgresql_is_woken_by_the_admissions_notify() -> None:
    with postgres_database() as dsn:
        worker_store, admit_store = PostgresStore(dsn), PostgresStore(dsn)
        try:
            latency = _run_idle_worker_then_admit(worker_store, admit_store)
        finally:
            worker_store.close()
            admit_store.close()
    assert latency < 5.0


def test_an_idle_worker_on_a_memory_store_is_woken_by_an_admission() -> None:
    store = MemoryStore()
    assert _run_idle_worker_then_admit(store, store) < 5.0


def test_a_worker_with_a_lease_of_ages_sleeps_and_wakes_without_overflowing() -> None:
    # A heartbeat due months away (the longest lease, a year, heartbeats after four
    # months) must not become one wait that long: a lease of ages once overflowed the
    # thread's limit and the worker died with its job held. It looks again at least
    # hourly, and wakes at once for a handler that ends.
    store = MemoryStore()
    release = threading.Event()
    done: list[str] = []
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> str:
        release.wait(10)
        done.append(job.workload_id)
        return "sent"

    now = int(time.time() * 1000)
    lease = MAX_LEASE_MS
    workload_id = authority(store).admit(_request("ages", now), now).workload.workload_id
    worker = Worker(authority(store), app, tenant="t", application="app", lease_ms=lease)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(handle_signals=False)
        except BaseException as exc:  # noqa: BLE001 - what the thread died of, for the assert
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        time.sleep(0.5)  # claimed, started, and asleep until its heartbeat
        release.set()
        deadline = time.monotonic() + 10
        while authority(store).get(workload_id).state != "SUCCEEDED":
            assert time.monotonic() < deadline, "the job did not complete"
            assert not failures, failures
            time.sleep(0.02)
    finally:
        release.set()
        worker.stop(grace_s=5)
        thread.join(10)
    assert not failures, failures
    assert done == [workload_id]
