"""The extended lifecycles of specs/examples/: data only, and the whole toolkit follows them.

Each example is the shipped spec plus states, edges and operations whose effect
is `move`. With no code change, an `Authority` built on it takes a workload
through the new states on every backend, every history it writes is valid
against it, the invariants hold on every document, and the diagram draws it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import VERIFIER, request
from workwarden.statemachine import Authority, WorkloadError, errors, load_spec
from workwarden.statemachine.diagram import diagram_dot
from workwarden.statemachine.properties.decisions import check_history
from workwarden.statemachine.properties.invariants import check_workload
from workwarden.statemachine.spec import Spec
from workwarden.storage import Store

EXAMPLES = Path(__file__).resolve().parents[1] / "specs" / "examples"
NOW = 10_000
LEASE = 5_000


def example(name: str) -> Spec:
    return load_spec(EXAMPLES / f"{name}.toml")


def held_to_the_spec(spec: Spec, warden: Authority, workload_id: str) -> list[str]:
    """The workload's path, once its history and document pass every check of the spec."""
    workload = warden.get(workload_id)
    assert check_history(spec, workload.execution_history, workload) is None
    assert check_workload(spec, workload) == []
    return [event.to for event in workload.execution_history]


def test_every_example_validates() -> None:
    names = sorted(path.stem for path in EXAMPLES.glob("*.toml"))
    assert names == ["approval", "claim_starts", "pause"]
    for name in names:
        assert example(name).data.spec.name == f"workload-{name}"


def test_a_paused_workload_is_not_claimed_until_it_is_resumed(store: Store) -> None:
    spec = example("pause")
    warden = Authority(store, grants=VERIFIER, spec=spec)
    workload_id = warden.admit(request(), NOW).workload.workload_id

    assert warden.operate(workload_id, "pause", "ops", NOW + 1, reason="incident 7") == "PAUSED"
    assert warden.claim_next("t", "app", "w1", {"email:send"}, NOW + 2, lease_ms=LEASE) is None
    with pytest.raises(WorkloadError) as refused:
        warden.claim(workload_id, "w1", {"email:send"}, NOW + 2, lease_ms=LEASE)
    assert refused.value.code == errors.NOT_READY
    assert refused.value.details == {"state": "PAUSED"}

    assert warden.operate(workload_id, "resume", "ops", NOW + 3) == "READY"
    claim = warden.claim_next("t", "app", "w1", {"email:send"}, NOW + 4, lease_ms=LEASE)
    assert claim is not None
    warden.start(workload_id, claim.fence, NOW + 5)
    warden.complete(workload_id, claim.fence, "r1", {"ok": True}, NOW + 6)

    path = held_to_the_spec(spec, warden, workload_id)
    assert path == ["READY", "PAUSED", "READY", "CLAIMED", "RUNNING", "SUCCEEDED"]
    paused = warden.get(workload_id).execution_history[1]
    assert (paused.type, paused.actor, paused.actor_class) == ("workload.paused", "ops", "operator")
    assert paused.evidence == {"reason": "incident 7"}


def test_a_paused_workload_is_not_timed_out_by_its_queue_deadline(store: Store) -> None:
    spec = example("pause")
    warden = Authority(store, grants=VERIFIER, spec=spec)
    admitted = warden.admit(request(timeouts={"queue_ms": 1_000}), NOW)
    workload_id = admitted.workload.workload_id
    warden.operate(workload_id, "pause", "ops", NOW + 1)
    assert warden.enforce_deadlines(NOW + 50_000) == []
    assert warden.get(workload_id).state == "PAUSED"
    # Resumed, the queue deadline runs from the resumption.
    warden.operate(workload_id, "resume", "ops", NOW + 60_000)
    assert warden.enforce_deadlines(NOW + 60_999) == []
    assert warden.enforce_deadlines(NOW + 61_000) != []
    assert warden.get(workload_id).state == "DEAD_LETTER"
    held_to_the_spec(spec, warden, workload_id)


