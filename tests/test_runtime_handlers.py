"""Handlers: what a handler returns or raises is what the worker reports.

Driven step by step on a simulated clock with handlers run inline, so each
test reads as the sequence of calls the worker makes.
"""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

import pytest

from support import CAPS, authority, request
from workwarden import App, Fail, Job, Retry, Worker
from workwarden.runtime import ManualClock, result_id_for
from workwarden.runtime.testing import InlineExecutor
from workwarden.statemachine import Authority, RetryPolicy
from workwarden.storage import MemoryStore

T0 = 10_000


def _setup(
    app: App, *inputs: Any, **changes: Any
) -> tuple[Authority, Worker, list[str], ManualClock]:
    store = MemoryStore()
    auth = authority(store)
    clock = ManualClock(T0)
    ids = [
        auth.admit(
            request(idempotency_key=f"k{i}", input=value, **changes), T0
        ).workload.workload_id
        for i, value in enumerate(inputs)
    ]
    worker = Worker(
        auth,
        app,
        tenant="t",
        application="app",
        worker_id="w1",
        clock=clock,
        executor=InlineExecutor(),
        lease_ms=3_000,
    )
    return auth, worker, ids, clock


def _retrying(*kinds: str) -> RetryPolicy:
    return RetryPolicy(max_attempts=3, initial_delay_ms=100, max_delay_ms=1_000, retry_on=kinds)


def test_a_returned_value_completes_under_the_result_id_of_the_fence() -> None:
    app = App()
    seen: list[Job] = []

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> dict[str, Any]:
        seen.append(job)
        return {"sent": job.input["id"], "attempt": job.attempt}

    auth, worker, [wid], _ = _setup(app, {"id": 7})
    worker.step()
    workload = auth.get(wid)
    assert workload.state == "SUCCEEDED"
    assert workload.result is not None
    assert workload.result.output == {"sent": 7, "attempt": 1}
    assert workload.result.result_id == result_id_for(seen[0].fence)
    assert seen[0].workload_id == wid
    assert seen[0].definition_id == "send"
    assert worker.counts["completed"] == 1


def test_the_result_id_is_the_same_for_the_same_fence_and_differs_between_attempts() -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        return None

    _, worker, _, _ = _setup(app, {"id": 1})
    claim_fence = worker.authority.claim_next("t", "app", "w1", CAPS, T0, 1_000)
    assert claim_fence is not None
    fence = claim_fence.fence
    assert result_id_for(fence) == result_id_for(fence.model_copy())
    assert result_id_for(fence) != result_id_for(
        fence.model_copy(update={"token": fence.token + 1})
    )


def test_retry_reports_a_failure_with_no_effect_that_the_policy_retries() -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> str:
        if job.attempt == 1:
            raise Retry(kind="transient_connection", after_ms=250)
        return "second time lucky"

    auth, worker, [wid], clock = _setup(
        app, {"id": 1}, retry_policy=_retrying("transient_connection")
    )
    worker.step()
    workload = auth.get(wid)
    assert workload.state == "READY"
    assert workload.attempts[-1].error is not None
    assert "after 250 ms" in workload.attempts[-1].error
    assert worker.counts["retried"] == 1
    clock.advance(1_000)
    worker.step()
    assert auth.get(wid).state == "SUCCEEDED"


def test_fail_reports_its_kind_and_effect_and_a_kind_not_retried_dead_letters() -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        raise Fail(kind="validation", effect="none", message="the invoice has no lines")

    auth, worker, [wid], _ = _setup(app, {"id": 1}, retry_policy=_retrying("transient_connection"))
    worker.step()
    workload = auth.get(wid)
    assert workload.state == "DEAD_LETTER"
    assert workload.attempts[-1].error == "the invoice has no lines"
    assert worker.counts["failed"] == 1


