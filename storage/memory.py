"""`MemoryStore`: the `Store` protocol in one process's memory, behind one lock.

For tests, the checker and short-lived tools. It keeps exactly the semantics
of the durable backends: versions from 1, a require-absent create, a
conflicting write that changes nothing, a unique result id, the audit record
appended in the same critical section as its document. Like them, once
closed it refuses every call with `StoreFailure`.
"""

from __future__ import annotations

import builtins
import heapq
import threading
from collections.abc import Iterator, Sequence
from types import TracebackType

from workwarden.storage.base import (
    CLAIM_PAGES,
    AuditRecord,
    CandidateCursor,
    ChooseClaims,
    IndexFields,
    LocalWakeUps,
    NextInstants,
    PauseRecord,
    PauseScope,
    StoreConflict,
    StoredDocument,
    StoreFailure,
    WorkSignal,
    Write,
    WriteOutcome,
    check_audit_bounds,
    check_audit_since,
    distinct_keys,
    over_limit,
    spend_rate,
    wakes_claimers,
)

__all__ = ["MemoryStore"]


def _order(doc: StoredDocument) -> tuple[int, int, str]:
    return (-doc.index.priority, doc.index.created_at, doc.key)


class _Gate:
    """The store's one lock, which refuses entry (`StoreFailure`) once the store is closed."""

    __slots__ = ("_closed", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> None:
        self._lock.acquire()
        if self._closed:
            self._lock.release()
            raise StoreFailure("the memory store is closed")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()

    def close(self) -> None:
        """Refuse every later entry; closing twice is harmless."""
        with self._lock:
            self._closed = True


class MemoryStore:
    """An in-memory CAS document store with index fields and an audit log.

    After `close`, every call that reads or writes raises `StoreFailure`, as
    the durable stores' do (the authority surfaces it as
    `WORKLOAD_STORAGE_FAILURE`); closing twice is harmless.

    Thread-safety: every call holds one lock for its whole critical section,
    so any number of threads may share one store; it lives in one process.
    """

    def __init__(self) -> None:
        self._lock = _Gate()
        self._docs: dict[str, StoredDocument] = {}
        self._results: dict[str, str] = {}
        #: Each rated concurrency key's rate mark (`base.spend_rate`).
        self._rate_marks: dict[str, int] = {}
        self._audit: list[AuditRecord] = []
        self._requests: dict[str, AuditRecord] = {}
        self._wake_ups = LocalWakeUps()
        self._pauses: dict[str, PauseRecord] = {}
        self._pause_versions: dict[str, int] = {}
        self._tombstones: dict[str, int] = {}

    def read(self, key: str) -> StoredDocument | None:
        """The committed document under `key`, or None."""
        with self._lock:
            return self._docs.get(key)

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """Compare-and-swap `document` and append `audit`, or raise `StoreConflict`."""
        with self._lock:
            version = self._swap(Write(key, document, index, expected_version, audit))
        if wakes_claimers(index):
            self._wake_ups.notify(index.tenant, index.application)
        return version

    def _check_limit(
        self, key: str, index: IndexFields, current: StoredDocument | None, at: int
    ) -> int | None:
        """Refuse a claim past its key's limit or rate; the caller holds the lock.

        The key's new rate mark when the write spends a token (kept by the
        caller once the write is made), else None.
        """
        if not index.gated or (current is not None and current.index.claim_worker is not None):
            return None
        if index.limited:
            self._check_holders(key, index)
        if index.rated:
            return spend_rate(index, self._rate_marks.get(str(index.concurrency_key)), at)
        return None

    def _check_holders(self, key: str, index: IndexFields) -> None:
        holders = sum(
            1
            for doc in self._docs.values()
            if doc.index.concurrency_key == index.concurrency_key
            and doc.index.claim_worker is not None
            and doc.key != key
        )
        if index.concurrency_limit is not None and holders >= index.concurrency_limit:
            raise over_limit(index, holders)

    def _swap(self, write: Write) -> int:
        """One compare-and-swap with its audit record; the caller holds the lock."""
        key, index, expected_version, audit = (
            write.key,
            write.index,
            write.expected_version,
            write.audit,
        )
        current = self._docs.get(key)
        buried = self._tombstones.get(key)
        if expected_version is None:
            if current is not None:
                raise StoreConflict(f"{key} already exists")
            if buried is not None:
                raise StoreConflict(f"{key} was purged at version {buried}; a create names it")
        elif current is None and buried != expected_version:
            raise StoreConflict(f"{key}: expected version {expected_version}, found none")
        elif current is not None and current.version != expected_version:
            raise StoreConflict(
                f"{key}: expected version {expected_version}, found {current.version}"
            )
        if index.result_id is not None:
            owner = self._results.get(index.result_id)
            if owner is not None and owner != key:
                raise StoreConflict(f"result id {index.result_id} belongs to {owner}")
        mark = self._check_limit(key, index, current, audit.at)
        if mark is not None:
            self._rate_marks[str(index.concurrency_key)] = mark
        version = (buried or 0) + 1 if current is None else current.version + 1
        if current is not None and current.index.result_id not in (None, index.result_id):
            self._results.pop(current.index.result_id, None)
        if index.result_id is not None:
            self._results[index.result_id] = key
        self._docs[key] = StoredDocument(
            key=key, version=version, document=write.document, index=index
        )
        self._append_audit(audit, version)
        return version

    def _append_audit(self, audit: AuditRecord, version: int) -> None:
        """Append `audit` with its version and the next sequence; the caller holds the lock."""
        # Built field by field: `dataclasses.replace` costs more than the write.
        self._audit.append(
            AuditRecord(
                transaction_id=audit.transaction_id,
                key=audit.key,
                version=version,
                actor=audit.actor,
                operation=audit.operation,
                tenant=audit.tenant,
                application=audit.application,
                at=audit.at,
                digest=audit.digest,
                worker=audit.worker,
                attempt=audit.attempt,
                result=audit.result,
                fencing_token=audit.fencing_token,
                sequence=len(self._audit) + 1,
                request_id=audit.request_id,
            )
        )
        if audit.request_id is not None:
            self._requests.setdefault(audit.request_id, self._audit[-1])

    def _swap_all(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        """Each write's compare-and-swap in turn; the caller holds the lock."""
        outcomes: list[WriteOutcome] = []
        for write in writes:
            try:
                outcomes.append(self._swap(write))
            except StoreConflict as conflict:
                outcomes.append(conflict)
        return outcomes

    def _wake(self, writes: Sequence[Write], outcomes: Sequence[WriteOutcome]) -> None:
        scopes = {
            (write.index.tenant, write.index.application)
            for write, outcome in zip(writes, outcomes, strict=True)
            if wakes_claimers(write.index) and isinstance(outcome, int)
        }
        for tenant, application in sorted(scopes):
            self._wake_ups.notify(tenant, application)

    def _claimable(self, tenant: str, application: str, now: int) -> list[StoredDocument]:
        """The scope's READY documents eligible at `now`, but those paused; under the lock."""
        pauses = [p.scope for p in self._pauses.values() if p.scope.tenant == tenant]
        return [
            doc
            for doc in self._docs.values()
            if doc.index.tenant == tenant
            and doc.index.application == application
            and doc.index.eligible_at is not None
            and doc.index.eligible_at <= now
            and not any(
                scope.covers(
                    tenant, application, doc.index.definition or "", doc.index.concurrency_key
                )
                for scope in pauses
            )
        ]

    # -- Pauses -------------------------------------------------------------------

    def set_pause(self, scope: PauseScope, pause: PauseRecord | None, audit: AuditRecord) -> bool:
        """Pause or resume `scope` with its audit record, under the lock; False if no change."""
        with self._lock:
            present = scope.key in self._pauses
            if present == (pause is not None):
                return False
            if pause is None:
                del self._pauses[scope.key]
            else:
                self._pauses[scope.key] = pause
            # The audit record's version counts the scope's pauses and resumes.
            version = self._pause_versions.get(scope.key, 0) + 1
            self._pause_versions[scope.key] = version
            self._append_audit(audit, version)
        if pause is None:
            self._wake_ups.notify_all()
        return True

    def paused(self, tenant: str | None = None) -> list[PauseRecord]:
        """The pauses in force, of `tenant` or of all, by scope key."""
        with self._lock:
            return [
                self._pauses[key]
                for key in sorted(self._pauses)
                if tenant is None or self._pauses[key].scope.tenant == tenant
            ]

    # -- Purges -------------------------------------------------------------------

    def purgeable(
        self, states: Sequence[str], after: str | None, limit: int
    ) -> Sequence[StoredDocument]:
        """Documents in one of `states`, by key, after `after`."""
        wanted = frozenset(states)
        with self._lock:
            rows = [
                doc
                for key, doc in self._docs.items()
                if doc.index.state in wanted and (after is None or key > after)
            ]
        rows.sort(key=lambda doc: doc.key)
        return rows[:limit]

    def tombstone(self, key: str) -> int | None:
        """The version the last purge of `key` wrote, or None (`Tombstones`)."""
        with self._lock:
            return self._tombstones.get(key)

    def purge(self, key: str, expected_version: int, audit: AuditRecord) -> bool:
        """Delete `key` at `expected_version` with its audit record; its version a tombstone."""
        with self._lock:
            current = self._docs.get(key)
            if current is None or current.version != expected_version:
                return False
            del self._docs[key]
            if current.index.result_id is not None:
                self._results.pop(current.index.result_id, None)
            self._tombstones[key] = current.version + 1
            self._append_audit(audit, current.version + 1)
        return True

    # -- BatchStore ---------------------------------------------------------------

    def read_many(self, keys: Sequence[str]) -> dict[str, StoredDocument]:
        """The committed documents under `keys`; a missing key is absent from the answer."""
        with self._lock:
            return {key: self._docs[key] for key in keys if key in self._docs}

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        """Every write's compare-and-swap under one hold of the lock; outcomes in order."""
        distinct_keys(writes)
        with self._lock:
            outcomes = self._swap_all(writes)
        self._wake(writes, outcomes)
        return outcomes

    def claim_batch(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        choose: ChooseClaims,
    ) -> list[tuple[Write, WriteOutcome]]:
        """Pages of candidates offered to `choose`, and its claims written, under one lock hold."""
        chosen: list[Write] = []
        with self._lock:
            rows = sorted(self._claimable(tenant, application, now), key=_order)
            for page_number in range(CLAIM_PAGES):
                page = rows[page_number * limit : (page_number + 1) * limit]
                if page:
                    chosen.extend(choose(page))
                if len(chosen) >= limit or len(page) < limit:
                    break
            distinct_keys(chosen)
            outcomes = self._swap_all(chosen)
        self._wake(chosen, outcomes)
        return list(zip(chosen, outcomes, strict=True))

    def find_result(self, result_id: str) -> str | None:
        """The key holding `result_id`, or None."""
        with self._lock:
            return self._results.get(result_id)

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        """READY, eligible documents of a tenant and application, by priority then age.

        None of a paused scope (`Pauses`).
        """
        with self._lock:
            rows = self._claimable(tenant, application, now)
        rows.sort(key=_order)
        if after is not None:
            bound = (-after.priority, after.created_at, after.key)
            rows = [doc for doc in rows if _order(doc) > bound]
        return rows[:limit]

    def _due(
        self,
        field: str,
        now: int,
        limit: int,
        tenant: str | None,
        application: str | None,
    ) -> list[str]:
        with self._lock:
            rows = [
                (value, doc.key)
                for doc in self._docs.values()
                if (value := getattr(doc.index, field)) is not None
                and value <= now
                and (tenant is None or doc.index.tenant == tenant)
                and (application is None or doc.index.application == application)
            ]
        rows.sort()
        return [key for _, key in rows[:limit]]

    def expired_leases(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose lease expired at or before `now`."""
        return self._due("lease_expires_at", now, limit, tenant, application)

    def deadlines_due(
        self, now: int, limit: int, tenant: str | None = None, application: str | None = None
    ) -> Sequence[str]:
        """Keys whose next deadline falls at or before `now`."""
        return self._due("next_deadline_at", now, limit, tenant, application)

    def held_claims(
        self, tenant: str, application: str, worker_id: str
    ) -> Sequence[StoredDocument]:
        """Documents of a tenant and application whose claim `worker_id` holds, by key."""
        with self._lock:
            rows = [
                doc
                for doc in self._docs.values()
                if doc.index.claim_worker == worker_id
                and doc.index.tenant == tenant
                and doc.index.application == application
            ]
        rows.sort(key=lambda doc: doc.key)
        return rows

    def find_request(self, request_id: str) -> AuditRecord | None:
        """The first audit record made for `request_id`, or None."""
        with self._lock:
            return self._requests.get(request_id)

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """Every document of a tenant and application, by priority then age."""
        with self._lock:
            rows = [
                doc
                for doc in self._docs.values()
                if doc.index.tenant == tenant and doc.index.application == application
            ]
        rows.sort(key=_order)
        return rows

    def list_page(
        self, tenant: str, application: str, limit: int, after: CandidateCursor | None = None
    ) -> Sequence[StoredDocument]:
        """The next `limit` documents of a tenant and application after `after` (`ListPages`)."""
        start = None if after is None else (-after.priority, after.created_at, after.key)
        with self._lock:
            rows = [
                doc
                for doc in self._docs.values()
                if doc.index.tenant == tenant
                and doc.index.application == application
                and (start is None or _order(doc) > start)
            ]
        return heapq.nsmallest(limit, rows, key=_order)

    def audit_of(self, key: str) -> Sequence[AuditRecord]:
        """Every audit record of `key`, in commit order (`KeyedAudit`)."""
        with self._lock:
            return [record for record in self._audit if record.key == key]

    def audit_tail(self, limit: int) -> Sequence[AuditRecord]:
        """The last `limit` audit records, newest first (`RecentAudit`)."""
        check_audit_bounds(0, limit)
        with self._lock:
            return self._audit[::-1][:limit]

    def audit_since(self, at: int) -> Sequence[AuditRecord]:
        """Every audit record at `at` or later, in commit order (`RecentAudit`)."""
        check_audit_since(at)
        with self._lock:
            return [record for record in self._audit if record.at >= at]

    def scan(self) -> Iterator[StoredDocument]:
        """Every document, by key."""
        with self._lock:
            rows = sorted(self._docs.values(), key=lambda doc: doc.key)
        return iter(rows)

    def audit_log(self, after: int = 0, limit: int | None = None) -> Sequence[AuditRecord]:
        """Audit records after sequence `after`, in commit order, at most `limit` of them.

        A bound that is not a whole number from 0 is `WORKLOAD_INVALID`
        (`check_audit_bounds`).
        """
        check_audit_bounds(after, limit)
        with self._lock:
            rows = self._audit[after:]
        return rows if limit is None else rows[:limit]

    def close(self) -> None:
        """Refuse every later call with `StoreFailure`; closing twice is harmless."""
        self._lock.close()

    # -- optional capabilities (`DueInstants`, `WakeUps`) ---------------------------------

    def next_instants(
        self, after: int, tenant: str | None = None, application: str | None = None
    ) -> NextInstants:
        """The earliest eligibility, lease expiry and deadline after `after` in the scope."""
        found: dict[str, int] = {}
        with self._lock:
            for doc in self._docs.values():
                index = doc.index
                if (tenant is not None and index.tenant != tenant) or (
                    application is not None and index.application != application
                ):
                    continue
                for name in ("eligible_at", "lease_expires_at", "next_deadline_at"):
                    value = getattr(index, name)
                    if value is not None and value > after and value < found.get(name, value + 1):
                        found[name] = value
        return NextInstants(
            eligible_at=found.get("eligible_at"),
            lease_expires_at=found.get("lease_expires_at"),
            deadline_at=found.get("next_deadline_at"),
        )

    def claimable_scopes(self, now: int) -> builtins.list[tuple[str, str]]:
        """The (tenant, application) pairs with a document eligible at `now`, sorted."""
        with self._lock:
            return sorted(
                {
                    (doc.index.tenant, doc.index.application)
                    for doc in self._docs.values()
                    if doc.index.eligible_at is not None and doc.index.eligible_at <= now
                }
            )

    def work_signal(self, tenant: str, application: str) -> WorkSignal:
        """Woken by every write through this store that leaves work of the scope READY."""
        return self._wake_ups.signal(tenant, application)
