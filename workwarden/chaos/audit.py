"""Auditing a whole store after a chaos run: what must hold however the processes died.

`audit_store(store, spec, admitted, acknowledged)` reads every document and
the whole audit log and holds them to the registered properties
(`workwarden.statemachine.properties.registry`), through the same check
functions the stateful suite uses, so that a violation is reported under the
same name:

- the whole store (`check_store`): every document parses and keeps every
  property of one workload (a valid history, at most one success, a result
  exactly when succeeded, increasing fencing tokens, ...); one workload per
  scope; one audit record per version, in the document's tenant and
  application, the last one the digest of the document as stored; and the
  fences of every workload's writes, reconstructed from its audit records
  alone (no write committed under a fence that was stale at its commit,
  claims issuing increasing tokens, at most one completion);
- the run (`runs`): every admitted workload is present and nothing else is,
  each is in a terminal state once drained, and every completion a worker
  was told succeeded is in the store.

The store keeps only each document's latest version, so the properties of
one write (which need the version it replaced) are the suite's to check; the
audit log is what holds across processes. Which operations claim, complete,
recover or end a claim is read from the spec (`properties.operations`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import ValidationError

from workwarden.statemachine import Spec, Workload
from workwarden.statemachine.properties.audit_log import is_system_actor
from workwarden.statemachine.properties.invariants import check_store
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.registry import Violation as PropertyViolation
from workwarden.statemachine.properties.runs import (
    check_acknowledged,
    check_admitted,
    check_drained,
)
from workwarden.storage import AuditRecord, Store

__all__ = [
    "AuditFigures",
    "Violation",
    "audit_store",
    "claim_ending_operations",
    "history_lines",
]


@dataclass(frozen=True)
class Violation:
    """One thing that must not happen, with the workload's history and the offending record.

    `property` is the registered property it breaks (None for what is not a
    property of the store, such as a process of the run that raised).
    """

    workload_id: str | None
    message: str
    history: tuple[str, ...] = ()
    record: AuditRecord | None = None
    property: str | None = None

    def __str__(self) -> str:
        named = f" {self.property}:" if self.property is not None else ""
        lines = [f"VIOLATION {self.workload_id or '(store)'}:{named} {self.message}"]
        if self.history:
            lines.append("  history:")
            lines += [f"    {line}" for line in self.history]
        if self.record is not None:
            lines.append(f"  audit record: {_describe_record(self.record)}")
        return "\n".join(lines)


@dataclass
class AuditFigures:
    """What the audit counted in the store."""

    outcomes: Counter[str] = field(default_factory=Counter)
    documents: int = 0
    audit_records: int = 0
    claims: int = 0
    recoveries: int = 0
    deadline_timeouts: int = 0
    completions: int = 0
    acknowledged: int = 0


def _describe_record(record: AuditRecord) -> str:
    return (
        f"sequence {record.sequence} version {record.version} operation {record.operation}"
        f" actor {record.actor} worker {record.worker} attempt {record.attempt}"
        f" fencing_token {record.fencing_token} result {record.result} at {record.at}"
        f" transaction {record.transaction_id} digest {record.digest[:16]}"
    )


def history_lines(workload: Workload) -> tuple[str, ...]:
    """A workload's history, one event a line."""
    return tuple(
        f"{event.sequence:>3} {event.from_state} -> {event.to} {event.type}"
        f" by {event.actor} ({event.actor_class}) at {event.at}"
        f" {dict(sorted(event.evidence.items()))}"
        for event in workload.execution_history
    )


def claim_ending_operations(spec: Spec) -> frozenset[str]:
    """The operations that take an edge from a state a worker holds to one it does not."""
    return operation_roles(spec).claim_ending


def _count(figures: AuditFigures, spec: Spec, audit: Iterable[AuditRecord]) -> None:
    roles = operation_roles(spec)
    for record in audit:
        figures.audit_records += 1
        by_worker = not is_system_actor(record.actor)
        if record.operation in roles.claiming and by_worker:
            figures.claims += 1
        elif record.operation in roles.completing and by_worker and record.fencing_token:
            figures.completions += 1
        if record.operation in roles.recovering:
            figures.recoveries += 1
        if record.actor == roles.deadline_actor:
            figures.deadline_timeouts += 1


def audit_store(
    store: Store,
    spec: Spec,
    admitted: Iterable[str],
    acknowledged: Iterable[tuple[str, int, str]] = (),
) -> tuple[AuditFigures, list[Violation]]:
    """Check the whole store and its audit log; returns the figures and every violation.

    `admitted` are the ids of the workloads the run admitted; `acknowledged`
    the (workload id, fencing token, result id) of every completion a worker
    was told had succeeded.
    """
    figures = AuditFigures()
    documents = sorted(store.scan(), key=lambda doc: doc.key)
    audit = list(store.audit_log())
    figures.documents = len(documents)
    _count(figures, spec, audit)
    workloads: dict[str, Workload] = {}
    for doc in documents:
        try:
            workloads[doc.key] = Workload.model_validate_json(doc.document)
        except ValidationError:
            continue  # check_store reports it, as documents_parse
        figures.outcomes[workloads[doc.key].state] += 1
    acks = list(acknowledged)
    figures.acknowledged = len(acks)
    found: list[PropertyViolation] = [
        *check_admitted(list(admitted), [doc.key for doc in documents]),
        *check_store(spec, documents, audit),
        *check_drained(spec, workloads.values()),
        *check_acknowledged(workloads, acks),
    ]
    return figures, [_shown(violation, workloads) for violation in found]


def _shown(violation: PropertyViolation, workloads: dict[str, Workload]) -> Violation:
    """A property's violation as the audit reports it: with the workload's history."""
    workload = workloads.get(violation.key) if violation.key is not None else None
    return Violation(
        violation.key,
        violation.message,
        history_lines(workload) if workload is not None else (),
        violation.record,
        violation.property,
    )
