"""Named invariants of committed work: plain functions over documents and the audit log.

What must hold of everything an authority ever commits, whatever the calls
and however they interleave. Each invariant has a name (`INVARIANTS` lists
them with their meaning) and is checked by a plain function over committed
data, with no test framework in sight, so the stateful suite
(`workwarden.testing`) and the model checker hold the authority to exactly
the same definitions:

- `check_workload(spec, workload)`: one committed document on its own.
- `check_write(spec, before, after, record)`: one committed write, given the
  version it replaced, the version it wrote, and its audit record.
- `check_audit(documents, audit)` and `check_scopes(workloads)`: the store as
  a whole.
- `check_store(spec, documents, audit, versions)`: all of the above over a
  committed snapshot; `versions` (every document text ever committed, by key
  and version) enables the write checks.

Each returns a list of `Violation`s, empty when everything holds.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.models import Event, Workload
from workwarden.statemachine.predicates import Facts, attempt_budget
from workwarden.statemachine.properties.history import validate_workload
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord, StoredDocument

__all__ = [
    "DEADLINE_GUARDED_OPERATIONS",
    "INVARIANTS",
    "POLICY_ACTORS",
    "Violation",
    "check_audit",
    "check_scopes",
    "check_store",
    "check_workload",
    "check_write",
    "document_digest",
]

_Add = Callable[[str, str], None]

#: Every invariant, by name, with what it asserts.
INVARIANTS: dict[str, str] = {
    "documents_parse": "every committed document parses as a workload",
    "history_is_a_legal_path": (
        "the history is a path of legal edges of the table, numbered 1, 2, 3, ... without a "
        "gap, each taken by an actor class the edge allows, never going back in time, ending "
        "at the workload's state, its claims under strictly increasing fencing tokens that "
        "the workload's fencing_token counts"
    ),
    "no_transient_state_at_rest": "no committed workload rests in a state of kind transient",
    "claim_exactly_when_claimed": (
        "a workload holds a claim exactly in the claimed (active) states, and that claim is "
        "its last attempt's, under its current fencing token"
    ),
    "fencing_tokens_increase": (
        "attempts carry strictly increasing fencing tokens, each the token of its CLAIMED "
        "event; no write lowers the token, and a write that claims raises it by exactly one"
    ),
    "one_attempt_per_claim": "one attempt record per counted attempt, one per CLAIMED event",
    "attempts_within_budget": (
        "attempt_count never exceeds the attempt budget (max_attempts plus operator re-arms)"
    ),
    "at_most_one_success": "at most one attempt succeeded",
    "result_exactly_when_succeeded": (
        "a result is recorded exactly when the workload is SUCCEEDED, for the attempt that "
        "succeeded"
    ),
    "decisions_follow_the_policy": (
        "every decision recorded as evidence is the one the spec's policy gives, recomputed "
        "from the workload as it was before the decided step and the inputs the step recorded; "
        "a policy's via state is only ever left by a decision"
    ),
    "recovered_only_after_lease_expiry": (
        "a recovery happens only once the lease it recovers has expired (expires_at <= at)"
    ),
    "deadlines_enforced_only_when_due": (
        "a deadline is enforced only once it has fallen: the recorded deadline is the first "
        "fallen one, at its recorded instant, at or before the write"
    ),
    "one_workload_per_scope": (
        "one workload per idempotency scope (tenant, application, requester kind and id, "
        "key), stored under its own workload id"
    ),
    "one_audit_record_per_version": (
        "the audit log has one record per committed version: per key, versions 1..n in "
        "commit order with n the document's version, sequence numbers increasing"
    ),
    "audit_matches_the_documents": (
        "an audit record carries the digest of the document it committed, and the events a "
        "write adds carry the write's instant"
    ),
    "writes_extend_the_committed_history": (
        "a write keeps every event of the version it replaced and appends after them"
    ),
    "no_write_from_a_stale_fence": (
        "a worker's write is accepted only under the current claim's fencing token and worker"
    ),
    "no_write_from_an_expired_lease": (
        "a worker's write is accepted only while the claim's lease is live (expires_at > at)"
    ),
    "no_write_after_a_deadline": (
        "no claim and no deadline-guarded worker write is accepted once a deadline of the "
        "workload has fallen (only the timeout it causes is written)"
    ),
}

#: The actor each policy's decisions are recorded under.
POLICY_ACTORS: dict[str, str] = {
    "system.failure": "failure",
    "system.recovery": "recovery",
    "system.deadline": "deadline",
    "system.timeout": "operator_timeout",
    "system.claim": "claim",
}

#: Operations refused once a deadline has fallen (they time the workload out instead).
DEADLINE_GUARDED_OPERATIONS = frozenset(
    {
        "claim",
        "claim_next",
        "start",
        "heartbeat",
        "execution_context",
        "checkpoint",
        "complete",
        "fail",
    }
)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its name, the workload (key) it concerns, and what was wrong."""

    invariant: str
    key: str | None
    message: str

    def __str__(self) -> str:
        where = f" [{self.key}]" if self.key is not None else ""
        return f"{self.invariant}{where}: {self.message}"


