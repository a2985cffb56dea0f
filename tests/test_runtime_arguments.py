"""The runtime's constructors refuse a bad argument when the object is built.

A `Worker`, `Sweeper`, `App`, handler registration, `Retry` or `Fail` given
a bad argument is `WORKLOAD_INVALID` naming it, at once: never a bare
`TypeError` or `AttributeError`, and never accepted only to fail every
claim or report later.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import CAPS, authority, request, store_snapshot
from workwarden import App, Fail, Retry, Sweeper, Worker
from workwarden.runtime import ManualClock
from workwarden.runtime.arguments import MAX_LEASE_MS
from workwarden.runtime.testing import InlineExecutor
from workwarden.runtime.worker import WORKER_ID_MAX
from workwarden.statemachine import WorkloadError, errors
from workwarden.statemachine.authority import Authority
from workwarden.storage import MemoryStore

T0 = 10_000


def _app(**options: Any) -> App:
    app = App(**options)
    app.handler("send", needs=CAPS)(lambda job: None)
    return app


def _field(refused: pytest.ExceptionInfo[WorkloadError]) -> list[str]:
    return [error["field"] for error in refused.value.details["errors"]]


def _refused_naming(field: str, build: Any, *args: Any, **options: Any) -> None:
    with pytest.raises(WorkloadError) as refused:
        build(*args, **options)
    assert refused.value.code == errors.INVALID
    assert any(name.partition("[")[0] == field for name in _field(refused)), _field(refused)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"worker_id": 5}, "worker_id"),
        ({"worker_id": ""}, "worker_id"),
        ({"worker_id": "w\n1"}, "worker_id"),
        ({"worker_id": "w" * (WORKER_ID_MAX + 1)}, "worker_id"),
        ({"tenant": 5}, "tenant"),
        ({"application": ""}, "application"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"concurrency": "2"}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": 0}, "concurrency"),
        ({"lease_ms": 1000.5}, "lease_ms"),
        ({"lease_ms": "1"}, "lease_ms"),
        ({"lease_ms": False}, "lease_ms"),
        ({"lease_ms": 2**53}, "lease_ms"),
        ({"lease_ms": MAX_LEASE_MS + 1}, "lease_ms"),
        ({"lease_ms": 2**53 - 1}, "lease_ms"),
        ({"capabilities": "email:send"}, "capabilities"),
        ({"capabilities": [1, 2]}, "capabilities"),
        ({"capabilities": 5}, "capabilities"),
        ({"capabilities": [f"c{i}" for i in range(257)]}, "capabilities"),
        ({"clock": 5}, "clock"),
        ({"executor": "threads"}, "executor"),
        ({"sleep": 1.0}, "sleep"),
        ({"heartbeat_fraction": "0.5"}, "heartbeat_fraction"),
        ({"heartbeat_fraction": float("nan")}, "heartbeat_fraction"),
        ({"poll_ms": "1"}, "poll_ms"),
        ({"poll_ms": 0}, "poll_ms"),
        ({"grace_s": "30"}, "grace_s"),
        ({"grace_s": float("inf")}, "grace_s"),
        ({"grace_s": -1}, "grace_s"),
        ({"backoff_base_ms": 0}, "backoff_base_ms"),
        ({"backoff_cap_ms": 1.5}, "backoff_cap_ms"),
        ({"backoff_base_ms": 200, "backoff_cap_ms": 100}, "backoff_cap_ms"),
        ({"batch": "yes"}, "batch"),
        # A heartbeat sent 10 s into a 30 s lease, then held 20 s, lands as the lease ends.
        ({"lease_ms": 30_000, "batch_window_ms": 20_000}, "batch_window_ms"),
        ({"lease_ms": 3_000, "heartbeat_fraction": 0.9, "batch_window_ms": 300}, "batch_window_ms"),
        ({"also_serve": 5}, "also_serve"),
        ({"all_scopes": 1}, "all_scopes"),
    ],
)
def test_a_bad_worker_option_is_refused_naming_it_and_nothing_is_claimed(
    options: dict[str, Any], field: str
) -> None:
    store = MemoryStore()
    auth = authority(store)
    auth.admit(request(), T0)
    before = store_snapshot(store)
    settings: dict[str, Any] = {"tenant": "t", "application": "app", "clock": ManualClock(T0)}
    _refused_naming(field, Worker, auth, _app(), **{**settings, **options})
    assert store_snapshot(store) == before


def test_a_batch_window_a_heartbeat_can_wait_out_is_accepted_and_ignored_without_batches() -> None:
    auth = authority(MemoryStore())
    settings: dict[str, Any] = {"tenant": "t", "application": "app", "clock": ManualClock(T0)}
    assert Worker(auth, _app(), lease_ms=30_000, batch_window_ms=19_999, **settings)
    # Without batches no report waits, whatever the window says.
    assert Worker(auth, _app(), lease_ms=30_000, batch=False, batch_window_ms=60_000, **settings)


def test_the_longest_worker_id_still_names_every_claim_it_makes() -> None:
    auth = authority(MemoryStore())
    wid = auth.admit(request(), T0).workload.workload_id
    worker = Worker(
        auth,
        _app(),
        tenant="t",
        application="app",
        worker_id="w" * WORKER_ID_MAX,
        clock=ManualClock(T0),
        executor=InlineExecutor(),
    )
    worker.step()
    assert auth.get(wid).state == "SUCCEEDED"
    assert "store_error" not in worker.counts


def test_a_worker_needs_an_authority_and_an_app() -> None:
    auth = authority(MemoryStore())
    _refused_naming("app", Worker, auth, 5, tenant="t", application="app")
    _refused_naming("authority", Worker, None, _app(), tenant="t", application="app")
    _refused_naming("authority", Worker, auth.store, _app(), tenant="t", application="app")


def test_a_worker_refuses_an_app_whose_failure_kind_the_spec_does_not_declare() -> None:
    auth = authority(MemoryStore())
    with pytest.raises(WorkloadError) as refused:
        Worker(auth, _app(failure_kind="nope"), tenant="t", application="app")
    assert refused.value.code == errors.INVALID
    assert _field(refused) == ["failure_kind"]
    assert "worker_failure" in refused.value.message, "the message names the declared kinds"
    Worker(auth, _app(failure_kind="timeout"), tenant="t", application="app")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"failure_kind": 5}, "failure_kind"),
        ({"failure_kind": ""}, "failure_kind"),
        ({"unknown_after_ms": "5"}, "unknown_after_ms"),
        ({"unknown_after_ms": 1.5}, "unknown_after_ms"),
        ({"unknown_after_ms": True}, "unknown_after_ms"),
        ({"unknown_after_ms": -1}, "unknown_after_ms"),
    ],
)
def test_a_bad_app_option_is_refused_naming_it(options: dict[str, Any], field: str) -> None:
    _refused_naming(field, App, **options)


@pytest.mark.parametrize(
    ("definition_id", "needs", "field"),
    [
        ("send", "billing", "needs"),
        ("send", b"billing", "needs"),
        ("send", [1, 2], "needs"),
        ("send", None, "needs"),
        ("send", 5, "needs"),
        ("send", [""], "needs"),
        (5, (), "definition_id"),
        ("", (), "definition_id"),
        ("x" * 257, (), "definition_id"),
    ],
)
def test_a_bad_handler_registration_is_refused_and_registers_nothing(
    definition_id: Any, needs: Any, field: str
) -> None:
    app = App()
    _refused_naming(field, app.handler, definition_id, needs=needs)
    assert app.definitions == frozenset()
    assert app.capabilities == ()


def test_needs_are_whole_capability_names_never_split_into_characters() -> None:
    app = App()
    app.handler("send", needs=["billing", "email:send", "billing"])(lambda job: None)
    assert app.capabilities == ("billing", "email:send")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"poll_ms": "1"}, "poll_ms"),
        ({"poll_ms": 1.5}, "poll_ms"),
        ({"idle_horizon_ms": -1}, "idle_horizon_ms"),
        ({"backoff_base_ms": "100"}, "backoff_base_ms"),
        ({"backoff_base_ms": 200, "backoff_cap_ms": 100}, "backoff_cap_ms"),
        ({"tenant": 5}, "tenant"),
        ({"clock": "wall"}, "clock"),
    ],
)
def test_a_bad_sweeper_option_is_refused_naming_it(options: dict[str, Any], field: str) -> None:
    _refused_naming(field, Sweeper, authority(MemoryStore()), **options)


def test_a_sweeper_needs_an_authority() -> None:
    _refused_naming("authority", Sweeper, None)
    _refused_naming("authority", Sweeper, MemoryStore())


def test_a_sweeper_over_an_authority_wrapper_with_the_sweep_calls_is_accepted() -> None:
    class SweepOnly:
        def __init__(self, inner: Authority) -> None:
            self.recover_expired = inner.recover_expired
            self.enforce_deadlines = inner.enforce_deadlines

    sweeper = Sweeper(SweepOnly(authority(MemoryStore())), clock=ManualClock(T0))  # type: ignore[arg-type]
    assert sweeper.step() == T0 + 1_000


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Retry(5), "kind"),  # type: ignore[arg-type]
        (lambda: Retry(""), "kind"),
        (lambda: Retry("timeout", after_ms="5"), "after_ms"),  # type: ignore[arg-type]
        (lambda: Retry("timeout", after_ms=-1), "after_ms"),
        (lambda: Retry("timeout", message=5), "message"),  # type: ignore[arg-type]
        (lambda: Fail(5), "kind"),  # type: ignore[arg-type]
        (lambda: Fail("timeout", effect="maybe"), "effect"),
        (lambda: Fail("timeout", message=None), "message"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_retry_or_fail_is_refused_when_raised(build: Any, field: str) -> None:
    _refused_naming(field, build)


def test_a_good_retry_and_fail_keep_what_they_were_given() -> None:
    retry = Retry("transient_connection", after_ms=250, message="busy")
    assert (retry.kind, retry.after_ms, retry.message) == ("transient_connection", 250, "busy")
    fail = Fail("validation", effect="unknown")
    assert (fail.kind, fail.effect, str(fail)) == ("validation", "unknown", "validation")