def test_only_queued_work_can_be_paused_and_pausing_twice_changes_nothing(store: Store) -> None:
    spec = example("pause")
    warden = Authority(store, grants=VERIFIER, spec=spec)
    workload_id = warden.admit(request(), NOW).workload.workload_id
    warden.claim(workload_id, "w1", {"email:send"}, NOW + 1, lease_ms=LEASE)
    before = warden.get(workload_id)
    with pytest.raises(WorkloadError) as refused:
        warden.operate(workload_id, "pause", "ops", NOW + 2)
    assert refused.value.code == errors.TRANSITION_DENIED
    assert warden.get(workload_id) == before


def test_an_operation_the_spec_lacks_is_refused_as_invalid(store: Store) -> None:
    warden = Authority(store, grants=VERIFIER)
    workload_id = warden.admit(request(), NOW).workload.workload_id
    with pytest.raises(WorkloadError) as refused:
        warden.operate(workload_id, "pause", "ops", NOW + 1)
    assert refused.value.code == errors.INVALID
    assert warden.get(workload_id).state == "READY"


def test_approved_work_runs_and_rejected_work_never_does(store: Store) -> None:
    spec = example("approval")
    warden = Authority(store, grants=VERIFIER, spec=spec)
    approved = warden.admit(request(), NOW).workload
    rejected = warden.admit(request(idempotency_key="two"), NOW).workload
    assert approved.state == rejected.state == "AWAITING_APPROVAL"
    assert warden.claim_next("t", "app", "w1", {"email:send"}, NOW + 1, lease_ms=LEASE) is None

    assert warden.operate(rejected.workload_id, "reject", "ops", NOW + 2) == "REJECTED"
    assert warden.operate(approved.workload_id, "approve", "ops", NOW + 3) == "READY"
    claim = warden.claim_next("t", "app", "w1", {"email:send"}, NOW + 4, lease_ms=LEASE)
    assert claim is not None
    assert claim.workload_id == approved.workload_id
    assert warden.claim_next("t", "app", "w2", {"email:send"}, NOW + 5, lease_ms=LEASE) is None
    warden.start(approved.workload_id, claim.fence, NOW + 6)
    warden.complete(approved.workload_id, claim.fence, "r1", {"ok": True}, NOW + 7)

    assert held_to_the_spec(spec, warden, approved.workload_id) == [
        "AWAITING_APPROVAL",
        "READY",
        "CLAIMED",
        "RUNNING",
        "SUCCEEDED",
    ]
    assert held_to_the_spec(spec, warden, rejected.workload_id) == [
        "AWAITING_APPROVAL",
        "REJECTED",
    ]
    with pytest.raises(WorkloadError) as refused:
        warden.operate(rejected.workload_id, "approve", "ops", NOW + 8)
    assert refused.value.code == errors.TRANSITION_DENIED


def test_a_replayed_admission_awaiting_approval_is_answered_as_the_first(store: Store) -> None:
    spec = example("approval")
    warden = Authority(store, grants=VERIFIER, spec=spec)
    first = warden.admit(request(not_before=NOW + 500), NOW)
    again = warden.admit(request(not_before=NOW + 500), NOW + 1)
    assert again.created is False
    assert again.workload == first.workload


@pytest.mark.parametrize("name", ["pause", "approval"])
def test_the_diagram_of_an_example_draws_its_new_states(name: str) -> None:
    spec = example(name)
    dot = diagram_dot(spec)
    for state in set(spec.states) - set(load_spec().states):
        assert re.search(rf"^\s*{state} \[", dot, re.MULTILINE), f"no node {state}"
    for edge in set(spec.edges) - set(load_spec().edges):
        assert re.search(rf"^\s*{edge[0]} -> {edge[1]} \[", dot, re.MULTILINE), edge
