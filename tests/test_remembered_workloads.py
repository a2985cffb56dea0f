"""What an authority keeps between calls can never be changed from outside, or by the core.

By default an authority remembers its latest writes and decides the next call
on such a key on what it wrote, letting the compare-and-swap confirm it; after
a claim, start or heartbeat it keeps the decoded workload too. That is only
sound if nothing can change a kept workload: neither the core while deciding
(it must never edit the workload it is given) nor a caller editing what a
call returned. These tests try both.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import pytest

from support import CAPS, VERIFIER, request
from workwarden.statemachine import Authority, default_spec
from workwarden.statemachine import authority as authority_module
from workwarden.statemachine.authority import DEFAULT_REMEMBER
from workwarden.statemachine.conformance.vectors import all_scenarios, run_scenario
from workwarden.statemachine.models import Attempt, Claim
from workwarden.storage import Store

LEASE = 1_000
T = 10_000  # the grant is active from 1,000


def stored_document(store: Store, key: str) -> dict[str, Any]:
    doc = store.read(key)
    assert doc is not None
    parsed: dict[str, Any] = json.loads(doc.document)
    return parsed


def test_an_authority_remembers_its_writes_by_default(store: Store) -> None:
    warden = Authority(store, grants=VERIFIER)
    assert warden.remember == DEFAULT_REMEMBER > 0


def test_the_core_never_edits_the_workload_it_decides_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every conformance scenario, with every decision checked: its input is left as it was."""
    decide = authority_module.decide
    checked = 0

    def checking_decide(spec: Any, workload: Any, command: Any, now: int, **given: Any) -> Any:
        nonlocal checked
        before = None if workload is None else workload.model_dump_json(by_alias=True)
        try:
            return decide(spec, workload, command, now, **given)
        finally:
            after = None if workload is None else workload.model_dump_json(by_alias=True)
            assert after == before, f"deciding {command.op} edited the workload it was given"
            checked += workload is not None

    monkeypatch.setattr(authority_module, "decide", checking_decide)
    spec = default_spec()
    for scenario in all_scenarios(spec):
        run_scenario(spec, scenario, check_ends=False)
    assert checked > 500


def test_editing_a_claim_or_attempt_reply_changes_nothing_the_next_call_decides_on(
    store: Store,
) -> None:
    warden = Authority(store, grants=VERIFIER)
    wid = warden.admit(request(), T).workload.workload_id
    claim = warden.claim(wid, "w1", CAPS, T + 20, LEASE)
    fence = claim.fence
    claim.expires_at = T + 25  # a caller's edit: the lease is not shortened by it
    claim.fencing_token = 99
    attempt = warden.start(wid, fence, T + 30)
    attempt.status = "FAILED"
    attempt.input_hash = "edited"
    warden.heartbeat(wid, fence, T + 900, LEASE)  # after the edited expiry: still leased
    document = stored_document(store, wid)
    assert document["state"] == "RUNNING"
    assert document["current_claim"]["fencing_token"] == 1
    assert document["current_claim"]["expires_at"] == T + 900 + LEASE
    assert document["attempts"][-1]["status"] == "RUNNING"
    assert document["attempts"][-1]["input_hash"] != "edited"


def test_editing_the_admitted_workload_changes_nothing_that_is_written_later(
    store: Store,
) -> None:
    warden = Authority(store, grants=VERIFIER)
    admitted = warden.admit(request(), T)
    workload = admitted.workload
    wid = workload.workload_id
    original_input = stored_document(store, wid)["input"]
    assert isinstance(workload.input, dict)
    workload.input["edited"] = True
    workload.priority = 7
    workload.execution_history.clear()
    claim = warden.claim(wid, "w1", CAPS, T + 20, LEASE)
    warden.start(wid, claim.fence, T + 30)
    document = stored_document(store, wid)
    assert document["input"] == original_input
    assert document["priority"] == request().priority
    assert [event["to"] for event in document["execution_history"]] == [
        "READY",
        "CLAIMED",
        "RUNNING",
    ]


def test_editing_a_result_or_checkpoint_reply_changes_nothing_written_later(
    store: Store,
) -> None:
    warden = Authority(store, grants=VERIFIER)
    wid = warden.admit(request(), T).workload.workload_id
    claim = warden.claim(wid, "w1", CAPS, T + 20, LEASE)
    warden.start(wid, claim.fence, T + 30)
    checkpoint = warden.checkpoint(wid, claim.fence, {"page": 1}, T + 40)
    assert isinstance(checkpoint.state, dict)
    checkpoint.state["page"] = 2
    warden.heartbeat(wid, claim.fence, T + 50, LEASE)
    result = warden.complete(wid, claim.fence, "result-1", {"sent": True}, T + 60)
    assert isinstance(result.output, dict)
    result.output["sent"] = False
    replayed = warden.complete(wid, claim.fence, "result-1", {"sent": True}, T + 70)
    assert replayed.output == {"sent": True}
    document = stored_document(store, wid)
    assert document["checkpoints"][0]["state"] == {"page": 1}
    assert document["result"]["output"] == {"sent": True}


def _immutable(annotation: Any) -> bool:
    """Is every value of `annotation` immutable (text, numbers, literals, tuples of them)?"""
    if annotation in (str, int, bool, type(None)):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin is typing.Annotated:
        return _immutable(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, tuple):
        return all(arg is Ellipsis or _immutable(arg) for arg in typing.get_args(annotation))
    return False


@pytest.mark.parametrize("model", [Claim, Attempt])
def test_claims_and_attempts_hold_only_values_no_caller_can_edit_in_place(model: Any) -> None:
    """Why a copied claim or attempt may be handed out while the workload it came from is kept."""
    for name, field in model.model_fields.items():
        assert _immutable(field.annotation), (
            f"{model.__name__}.{name} is {field.annotation}: a copy of a reply would share it"
        )
    assert not _immutable(dict[str, str])
    assert not _immutable(list[str] | None)