def document_digest(document: str) -> str:
    """The digest an audit record carries for the document text it committed (SHA-256, hex)."""
    return hashlib.sha256(document.encode("utf-8")).hexdigest()


# -- one workload ----------------------------------------------------------------


def check_workload(spec: Spec, workload: Workload) -> list[Violation]:
    """The invariants of one committed workload on its own."""
    key = workload.workload_id
    out: list[Violation] = []

    def add(name: str, message: str) -> None:
        out.append(Violation(name, key, message))

    problem = validate_workload(spec, workload)
    if problem is not None:
        add("history_is_a_legal_path", str(problem))
    state = spec.states.get(workload.state)
    if state is not None and state.kind == "transient":
        add("no_transient_state_at_rest", f"rests in {workload.state}")
    _check_claim(spec, workload, add)
    budget = attempt_budget(workload)
    if workload.attempt_count > budget:
        add("attempts_within_budget", f"attempt_count {workload.attempt_count} > budget {budget}")
    claims = sum(1 for event in workload.execution_history if event.to in spec.roles.claimed)
    if not len(workload.attempts) == workload.attempt_count == claims:
        add(
            "one_attempt_per_claim",
            f"{len(workload.attempts)} attempt records, attempt_count {workload.attempt_count}, "
            f"{claims} CLAIMED events",
        )
    success = spec.operations["complete"].spec.attempt_status
    succeeded = [a for a in workload.attempts if a.status == success]
    if len(succeeded) > 1:
        add("at_most_one_success", f"{len(succeeded)} attempts succeeded")
    if (workload.result is not None) != (workload.state in spec.roles.succeeded):
        add(
            "result_exactly_when_succeeded",
            f"{workload.state} with {'a' if workload.result is not None else 'no'} result",
        )
    elif workload.result is not None and (
        len(succeeded) != 1 or succeeded[0].attempt_id != workload.result.attempt_id
    ):
        add("result_exactly_when_succeeded", "the result is not the succeeded attempt's")
    for event in workload.execution_history:
        expired_at = event.evidence.get("lease_expired_at")
        if expired_at is not None and (not expired_at.isdigit() or int(expired_at) > event.at):
            add(
                "recovered_only_after_lease_expiry",
                f"event {event.sequence} at {event.at} recovered a lease expiring at {expired_at}",
            )
        deadline_at = event.evidence.get("deadline_at")
        if deadline_at is not None and (not deadline_at.isdigit() or int(deadline_at) > event.at):
            add(
                "deadlines_enforced_only_when_due",
                f"event {event.sequence} at {event.at} enforced a deadline falling at "
                f"{deadline_at}",
            )
    out.extend(_check_decisions(spec, workload))
    return out


