"""A store that fails never ends the worker: it backs off with jitter and goes on.

`FlakyStore` is a real store behind a switch: while `down`, every call
raises `StoreFailure`; `lose_next_reply` lets one write commit and then
raises `StoreOutcomeUnknown`, as a connection breaking after the commit
would. The worker is driven step by step on a simulated clock.
"""

from __future__ import annotations

import pytest

from support import CAPS, SwitchedStore, authority, request
from workwarden import App, Job, Sweeper, Worker
from workwarden.runtime import ManualClock
from workwarden.runtime.testing import InlineExecutor, ManualExecutor
from workwarden.storage import (
    AuditRecord,
    MemoryStore,
)

T0 = 10_000

#: Batched reports and one call each are followed alike.
BOTH_MODES = pytest.mark.parametrize("batch", [True, False], ids=["batch", "one-call"])


class FlakyStore(SwitchedStore):
    """A memory store behind the switch (`tests/support.py`)."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())


def _app() -> App:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> dict[str, int]:
        return {"id": job.input["id"]}

    return app


def _operations(store: FlakyStore, operation: str) -> list[AuditRecord]:
    return [r for r in store.audit_log() if r.operation == operation]


@BOTH_MODES
def test_a_store_that_is_down_is_backed_off_with_growing_jittered_delays(batch: bool) -> None:
    store = FlakyStore()
    auth = authority(store)
    wid = auth.admit(request(), T0).workload.workload_id
    clock = ManualClock(T0)
    worker = Worker(
        auth,
        _app(),
        tenant="t",
        application="app",
        clock=clock,
        executor=ManualExecutor(),
        backoff_base_ms=100,
        backoff_cap_ms=3_000,
        batch=batch,
    )
    store.down = True
    delays = []
    for _ in range(8):
        due = worker.step()
        delays.append(due - clock.now())
        clock.instant = due
    assert worker.counts["store_error"] == 8
    assert all(50 <= d <= 3_000 for d in delays)
    assert max(delays[4:]) > max(delays[:2]), "the delays grow"
    store.down = False
    worker.step()
    assert auth.get(wid).state == "RUNNING"


@BOTH_MODES
def test_a_result_reported_while_the_store_is_down_is_reported_again_with_the_same_result_id(
    batch: bool,
) -> None:
    store = FlakyStore()
    auth = authority(store)
    wid = auth.admit(request(), T0).workload.workload_id
    clock, executor = ManualClock(T0), ManualExecutor()
    worker = Worker(
        auth,
        _app(),
        tenant="t",
        application="app",
        clock=clock,
        executor=executor,
        lease_ms=10_000,
        batch=batch,
    )
    worker.step()
    store.down = True
    executor.run_all()
    for _ in range(5):
        clock.instant = worker.step()
    assert worker.counts["store_error"] >= 5
    store.down = False
    clock.instant = worker.step()
    assert auth.get(wid).state == "SUCCEEDED"
    assert worker.counts["completed"] == 1
    assert len(_operations(store, "complete")) == 1


@BOTH_MODES
def test_a_completion_whose_reply_was_lost_is_repeated_and_answered_by_the_replay(
    batch: bool,
) -> None:
    store = FlakyStore()
    auth = authority(store)
    wid = auth.admit(request(), T0).workload.workload_id
    clock, executor = ManualClock(T0), ManualExecutor()
    worker = Worker(
        auth, _app(), tenant="t", application="app", clock=clock, executor=executor, batch=batch
    )
    worker.step()
    executor.run_all()
    store.lose_next_reply = True
    clock.instant = worker.step()
    assert "completed" not in worker.counts
    assert worker.counts["store_error"] == 1
    assert auth.get(wid).state == "SUCCEEDED", "the first report did commit"
    clock.instant = worker.step()
    assert worker.counts["completed"] == 1
    assert len(_operations(store, "complete")) == 1, "the repeat wrote nothing"


@BOTH_MODES
def test_a_claim_whose_reply_was_lost_is_answered_again_by_its_request_id(batch: bool) -> None:
    store = FlakyStore()
    auth = authority(store)
    wid = auth.admit(request(), T0).workload.workload_id
    clock = ManualClock(T0)
    worker = Worker(
        auth,
        _app(),
        tenant="t",
        application="app",
        clock=clock,
        executor=InlineExecutor(),
        batch=batch,
    )
    store.lose_next_reply = True
    clock.instant = worker.step()
    assert worker.counts["store_error"] == 1
    assert "claimed" not in worker.counts
    clock.instant = worker.step()
    assert auth.get(wid).state == "SUCCEEDED"
    assert len(_operations(store, "claim_next")) + len(_operations(store, "claim")) == 1


def test_a_sweeper_backs_off_while_the_store_is_down_and_sweeps_once_it_is_back() -> None:
    store = FlakyStore()
    auth = authority(store)
    wid = auth.admit(request(), T0).workload.workload_id
    assert auth.claim_next("t", "app", "w1", CAPS, T0, 1_000) is not None
    clock = ManualClock(T0 + 5_000)
    sweeper = Sweeper(auth, clock=clock)
    store.down = True
    for _ in range(4):
        clock.instant = sweeper.step()
    assert sweeper.counts["store_error"] == 4
    store.down = False
    sweeper.step()
    assert sweeper.counts["recovered"] == 1
    assert auth.get(wid).state == "READY"