@pytest.mark.parametrize(("checkpoint", "effect_unknown"), [(False, False), (True, True)])
def test_another_exception_is_the_apps_failure_kind_unknown_once_checkpointed(
    checkpoint: bool, effect_unknown: bool
) -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        if checkpoint:
            job.checkpoint({"rendered": True})
        raise RuntimeError("the printer caught fire")

    # `worker_failure` is what a failure of unknown effect is retried under;
    # retrying only `timeout` makes the effect decide the outcome.
    auth, worker, [wid], _ = _setup(app, {"id": 1}, retry_policy=_retrying("worker_failure"))
    worker.step()
    workload = auth.get(wid)
    assert workload.attempts[-1].error == "RuntimeError: the printer caught fire"
    failures = [e for e in workload.execution_history if e.to == "FAILED"]
    assert failures
    assert failures[-1].evidence.get("effect", "none") == ("unknown" if effect_unknown else "none")
    assert workload.state == "READY"


def test_an_exception_whose_text_no_store_holds_is_still_reported_as_a_failure() -> None:
    # The authority refuses NUL and lone surrogates in an error text; the worker
    # reports what it can of the exception instead of a refused failure.
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        raise RuntimeError("bad\x00byte \ud800 here" + "x" * 1_000)

    auth, worker, [wid], _ = _setup(app, {"id": 1}, retry_policy=_retrying("worker_failure"))
    worker.step()
    workload = auth.get(wid)
    error = workload.attempts[-1].error
    assert error is not None
    assert error.startswith("RuntimeError: bad\ufffdbyte \ufffd here")
    assert len(error) == 500
    assert workload.state == "READY"
    assert worker.counts["retried"] == 1


def test_an_exception_after_the_configured_point_has_an_unknown_effect() -> None:
    app = App(failure_kind="worker_failure", unknown_after_ms=0)

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        raise RuntimeError("late")

    auth, worker, [wid], _ = _setup(app, {"id": 1}, retry_policy=_retrying("timeout"))
    worker.step()
    # Effect unknown and `worker_failure` not retried: the policy dead-letters it.
    assert auth.get(wid).state == "DEAD_LETTER"


def test_an_async_handler_runs_and_its_value_completes() -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    async def send(job: Job) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"id": job.input["id"]}

    auth, worker, [wid], _ = _setup(app, {"id": 3})
    worker.step()
    result = auth.get(wid).result
    assert result is not None
    assert result.output == {"id": 3}


def test_checkpoints_of_earlier_attempts_reach_the_next_attempt_oldest_first() -> None:
    app = App()
    seen: list[list[Any]] = []

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        seen.append(job.checkpoints)
        job.checkpoint({"attempt": job.attempt})
        if job.attempt == 1:
            raise Retry(kind="transient_connection")

    _, worker, _, clock = _setup(app, {"id": 1}, retry_policy=_retrying("transient_connection"))
    worker.step()
    clock.advance(1_000)
    worker.step()
    assert seen == [[], [{"attempt": 1}]]


def test_the_worker_offers_the_union_of_the_definitions_needs_and_claims_only_what_it_handles() -> (
    None
):
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> str:
        return "sent"

    @app.handler("print", needs=("printer",))
    def print_(job: Job) -> str:
        return "printed"

    assert app.capabilities == tuple(sorted({*CAPS, "printer"}))
    store = MemoryStore()
    auth = authority(store)
    other = auth.admit(
        request(idempotency_key="other", definition_id="archive", priority=9), T0
    ).workload.workload_id
    mine = auth.admit(request(idempotency_key="mine"), T0).workload.workload_id
    worker = Worker(
        auth, app, tenant="t", application="app", clock=ManualClock(T0), executor=InlineExecutor()
    )
    worker.step()
    assert auth.get(mine).state == "SUCCEEDED"
    assert auth.get(other).state == "READY", "a definition without a handler is never claimed"
    assert worker.idle


def test_registering_a_definition_twice_is_refused() -> None:
    app = App()
    app.handler("send")(lambda job: None)
    with pytest.raises(ValueError, match="already has a handler"):
        app.handler("send")(lambda job: None)