def _check_claim(spec: Spec, workload: Workload, add: _Add) -> None:
    claim = workload.current_claim
    claimed = workload.state in spec.claimed_states
    if (claim is not None) != claimed:
        add(
            "claim_exactly_when_claimed",
            f"{workload.state} {'with' if claim is not None else 'without'} a claim",
        )
    elif claim is not None:
        last = workload.attempts[-1] if workload.attempts else None
        if last is None or last.claim_id != claim.claim_id:
            add("claim_exactly_when_claimed", "the claim is not the last attempt's")
        if claim.fencing_token != workload.fencing_token:
            add(
                "claim_exactly_when_claimed",
                f"claim token {claim.fencing_token} is not the fencing token "
                f"{workload.fencing_token}",
            )
    tokens = [a.fencing_token for a in workload.attempts]
    if any(b <= a for a, b in itertools.pairwise(tokens)):
        add("fencing_tokens_increase", f"attempt tokens {tokens} do not strictly increase")
    claimed_tokens = [
        event.evidence.get("fencing_token")
        for event in workload.execution_history
        if event.to in spec.roles.claimed
    ]
    if claimed_tokens != [str(t) for t in tokens]:
        add(
            "fencing_tokens_increase",
            f"attempt tokens {tokens} are not the CLAIMED events' {claimed_tokens}",
        )


def _check_decisions(spec: Spec, workload: Workload) -> list[Violation]:
    """Recompute every decision the history records and compare.

    For each event whose evidence has `decision`, the deciding policy is
    named by the event's actor (`POLICY_ACTORS`). The decision's inputs are
    the evidence of the step that led into the policy's via state (the event
    before it), or for a direct rule the event's own evidence: the reported
    `failure_kind` and `effect`, and the fallen `deadline` (whose `bounds`
    the spec's deadline table gives). The workload as it was before the step
    is the document with the state the step started from, its attempt count
    (the CLAIMED events before it) and its history up to it (which counts
    operator re-arms). The spec's policy decides on those facts; its rule
    must name the recorded decision and target. Evidence `attempts_used` and
    `attempt_budget`, when recorded, must equal the recomputed values.
    """
    out: list[Violation] = []
    key = workload.workload_id
    history = workload.execution_history
    vias = {p.spec.via for p in spec.policies.values() if p.spec.via is not None}
    claims = 0
    for index, event in enumerate(history):
        decision = event.evidence.get("decision")
        if decision is None:
            if event.from_state in vias and index > 0:
                out.append(
                    Violation(
                        "decisions_follow_the_policy",
                        key,
                        f"event {event.sequence} leaves {event.from_state} without a decision",
                    )
                )
        else:
            problem = _recompute(spec, workload, history, index, event, decision, claims)
            if problem is not None:
                out.append(Violation("decisions_follow_the_policy", key, problem))
        if event.to in spec.roles.claimed:
            claims += 1
    return out


def _recompute(
    spec: Spec,
    workload: Workload,
    history: Sequence[Event],
    index: int,
    event: Event,
    decision: str,
    claims: int,
) -> str | None:
    where = f"event {event.sequence} ({event.from_state} -> {event.to}, {decision})"
    name = POLICY_ACTORS.get(event.actor)
    policy = spec.policies.get(name) if name is not None else None
    if policy is None:
        return f"{where} is recorded by {event.actor}, which is no policy's actor"
    via = policy.spec.via
    if via is not None and event.from_state == via:
        if index == 0 or history[index - 1].to != via:
            return f"{where} leaves {via} without having entered it"
        inputs = history[index - 1].evidence
        before_state = history[index - 1].from_state or ""
    else:
        inputs = event.evidence
        before_state = event.from_state or ""
    kind = inputs.get("deadline")
    bounds = spec.deadline_kinds[kind].bounds if kind in spec.deadline_kinds else None
    before = workload.model_copy(
        update={
            "state": before_state,
            "attempt_count": claims,
            "execution_history": list(history[:index]),
        }
    )
    facts = Facts(
        workload=before,
        roles=spec.roles,
        failure_kind=inputs.get("failure_kind"),
        effect=inputs.get("effect"),
        deadline_bounds=bounds,
    )
    rule = policy.decide(facts)
    if rule.spec.decision != decision or rule.spec.to != event.to:
        return (
            f"{where}: policy {name} decides {rule.spec.decision} -> {rule.spec.to} "
            f"(attempts {claims}, budget {attempt_budget(before)}, inputs {dict(inputs)})"
        )
    used = inputs.get("attempts_used")
    if used is not None and used != str(claims):
        return f"{where} records attempts_used {used}, the history counts {claims}"
    budget = inputs.get("attempt_budget")
    if budget is not None and budget != str(attempt_budget(before)):
        return f"{where} records attempt_budget {budget}, not {attempt_budget(before)}"
    return None


