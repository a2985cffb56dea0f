"""The properties of one committed write: what it replaced, what it wrote, its audit record.

`check_write(spec, before, after, record)` holds one write to every
registered property checked over a write (`registry.SUBJECTS["write"]`).
The stateful suite calls it with the audit record the store committed; the
model checker with the record of what its step presented (the operation, the
fence a worker held, the instant), since its states keep no audit log.
Which operations present a fence or are refused after a deadline is read
from the spec's operations table (`operations.operation_roles`).
"""

from __future__ import annotations

from collections.abc import Callable

from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.audit_log import document_digest
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord

__all__ = ["check_write"]

_Add = Callable[[str, str], None]


def check_write(
    spec: Spec,
    before: Workload | None,
    after: Workload,
    record: AuditRecord,
    document: str | None = None,
) -> list[Violation]:
    """The properties of one committed write.

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
        out.append(Violation(name, key, f"v{record.version} {record.operation}: {message}", record))

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
    if record.operation in operation_roles(spec).deadline_guarded:
        breach = deadline_breach(spec, before, record.at)
        if breach is not None:
            add(
                "no_write_after_a_deadline",
                f"accepted at {record.at}; the {breach[0]} deadline fell at {breach[1]}",
            )
