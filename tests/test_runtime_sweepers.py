"""Sweepers: they sweep at the instants leases and deadlines fall, and several share a store.

Three sweepers on threads over one SQLite file recover every expired lease
exactly once; on a simulated clock a sweeper sleeps until the next instant
the store names, not a fixed tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from support import CAPS, authority, request
from workwarden import Sweeper
from workwarden.runtime import ManualClock
from workwarden.statemachine import Timeouts
from workwarden.storage import MemoryStore, SQLiteStore, StoreFailure

T0 = 10_000


def test_a_sweeper_sleeps_until_the_next_lease_expiry_or_deadline_the_store_names() -> None:
    auth = authority(MemoryStore())
    first = auth.admit(request(idempotency_key="a"), T0).workload.workload_id
    assert auth.claim_next("t", "app", "w1", CAPS, T0, 400) is not None
    auth.admit(request(idempotency_key="b", timeouts=Timeouts(queue_ms=700)), T0)
    clock = ManualClock(T0)
    sweeper = Sweeper(auth, clock=clock, poll_ms=60_000)
    assert sweeper.step() == T0 + 400, "the lease expiry is the next instant"
    clock.instant = T0 + 400
    assert sweeper.step() == T0 + 700, "then the queue deadline"
    assert sweeper.counts["recovered"] == 1
    assert auth.get(first).state == "READY"
    clock.instant = T0 + 700
    sweeper.step()
    assert sweeper.counts["timed_out"] == 1
    assert sweeper.idle, "nothing else falls due"


def test_with_nothing_due_a_sweeper_looks_again_after_poll_ms() -> None:
    clock = ManualClock(T0)
    sweeper = Sweeper(authority(MemoryStore()), clock=clock, poll_ms=2_500)
    assert sweeper.step() == T0 + 2_500
    assert sweeper.step() == T0 + 2_500, "not due yet: no sweep"
    assert sweeper.counts["sweeps"] == 1


def test_three_sweepers_at_once_recover_each_expired_lease_exactly_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    try:
        auth = authority(store)
        ids = [
            auth.admit(request(idempotency_key=f"k{i}"), T0).workload.workload_id for i in range(30)
        ]
        for i in range(30):
            assert auth.claim_next("t", "app", f"w{i}", CAPS, T0, 100 + 10 * (i % 5)) is not None
        clock = ManualClock(T0 + 1_000)
        sweepers = [Sweeper(authority(store), clock=clock) for _ in range(3)]
        barrier = threading.Barrier(3)
        failures: list[BaseException] = []

        def sweep(sweeper: Sweeper) -> None:
            try:
                barrier.wait(10)
                sweeper.step()
            except BaseException as exc:  # noqa: BLE001 -- asserted on below
                failures.append(exc)

        threads = [threading.Thread(target=sweep, args=(s,)) for s in sweepers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert sum(s.counts.get("recovered", 0) for s in sweepers) == 30
        recoveries = [r.key for r in store.audit_log() if r.operation == "recover_expired"]
        assert sorted(recoveries) == sorted(ids), "each lease recovered once, by one sweeper"
        assert {w.state for w in auth.list("t", "app")} == {"READY"}
    finally:
        store.close()


class _DeadlineScanFails(SQLiteStore):
    """A SQLite store whose deadline scan fails, as a store that went away between two
    statements would: the lease recovery just before it committed."""

    def deadlines_due(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        raise StoreFailure("the server went away")


def test_recoveries_committed_before_a_failed_deadline_scan_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _DeadlineScanFails(tmp_path / "store.db")
    try:
        auth = authority(store)
        wid = auth.admit(request(), T0).workload.workload_id
        assert auth.claim_next("t", "app", "w1", CAPS, T0, 100) is not None
        sweeper = Sweeper(auth, clock=ManualClock(T0 + 1_000))
        with caplog.at_level(logging.INFO, logger="workwarden.runtime"):
            sweeper.step()
        assert auth.get(wid).state == "READY", "the recovery committed"
        assert sweeper.counts.get("recovered") == 1
        assert sweeper.counts.get("store_error") == 1
        assert f"recovered workload={wid}" in caplog.messages
    finally:
        store.close()
