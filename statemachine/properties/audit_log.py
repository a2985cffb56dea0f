"""The properties of the audit log, against the documents it committed.

- `check_audit(documents, audit)`: one record per committed version, in
  commit order, in the document's tenant and application, the last one
  carrying the digest of the document as stored. A purge's record is a
  version of its key too (the tombstone a document created again follows);
  the records of pauses and resumes are of a scope, not of a document
  (`is_scope_record`), and are left out.
- `check_audit_fences(spec, workload, records)`: the fences of one
  workload's writes, reconstructed from its audit records alone, so that it
  holds across processes and needs no earlier version of the document.

The fence a write replaced is reconstructed by walking a workload's records
in version order: a worker's claim (an operation that leases, by the worker
itself) makes its attempt's token the held one, and a write that takes the
work out of the states a worker holds ends it (an operation on an edge from
a held state to one that is not, or a deadline enforced at a worker's call,
recorded as the deadline operation's actor). A write by a worker that
presents a token must present the held one, as that worker. (A deadline
found at a stale worker's call is the system's write, not the worker's: the
sweep would have written the same.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord, StoredDocument

__all__ = [
    "PURGE_OPERATION",
    "check_audit",
    "check_audit_fences",
    "document_digest",
    "is_scope_record",
    "is_system_actor",
]

#: The operation of a purge's audit record (`workwarden.statemachine.retention`).
PURGE_OPERATION = "purge"

# A pause's or a resume's audit record is keyed by its scope: `pause/TENANT/APP/DEFINITION`.
_SCOPE_KEY_PREFIX = "pause/"
_SCOPE_OPERATIONS = frozenset({"pause", "resume"})


def document_digest(document: str) -> str:
    """The digest an audit record carries for the document text it committed (SHA-256, hex)."""
    return hashlib.sha256(document.encode("utf-8")).hexdigest()


def is_system_actor(actor: str) -> bool:
    """Is `actor` the system (acting as one of its operations or policies), not a caller?"""
    return actor.startswith("system.")


def is_scope_record(record: AuditRecord) -> bool:
    """Is `record` a pause's or a resume's (of a scope, keyed `pause/...`), not a document's?"""
    return record.operation in _SCOPE_OPERATIONS and record.key.startswith(_SCOPE_KEY_PREFIX)


def check_audit(
    documents: Sequence[StoredDocument], audit: Sequence[AuditRecord]
) -> list[Violation]:
    """One audit record per committed version, in commit order, matching the documents."""
    out: list[Violation] = []
    previous = 0
    versions: dict[str, list[int]] = {}
    last: dict[str, AuditRecord] = {}
    by_key = {doc.key: doc for doc in documents}
    for record in audit:
        if record.sequence <= previous:
            out.append(
                Violation(
                    "one_audit_record_per_version",
                    record.key,
                    f"sequence {record.sequence} after {previous}",
                    record,
                )
            )
        previous = record.sequence
        if is_scope_record(record):  # a pause's or resume's: in the sequence, of no document
            continue
        versions.setdefault(record.key, []).append(record.version)
        last[record.key] = record
        doc = by_key.get(record.key)
        if doc is not None and (record.tenant, record.application) != (
            doc.index.tenant,
            doc.index.application,
        ):
            out.append(
                Violation(
                    "audit_matches_the_documents",
                    record.key,
                    f"v{record.version} is audited in {record.tenant}/{record.application}, "
                    f"the document is in {doc.index.tenant}/{doc.index.application}",
                    record,
                )
            )
    for key in sorted(set(by_key) | set(versions)):
        doc = by_key.get(key)
        found = versions.get(key, [])
        if doc is not None:
            wanted = list(range(1, doc.version + 1))
        elif key in last and last[key].operation == PURGE_OPERATION:
            # Purged: its versions run up to the purge's, the key's tombstone.
            wanted = list(range(1, last[key].version + 1))
        else:
            wanted = []
        if found != wanted:
            shown = found if len(found) <= 20 else [*found[:20], "..."]
            out.append(
                Violation(
                    "one_audit_record_per_version",
                    key,
                    f"audit versions {shown}, document version "
                    f"{doc.version if doc is not None else None}",
                )
            )
        elif doc is not None and document_digest(doc.document) != last[key].digest:
            out.append(
                Violation(
                    "audit_matches_the_documents",
                    key,
                    f"the last record's digest is not version {doc.version}'s",
                    last[key],
                )
            )
    return out


def check_audit_fences(
    spec: Spec, workload: Workload, records: Sequence[AuditRecord]
) -> list[Violation]:
    """The fences of one workload's writes, from its audit records (in version order)."""
    roles = operation_roles(spec)
    key = workload.workload_id
    out: list[Violation] = []

    def add(name: str, message: str, record: AuditRecord | None = None) -> None:
        out.append(Violation(name, key, message, record))

    attempts = {attempt.attempt_id: attempt for attempt in workload.attempts}
    held: tuple[int, str] | None = None
    issued: list[int] = []
    completions = 0
    # A workload admitted again after a purge starts afresh: its fences are its own.
    purges = [i for i, r in enumerate(records) if r.operation == PURGE_OPERATION]
    if purges:
        records = records[purges[-1] + 1 :]
    for record in records:
        by_worker = not is_system_actor(record.actor)
        if record.operation in roles.claiming and by_worker:
            attempt = attempts.get(record.attempt or "")
            if attempt is None or attempt.worker_id != record.worker:
                add("one_attempt_per_claim", "a claim whose attempt is not recorded", record)
                continue
            if record.fencing_token not in (None, attempt.fencing_token):
                add("fencing_tokens_increase", "a claim audited under another token", record)
            if issued and attempt.fencing_token <= issued[-1]:
                add(
                    "fencing_tokens_increase",
                    f"fencing token {attempt.fencing_token} issued after {issued[-1]}",
                    record,
                )
            issued.append(attempt.fencing_token)
            held = (attempt.fencing_token, attempt.worker_id)
            continue
        if record.fencing_token is not None and by_worker:
            if held is None or held != (record.fencing_token, record.worker):
                add(
                    "no_write_from_a_stale_fence",
                    f"a write under a stale fence: presented token {record.fencing_token}"
                    f" by {record.worker}, held {held}",
                    record,
                )
            if record.operation in roles.completing:
                completions += 1
        if record.operation in roles.claim_ending or record.actor == roles.deadline_actor:
            held = None
    if completions > 1:
        add("at_most_one_success", f"{completions} completions committed")
    if issued != [attempt.fencing_token for attempt in workload.attempts]:
        add("one_attempt_per_claim", f"claims in the audit {issued} are not the attempts")
    return out
