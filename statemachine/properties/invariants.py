"""The always-properties of committed work: one document, the scopes, the whole store.

What must hold of everything an authority ever commits, whatever the calls
and however they interleave. Each property is declared once, with its kind
and meaning, in `registry.PROPERTIES`; the functions here (and in `writes`
and `audit_log`) check them over committed data, with no test framework in
sight, so that the model checker, the stateful suite (`workwarden.testing`)
and the chaos audit hold the authority to exactly the same definitions:

- `check_workload(spec, workload)`: one committed document on its own.
- `check_reached(spec, workload)`: what holds of a document the core reached
  from its admission (the checker's states), not of an imported one.
- `check_write(spec, before, after, record)` (from `writes`): one committed
  write, given the version it replaced, the version it wrote, and its audit
  record.
- `check_audit(documents, audit)` and `check_audit_fences(spec, workload,
  records)` (from `audit_log`), and `check_scopes(workloads)`: the store as a
  whole.
- `check_concurrency(spec, workloads)` (from `concurrency`): no concurrency key
  has more workloads holding a claim than its limit.
- `check_store(spec, documents, audit, versions)`: all of the above over a
  committed snapshot; `versions` (every document text ever committed, by key
  and version) enables the write checks.

Each returns a list of `Violation`s, each named by its registered property,
empty when everything holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

from pydantic import ValidationError

from workwarden.statemachine.models import Event, Workload
from workwarden.statemachine.predicates import Facts, attempt_budget
from workwarden.statemachine.properties.audit_log import (
    check_audit,
    check_audit_fences,
    document_digest,
)
from workwarden.statemachine.properties.concurrency import (
    check_concurrency,
    check_rates,
    claimed_instants,
)
from workwarden.statemachine.properties.history import validate_workload
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.properties.writes import check_write
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord, StoredDocument

__all__ = [
    "Violation",
    "check_audit",
    "check_audit_fences",
    "check_reached",
    "check_scopes",
    "check_store",
    "check_workload",
    "check_write",
    "document_digest",
]

_Add = Callable[[str, str], None]


# -- one workload ----------------------------------------------------------------


def check_workload(spec: Spec, workload: Workload) -> list[Violation]:
    """The always-properties of one committed workload on its own (subject `workload`)."""
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
    successes = operation_roles(spec).success_statuses
    succeeded = [a for a in workload.attempts if a.status in successes]
    if len(succeeded) > 1:
        add("at_most_one_success", f"{len(succeeded)} attempts succeeded")
    entered = sum(1 for event in workload.execution_history if event.to in spec.roles.succeeded)
    if entered > 1:
        add("at_most_one_success", f"the history enters a succeeded state {entered} times")
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
    named by the event's actor (the policy whose `actor` it is). The decision's inputs are
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
    name = operation_roles(spec).policy_of_actor.get(event.actor)
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


def check_reached(spec: Spec, workload: Workload) -> list[Violation]:
    """What holds of a workload the core reached from its admission (subject `reached`).

    Queued work has an attempt left: every way back to a queued state checks
    the budget first. Only a document written outside the core (an import)
    can be queued with its budget spent, so the stateful suite and the audit,
    which see imported documents too, do not hold documents to this.
    """
    budget = attempt_budget(workload)
    if workload.state in spec.roles.queued and workload.attempt_count >= budget:
        return [
            Violation(
                "ready_work_has_an_attempt_left",
                workload.workload_id,
                f"{workload.state} with {workload.attempt_count} of {budget} attempts used",
            )
        ]
    return []


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
    """Every always-property of committed data over a snapshot (subject `store`).

    Each document parses and is stored under its own id, and is checked on
    its own (`check_workload`); then the scopes, the audit log, and, when
    `versions` is given, every write. `versions` maps (key, version) to the
    document text committed then; the write checks run for every audit record
    whose version (and, after the first, whose predecessor) it holds. Last,
    each workload's fences are reconstructed from its audit records
    (`check_audit_fences`).
    """
    out: list[Violation] = []
    workloads: list[Workload] = []
    parsed_keys: list[str] = []
    for doc in documents:
        parsed = _parse(doc.key, doc.document, out)
        if parsed is not None:
            workloads.append(parsed)
            parsed_keys.append(doc.key)
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
    out.extend(check_concurrency(spec, workloads))
    out.extend(check_audit(documents, audit))
    key_of = {w.workload_id: w.concurrency_key for w in workloads}
    out.extend(check_rates(spec, claimed_instants(audit, key_of)))
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
    by_key: dict[str, list[AuditRecord]] = {}
    for record in audit:
        by_key.setdefault(record.key, []).append(record)
    for key, workload in zip(parsed_keys, workloads, strict=True):
        records = sorted(by_key.get(key, []), key=lambda r: r.version)
        out.extend(check_audit_fences(spec, workload, records))
    return out
