"""Auditing a whole store after a chaos run: what must hold however the processes died.

`audit_store(store, spec, admitted, acknowledged)` reads every document and
the whole audit log and checks:

- every admitted workload is present, and nothing else is;
- each is in a terminal state;
- no workload has two successful attempts (attempts, history and audit agree);
- every committed history is valid against the spec (`validate_workload`);
- fencing tokens strictly increase, claim after claim, in the audit log and in
  the document;
- no worker's write was committed under a fence that was stale at its commit;
- audit records and document versions agree one to one: versions 1..n, each
  once, in the document's tenant and application, the last record's digest
  the digest of the document as stored;
- every completion a worker was told succeeded is in the store.

The fence a write replaced is reconstructed from the audit log and the
documents: walking a workload's records in version order, a worker's claim
(operation `claim` or `claim_next` by the worker itself) makes its attempt's
token the held one, and a write that takes the work out of the states a
worker holds ends it. Which operations do is read from the spec: an
operation on an edge from a held state to one that is not (`complete`,
`fail`, `confirm_cancel`, `recover_expired`, `timeout`, `enforce_deadlines`),
or a deadline found at a worker call (actor `system.deadline`). A write by a
worker that presents a token must present the held one, as that worker. (A
deadline found at a stale worker's call is the system's write, not the
worker's: the sweep would have written the same.)
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from pydantic import ValidationError

from workwarden.statemachine import Spec, Workload
from workwarden.statemachine.properties.history import validate_workload
from workwarden.storage import AuditRecord, Store, StoredDocument

__all__ = ["AuditFigures", "Violation", "audit_store", "claim_ending_operations"]

_CLAIMS = frozenset({"claim", "claim_next"})
_DEADLINE_ACTOR = "system.deadline"


@dataclass(frozen=True)
class Violation:
    """One thing that must not happen, with the workload's history and the offending record."""

    workload_id: str | None
    message: str
    history: tuple[str, ...] = ()
    record: AuditRecord | None = None

    def __str__(self) -> str:
        lines = [f"VIOLATION {self.workload_id or '(store)'}: {self.message}"]
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
    held = spec.claimed_states
    return frozenset(
        operation
        for edge in spec.data.transitions
        if edge.from_state in held and edge.to not in held
        for operation in edge.operations
    )


