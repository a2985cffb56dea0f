"""`ForwardingStore`: a `Store` that hands every call to another store.

The base of wrappers that observe or change a few calls of a store (count
the reads, record what was written, break a promise on purpose) and let the
rest through unchanged. Every method of the `Store` protocol is written out,
so that a type checker sees the wrapper as a `Store` and a subclass's
override is checked against the protocol's signature.

`BatchStore` is a runtime protocol: `isinstance(x, BatchStore)` asks only
whether `x` has its methods. So a wrapper must not define them unless the
store it wraps has them too, or the authority would take the batch path into
a store that cannot follow it. `ForwardingStore` leaves them out;
`ForwardingBatchStore` adds them, for a wrapped store that is a
`BatchStore`; `forwarding_store(inner)` picks the one that fits. The same
holds for the optional capabilities: `ForwardingPauses` and `ForwardingPurges`
(with `Tombstones`, which travel together) are mixins for a wrapper over a
store that has them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

from workwarden.storage.base import (
    AuditRecord,
    BatchStore,
    CandidateCursor,
    ChooseClaims,
    IndexFields,
    PauseRecord,
    Pauses,
    PauseScope,
    Purges,
    Store,
    StoredDocument,
    Tombstones,
    Write,
    WriteOutcome,
)

__all__ = [
    "ForwardingBatchStore",
    "ForwardingPauses",
    "ForwardingPurges",
    "ForwardingStore",
    "forwarding_store",
]


class ForwardingStore:
    """A store that forwards every method of the `Store` protocol to `self.inner`.

    Subclasses override what they observe or change, and call the inherited
    method (or `self.inner`) to reach the wrapped store:

        class CountingReads(ForwardingStore):
            def __init__(self, inner: Store) -> None:
                super().__init__(inner)
                self.reads = 0

            def read(self, key: str) -> StoredDocument | None:
                self.reads += 1
                return super().read(key)
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def read(self, key: str) -> StoredDocument | None:
        """The wrapped store's `read`."""
        return self.inner.read(key)

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """The wrapped store's `write`."""
        return self.inner.write(key, document, index, expected_version, audit)

    def find_result(self, result_id: str) -> str | None:
        """The wrapped store's `find_result`."""
        return self.inner.find_result(result_id)

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        """The wrapped store's `claim_candidates`."""
        return self.inner.claim_candidates(tenant, application, now, limit, after)

    def expired_leases(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """The wrapped store's `expired_leases`."""
        return self.inner.expired_leases(now, limit, tenant, application)

    def deadlines_due(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """The wrapped store's `deadlines_due`."""
        return self.inner.deadlines_due(now, limit, tenant, application)

    def held_claims(
        self, tenant: str, application: str, worker_id: str
    ) -> Sequence[StoredDocument]:
        """The wrapped store's `held_claims`."""
        return self.inner.held_claims(tenant, application, worker_id)

    def find_request(self, request_id: str) -> AuditRecord | None:
        """The wrapped store's `find_request`."""
        return self.inner.find_request(request_id)

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """The wrapped store's `list`."""
        return self.inner.list(tenant, application)

    def scan(self) -> Iterator[StoredDocument]:
        """The wrapped store's `scan`."""
        return self.inner.scan()

    def audit_log(self, after: int = 0, limit: int | None = None) -> Sequence[AuditRecord]:
        """The wrapped store's `audit_log`."""
        return self.inner.audit_log(after, limit)

    def close(self) -> None:
        """Close the wrapped store."""
        self.inner.close()


class ForwardingBatchStore(ForwardingStore):
    """A `ForwardingStore` that forwards the `BatchStore` methods too; its inner store must be one.

    Built over a store that is not a `BatchStore`, it raises `TypeError`:
    offering batches the wrapped store cannot take would break the first
    batch call. Subclasses override the batch methods as they override the
    others (a wrapper that records every write records `write_many`'s and
    `claim_batch`'s too).
    """

    def __init__(self, inner: Store) -> None:
        if not isinstance(inner, BatchStore):
            raise TypeError(
                f"{type(inner).__name__} is not a BatchStore: wrap it in a ForwardingStore"
            )
        super().__init__(inner)
        self.batch_inner: BatchStore = inner
        """The wrapped store, as the `BatchStore` it is."""

    def read_many(self, keys: Sequence[str]) -> dict[str, StoredDocument]:
        """The wrapped store's `read_many`."""
        return self.batch_inner.read_many(keys)

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        """The wrapped store's `write_many`; each write and its outcome go to `batch_written`."""
        outcomes = self.batch_inner.write_many(writes)
        self.batch_written(list(zip(writes, outcomes, strict=True)))
        return outcomes

    def claim_batch(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        choose: ChooseClaims,
    ) -> list[tuple[Write, WriteOutcome]]:
        """The wrapped store's `claim_batch`; its writes and outcomes go to `batch_written`."""
        results = self.batch_inner.claim_batch(tenant, application, now, limit, choose)
        self.batch_written(results)
        return results

    def batch_written(self, results: Sequence[tuple[Write, WriteOutcome]]) -> None:
        """Called after each batch with every write and its outcome; override to observe them."""


class ForwardingPauses(ForwardingStore):
    """Forwards the `Pauses` methods; mix it in only over a store that keeps pauses."""

    def set_pause(self, scope: PauseScope, pause: PauseRecord | None, audit: AuditRecord) -> bool:
        """The wrapped store's `set_pause`."""
        return cast(Pauses, self.inner).set_pause(scope, pause, audit)

    def paused(self, tenant: str | None = None) -> list[PauseRecord]:
        """The wrapped store's `paused`."""
        return cast(Pauses, self.inner).paused(tenant)


class ForwardingPurges(ForwardingStore):
    """Forwards the `Purges` and `Tombstones` methods; mix it in only over a store that purges.

    The authority reads a purged key's tombstone before admitting it again
    (its fencing tokens continue past it), so the two travel together.
    """

    def purgeable(
        self, states: Sequence[str], after: str | None, limit: int
    ) -> Sequence[StoredDocument]:
        """The wrapped store's `purgeable`."""
        return cast(Purges, self.inner).purgeable(states, after, limit)

    def purge(self, key: str, expected_version: int, audit: AuditRecord) -> bool:
        """The wrapped store's `purge`."""
        return cast(Purges, self.inner).purge(key, expected_version, audit)

    def tombstone(self, key: str) -> int | None:
        """The wrapped store's `tombstone` (`Tombstones`), or None if it keeps none."""
        inner = self.inner
        return inner.tombstone(key) if isinstance(inner, Tombstones) else None


def forwarding_store(inner: Store) -> ForwardingStore:
    """A wrapper forwarding every call to `inner`: batches too, exactly when `inner` takes them."""
    if isinstance(inner, BatchStore):
        return ForwardingBatchStore(inner)
    return ForwardingStore(inner)