# -- one write --------------------------------------------------------------------


def check_write(
    spec: Spec,
    before: Workload | None,
    after: Workload,
    record: AuditRecord,
    document: str | None = None,
) -> list[Violation]:
    """The invariants of one committed write.

    `before` is the version it replaced (None for a create), `after` the one
    it wrote, `record` its audit record, `document` the text it wrote (to
    check the record's digest). What is checked, by the kind of write (told
    by its audit record and the events it adds):

    - every write: it extends the history it replaced; its new events carry
      its instant; it does not lower the fencing token, and a claim raises it
      by one;
    - a write that enforces a deadline (its first new event records
      `deadline`): that deadline had fallen at the write's instant;
    - a recovery (its first new event records `recovery_reason`): the lease
      had expired at the write's instant;
    - a claim (it adds a CLAIMED event): no deadline of `before` had fallen,
      and its record carries no token or the token it issued;
    - any other write through a fence (the record has a `fencing_token`): the
      token and worker are the claim's in `before`, its lease still live, and
      for a deadline-guarded operation no deadline of `before` had fallen.
    """
    key = record.key
    out: list[Violation] = []

    def add(name: str, message: str) -> None:
        out.append(Violation(name, key, f"v{record.version} {record.operation}: {message}"))

    if after.workload_id != key:
        add("one_workload_per_scope", f"document {after.workload_id} written under key {key}")
    if document is not None and document_digest(document) != record.digest:
        add("audit_matches_the_documents", "the record's digest is not the document's")
    old = before.execution_history if before is not None else []
    if after.execution_history[: len(old)] != old:
        add("writes_extend_the_committed_history", "the write changed or lost committed events")
        return out
    new = after.execution_history[len(old) :]
    if any(event.at != record.at for event in new):
        add(
            "audit_matches_the_documents",
            f"events not stamped with the write's instant {record.at}",
        )
    previous_token = before.fencing_token if before is not None else 0
    if after.fencing_token < previous_token:
        add("fencing_tokens_increase", f"token {previous_token} lowered to {after.fencing_token}")
    claimed = any(event.to in spec.roles.claimed for event in new)
    if claimed and after.fencing_token != previous_token + 1:
        add(
            "fencing_tokens_increase",
            f"a claim moved the token from {previous_token} to {after.fencing_token}",
        )
    if before is None:
        return out
    first = new[0].evidence if new else {}
    if "deadline" in first:
        breach = deadline_breach(spec, before, record.at)
        recorded = (first.get("deadline"), first.get("deadline_at"))
        if breach is None or (breach[0], str(breach[1])) != recorded:
            add(
                "deadlines_enforced_only_when_due",
                f"enforced {recorded[0]} (at {recorded[1]}) at {record.at}; fallen then: {breach}",
            )
    elif first.get("recovery_reason") == "lease_expired":
        claim = before.current_claim
        if claim is None or claim.expires_at > record.at:
            expiry = claim.expires_at if claim is not None else None
            add(
                "recovered_only_after_lease_expiry",
                f"recovered at {record.at} a lease expiring at {expiry}",
            )
    elif claimed:
        if record.fencing_token not in (None, after.fencing_token):
            add(
                "fencing_tokens_increase",
                f"the claim's record carries token {record.fencing_token}, "
                f"it issued {after.fencing_token}",
            )
        breach = deadline_breach(spec, before, record.at)
        if breach is not None:
            add(
                "no_write_after_a_deadline",
                f"claimed at {record.at}; {breach[0]} fell at {breach[1]}",
            )
    elif record.fencing_token is not None:
        _check_fenced(spec, before, record, add)
    return out


