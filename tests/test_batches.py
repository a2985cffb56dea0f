"""Batch calls: `admit_many`, `claim_many`, `report_many`, on every backend.

A batch is a fast path, never other rules: each slot of its answer is what
the one-call method would have answered, and what it leaves in the store is
what the one-call methods would have left. The tests hold a batch against
the same calls made one at a time on a second store of the same backend.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends import BACKENDS
from support import CAPS, VERIFIER, overwrite, request, store_snapshot
from workwarden.statemachine import (
    Authority,
    Dependency,
    Timeouts,
    WorkloadError,
    errors,
    load_spec,
)
from workwarden.statemachine.batches import MAX_BATCH
from workwarden.statemachine.check.checker import check
from workwarden.statemachine.check.universe import Universe
from workwarden.statemachine.commands import (
    CompleteCommand,
    FailCommand,
    HeartbeatCommand,
    StartCommand,
)
from workwarden.statemachine.conformance.conform import run_conformance
from workwarden.statemachine.conformance.runner import read_vectors, render_vectors
from workwarden.statemachine.conformance.vectors import generate_vectors
from workwarden.statemachine.models import ClaimReply, Fence
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text
from workwarden.storage import Store, StoreFailure
from workwarden.storage.base import CLAIM_PAGES
from workwarden.storage.forwarding import ForwardingBatchStore

NOW = 10_000
LEASE = 10_000
SPECS = Path(__file__).resolve().parents[1] / "specs"
CLAIM_STARTS = SPECS / "examples" / "claim_starts.toml"
VECTORS = SPECS / "vectors" / "workload-claim_starts.jsonl"


@pytest.fixture
def twin(request: pytest.FixtureRequest, store: Store) -> Iterator[Store]:
    """A second fresh store of the same backend as `store`."""
    backend = request.node.callspec.params["store"]
    with BACKENDS[backend]() as fresh:
        yield fresh


def _answers(outcomes: list[Any]) -> list[Any]:
    """Outcomes comparable across stores: a reply's fields, or an error's code and details."""
    shown: list[Any] = []
    for outcome in outcomes:
        if isinstance(outcome, WorkloadError):
            shown.append(("error", outcome.code, outcome.details))
        else:
            shown.append(("ok", outcome.model_dump()))
    return shown


def _single(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except WorkloadError as exc:
        return exc


def _snapshot(store: Store) -> tuple[Any, ...]:
    docs, audit = store_snapshot(store)
    # Sequences and versions are the store's; everything else must match.
    return docs, tuple((r.key, r.version, r.operation, r.digest, r.fencing_token) for r in audit)


# -- admission ------------------------------------------------------------------------------


def test_admit_many_answers_each_request_as_admit_would_and_leaves_the_same_store(
    store: Store, twin: Store
) -> None:
    batch = Authority(store, grants=VERIFIER)
    single = Authority(twin, grants=VERIFIER)
    for warden in (batch, single):
        warden.admit(request(idempotency_key="old"), NOW - 500)
    requests: list[Any] = [
        request(idempotency_key="a"),
        request(idempotency_key="old"),  # the original, replayed
        request(idempotency_key="old", input={"id": 2}),  # the key reused for another request
        {"tenant_id": "t"},  # not a request at all
        request(idempotency_key="b", priority=3),
        request(idempotency_key="a"),  # twice in one batch: the second is a replay
    ]
    answers = batch.admit_many(requests, NOW)
    expected = [_single(lambda r=r: single.admit(r, NOW)) for r in requests]
    assert _answers(answers) == _answers(expected)
    assert [getattr(a, "created", None) for a in answers] == [True, False, None, None, True, False]
    assert isinstance(answers[2], WorkloadError)
    assert answers[2].code == errors.IDEMPOTENCY_KEY_REUSED
    assert isinstance(answers[3], WorkloadError)
    assert answers[3].code == errors.INVALID
    assert _snapshot(store) == _snapshot(twin)


@pytest.mark.parametrize("remember", [256, 0])
def test_a_store_that_fails_is_each_slots_answer_never_the_batchs(
    store: Store, remember: int
) -> None:
    # Whether the authority reads first (remember=0) or decides on absence,
    # a failing store is the answer of each request that reached it; a
    # request refused on its own keeps its own answer.
    authority = Authority(store, grants=VERIFIER, remember=remember)
    store.close()
    requests: list[Any] = [
        request(idempotency_key="a"),
        {"tenant_id": "t"},
        request(idempotency_key="b"),
        request(idempotency_key="a"),
    ]
    answers = authority.admit_many(requests, NOW)
    assert [a.code if isinstance(a, WorkloadError) else a for a in answers] == [
        errors.STORAGE_FAILURE,
        errors.INVALID,
        errors.STORAGE_FAILURE,
        errors.STORAGE_FAILURE,
    ]


def test_a_batch_that_is_not_a_list_or_too_long_is_refused_and_writes_nothing(
    authority: Authority, store: Store
) -> None:
    before = store_snapshot(store)
    # Bytes of any kind are refused whole, not read as a list of numbers, each its own slot.
    for bad in ("requests", {"a": 1}, 7, b"xy", bytearray(b"xy"), memoryview(b"xy")):
        with pytest.raises(WorkloadError) as refused:
            authority.admit_many(bad, NOW)  # type: ignore[arg-type]
        assert refused.value.code == errors.INVALID
        with pytest.raises(WorkloadError) as refused:
            authority.report_many(bad, NOW)  # type: ignore[arg-type]
        assert refused.value.code == errors.INVALID
    with pytest.raises(WorkloadError) as too_long:
        authority.admit_many([request(idempotency_key=f"k{i}") for i in range(MAX_BATCH + 1)], NOW)
    assert too_long.value.code == errors.INVALID
    with pytest.raises(WorkloadError):
        authority.report_many("start", NOW)  # type: ignore[arg-type]
    assert store_snapshot(store) == before


def test_a_batch_from_a_long_iterable_is_refused_after_one_item_too_many(
    authority: Authority, store: Store
) -> None:
    # A generator may be long, or endless: the batch draws one item past the
    # most it takes, and refuses, instead of drawing it dry first.
    before = store_snapshot(store)
    for call in (authority.admit_many, authority.report_many):
        drawn = itertools.count()
        items = ({"n": next(drawn)} for _ in range(MAX_BATCH * 50))
        with pytest.raises(WorkloadError) as refused:
            call(items, NOW)
        assert refused.value.code == errors.INVALID
        assert next(drawn) == MAX_BATCH + 1, "no more drawn than it takes to tell"
    assert store_snapshot(store) == before


# -- claims ---------------------------------------------------------------------------------


def _admit(authority: Authority, key: str, now: int = NOW, **changes: Any) -> str:
    return authority.admit(request(idempotency_key=key, **changes), now).workload.workload_id


def test_claim_many_takes_the_best_claimable_work_each_with_its_own_fence(
    authority: Authority, store: Store
) -> None:
    low = _admit(authority, "low", priority=1)
    high = _admit(authority, "high", priority=5)
    later = _admit(authority, "later", priority=9, not_before=NOW + 60_000)
    sms = _admit(authority, "sms", priority=9, capability_snapshot=("email:send", "sms:send"))
    parent = _admit(authority, "parent", now=NOW + 1)
    child = _admit(authority, "child", priority=7, dependencies=(Dependency(workload_id=parent),))
    claims = authority.claim_many("t", "app", "w1", CAPS, NOW + 100, LEASE, 10)
    ids = [claim.workload_id for claim in claims]
    assert ids == [high, low, parent], "priority then age; not-yet-eligible, capability, waiting"
    assert later not in ids
    assert sms not in ids
    assert child not in ids
    assert len({claim.claim_id for claim in claims}) == 3
    for claim in claims:
        workload = authority.get(claim.workload_id)
        assert workload.state == "CLAIMED"
        assert workload.current_claim is not None
        assert claim.fence == workload.current_claim.fence
        assert claim.attempt_id == workload.attempts[-1].attempt_id
        assert claim.expires_at == NOW + 100 + LEASE
    audit = [r for r in store.audit_log() if r.operation == "claim_next"]
    assert sorted(r.key for r in audit) == sorted(ids)
    assert authority.claim_many("t", "app", "w1", CAPS, NOW + 200, LEASE, 10) == []


def test_claim_many_claims_a_child_once_its_dependencies_are_met(authority: Authority) -> None:
    parent = _admit(authority, "parent")
    child = _admit(authority, "child", priority=9, dependencies=(Dependency(workload_id=parent),))
    (claim,) = authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, 5)
    assert claim.workload_id == parent
    authority.start(parent, claim.fence, NOW + 2)
    authority.complete(parent, claim.fence, "parent-result", {"ok": True}, NOW + 3)
    (second,) = authority.claim_many("t", "app", "w", CAPS, NOW + 4, LEASE, 5)
    assert second.workload_id == child


def test_claim_many_honours_its_limit_and_refuses_a_bad_one(authority: Authority) -> None:
    for i in range(5):
        _admit(authority, f"k{i}")
    assert len(authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, 2)) == 2
    assert len(authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, 9)) == 3
    for bad in (0, -1, MAX_BATCH + 1, True, "3"):
        with pytest.raises(WorkloadError) as refused:
            authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, bad)  # type: ignore[arg-type]
        assert refused.value.code == errors.INVALID


def _limited_spec() -> Any:
    """The shipped spec with the concurrency key `reports` limited to one holder."""
    text = shipped_spec_text()
    table = "[concurrency]\nlimits = {}"
    assert table in text
    return load_spec_text(text.replace(table, "[concurrency]\nlimits = { reports = 1 }"))


@pytest.mark.parametrize("blocked_by", ["a full concurrency key", "a capability", "a dependency"])
@pytest.mark.parametrize("ahead", [1, CLAIM_PAGES + 2])
def test_claim_many_passes_over_work_it_cannot_claim_to_the_work_behind_it(
    store: Store, blocked_by: str, ahead: int
) -> None:
    # A batched worker asks for its free slots; work it may not take now
    # stands first in the queue. `claim_next` passes it over, and so must
    # `claim_many`, however many such candidates there are: else the worker
    # idles while work it can do waits behind them.
    authority = Authority(store, grants=VERIFIER, spec=_limited_spec())
    blocker: dict[str, Any] = {
        "a full concurrency key": {"concurrency_key": "reports"},
        "a capability": {"capability_snapshot": ("email:send", "fax:send")},
        "a dependency": {},
    }[blocked_by]
    if blocked_by == "a full concurrency key":
        held = _admit(authority, "held", now=NOW - 1_000, concurrency_key="reports")
        claimed = authority.claim_next("t", "app", "holder", CAPS, NOW, LEASE)
        assert claimed is not None
        assert claimed.workload_id == held
    if blocked_by == "a dependency":
        parent = _admit(authority, "parent", now=NOW - 1_000, not_before=NOW + 60_000)
        blocker = {"dependencies": (Dependency(workload_id=parent),)}
    for n in range(ahead):
        _admit(authority, f"blocked-{n}", now=NOW - 900 + n, **blocker)
    behind = [_admit(authority, f"free-{n}", now=NOW - 500 + n) for n in range(2)]

    (claim,) = authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, 1)
    assert claim.workload_id == behind[0]
    claims = authority.claim_many("t", "app", "w", CAPS, NOW + 2, LEASE, 5)
    assert [c.workload_id for c in claims] == [behind[1]]
    assert authority.claim_many("t", "app", "w", CAPS, NOW + 3, LEASE, 5) == []
    states = {w.workload_id: w.state for w in authority.list("t", "app")}
    blocked = [key for key, state in states.items() if key not in behind and state == "READY"]
    assert len(blocked) == ahead + (blocked_by == "a dependency"), "blocked work waits, untouched"


def test_claim_many_dead_letters_an_exhausted_candidate_and_claims_the_next(
    authority: Authority, store: Store
) -> None:
    spent = _admit(authority, "spent", priority=5)
    fresh = _admit(authority, "fresh")
    overwrite(store, authority, spent, attempt_count=3)
    claims = authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, 5)
    assert [claim.workload_id for claim in claims] == [fresh]
    assert authority.get(spent).state == "DEAD_LETTER"


def test_claim_many_claims_in_place_of_a_candidate_it_timed_out(authority: Authority) -> None:
    late = _admit(authority, "late", priority=9, timeouts=Timeouts(queue_ms=100))
    other = _admit(authority, "other")
    claims = authority.claim_many("t", "app", "w", CAPS, NOW + 500, LEASE, 1)
    assert [claim.workload_id for claim in claims] == [other]
    assert authority.get(late).state == "DEAD_LETTER", "its queue deadline fell: timed out"


class _SecondBatchFails(ForwardingBatchStore):
    """A real store whose second `claim_batch` of a call cannot reach it (nothing written)."""

    batches = 0

    def claim_batch(self, *args: Any) -> Any:
        self.batches += 1
        if self.batches == 2:
            raise StoreFailure("the server could not be reached")
        return super().claim_batch(*args)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_claim_many_whose_later_round_fails_answers_the_claims_earlier_rounds_made(
    backend: str,
) -> None:
    with BACKENDS[backend]() as inner:
        store = _SecondBatchFails(inner)
        warden = Authority(store, grants=VERIFIER)
        late = _admit(warden, "late", priority=9, timeouts=Timeouts(queue_ms=100))
        first = _admit(warden, "first", priority=5)
        second = _admit(warden, "second", priority=4)
        third = _admit(warden, "third", priority=3)
        # The first round times `late` out in place of a claim, so a second round is
        # asked for the third claim; it fails, and the two claims made are the answer.
        claims = warden.claim_many("t", "app", "w", CAPS, NOW + 500, LEASE, 3)
        assert [claim.workload_id for claim in claims] == [first, second]
        assert store.batches == 2
        assert [warden.get(key).state for key in (late, first, second, third)] == [
            "DEAD_LETTER",
            "CLAIMED",
            "CLAIMED",
            "READY",
        ]
        for claim in claims:
            warden.start(claim.workload_id, claim.fence, NOW + 501)


def test_a_repeated_claim_many_request_is_answered_with_its_claims_and_writes_nothing(
    authority: Authority, store: Store
) -> None:
    for i in range(4):
        _admit(authority, f"k{i}")
    first = authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, 3, request_id="batch-1")
    before = store_snapshot(store)
    again = authority.claim_many("t", "app", "w", CAPS, NOW + 2, LEASE, 3, request_id="batch-1")
    assert sorted(c.claim_id for c in again) == sorted(c.claim_id for c in first)
    assert store_snapshot(store) == before
    for claim in first:
        authority.start(claim.workload_id, claim.fence, NOW + 3)
    with pytest.raises(WorkloadError) as refused:
        authority.claim_many("t", "app", "w", CAPS, NOW + 4, LEASE, 3, request_id="batch-1")
    assert refused.value.code == errors.NOT_READY
    (new,) = authority.claim_many("t", "app", "w", CAPS, NOW + 5, LEASE, 3, request_id="batch-2")
    assert new.workload_id not in {c.workload_id for c in first}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_concurrent_claim_many_callers_never_claim_one_workload_twice(backend: str) -> None:
    with BACKENDS[backend]() as store:
        warden = Authority(store, grants=VERIFIER)
        admitted = warden.admit_many([request(idempotency_key=f"k{i}") for i in range(120)], NOW)
        assert all(not isinstance(a, WorkloadError) for a in admitted)
        claimed: list[ClaimReply] = []
        lock = threading.Lock()
        failures: list[BaseException] = []

        def work(worker: str) -> None:
            # Each thread is its own authority: nothing remembered is shared.
            own = Authority(store, grants=VERIFIER)
            try:
                while True:
                    got = own.claim_many("t", "app", worker, CAPS, NOW + 1, LEASE, 7)
                    if not got:
                        return
                    with lock:
                        claimed.extend(got)
            except Exception as exc:  # noqa: BLE001  # asserted below, in the test's thread
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        ids = [claim.workload_id for claim in claimed]
        assert len(ids) == len(set(ids)) == 120
        claims_written = [r for r in store.audit_log() if r.operation == "claim_next"]
        assert len(claims_written) == 120


# -- reports ----------------------------------------------------------------------------------


def _claimed(authority: Authority, n: int) -> list[ClaimReply]:
    for i in range(n):
        _admit(authority, f"job-{i}")
    return authority.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, n)


def test_report_many_answers_each_report_as_its_own_call_would(store: Store, twin: Store) -> None:
    batch = Authority(store, grants=VERIFIER)
    single = Authority(twin, grants=VERIFIER)
    claims = _claimed(batch, 4)
    assert [c.workload_id for c in _claimed(single, 4)] == [c.workload_id for c in claims]
    a, b, c, d = claims
    stale = Fence(claim_id=a.claim_id, worker_id="w", token=a.fencing_token + 1)
    reports: list[Any] = [
        StartCommand(workload_id=a.workload_id, fence=a.fence),
        StartCommand(workload_id=b.workload_id, fence=b.fence),
        StartCommand(workload_id=c.workload_id, fence=stale),  # the wrong token
        {"op": "start", "workload_id": "workload_missing", "fence": a.fence.model_dump()},
        {"op": "cancel", "workload_id": a.workload_id, "actor": "ops"},  # not a report
        # Reports of one workload are decided in order: start, then complete.
        CompleteCommand(workload_id=a.workload_id, fence=a.fence, result_id="r-a", output=1),
        HeartbeatCommand(workload_id=b.workload_id, fence=b.fence, extend_ms=20_000),
        FailCommand(workload_id=b.workload_id, fence=b.fence, kind="timeout", error="slow"),
        CompleteCommand(workload_id=d.workload_id, fence=d.fence, result_id="r-d", output=1),
        {"op": "fail", "workload_id": d.workload_id, "fence": d.fence.model_dump(), "kind": "?"},
    ]
    answers = batch.report_many(reports, NOW + 10)
    # The same reports one call each (all but the cancel, which report_many refuses).
    expected = [
        _single(lambda r=report: single.execute(r, NOW + 10))
        for i, report in enumerate(reports)
        if i != 4
    ]
    assert _answers(answers[:4] + answers[5:]) == _answers(expected)
    assert isinstance(answers[2], WorkloadError)
    assert answers[2].code == errors.STALE_FENCE
    assert isinstance(answers[3], WorkloadError)
    assert answers[3].code == errors.NOT_FOUND
    assert isinstance(answers[4], WorkloadError)
    assert answers[4].code == errors.INVALID
    assert isinstance(answers[8], WorkloadError), "completing an attempt never started"
    assert batch.get(a.workload_id).state == "SUCCEEDED"
    assert batch.get(b.workload_id).state == "READY", "the failure was retried"
    assert _snapshot(store) == _snapshot(twin)


@pytest.mark.parametrize("remembered", ["the first", "the second", "neither"])
def test_a_result_id_two_completions_of_a_batch_name_goes_to_the_first_as_one_calls_give_it(
    store: Store, twin: Store, remembered: str
) -> None:
    # A result id is one workload's. Named by two completions of one batch, it
    # is the earlier slot's, as when the same reports are made one call each,
    # whether the earlier one waits on a start before it, and whichever of the
    # workloads the authority wrote last itself.
    batch = Authority(store, grants=VERIFIER)
    single = Authority(twin, grants=VERIFIER)
    claims = _claimed(batch, 3)
    assert [c.workload_id for c in _claimed(single, 3)] == [c.workload_id for c in claims]
    a, b, c = claims
    for warden in (batch, single):
        warden.start(b.workload_id, b.fence, NOW + 2)
        warden.start(c.workload_id, c.fence, NOW + 2)
    # The authority decides a workload it did not write last on a fresh read.
    forgotten = {"the first": [b], "the second": [c], "neither": [b, c]}[remembered]
    for claim in forgotten:
        batch._latest.forget(claim.workload_id)
    reports: list[Any] = [
        StartCommand(workload_id=a.workload_id, fence=a.fence),
        CompleteCommand(workload_id=a.workload_id, fence=a.fence, result_id="shared", output=1),
        CompleteCommand(workload_id=b.workload_id, fence=b.fence, result_id="shared", output=2),
        CompleteCommand(workload_id=c.workload_id, fence=c.fence, result_id="r-c", output=3),
        CompleteCommand(workload_id=c.workload_id, fence=c.fence, result_id="shared", output=3),
    ]
    answers = batch.report_many(reports, NOW + 10)
    expected = [_single(lambda r=report: single.execute(r, NOW + 10)) for report in reports]
    assert _answers(answers) == _answers(expected)
    assert not isinstance(answers[1], WorkloadError)
    assert isinstance(answers[2], WorkloadError)
    assert answers[2].code == errors.RESULT_DUPLICATE
    assert store.find_result("shared") == a.workload_id
    # The batch commits in rounds, so the audit log holds the same records in another order.
    docs, audit = _snapshot(store)
    twin_docs, twin_audit = _snapshot(twin)
    assert docs == twin_docs
    assert sorted(audit) == sorted(twin_audit)


def test_a_report_many_repeated_after_its_reply_was_lost_writes_nothing_more(
    authority: Authority, store: Store
) -> None:
    claims = _claimed(authority, 3)
    starts = [StartCommand(workload_id=c.workload_id, fence=c.fence) for c in claims]
    completes = [
        CompleteCommand(workload_id=c.workload_id, fence=c.fence, result_id=f"r{i}", output=i)
        for i, c in enumerate(claims)
    ]
    first = authority.report_many([*starts, *completes], NOW + 5)
    before = store_snapshot(store)
    # A new authority (a restarted worker) repeats the batch: each completion is
    # replayed; a start after the completion ended the claim is refused, as the
    # one-call `start` is; nothing is written.
    again = Authority(store, grants=VERIFIER).report_many([*starts, *completes], NOW + 6)
    assert _answers(again[3:]) == _answers(first[3:])
    assert [getattr(a, "code", None) for a in again[:3]] == [errors.CLAIM_INVALID] * 3
    assert store_snapshot(store) == before


def test_a_report_another_writer_overtook_is_decided_again_on_a_fresh_read(
    authority: Authority, second_authority: Authority
) -> None:
    claims = _claimed(authority, 2)
    authority.report_many(
        [StartCommand(workload_id=c.workload_id, fence=c.fence) for c in claims], NOW + 2
    )
    # The other writer moves the first workload on (its heartbeat), unseen by `authority`.
    second_authority.heartbeat(claims[0].workload_id, claims[0].fence, NOW + 3, 30_000)
    second_authority.cancel(claims[1].workload_id, "ops", NOW + 3)
    answers = authority.report_many(
        [
            CompleteCommand(
                workload_id=c.workload_id, fence=c.fence, result_id=f"r{i}", output=None
            )
            for i, c in enumerate(claims)
        ],
        NOW + 4,
    )
    assert not isinstance(answers[0], WorkloadError)
    assert authority.get(claims[0].workload_id).state == "SUCCEEDED"
    assert isinstance(answers[1], WorkloadError)
    assert answers[1].code == errors.TRANSITION_DENIED
    assert answers[1].details["state"] == "CANCELLATION_REQUESTED"


# -- a claim that starts its attempt (specs/examples/claim_starts.toml) --------------------------


def test_a_claim_that_starts_its_attempt_is_one_commit_with_both_events(store: Store) -> None:
    warden = Authority(store, grants=VERIFIER, spec=load_spec(CLAIM_STARTS))
    workload_id = _admit(warden, "one")
    claim = warden.claim_next("t", "app", "w", CAPS, NOW + 1, LEASE, request_id="c1")
    assert claim is not None
    assert claim.started_at == NOW + 1
    workload = warden.get(workload_id)
    assert workload.state == "RUNNING"
    assert [e.type for e in workload.execution_history[-2:]] == [
        "workload.claimed",
        "workload.started",
    ]
    assert [r.operation for r in store.audit_log()] == ["admit", "claim_next"]
    before = store_snapshot(store)
    # A start with the claim's fence is answered as a replay; a repeat of the
    # claim request is answered with the claim: neither writes.
    assert warden.start(workload_id, claim.fence, NOW + 2).started_at == NOW + 1
    again = warden.claim_next("t", "app", "w", CAPS, NOW + 3, LEASE, request_id="c1")
    assert again is not None
    assert again.claim_id == claim.claim_id
    assert store_snapshot(store) == before
    warden.complete(workload_id, claim.fence, "r1", {"ok": True}, NOW + 4)
    assert [r.operation for r in store.audit_log()] == ["admit", "claim_next", "complete"]


def test_a_batch_of_claims_that_start_their_attempts_needs_only_the_completions(
    store: Store,
) -> None:
    warden = Authority(store, grants=VERIFIER, spec=load_spec(CLAIM_STARTS))
    warden.admit_many([request(idempotency_key=f"k{i}") for i in range(5)], NOW)
    claims = warden.claim_many("t", "app", "w", CAPS, NOW + 1, LEASE, 5)
    assert [c.started_at for c in claims] == [NOW + 1] * 5
    answers = warden.report_many(
        [
            CompleteCommand(workload_id=c.workload_id, fence=c.fence, result_id=f"r{i}", output=i)
            for i, c in enumerate(claims)
        ],
        NOW + 2,
    )
    assert not any(isinstance(answer, WorkloadError) for answer in answers)
    operations = [r.operation for r in store.audit_log()]
    assert operations.count("claim_next") == 5
    assert operations.count("start") == 0
    assert len(operations) == 15, "three commits per job"


def test_the_checker_explores_the_claim_that_starts_its_attempt_and_finds_nothing() -> None:
    spec = load_spec(CLAIM_STARTS)
    report = check(spec, Universe.from_spec(spec, dependent=False, workers=1))
    assert report.complete
    assert report.violations == []
    assert report.cannot_finish == 0
    # CLAIMED is passed through inside the claim's commit, never left at rest,
    # so no edge out of it but the start is ever taken.
    assert "CLAIMED" in report.never_at_rest
    assert "CLAIMED -> RUNNING" in report.edges_taken
    claimed_edges = [edge for edge in report.edges_never_taken if edge.startswith("CLAIMED ->")]
    assert len(claimed_edges) == 4


def test_the_shipped_claim_starts_vectors_are_what_the_reference_writes_and_an_adapter_passes() -> (
    None
):
    spec = load_spec(CLAIM_STARTS)
    shipped = VECTORS.read_text(encoding="ascii")
    assert render_vectors(generate_vectors(spec, check_ends=False)) == shipped
    vectors = read_vectors(shipped)
    results = run_conformance(
        [sys.executable, "-m", "workwarden.adapter", "--spec", str(CLAIM_STARTS)],
        vectors,
        timeout=30,
    )
    assert [r.name for r in results if not r.passed] == []
    # The vectors tell the claim that starts from the shipped one: an adapter of the
    # shipped spec fails most of them.
    against_shipped = run_conformance(
        [sys.executable, "-m", "workwarden.adapter"], vectors[:40], timeout=30
    )
    assert sum(not r.passed for r in against_shipped) > 20