class _Audit:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.ending = claim_ending_operations(spec)
        self.figures = AuditFigures()
        self.violations: list[Violation] = []

    def flag(
        self, workload: Workload | None, key: str | None, message: str, record: AuditRecord | None
    ) -> None:
        history = history_lines(workload) if workload is not None else ()
        self.violations.append(Violation(key, message, history, record))

    def document(self, doc: StoredDocument, records: Sequence[AuditRecord]) -> None:
        try:
            workload = Workload.model_validate_json(doc.document)
        except ValidationError as exc:
            self.flag(None, doc.key, f"the document does not parse: {exc}", None)
            return
        self.figures.outcomes[workload.state] += 1
        if workload.state not in self.spec.terminal_states:
            self.flag(workload, doc.key, f"not terminal after draining: {workload.state}", None)
        problem = validate_workload(self.spec, workload)
        if problem is not None:
            self.flag(workload, doc.key, f"history invalid against the spec: {problem}", None)
        successes = [a for a in workload.attempts if a.status == "SUCCEEDED"]
        succeeded = [e for e in workload.execution_history if e.to == "SUCCEEDED"]
        if len(successes) > 1 or len(succeeded) > 1:
            self.flag(workload, doc.key, "two successful attempts", None)
        if (workload.state == "SUCCEEDED") != (workload.result is not None):
            self.flag(workload, doc.key, "result and state disagree", None)
        tokens = [attempt.fencing_token for attempt in workload.attempts]
        if any(later <= earlier for earlier, later in pairwise(tokens)):
            self.flag(workload, doc.key, f"attempt fencing tokens not increasing: {tokens}", None)
        self.versions(doc, workload, records)
        self.fences(doc.key, workload, records)

    def versions(
        self, doc: StoredDocument, workload: Workload, records: Sequence[AuditRecord]
    ) -> None:
        versions = [record.version for record in records]
        if versions != list(range(1, doc.version + 1)):
            shown = versions if len(versions) <= 20 else [*versions[:20], "..."]
            self.flag(
                workload,
                doc.key,
                f"audit versions {shown} do not match document versions 1..{doc.version}",
                None,
            )
            return
        for record in records:
            if (record.tenant, record.application) != (workload.tenant_id, workload.application_id):
                self.flag(workload, doc.key, "audit record in another scope", record)
        digest = hashlib.sha256(doc.document.encode("utf-8")).hexdigest()
        if records and records[-1].digest != digest:
            self.flag(workload, doc.key, "the last audit digest is not the document's", records[-1])

    def fences(self, key: str, workload: Workload, records: Sequence[AuditRecord]) -> None:
        attempts = {attempt.attempt_id: attempt for attempt in workload.attempts}
        held: tuple[int, str] | None = None
        issued: list[int] = []
        completions = 0
        for record in records:
            by_worker = not record.actor.startswith("system.")
            if record.operation in _CLAIMS and by_worker:
                attempt = attempts.get(record.attempt or "")
                if attempt is None or attempt.worker_id != record.worker:
                    self.flag(workload, key, "a claim whose attempt is not recorded", record)
                    continue
                if record.fencing_token not in (None, attempt.fencing_token):
                    self.flag(workload, key, "a claim audited under another token", record)
                if issued and attempt.fencing_token <= issued[-1]:
                    self.flag(
                        workload,
                        key,
                        f"fencing token {attempt.fencing_token} issued after {issued[-1]}",
                        record,
                    )
                issued.append(attempt.fencing_token)
                held = (attempt.fencing_token, attempt.worker_id)
                self.figures.claims += 1
                continue
            if record.fencing_token is not None and by_worker:
                if held is None or held != (record.fencing_token, record.worker):
                    self.flag(
                        workload,
                        key,
                        f"a write under a stale fence: presented token {record.fencing_token}"
                        f" by {record.worker}, held {held}",
                        record,
                    )
                if record.operation == "complete":
                    completions += 1
            if record.operation in self.ending or record.actor == _DEADLINE_ACTOR:
                held = None
            if record.operation == "recover_expired":
                self.figures.recoveries += 1
            if record.actor == _DEADLINE_ACTOR:
                self.figures.deadline_timeouts += 1
        self.figures.completions += completions
        if completions > 1:
            self.flag(workload, key, f"{completions} completions committed", None)
        if issued != [attempt.fencing_token for attempt in workload.attempts]:
            self.flag(workload, key, f"claims in the audit {issued} are not the attempts", None)


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
    audit = _Audit(spec)
    by_key: dict[str, list[AuditRecord]] = defaultdict(list)
    sequences: list[int] = []
    for record in store.audit_log():
        by_key[record.key].append(record)
        sequences.append(record.sequence)
    audit.figures.audit_records = len(sequences)
    if sequences != sorted(set(sequences)):
        audit.flag(None, None, "audit sequence numbers repeat or go back", None)
    documents = {doc.key: doc for doc in store.scan()}
    audit.figures.documents = len(documents)
    wanted = set(admitted)
    for key in sorted(wanted - set(documents)):
        audit.flag(None, key, "admitted but not in the store", None)
    for key in sorted(set(documents) - wanted):
        audit.flag(None, key, "in the store but never admitted", None)
    for key in sorted(set(by_key) - set(documents)):
        audit.flag(None, key, "audit records of a document that does not exist", by_key[key][0])
    for key in sorted(documents):
        records = sorted(by_key.get(key, []), key=lambda record: record.version)
        audit.document(documents[key], records)
    for workload_id, token, result_id in acknowledged:
        audit.figures.acknowledged += 1
        doc = documents.get(workload_id)
        workload = Workload.model_validate_json(doc.document) if doc is not None else None
        result = workload.result if workload is not None else None
        if (
            result is None
            or result.result_id != result_id
            or result.provenance.get("fencing_token") != str(token)
        ):
            audit.flag(
                workload,
                workload_id,
                f"completion {result_id} under token {token} was acknowledged but is not stored",
                None,
            )
    return audit.figures, audit.violations