def _check_fenced(spec: Spec, before: Workload, record: AuditRecord, add: _Add) -> None:
    claim = before.current_claim
    if (
        claim is None
        or claim.fencing_token != record.fencing_token
        or (record.worker is not None and claim.worker_id != record.worker)
    ):
        current = None if claim is None else (claim.worker_id, claim.fencing_token)
        add(
            "no_write_from_a_stale_fence",
            f"accepted token {record.fencing_token} of {record.worker}; the claim was {current}",
        )
    elif claim.expires_at <= record.at:
        add(
            "no_write_from_an_expired_lease",
            f"accepted at {record.at}; the lease expired at {claim.expires_at}",
        )
    if record.operation in DEADLINE_GUARDED_OPERATIONS:
        breach = deadline_breach(spec, before, record.at)
        if breach is not None:
            add(
                "no_write_after_a_deadline",
                f"accepted at {record.at}; the {breach[0]} deadline fell at {breach[1]}",
            )


# -- the whole store ------------------------------------------------------------------


def check_scopes(workloads: Sequence[Workload]) -> list[Violation]:
    """One workload per idempotency scope."""
    out: list[Violation] = []
    seen: dict[tuple[str, ...], str] = {}
    for w in workloads:
        scope = (
            w.tenant_id,
            w.application_id,
            w.requested_by.kind,
            w.requested_by.id,
            w.idempotency_key,
        )
        other = seen.setdefault(scope, w.workload_id)
        if other != w.workload_id:
            out.append(
                Violation(
                    "one_workload_per_scope",
                    w.workload_id,
                    f"scope {scope} is also admitted as {other}",
                )
            )
    return out


def check_audit(
    documents: Sequence[StoredDocument], audit: Sequence[AuditRecord]
) -> list[Violation]:
    """One audit record per committed version, in commit order, matching the documents."""
    out: list[Violation] = []
    previous = 0
    versions: dict[str, list[int]] = {}
    last: dict[str, AuditRecord] = {}
    for record in audit:
        if record.sequence <= previous:
            out.append(
                Violation(
                    "one_audit_record_per_version",
                    record.key,
                    f"sequence {record.sequence} after {previous}",
                )
            )
        previous = record.sequence
        versions.setdefault(record.key, []).append(record.version)
        last[record.key] = record
    by_key = {doc.key: doc for doc in documents}
    for key in sorted(set(by_key) | set(versions)):
        doc = by_key.get(key)
        found = versions.get(key, [])
        wanted = list(range(1, doc.version + 1)) if doc is not None else []
        if found != wanted:
            out.append(
                Violation(
                    "one_audit_record_per_version",
                    key,
                    f"audit versions {found}, document version "
                    f"{doc.version if doc is not None else None}",
                )
            )
        elif doc is not None and document_digest(doc.document) != last[key].digest:
            out.append(
                Violation(
                    "audit_matches_the_documents",
                    key,
                    f"the last record's digest is not version {doc.version}'s",
                )
            )
    return out


def _parse(key: str, text: str, out: list[Violation]) -> Workload | None:
    try:
        return Workload.model_validate_json(text)
    except ValidationError as exc:
        out.append(Violation("documents_parse", key, str(exc).splitlines()[0]))
        return None


def check_store(
    spec: Spec,
    documents: Sequence[StoredDocument],
    audit: Sequence[AuditRecord],
    versions: Mapping[tuple[str, int], str] | None = None,
) -> list[Violation]:
    """Every invariant over a committed snapshot.

    `versions` maps (key, version) to the document text committed then; the
    write checks run for every audit record whose version (and, after the
    first, whose predecessor) it holds.
    """
    out: list[Violation] = []
    workloads: list[Workload] = []
    for doc in documents:
        parsed = _parse(doc.key, doc.document, out)
        if parsed is not None:
            workloads.append(parsed)
            if parsed.workload_id != doc.key:
                out.append(
                    Violation(
                        "one_workload_per_scope",
                        doc.key,
                        f"stored under {doc.key} but is {parsed.workload_id}",
                    )
                )
            out.extend(check_workload(spec, parsed))
    out.extend(check_scopes(workloads))
    out.extend(check_audit(documents, audit))
    if versions is not None:
        for record in audit:
            text = versions.get((record.key, record.version))
            prior = versions.get((record.key, record.version - 1))
            if text is None or (record.version > 1 and prior is None):
                continue
            after = _parse(record.key, text, out)
            before = _parse(record.key, prior, out) if prior is not None else None
            if after is not None:
                out.extend(check_write(spec, before, after, record, text))
    return out
