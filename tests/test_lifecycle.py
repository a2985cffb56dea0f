"""The legal lifecycle: admit, claim, start, checkpoint, complete, and what each leaves behind.

Every commit appends to the workload's history with the next sequence number
(1, 2, 3, ... without gaps), every checkpoint records an event, and every
committed version has one audit record.
"""

from __future__ import annotations

import pytest

from support import CAPS, request
from support import authority as authority_over
from workwarden.statemachine import Authority, WorkloadError
from workwarden.storage import Store


def test_a_workload_goes_from_admission_through_checkpoints_to_success(
    authority: Authority, store: Store
) -> None:
    admitted = authority.admit(request(), now=10_000)
    assert admitted.created
    workload_id = admitted.workload.workload_id

    claim = authority.claim(workload_id, "worker", CAPS, now=11_000, lease_ms=10_000)
    assert claim.fencing_token == 1
    assert claim.expires_at == 21_000, "a 10 000 ms lease lasts 10 000 ms"
    assert authority.get(workload_id).state == "CLAIMED"

    started = authority.start(workload_id, claim.fence, now=12_000)
    assert started.status == "RUNNING"
    assert started.started_at == 12_000
    assert authority.get(workload_id).state == "RUNNING"

    first = authority.checkpoint(workload_id, claim.fence, {"step": 1}, now=12_500)
    second = authority.checkpoint(workload_id, claim.fence, {"step": 2}, now=12_700)
    assert (first.sequence, second.sequence) == (1, 2)
    assert authority.get(workload_id).state == "CHECKPOINTED"

    result = authority.complete(workload_id, claim.fence, "result-1", {"ok": True}, now=13_000)
    assert result.result_id == "result-1"
    assert result.produced_by == "worker"

    done = authority.get(workload_id)
    assert done.state == "SUCCEEDED"
    assert done.current_claim is None
    assert done.result == result
    assert [c.state for c in done.checkpoints] == [{"step": 1}, {"step": 2}]
    (attempt,) = done.attempts
    assert attempt.status == "SUCCEEDED"
    assert (attempt.started_at, attempt.ended_at) == (12_000, 13_000)
    assert attempt.result_hash == result.output_hash
    assert done.attempt_count == 1
    history = [(e.sequence, e.type, e.from_state, e.to, e.actor) for e in done.execution_history]
    assert history == [
        (1, "workload.ready", "CREATED", "READY", "system.admission"),
        (2, "workload.claimed", "READY", "CLAIMED", "worker"),
        (3, "workload.started", "CLAIMED", "RUNNING", "worker"),
        (4, "workload.checkpointed", "RUNNING", "CHECKPOINTED", "worker"),
        (5, "workload.checkpointed", "CHECKPOINTED", "CHECKPOINTED", "worker"),
        (6, "workload.completed", "CHECKPOINTED", "SUCCEEDED", "worker"),
    ]
    assert [e.at for e in done.execution_history] == [
        10_000,
        11_000,
        12_000,
        12_500,
        12_700,
        13_000,
    ]


def test_a_workload_without_checkpoints_completes_from_running(authority: Authority) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "worker", CAPS, now=11_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, now=12_000)
    authority.complete(workload_id, claim.fence, "result-1", {"ok": True}, now=13_000)

    history = authority.get(workload_id).execution_history
    assert [e.sequence for e in history] == [1, 2, 3, 4]
    assert [e.type for e in history] == [
        "workload.ready",
        "workload.claimed",
        "workload.started",
        "workload.completed",
    ]


def test_the_same_admission_twice_is_one_workload_and_a_finished_one_stays_finished(
    store: Store,
) -> None:
    authority = authority_over(store)
    one = authority.admit(request(), now=10_000).workload
    two = authority.admit(request(), now=10_000).workload
    assert one.workload_id == two.workload_id
    claim = authority.claim(one.workload_id, "worker", CAPS, now=11_000, lease_ms=10_000)
    authority.start(one.workload_id, claim.fence, now=12_000)
    authority.complete(one.workload_id, claim.fence, "result-1", {"ok": True}, now=13_000)

    with pytest.raises(WorkloadError) as caught:
        authority.start(one.workload_id, claim.fence, now=14_000)
    assert caught.value.code == "WORKLOAD_CLAIM_INVALID", "completion released the claim"

    reopened = authority_over(store)
    assert reopened.get(one.workload_id).state == "SUCCEEDED"
    assert reopened.get(one.workload_id).result is not None