@pytest.mark.parametrize(
    "raised",
    [
        lambda: Retry(5),  # type: ignore[arg-type]
        lambda: Fail("validation", effect="maybe"),
    ],
)
def test_a_handler_raising_a_bad_retry_or_fail_still_reports_a_failure(raised: Any) -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        raise raised()

    # Retrying the app's failure kind shows the failure was reported under it.
    auth, worker, [wid], _ = _setup(app, {"id": 1}, retry_policy=_retrying("worker_failure"))
    worker.step()
    workload = auth.get(wid)
    assert workload.state == "READY", "reported as the app's failure kind, not dropped"
    error = workload.attempts[-1].error
    assert error is not None
    assert "WORKLOAD_INVALID" in error
    assert worker.counts["retried"] == 1
    assert "refused" not in worker.counts


def test_a_failure_of_a_kind_the_spec_does_not_declare_is_reported_under_the_apps_kind() -> None:
    # `Retry("not_declared")` is a well-formed name, so only the authority can
    # refuse it; the worker then reports the failure under the app's kind
    # instead of dropping the attempt until its lease runs out.
    app = App(failure_kind="worker_failure")

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        raise Retry(kind="not_declared", message="the printer is out of paper")

    auth, worker, [wid], _ = _setup(app, {"id": 1}, retry_policy=_retrying("worker_failure"))
    worker.step()  # runs the handler; its failure is refused for its kind
    assert auth.get(wid).state == "RUNNING"
    worker.step()  # reports it again under the app's kind
    workload = auth.get(wid)
    assert workload.state == "READY"
    error = workload.attempts[-1].error
    assert error is not None
    assert error.startswith("not_declared: refused (WORKLOAD_INVALID)")
    assert "the printer is out of paper" in error
    assert worker.counts["retried"] == 1


class _Unspeakable(Exception):
    """An exception whose text cannot be made: its `__str__` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no words")


def test_an_exception_whose_text_cannot_be_made_is_a_failure_and_the_worker_carries_on() -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> dict[str, int]:
        if job.input["id"] == 1:
            raise _Unspeakable
        return {"sent": job.input["id"]}

    auth, worker, [bad, good], _ = _setup(
        app, {"id": 1}, {"id": 2}, retry_policy=_retrying("worker_failure")
    )
    worker.step()
    worker.step()
    failed = auth.get(bad)
    assert failed.state == "READY"
    assert failed.attempts[-1].error == ("_Unspeakable: (its text could not be made: RuntimeError)")
    assert auth.get(good).state == "SUCCEEDED"
    assert worker.counts["retried"] == 1
    assert worker.counts["completed"] == 1


@pytest.mark.parametrize(
    "raised",
    [
        Retry(kind="transient_connection", message="sk-live-0123456789abcdef"),
        Retry(kind="not_declared", message="sk-live-0123456789abcdef"),
        Fail(kind="transient_connection", message="sk-live-0123456789abcdef"),
    ],
)
def test_a_failure_text_refused_as_a_secret_is_never_sent_again(
    raised: BaseException,
) -> None:
    app = App(failure_kind="worker_failure")

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        raise raised

    auth, worker, [wid], _ = _setup(
        app, {"id": 1}, retry_policy=_retrying("worker_failure", "transient_connection")
    )
    for _ in range(4):
        worker.step()
    workload = auth.get(wid)
    assert workload.state == "READY", workload.state
    assert "sk-" not in auth.store.read(wid).document  # type: ignore[union-attr]
    assert workload.attempts[-1].error is not None
    assert "refused as secret material" in workload.attempts[-1].error


def test_an_exception_text_of_several_lines_is_logged_as_one_event_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        raise ValueError('line one\nline "two"\r\tthree\x1b[31m\u2028four \\ five')

    auth, worker, [wid], _ = _setup(app, {"id": 1}, retry_policy=_retrying("worker_failure"))
    with caplog.at_level("INFO", logger="workwarden.runtime"):
        worker.step()
        worker.step()
    assert auth.get(wid).state == "READY"
    [retried] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retried ")]
    assert len(retried.splitlines()) == 1, retried
    assert all(c.isprintable() for c in retried), retried
    # The text can be read back from the line, every character of it.
    fields = dict(word.split("=", 1) for word in shlex.split(retried)[1:])
    assert fields["error"] == (
        'ValueError: line one\\nline "two"\\r\\tthree\\x1b[31m\\u2028four \\ five'
    )
