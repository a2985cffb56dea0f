"""A refusal changes nothing: for every code a call can produce, the store is left byte for byte.

Each scenario below drives the authority into a situation that produces one
refusal code and hands back the refused call. The store (documents, versions,
index fields and audit log) must be the same after the refusal as before it,
except for the codes whose catalogue entry says `records = true`: those are
raised after the decision they report has been committed, as exactly one new
version. Every code in the catalogue has a scenario here or is named in
`NOT_PRODUCED_BY_CALLS`, so a new code cannot be added without a refusal test.

Malformed input is refused the same way, and only ever as `WORKLOAD_INVALID`
naming the field, whether it comes through a one-call method or `prepare`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from support import CAPS, SIGNER, grant_for, request, store_snapshot
from workwarden.cli import COMMAND_LINE_CODES
from workwarden.statemachine import (
    Authority,
    Claim,
    ClaimCommand,
    Fence,
    GrantSigner,
    RetryPolicy,
    Timeouts,
    WorkloadError,
    default_spec,
    errors,
)
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.models import DEFAULT_RETRY_ON
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text
from workwarden.storage import AuditRecord, Store

Call = Callable[[], Any]
Scenario = Callable[[Authority, Authority, Store], Call]

#: Codes no authority call produces: they come from loading a spec and from importing files.
# Spec loading and imports are not calls of the authority; an outcome unknown is, by
# definition, a write that may have committed (tests/test_replays.py holds it).
NOT_PRODUCED_BY_CALLS = frozenset(
    {
        errors.SPEC_INVALID,
        errors.MIGRATION_CONFLICT,
        errors.OUTCOME_UNKNOWN,
        errors.EXTRA_MISSING,
    }
)

CATALOGUE = default_spec().errors

#: Scenario id -> (the code it produces, the scenario).
REFUSALS: dict[str, tuple[str, Scenario]] = {}


def refusal(code: str, name: str) -> Callable[[Scenario], Scenario]:
    """Register a scenario that produces `code`."""

    def register(scenario: Scenario) -> Scenario:
        REFUSALS[f"{code}-{name}"] = (code, scenario)
        return scenario

    return register


# -- builders --------------------------------------------------------------------


def _admit(authority: Authority, **changes: Any) -> str:
    return authority.admit(request(**changes), now=10_000).workload.workload_id


def _claimed(authority: Authority, lease_ms: int = 10_000, **changes: Any) -> tuple[str, Claim]:
    workload_id = _admit(authority, **changes)
    return workload_id, authority.claim(workload_id, "w", CAPS, now=11_000, lease_ms=lease_ms)


def _running(authority: Authority, **changes: Any) -> tuple[str, Claim]:
    workload_id, claim = _claimed(authority, **changes)
    authority.start(workload_id, claim.fence, now=12_000)
    return workload_id, claim


def _overwrite(store: Store, key: str, document: str, index: Any) -> None:
    """Commit `document` under `key` through the store protocol, as another program might."""
    current = store.read(key)
    assert current is not None
    audit = AuditRecord(
        transaction_id="tx_fixture",
        key=key,
        version=0,
        actor="fixture",
        operation="fixture",
        tenant="t",
        application="app",
        at=10_000,
        digest=hashlib.sha256(document.encode()).hexdigest(),
    )
    store.write(key, document, index, current.version, audit)


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


# -- one scenario per refusal (at least) ------------------------------------------


@refusal(errors.NOT_FOUND, "claim")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    return lambda: a.claim("workload_missing", "w", CAPS, now=11_000, lease_ms=1_000)


@refusal(errors.NOT_FOUND, "cancel")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    return lambda: a.cancel("workload_missing", "operator", now=11_000)


@refusal(errors.NOT_FOUND, "start")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _, claim = _claimed(a)
    return lambda: a.start("workload_missing", claim.fence, now=12_000)


@refusal(errors.INVALID, "blank-idempotency-key")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    return lambda: a.admit(request(idempotency_key=" "), now=11_000)


@refusal(errors.INVALID, "zero-timeout")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    return lambda: a.admit(request(timeouts=Timeouts(heartbeat_ms=0)), now=11_000)


@refusal(errors.INVALID, "initial-delay-over-max")
def _(a: Authority, b: Authority, store: Store) -> Call:
    policy = RetryPolicy(initial_delay_ms=10_000, max_delay_ms=1_000, retry_on=DEFAULT_RETRY_ON)
    return lambda: a.admit(request(retry_policy=policy), now=11_000)


@refusal(errors.INVALID, "unknown-dependency-state")
def _(a: Authority, b: Authority, store: Store) -> Call:
    deps = [{"workload_id": "w1", "required_state": "DONE"}]
    return lambda: a.admit(request(dependencies=deps), now=11_000)


@refusal(errors.INVALID, "input-nested-too-deep")
def _(a: Authority, b: Authority, store: Store) -> Call:
    return lambda: a.admit(request(input=_deep(100)), now=11_000)


@refusal(errors.INVALID, "output-not-finite")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    return lambda: a.complete(workload_id, claim.fence, "r", {"x": float("nan")}, now=13_000)


@refusal(errors.INVALID, "zero-lease")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    return lambda: a.claim(workload_id, "w", CAPS, now=11_000, lease_ms=0)


@refusal(errors.INVALID, "negative-now")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    return lambda: a.claim(workload_id, "w", CAPS, now=-1, lease_ms=1_000)


@refusal(errors.INVALID, "unknown-effect-through-prepare")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    command = {
        "op": "fail",
        "workload_id": workload_id,
        "fence": claim.fence.model_dump(),
        "kind": "timeout",
        "error": "slow",
        "effect": "maybe",
    }
    return lambda: a.prepare(command, 13_000)


@refusal(errors.UNAUTHORIZED, "unbound-snapshot")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    return lambda: a.admit(request(authorization_snapshot=SIGNER.sign(grant_for("a2"))), 11_000)


@refusal(errors.UNAUTHORIZED, "expired-grant")
def _(a: Authority, b: Authority, store: Store) -> Call:
    expired = SIGNER.sign(grant_for(expires_at=11_000))
    return lambda: a.admit(request(authorization_snapshot=expired), now=11_000)


@refusal(errors.UNAUTHORIZED, "unknown-signing-key")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    forged = GrantSigner("k-other", b"0123456789abcdef0123").sign(grant_for())
    return lambda: a.admit(request(authorization_snapshot=forged), now=11_000)


@refusal(errors.IDEMPOTENCY_KEY_REUSED, "different-input")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    return lambda: a.admit(request(input={"id": 2}), now=11_000)


@refusal(errors.CONFLICT, "overtaken-claim")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    command = ClaimCommand(workload_id=workload_id, worker_id="w", capabilities=CAPS, lease_ms=10)
    winner = a.prepare(command, 11_000)
    loser = b.prepare(command.model_copy(update={"worker_id": "v"}), 11_000)
    winner.commit()
    return loser.commit


@refusal(errors.TRANSITION_DENIED, "complete-while-cancellation-requested")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    a.cancel(workload_id, "user", now=13_000)
    return lambda: a.complete(workload_id, claim.fence, "r", None, now=14_000)


@refusal(errors.TRANSITION_DENIED, "cancel-finished")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    a.complete(workload_id, claim.fence, "r", None, now=13_000)
    return lambda: a.cancel(workload_id, "user", now=14_000)


@refusal(errors.TRANSITION_DENIED, "retry-running")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, _ = _running(a)
    return lambda: a.retry(workload_id, "operator", now=13_000)


@refusal(errors.TRANSITION_DENIED, "timeout-cancelled")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    a.cancel(workload_id, "user", now=11_000)
    return lambda: a.timeout(workload_id, "operator", now=12_000)


@refusal(errors.NOT_READY, "claim-claimed")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, _ = _claimed(a)
    return lambda: b.claim(workload_id, "v", CAPS, now=11_000, lease_ms=1_000)


@refusal(errors.NOT_YET_ELIGIBLE, "claim-early")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a, not_before=50_000)
    return lambda: a.claim(workload_id, "w", CAPS, now=49_999, lease_ms=1_000)


@refusal(errors.CAPABILITY_DENIED, "claim-without-capability")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    return lambda: a.claim(workload_id, "w", ("sms:send",), now=11_000, lease_ms=1_000)


@refusal(errors.CLAIM_INVALID, "start-never-claimed")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    fence = Fence(claim_id="claim_x", worker_id="w", token=1)
    return lambda: a.start(workload_id, fence, now=11_000)


@refusal(errors.STALE_FENCE, "lost-worker")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, lost = _claimed(a, lease_ms=1_000)
    a.recover_expired(now=12_000)
    a.claim(workload_id, "v", CAPS, now=12_000, lease_ms=10_000)
    return lambda: a.start(workload_id, lost.fence, now=12_500)


@refusal(errors.LEASE_EXPIRED, "start-after-lease")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _claimed(a, lease_ms=1_000)
    return lambda: a.start(workload_id, claim.fence, now=12_000)


@refusal(errors.SECRET_REJECTED, "secret-in-input")
def _(a: Authority, b: Authority, store: Store) -> Call:
    _admit(a)
    return lambda: a.admit(request(input={"auth": {"Password": "x"}}), now=11_000)


@refusal(errors.SECRET_REJECTED, "secret-in-checkpoint")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    return lambda: a.checkpoint(workload_id, claim.fence, {"rows": [{"token": "t"}]}, 13_000)


@refusal(errors.SECRET_REJECTED, "plaintext-reference")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    return lambda: a.execution_context(workload_id, claim.fence, 13_000, ["sk-live"])


@refusal(errors.SECRET_REJECTED, "secret-in-failure-text")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    return lambda: a.fail(workload_id, claim.fence, "timeout", "sk-live-abc", now=13_000)


@refusal(errors.SECRET_REJECTED, "secret-in-retry-reason")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    assert a.fail(workload_id, claim.fence, "validation", "bad", now=13_000) == "DEAD_LETTER"
    return lambda: a.retry(workload_id, "operator", now=14_000, reason="fdb_live_abc")


@refusal(errors.RESULT_DUPLICATE, "result-id-of-another-workload")
def _(a: Authority, b: Authority, store: Store) -> Call:
    first, first_claim = _running(a)
    a.complete(first, first_claim.fence, "r1", None, now=13_000)
    other, claim = _running(a, idempotency_key="two")
    return lambda: a.complete(other, claim.fence, "r1", None, now=13_000)


@refusal(errors.RESULT_CONFLICT, "same-result-id-other-output")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(a)
    a.complete(workload_id, claim.fence, "r1", {"sent": 1}, now=13_000)
    return lambda: a.complete(workload_id, claim.fence, "r1", {"sent": 2}, now=13_000)


@refusal(errors.RETRY_EXHAUSTED, "operator-retries-used")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _running(
        a, retry_policy=RetryPolicy(max_attempts=1, retry_on=DEFAULT_RETRY_ON)
    )
    a.fail(workload_id, claim.fence, "validation", "bad", now=13_000)
    assert a.retry(workload_id, "operator", now=14_000) == "READY"
    again = a.claim(workload_id, "w", CAPS, now=15_000, lease_ms=10_000)
    assert a.fail(workload_id, again.fence, "validation", "bad", now=16_000) == "DEAD_LETTER"
    return lambda: a.retry(workload_id, "operator", now=17_000)


@refusal(errors.STORAGE_FAILURE, "stored-document-does-not-parse")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    current = store.read(workload_id)
    assert current is not None
    _overwrite(store, workload_id, '{"not": "a workload"}', current.index)
    return lambda: a.claim(workload_id, "w", CAPS, now=11_000, lease_ms=1_000)


@refusal(errors.TIMED_OUT, "start-after-claim-deadline")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id, claim = _claimed(a, timeouts=Timeouts(claim_ms=2_000))
    return lambda: a.start(workload_id, claim.fence, now=13_000)


@refusal(errors.ATTEMPTS_EXHAUSTED, "claim-of-ready-work-past-its-budget")
def _(a: Authority, b: Authority, store: Store) -> Call:
    workload_id = _admit(a)
    # What unbounded recovery once left behind: READY, with its attempt budget spent.
    spent = a.get(workload_id).model_copy(update={"attempt_count": 7})
    _overwrite(
        store, workload_id, spent.model_dump_json(by_alias=True), index_fields(a.spec, spent)
    )
    return lambda: a.claim(workload_id, "w", CAPS, now=11_000, lease_ms=1_000)


@refusal(errors.CONCURRENCY_LIMITED, "claim-of-a-key-at-its-limit")
def _(a: Authority, b: Authority, store: Store) -> Call:
    text = shipped_spec_text().replace(
        "[concurrency]\nlimits = {}", "[concurrency]\nlimits = { reports = 1 }"
    )
    limited = Authority(store, grants=a.grants, spec=load_spec_text(text))
    first = _admit(limited, idempotency_key="first", concurrency_key="reports")
    second = _admit(limited, idempotency_key="second", concurrency_key="reports")
    limited.claim(first, "w1", CAPS, now=11_000, lease_ms=10_000)
    return lambda: limited.claim(second, "w2", CAPS, now=11_000, lease_ms=10_000)


@refusal(errors.RATE_LIMITED, "claim-of-a-key-with-no-token-left")
def _(a: Authority, b: Authority, store: Store) -> Call:
    text = shipped_spec_text().replace(
        "[concurrency]\nlimits = {}",
        "[concurrency]\nlimits = {}\nrates = { reports = { every_ms = 1000 } }",
    )
    rated = Authority(store, grants=a.grants, spec=load_spec_text(text))
    first = _admit(rated, idempotency_key="first", concurrency_key="reports")
    second = _admit(rated, idempotency_key="second", concurrency_key="reports")
    rated.claim(first, "w1", CAPS, now=11_000, lease_ms=10_000)
    return lambda: rated.claim(second, "w2", CAPS, now=11_500, lease_ms=10_000)


def _records(code: str) -> bool:
    return CATALOGUE[code].records


UNCHANGED = sorted(case for case, (code, _) in REFUSALS.items() if not _records(code))
RECORDED = sorted(case for case, (code, _) in REFUSALS.items() if _records(code))


def test_every_catalogue_code_has_a_refusal_scenario_or_is_named_unproducible() -> None:
    produced = {code for code, _ in REFUSALS.values()}
    raised = {
        value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)
    }
    assert produced.isdisjoint(NOT_PRODUCED_BY_CALLS)
    # The command line's codes are catalogued too; the core never raises them.
    assert produced | NOT_PRODUCED_BY_CALLS | COMMAND_LINE_CODES == set(CATALOGUE)
    assert raised | COMMAND_LINE_CODES == set(CATALOGUE)


def test_the_catalogue_marks_exactly_the_recorded_refusals() -> None:
    assert {code for code in CATALOGUE if _records(code)} == {
        errors.TIMED_OUT,
        errors.ATTEMPTS_EXHAUSTED,
    }


@pytest.mark.parametrize("case", UNCHANGED)
def test_a_refusal_leaves_the_store_byte_for_byte_unchanged(
    case: str, store: Store, authority: Authority, second_authority: Authority
) -> None:
    code, scenario = REFUSALS[case]
    refused_call = scenario(authority, second_authority, store)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        refused_call()

    assert caught.value.code == code
    assert store_snapshot(store) == before


@pytest.mark.parametrize("case", RECORDED)
def test_a_recorded_refusal_commits_exactly_the_decision_it_reports(
    case: str, store: Store, authority: Authority, second_authority: Authority
) -> None:
    code, scenario = REFUSALS[case]
    refused_call = scenario(authority, second_authority, store)
    docs_before, audit_before = store_snapshot(store)
    history_before = {doc[0]: authority.get(doc[0]).execution_history for doc in docs_before}

    with pytest.raises(WorkloadError) as caught:
        refused_call()

    refusal = caught.value
    assert refusal.code == code
    docs_after, audit_after = store_snapshot(store)
    changed = [a for b, a in zip(docs_before, docs_after, strict=True) if a != b]
    assert len(changed) == 1, "exactly one workload changed"
    key, version = changed[0][0], changed[0][1]
    assert version == next(d[1] for d in docs_before if d[0] == key) + 1
    assert audit_after[: len(audit_before)] == audit_before
    (record,) = audit_after[len(audit_before) :]
    assert (record.key, record.version) == (key, version)

    committed = authority.get(key)
    old = history_before[key]
    assert committed.execution_history[: len(old)] == old
    new_events = committed.execution_history[len(old) :]
    assert [e.sequence for e in new_events] == list(
        range(len(old) + 1, len(old) + 1 + len(new_events))
    )
    decided = new_events[-1].evidence["decision"]
    assert refusal.details is not None
    if code == errors.TIMED_OUT:
        timed_out = next(e for e in new_events if e.to == "TIMED_OUT")
        assert timed_out.evidence["deadline"] == refusal.details["deadline"]
        assert timed_out.evidence["deadline_at"] == str(refusal.details["deadline_at"])
        assert decided in {"retry", "timeout_not_retryable", "attempt_budget_exhausted"}
        assert committed.state == ("READY" if decided == "retry" else "DEAD_LETTER")
    else:
        assert code == errors.ATTEMPTS_EXHAUSTED
        assert decided == refusal.details["decision"] == "attempt_budget_exhausted"
        assert committed.state == "DEAD_LETTER"
        assert committed.attempts == []


# -- malformed input ----------------------------------------------------------------


def _wire(**changes: Any) -> dict[str, Any]:
    """The fixture request as JSON data, with `changes` applied (no validation here)."""
    data: dict[str, Any] = request().model_dump(mode="json")
    data.update(changes)
    return data


def _without(field: str) -> dict[str, Any]:
    data = _wire()
    del data[field]
    return data


#: The caller is untyped: these calls break the signatures on purpose.
OneCall = Callable[[Any, str, Fence], Any]

#: (id, the malformed call, a field path the refusal must name).
MALFORMED_CALLS: list[tuple[str, OneCall, str]] = [
    ("admit-unknown-field", lambda a, w, f: a.admit(_wire(colour="red"), 20_000), "request.colour"),
    (
        "admit-missing-field",
        lambda a, w, f: a.admit(_without("tenant_id"), 20_000),
        "request.tenant_id",
    ),
    ("admit-wrong-type", lambda a, w, f: a.admit(_wire(priority="1"), 20_000), "request.priority"),
    (
        "admit-negative-instant",
        lambda a, w, f: a.admit(_wire(not_before=-1), 20_000),
        "request.not_before",
    ),
    (
        "admit-nul-in-id",
        lambda a, w, f: a.admit(_wire(idempotency_key="k\x00"), 20_000),
        "request.idempotency_key",
    ),
    (
        "admit-nul-in-tenant",
        lambda a, w, f: a.admit(_wire(tenant_id="t\x00"), 20_000),
        "request.tenant_id",
    ),
    ("admit-not-a-request", lambda a, w, f: a.admit("one", 20_000), "request"),
    ("admit-input-not-json", lambda a, w, f: a.admit(_wire(input={1, 2}), 20_000), "request.input"),
    (
        "admit-bad-subject",
        lambda a, w, f: a.admit(_wire(requested_by={"kind": "robot", "id": "a1"}), 20_000),
        "request.requested_by.kind",
    ),
    ("admit-now-float", lambda a, w, f: a.admit(request(idempotency_key="f"), 1.5), "now"),
    ("claim-nul-in-id", lambda a, w, f: a.claim("w\x00", "w", CAPS, 20_000, 1_000), "workload_id"),
    ("claim-id-not-text", lambda a, w, f: a.claim(7, "w", CAPS, 20_000, 1_000), "workload_id"),
    ("claim-negative-lease", lambda a, w, f: a.claim(w, "w", CAPS, 20_000, -1), "lease_ms"),
    (
        "claim-capabilities-not-a-set",
        lambda a, w, f: a.claim(w, "w", 5, 20_000, 1_000),
        "capabilities",
    ),
    (
        "claim-capabilities-text",
        lambda a, w, f: a.claim(w, "w", "email:send", 20_000, 1_000),
        "capabilities",
    ),
    ("claim-negative-now", lambda a, w, f: a.claim(w, "w", CAPS, -5, 1_000), "now"),
    ("claim-now-text", lambda a, w, f: a.claim(w, "w", CAPS, "5", 1_000), "now"),
    ("claim-now-bool", lambda a, w, f: a.claim(w, "w", CAPS, True, 1_000), "now"),
    (
        "claim-next-now-float",
        lambda a, w, f: a.claim_next("t", "app", "w", CAPS, 1.5, 1_000),
        "now",
    ),
    (
        "claim-next-negative-now",
        lambda a, w, f: a.claim_next("t", "app", "w", CAPS, -1, 1_000),
        "now",
    ),
    (
        "claim-next-capabilities",
        lambda a, w, f: a.claim_next("t", "app", "w", None, 20_000, 1_000),
        "capabilities",
    ),
    ("start-fence-not-a-fence", lambda a, w, f: a.start(w, "fence", 20_000), "fence"),
    (
        "start-fence-negative-token",
        lambda a, w, f: a.start(w, {"claim_id": f.claim_id, "worker_id": "w", "token": -1}, 20_000),
        "fence.token",
    ),
    (
        "start-fence-missing-worker",
        lambda a, w, f: a.start(w, {"claim_id": f.claim_id, "token": 1}, 20_000),
        "fence.worker_id",
    ),
    ("heartbeat-zero-extension", lambda a, w, f: a.heartbeat(w, f, 20_000, 0), "extend_ms"),
    (
        "context-references-not-a-list",
        lambda a, w, f: a.execution_context(w, f, 20_000, 5),
        "secret_references",
    ),
    (
        "context-references-text",
        lambda a, w, f: a.execution_context(w, f, 20_000, "secret://x"),
        "secret_references",
    ),
    (
        "complete-artifacts-not-a-list",
        lambda a, w, f: a.complete(w, f, "r", 1, 20_000, artifacts=5),
        "artifacts",
    ),
    (
        "complete-artifacts-text",
        lambda a, w, f: a.complete(w, f, "r", 1, 20_000, artifacts="ab"),
        "artifacts",
    ),
    (
        "complete-schema-version-bool",
        lambda a, w, f: a.complete(w, f, "r", 1, 20_000, schema_version=True),
        "schema_version",
    ),
    ("complete-output-not-json", lambda a, w, f: a.complete(w, f, "r", object(), 20_000), "output"),
    (
        "fail-unknown-effect",
        lambda a, w, f: a.fail(w, f, "timeout", "x", 20_000, effect="maybe"),
        "effect",
    ),
    ("fail-error-not-text", lambda a, w, f: a.fail(w, f, "timeout", 5, 20_000), "error"),
    ("cancel-actor-not-text", lambda a, w, f: a.cancel(w, None, 20_000), "actor"),
    ("retry-reason-not-text", lambda a, w, f: a.retry(w, "op", 20_000, reason=5), "reason"),
    ("recover-negative-now", lambda a, w, f: a.recover_expired(-1), "now"),
    ("recover-now-text", lambda a, w, f: a.recover_expired("1"), "now"),
    ("deadlines-now-float", lambda a, w, f: a.enforce_deadlines(2.5), "now"),
]


def _held(authority: Authority) -> tuple[str, Fence]:
    workload_id, claim = _claimed(authority)
    return workload_id, claim.fence


def _names(field: str, refusal: WorkloadError) -> bool:
    assert refusal.details is not None
    problems = refusal.details["errors"]
    assert problems, "at least one problem is listed"
    assert all(set(problem) == {"field", "message"} for problem in problems)
    return any(problem["field"] == field for problem in problems)


@pytest.mark.parametrize(
    ("call", "field"),
    [(call, field) for _, call, field in MALFORMED_CALLS],
    ids=[name for name, _, _ in MALFORMED_CALLS],
)
def test_a_malformed_call_is_refused_as_invalid_naming_the_field(
    authority: Authority, store: Store, call: OneCall, field: str
) -> None:
    workload_id, fence = _held(authority)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        call(authority, workload_id, fence)

    assert caught.value.code == "WORKLOAD_INVALID"
    assert _names(field, caught.value), caught.value.details
    assert store_snapshot(store) == before


def _claim_data(workload_id: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "op": "claim",
        "workload_id": workload_id,
        "worker_id": "v",
        "capabilities": list(CAPS),
        "lease_ms": 1_000,
    }
    data.update(changes)
    return data


#: (id, builds the command data from the held workload's id and fence, the field it must name).
MALFORMED_COMMANDS: list[tuple[str, Callable[[str, Fence], Any], str]] = [
    ("no-op", lambda w, f: {"workload_id": w}, "op"),
    ("unknown-op", lambda w, f: {"op": "frobnicate", "workload_id": w}, "op"),
    ("op-not-text", lambda w, f: {"op": 3, "workload_id": w}, "op"),
    ("unknown-field", lambda w, f: _claim_data(w, colour="red"), "claim.colour"),
    (
        "missing-field",
        lambda w, f: {"op": "claim", "workload_id": w, "worker_id": "v"},
        "claim.lease_ms",
    ),
    ("nul-in-id", lambda w, f: _claim_data("w\x00"), "claim.workload_id"),
    ("wrong-type", lambda w, f: _claim_data(w, lease_ms="1000"), "claim.lease_ms"),
    ("negative-duration", lambda w, f: _claim_data(w, lease_ms=-1), "claim.lease_ms"),
    (
        "fence-token-text",
        lambda w, f: {"op": "start", "workload_id": w, "fence": {**f.model_dump(), "token": "1"}},
        "start.fence.token",
    ),
    (
        "admit-negative-instant",
        lambda w, f: {"op": "admit", "request": _wire(not_before=-1)},
        "admit.request.not_before",
    ),
    (
        "admit-missing-field",
        lambda w, f: {"op": "admit", "request": _without("idempotency_key")},
        "admit.request.idempotency_key",
    ),
    (
        "admit-unknown-nested-field",
        lambda w, f: {"op": "admit", "request": _wire(timeouts={"lunch_ms": 1})},
        "admit.request.timeouts.lunch_ms",
    ),
]


@pytest.mark.parametrize(
    ("build", "field"),
    [(build, field) for _, build, field in MALFORMED_COMMANDS],
    ids=[name for name, _, _ in MALFORMED_COMMANDS],
)
def test_a_malformed_command_is_refused_by_prepare_as_invalid_naming_the_field(
    authority: Authority, store: Store, build: Callable[[str, Fence], Any], field: str
) -> None:
    workload_id, fence = _held(authority)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.prepare(build(workload_id, fence), 20_000)

    assert caught.value.code == "WORKLOAD_INVALID"
    assert _names(field, caught.value), caught.value.details
    assert store_snapshot(store) == before


@pytest.mark.parametrize("command", ["claim", None, 7, ["op", "claim"]], ids=repr)
def test_a_command_that_is_not_a_mapping_is_refused_as_invalid(
    authority: Authority, store: Store, command: Any
) -> None:
    with pytest.raises(WorkloadError) as caught:
        authority.prepare(command, 20_000)

    assert caught.value.code == "WORKLOAD_INVALID"
    assert caught.value.details is not None
    assert caught.value.details["errors"]
    assert list(store.scan()) == []


@pytest.mark.parametrize("now", [-1, 2**53, 1.0, "20000", None, True], ids=repr)
def test_prepare_refuses_an_instant_that_is_not_integer_milliseconds(
    authority: Authority, store: Store, now: Any
) -> None:
    workload_id = _admit(authority)
    before = store_snapshot(store)

    with pytest.raises(WorkloadError) as caught:
        authority.prepare(_claim_data(workload_id), now)

    assert caught.value.code == "WORKLOAD_INVALID"
    assert _names("now", caught.value)
    assert store_snapshot(store) == before


def test_a_valid_command_as_data_is_decided_like_the_one_call_method(
    authority: Authority, store: Store
) -> None:
    workload_id = _admit(authority)

    claim: Claim = authority.prepare(_claim_data(workload_id), 11_000).commit()

    assert claim.worker_id == "v"
    assert authority.get(workload_id).current_claim == claim