def test_every_committed_version_is_audited_once_with_who_did_what(
    authority: Authority, store: Store
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "worker", CAPS, now=11_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, now=12_000)
    authority.heartbeat(workload_id, claim.fence, now=12_100, extend_ms=10_000)
    authority.checkpoint(workload_id, claim.fence, {"step": 1}, now=12_500)
    authority.execution_context(workload_id, claim.fence, now=12_600)  # a read: no version
    authority.complete(workload_id, claim.fence, "result-1", {"ok": True}, now=13_000)

    records = [r for r in store.audit_log() if r.key == workload_id]
    assert [r.version for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r.operation for r in records] == [
        "admit",
        "claim",
        "start",
        "heartbeat",
        "checkpoint",
        "complete",
    ]
    assert [r.actor for r in records] == ["a1"] + ["worker"] * 5
    assert [r.worker for r in records] == [None] + ["worker"] * 5
    assert [r.fencing_token for r in records[2:]] == [1, 1, 1, 1], "each fenced call's token"
    assert [r.at for r in records] == [10_000, 11_000, 12_000, 12_100, 12_500, 13_000]
    assert records[-1].result == "result-1"
    assert {(r.tenant, r.application) for r in records} == {("t", "app")}
    attempt_id = authority.get(workload_id).attempts[0].attempt_id
    assert [r.attempt for r in records] == [None] + [attempt_id] * 5
    committed = store.read(workload_id)
    assert committed is not None
    assert committed.version == 6


def test_a_heartbeat_extends_the_lease_from_its_own_instant(authority: Authority) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "worker", CAPS, now=11_000, lease_ms=1_000)

    extended = authority.heartbeat(workload_id, claim.fence, now=11_900, extend_ms=5_000)

    assert extended.expires_at == 16_900
    assert extended.last_heartbeat == 11_900
    assert extended.fencing_token == claim.fencing_token
    # Past the original lease, the worker still holds the work.
    authority.start(workload_id, claim.fence, now=15_000)
    assert authority.get(workload_id).state == "RUNNING"


def test_completion_needs_a_started_attempt(authority: Authority) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "worker", CAPS, now=11_000, lease_ms=10_000)

    with pytest.raises(WorkloadError) as completed:
        authority.complete(workload_id, claim.fence, "r", {"ok": True}, now=12_000)
    with pytest.raises(WorkloadError) as checkpointed:
        authority.checkpoint(workload_id, claim.fence, {"step": 1}, now=12_000)

    assert completed.value.code == "WORKLOAD_TRANSITION_DENIED"
    assert checkpointed.value.code == "WORKLOAD_TRANSITION_DENIED"
    assert authority.get(workload_id).state == "CLAIMED"


@pytest.mark.parametrize(
    "state",
    [
        {"credentials": {"password": "x"}},
        {"rows": [{"ok": 1}, {"Token": "abc"}]},
        {"log": ["fine", "sk-abc"]},
    ],
    ids=["nested-key", "key-in-list", "text"],
)
def test_plaintext_secrets_in_a_checkpoint_or_output_are_refused(
    authority: Authority, state: object
) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "worker", CAPS, now=11_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, now=12_000)

    with pytest.raises(WorkloadError) as checkpointed:
        authority.checkpoint(workload_id, claim.fence, state, now=12_500)
    with pytest.raises(WorkloadError) as completed:
        authority.complete(workload_id, claim.fence, "r", state, now=12_500)

    assert checkpointed.value.code == "WORKLOAD_SECRET_REJECTED"
    assert completed.value.code == "WORKLOAD_SECRET_REJECTED"
    running = authority.get(workload_id)
    assert running.state == "RUNNING"
    assert running.checkpoints == []
    assert running.result is None
