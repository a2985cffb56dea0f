"""Retention: finished work older than the spec's `[retention] after_ms` is purged, audited.

`Authority.purge(now, ...)` walks the store's terminal documents
(`Purges.purgeable`, by key), keeps those in a `[retention] keep` state (dead
letters, by default: an operator still has to act on them) and those whose
last change is younger than `after_ms`, and deletes the rest one
compare-and-swap each (`Purges.purge`), each with an audit record (operation
`purge`, the actor, the instant, the digest of the document purged). An
`export` callable, when given, receives each stored document (key, version,
JSON text) before it is deleted;
if it raises, that workload is not purged and the purge stops there.

A workload changed between being found and being purged (re-armed by an
operator) is left alone: the compare-and-swap fails and it is skipped. A
dry run (`dry_run=True`) reports what would be purged and writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workwarden.statemachine import errors, inputs
from workwarden.storage.base import AuditRecord, Purges, StoredDocument

__all__ = ["PAGE", "PurgeReport", "purge"]

PAGE = 256
"""How many terminal documents one page of a purge reads."""

#: The actor a purge is recorded under when no operator is named.
RETENTION_ACTOR = "system.retention"

# The authority is handed in by `Authority.purge`; typed loosely so this module
# does not import the one that imports it.
Authority = Any


@dataclass
class PurgeReport:
    """What a purge did: the workloads purged, and those it passed over, with why."""

    purged: list[str] = field(default_factory=list)
    kept: int = 0
    """Terminal workloads in a `keep` state."""
    young: int = 0
    """Terminal workloads whose last change is younger than the retention age."""
    changed: int = 0
    """Workloads another writer changed between being found and being purged."""


def purge(
    authority: Authority,
    now: int,
    *,
    older_than_ms: Any = None,
    tenant: Any = None,
    application: Any = None,
    actor: Any = None,
    export: Callable[[StoredDocument], None] | None = None,
    dry_run: bool = False,
    limit: Any = None,
) -> PurgeReport:
    """Purge finished work as the spec's `[retention]` says; see the module docstring."""
    inputs.check_now(now)
    retention = authority.spec.data.retention
    age = retention.after_ms if older_than_ms is None else older_than_ms
    if isinstance(age, bool) or not isinstance(age, int) or not 0 <= age <= 2**53 - 1:
        raise errors.bad_argument(
            "older_than_ms", "older_than_ms must be a whole number of ms, 0 to 2**53 - 1"
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise errors.bad_argument("limit", "limit must be a whole number above 0")
    if not isinstance(dry_run, bool):
        # Read by truth, None or 0 would purge for real.
        raise errors.bad_argument("dry_run", "dry_run must be True or False")
    if export is not None and not callable(export):
        raise errors.bad_argument("export", "export must be callable with each stored document")
    tenant, application = inputs.as_scope(tenant, application)
    who = RETENTION_ACTOR if actor is None else inputs.as_name(actor, "actor")
    store = authority.store
    if not isinstance(store, Purges):
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"the store ({type(store).__name__}) cannot purge"
        )
    keep = frozenset(retention.keep)
    states = sorted(authority.spec.terminal_states)
    report = PurgeReport()
    after: str | None = None
    while limit is None or len(report.purged) < limit:
        page = authority._store_call(store.purgeable, states, after, PAGE)
        if not page:
            break
        after = page[-1].key
        for doc in page:
            if limit is not None and len(report.purged) >= limit:
                break
            if tenant not in (None, doc.index.tenant) or application not in (
                None,
                doc.index.application,
            ):
                continue
            if doc.index.state in keep:
                report.kept += 1
                continue
            workload = inputs.parse_stored(doc)
            if now - workload.updated_at < age:
                report.young += 1
                continue
            if dry_run:
                report.purged.append(doc.key)
                continue
            if export is not None:
                export(doc)
            audit = AuditRecord(
                transaction_id="tx_"
                + hashlib.sha256(f"purge\x1f{doc.key}\x1f{doc.version}".encode()).hexdigest()[:24],
                key=doc.key,
                version=0,
                actor=who,
                operation="purge",
                tenant=doc.index.tenant,
                application=doc.index.application,
                at=now,
                digest=hashlib.sha256(doc.document.encode("utf-8")).hexdigest(),
                result=doc.index.result_id,
            )
            if authority._store_call(store.purge, doc.key, doc.version, audit):
                authority._latest.forget(doc.key)
                report.purged.append(doc.key)
            else:
                report.changed += 1
    return report
