"""`ForwardingStore`: a `Store` that hands every call to another store.

The base of wrappers that observe or change a few calls of a store (count
the reads, record what was written, break a promise on purpose) and let the
rest through unchanged. Every method of the `Store` protocol is written out,
so that a type checker sees the wrapper as a `Store` and a subclass's
override is checked against the protocol's signature.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from workwarden.storage.base import (
    AuditRecord,
    CandidateCursor,
    IndexFields,
    Store,
    StoredDocument,
)

__all__ = ["ForwardingStore"]


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
