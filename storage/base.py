"""The `Store` protocol: a compare-and-swap document store with index columns and an audit log.

A store keeps one JSON document per key with a version counting from 1, a few
index fields computed by the core, and an append-only audit log. A write names
the version it expects (or requires the key to be absent); when that does not
hold, the write changes nothing at all, document and audit alike, and raises
`StoreConflict`. A store knows nothing of what a workload is beyond its index
fields.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "AuditRecord",
    "CandidateCursor",
    "IndexFields",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreFailure",
    "StoreOutcomeUnknown",
    "StoredDocument",
]


class StoreError(Exception):
    """Base of the errors a store raises."""


class StoreConflict(StoreError):
    """The expected version did not hold (or the key existed, or a unique index clashed)."""


class StoreFailure(StoreError):
    """The store could not be read or written."""


class StoreOutcomeUnknown(StoreFailure):
    """A write was sent, and the connection broke before its answer came back.

    The write may or may not have committed: the statement (or its commit)
    reached the server, but whether it took effect cannot be told from this
    side. Call again with the same arguments: the authority's replay rules
    make that safe (a write that did commit is then seen as already done, or
    its compare-and-swap no longer holds and changes nothing). Raised only
    for writes; a read, or a write that never reached the server, is retried
    by the store instead.
    """


@dataclass(frozen=True, slots=True)
class IndexFields:
    """What a store indexes about a document, computed by the core on every write.

    `eligible_at` is set only while the document is claimable-in-principle
    (READY): the instant from which it may be claimed (0 when at once).
    `lease_expires_at` is set while a lease is held, `next_deadline_at` while a
    deadline can fall, `result_id` once a result is recorded (unique).
    """

    tenant: str
    application: str
    state: str
    priority: int
    created_at: int
    eligible_at: int | None = None
    lease_expires_at: int | None = None
    next_deadline_at: int | None = None
    result_id: str | None = None


@dataclass(frozen=True, slots=True)
class StoredDocument:
    """A document as committed: its key, version, JSON text and index fields."""

    key: str
    version: int
    document: str
    index: IndexFields


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One committed write: who did what to which work, and the digest of what was written.

    `sequence` is assigned by the store in commit order (0 before the write).
    """

    transaction_id: str
    key: str
    version: int
    actor: str
    operation: str
    tenant: str
    application: str
    at: int
    digest: str
    worker: str | None = None
    attempt: str | None = None
    result: str | None = None
    fencing_token: int | None = None
    sequence: int = 0


@dataclass(frozen=True, slots=True)
class CandidateCursor:
    """Where a page of claim candidates ended: (priority, created_at, key) of its last row."""

    priority: int
    created_at: int
    key: str


@runtime_checkable
class Store(Protocol):
    """What the authority needs of a backend. See `workwarden.storage.testing` for its checks."""

    def read(self, key: str) -> StoredDocument | None:
        """The committed document under `key`, or None."""
        ...

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """Write `document` if the committed version is `expected_version` (None: absent).

        Atomically appends `audit` (with `version` and `sequence` filled in).
        Returns the new version. Raises `StoreConflict` and changes nothing otherwise.
        """
        ...

    def find_result(self, result_id: str) -> str | None:
        """The key of the document whose `result_id` index field is `result_id`."""
        ...

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        """READY documents of one tenant and application eligible at `now`.

        Ordered by priority (highest first), then created_at, then key; the
        page starts after `after`.
        """
        ...

    def expired_leases(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose lease expired at or before `now`, earliest first."""
        ...

    def deadlines_due(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose next deadline falls at or before `now`, earliest first."""
        ...

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """Every document of one tenant and application, by priority then age."""
        ...

    def scan(self) -> Iterator[StoredDocument]:
        """Every document, by key (for export)."""
        ...

    def audit_log(self, after: int = 0, limit: int | None = None) -> Sequence[AuditRecord]:
        """Audit records with sequence greater than `after`, in commit order."""
        ...

    def close(self) -> None:
        """Release connections and files."""
        ...
