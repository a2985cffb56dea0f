"""The `Store` protocol: a compare-and-swap document store with index columns and an audit log.

A store keeps one JSON document per key with a version counting from 1, a few
index fields computed by the core, and an append-only audit log. A write names
the version it expects (or requires the key to be absent); when that does not
hold, the write changes nothing at all, document and audit alike, and raises
`StoreConflict`. A store knows nothing of what a workload is beyond its index
fields.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable
from urllib.parse import quote

from workwarden.statemachine import errors

__all__ = [
    "CLAIM_PAGES",
    "AuditRecord",
    "BatchStore",
    "CandidateCursor",
    "ChooseClaims",
    "DueInstants",
    "IndexFields",
    "KeyedAudit",
    "ListPages",
    "LocalWakeUps",
    "NextInstants",
    "PauseRecord",
    "PauseScope",
    "Pauses",
    "Purges",
    "RecentAudit",
    "ScopeListing",
    "Store",
    "StoreAbsent",
    "StoreConflict",
    "StoreError",
    "StoreFailure",
    "StoreLimited",
    "StoreOutcomeUnknown",
    "StoreRateLimited",
    "StoredDocument",
    "Tombstones",
    "WakeUps",
    "WorkSignal",
    "Write",
    "WriteOutcome",
    "check_audit_bounds",
    "check_audit_since",
    "distinct_keys",
    "document_from_row",
    "over_limit",
    "pause_from_row",
    "spend_rate",
    "wakes_claimers",
]


class StoreError(Exception):
    """Base of the errors a store raises."""


class StoreConflict(StoreError):
    """The expected version did not hold (or the key existed, or a unique index clashed)."""


class StoreLimited(StoreConflict):
    """A claim's write would pass its concurrency key's limit; nothing was written.

    Raised (or, in a batch, returned as the write's outcome) when the write
    makes a document hold a claim while its committed version held none, and
    `concurrency_limit` other documents of its `concurrency_key` hold a claim
    already. A `StoreConflict`, so a caller that knows only conflicts still
    treats it as a write that changed nothing.
    """


class StoreRateLimited(StoreLimited):
    """A claim's write would pass its concurrency key's rate; nothing was written.

    Raised (or returned, in a batch) when the write makes a document hold a
    claim while its committed version held none, and its key's token bucket
    (`IndexFields.rate_every_ms`, `rate_burst`) has no token at the write's
    instant. `retry_at` is the first instant a token is back.
    """

    def __init__(self, message: str, retry_at: int) -> None:
        super().__init__(message)
        self.retry_at = retry_at


class StoreFailure(StoreError):
    """The store could not be read or written."""


class StoreAbsent(StoreFailure):
    """The database holds no store, and the store was opened not to create one."""


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
    `claim_worker` is the worker id of the claim the document holds (None
    while it holds none), for `Store.held_claims`. `definition` is the
    workload's definition id, for the pauses of one definition (`Pauses`).
    `concurrency_key` is the workload's concurrency key and
    `concurrency_limit` the limit in force for it (None: unlimited): a write
    that makes the document hold a claim while its committed version held
    none is refused (`StoreLimited`) when `concurrency_limit` other documents
    of that key hold a claim already, checked atomically with the write.
    `rate_every_ms` and `rate_burst` are the key's rate in force (None: no
    rate): such a write is refused (`StoreRateLimited`) unless the key's
    token bucket, which holds at most `rate_burst` tokens and gains one every
    `rate_every_ms`, has a token at the write's instant (`AuditRecord.at`);
    each claim spends one (`spend_rate`).
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
    claim_worker: str | None = None
    definition: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_every_ms: int | None = None
    rate_burst: int | None = None

    @property
    def limited(self) -> bool:
        """Does a write of these fields need the concurrency check (a claim, with a limit)?"""
        return (
            self.claim_worker is not None
            and self.concurrency_key is not None
            and self.concurrency_limit is not None
        )

    @property
    def rated(self) -> bool:
        """Does a write of these fields need the rate check (a claim, with a rate)?"""
        return (
            self.claim_worker is not None
            and self.concurrency_key is not None
            and self.rate_every_ms is not None
            and self.rate_burst is not None
        )

    @property
    def gated(self) -> bool:
        """Does a write of these fields need either check of its concurrency key?"""
        return self.limited or self.rated


def wakes_claimers(index: IndexFields) -> bool:
    """Does a committed write of these fields free work for claimers (so waiters are woken)?

    It does when it leaves the document claimable (`eligible_at`), and when it
    leaves a document of a limited concurrency key holding no claim: that may
    free a place under the limit for the key's READY work.
    """
    return index.eligible_at is not None or (
        index.concurrency_limit is not None
        and index.concurrency_key is not None
        and index.claim_worker is None
    )


def over_limit(index: IndexFields, holders: int) -> StoreLimited:
    """The refusal of a claim of `index` while `holders` other documents of its key hold one."""
    return StoreLimited(
        f"concurrency key {index.concurrency_key!r}: {holders} workloads hold a claim,"
        f" the limit is {index.concurrency_limit}"
    )


def spend_rate(index: IndexFields, mark: int | None, at: int) -> int:
    """The key's rate mark after a claim of `index` at `at`, or `StoreRateLimited`.

    The token bucket kept as one instant per key (the generic cell rate
    algorithm): `mark` is when the bucket would be full again had every claim
    so far spent its token (None: never claimed; full). A claim at `at` finds
    a token when `mark` is at most `(burst - 1) * every_ms` after `at`, and
    moves the mark on by `every_ms` from `max(mark, at)`. So at most `burst`
    claims happen at one instant, and over any span of `t` ms at most
    `burst + t // every_ms`.
    """
    every = index.rate_every_ms or 0
    burst = index.rate_burst or 1
    start = at if mark is None else max(mark, at)
    slack = (burst - 1) * every
    if start - at > slack:
        retry_at = start - slack
        raise StoreRateLimited(
            f"concurrency key {index.concurrency_key!r}: its rate of {burst} at once and one"
            f" every {every} ms is spent until {retry_at}",
            retry_at,
        )
    return start + every


@dataclass(frozen=True, slots=True)
class StoredDocument:
    """A document as committed: its key, version, JSON text and index fields."""

    key: str
    version: int
    document: str
    index: IndexFields


def document_from_row(row: Sequence[Any]) -> StoredDocument:
    """A `StoredDocument` from a row of the SQL stores' document columns.

    The columns, in order: key, version, document, then tenant, application,
    state, priority, created_at, eligible_at, lease_expires_at,
    next_deadline_at, result_id, claim_worker, definition, concurrency_key,
    concurrency_limit, rate_every_ms and rate_burst (SQLite and PostgreSQL
    select them alike).
    """
    return StoredDocument(
        key=row[0],
        version=row[1],
        document=row[2],
        index=IndexFields(
            tenant=row[3],
            application=row[4],
            state=row[5],
            priority=row[6],
            created_at=row[7],
            eligible_at=row[8],
            lease_expires_at=row[9],
            next_deadline_at=row[10],
            result_id=row[11],
            claim_worker=row[12],
            definition=row[13],
            concurrency_key=row[14],
            concurrency_limit=row[15],
            rate_every_ms=row[16],
            rate_burst=row[17],
        ),
    )


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One committed write: who did what to which work, and the digest of what was written.

    `sequence` is assigned by the store in commit order (0 before the write).
    `request_id` is the caller's request id the write was made for (a claim
    or operator request id; None when the call gave none), for
    `Store.find_request`.
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
    request_id: str | None = None


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
        On a store that `Purges`, a key purged before is created again by
        naming its tombstone as `expected_version` (None is then a conflict),
        so that a writer that decided on "never written" cannot create it
        unaware of its purged life (see `Purges`).
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

    def held_claims(
        self, tenant: str, application: str, worker_id: str
    ) -> Sequence[StoredDocument]:
        """Documents of one tenant and application whose `claim_worker` is `worker_id`, by key."""
        ...

    def find_request(self, request_id: str) -> AuditRecord | None:
        """The first audit record (lowest sequence) whose `request_id` is `request_id`."""
        ...

    def list(self, tenant: str, application: str) -> Sequence[StoredDocument]:
        """Every document of one tenant and application, by priority then age."""
        ...

    def scan(self) -> Iterator[StoredDocument]:
        """Every document, by key (for export)."""
        ...

    def audit_log(self, after: int = 0, limit: int | None = None) -> Sequence[AuditRecord]:
        """Audit records with sequence greater than `after`, in commit order, at most `limit`.

        `after` is a sequence number (0: from the first record), `limit` a
        count of records (None: every one). Each is a whole number from 0 to
        2**63 - 1; anything else is refused with `WORKLOAD_INVALID` before the
        store is read (`check_audit_bounds`).
        """
        ...

    def close(self) -> None:
        """Release connections and files."""
        ...


# -- optional capabilities ---------------------------------------------------------------
#
# A store may offer more than the `Store` protocol. The runtime
# (`workwarden.runtime`) asks with `isinstance(store, DueInstants)` and
# `isinstance(store, WakeUps)`, and falls back to a bounded poll when a store
# lacks one. The conformance suite checks a capability a store offers.


@dataclass(frozen=True, slots=True)
class NextInstants:
    """The earliest instants strictly after a given one at which something falls due in a scope.

    `eligible_at`: READY work becomes claimable; `lease_expires_at`: a lease
    runs out; `deadline_at`: a deadline falls. None when nothing of that
    kind is pending after the instant.
    """

    eligible_at: int | None = None
    lease_expires_at: int | None = None
    deadline_at: int | None = None


@runtime_checkable
class DueInstants(Protocol):
    """A store that can say when its work next falls due, so waiters sleep until then."""

    def next_instants(
        self, after: int, tenant: str | None = None, application: str | None = None
    ) -> NextInstants:
        """The earliest `eligible_at`, `lease_expires_at` and `next_deadline_at` after `after`.

        Each is the smallest value strictly greater than `after` among the
        documents of the scope (None for `tenant` or `application`: every one).
        """
        ...


@runtime_checkable
class ScopeListing(Protocol):
    """A store that can list the tenants and applications with work claimable now."""

    def claimable_scopes(self, now: int) -> list[tuple[str, str]]:
        """The (tenant, application) pairs with a document eligible at `now`, sorted.

        Paused scopes are listed as well: a claim in one finds nothing.
        """
        ...


@runtime_checkable
class KeyedAudit(Protocol):
    """A store that reads one key's audit records itself, so a caller never reads the whole log."""

    def audit_of(self, key: str) -> Sequence[AuditRecord]:
        """Every audit record of `key` (a workload, or a pause scope's key), in commit order."""
        ...


@runtime_checkable
class RecentAudit(Protocol):
    """A store that reads the end of its audit log itself, so a caller never reads all of it."""

    def audit_tail(self, limit: int) -> Sequence[AuditRecord]:
        """The last `limit` audit records (a whole number from 0), newest first."""
        ...

    def audit_since(self, at: int) -> Sequence[AuditRecord]:
        """Every audit record whose instant is `at` or later, in commit order."""
        ...


@runtime_checkable
class ListPages(Protocol):
    """A store that can list a scope a page at a time, so a listing never holds every document."""

    def list_page(
        self, tenant: str, application: str, limit: int, after: CandidateCursor | None = None
    ) -> Sequence[StoredDocument]:
        """The next `limit` documents of one tenant and application after `after`.

        In `list`'s order (highest priority first, then created_at, then
        key), starting after the document whose (priority, created_at, key)
        is `after` (None: from the first). Each page is read at one instant:
        a document written between two pages may be missed or listed twice
        when its priority changed, never otherwise.
        """
        ...


class WorkSignal(Protocol):
    """A subscription to "work may have become claimable" in one tenant and application."""

    def wait(self, timeout_s: float) -> bool:
        """Block until work may have become claimable since the last wait, or `timeout_s` passed.

        True when woken (or when a notification may have been missed, such
        as after a lost connection: the caller looks again), False on timeout.
        A write committed after the signal was made and before this call
        wakes it at once.
        """
        ...

    def close(self) -> None:
        """Stop listening and release what the signal holds."""
        ...


@runtime_checkable
class WakeUps(Protocol):
    """A store that wakes waiters when a write makes work claimable (admitted, re-armed...)."""

    def work_signal(self, tenant: str, application: str) -> WorkSignal:
        """A signal for the scope, listening from now on."""
        ...


@dataclass(frozen=True, slots=True)
class Write:
    """One compare-and-swap of a batch: the arguments of `Store.write`, as one value."""

    key: str
    document: str
    index: IndexFields
    expected_version: int | None
    audit: AuditRecord


WriteOutcome = int | StoreConflict
"""What became of one write of a batch: its new version, or the conflict that left it unwritten."""

ChooseClaims = Callable[[Sequence[StoredDocument]], Sequence[Write]]
"""Given a page of claim candidates, the claims to write (each on its document's version)."""

CLAIM_PAGES = 4
"""How many pages of candidates `BatchStore.claim_batch` offers before it commits what it has."""


@runtime_checkable
class BatchStore(Protocol):
    """A store that reads, writes and claims many documents in one round trip.

    Each write of a batch is its own compare-and-swap, appended with its own
    audit record exactly as `Store.write` would: a conflict leaves that write
    unwritten and is its outcome, and the other writes of the batch go on.
    What is not per write is the failure of the round trip itself: a
    `StoreFailure` raised by a batch call wrote nothing, and
    `StoreOutcomeUnknown` means the batch may have committed as a whole or
    not at all (never a part of it). The authority's batch calls
    (`Authority.admit_many`, `claim_many`, `report_many`) use this when a
    store offers it and fall back to one call per workload otherwise.
    """

    def read_many(self, keys: Sequence[str]) -> dict[str, StoredDocument]:
        """The committed documents under `keys` (a missing key is absent from the answer)."""
        ...

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        """Commit every write whose expected version holds, in one transaction; outcomes in order.

        Keys are distinct within a batch (two writes of one key are
        `ValueError`, before anything is written). An outcome is the new
        version, or a `StoreConflict` (the version did not hold, the key
        existed, or the result id belongs to another key) for a write that
        changed nothing.
        """
        ...

    def claim_batch(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        choose: ChooseClaims,
    ) -> list[tuple[Write, WriteOutcome]]:
        """Claim up to `limit` candidates in one transaction that no other batch claimer shares.

        `choose` is called with pages of up to `limit` READY documents of the
        scope eligible at `now`, in the order of `Store.claim_candidates`,
        that no other `claim_batch` holds at that moment (PostgreSQL: rows
        locked `FOR UPDATE SKIP LOCKED` until the commit; SQLite: the write
        lock; memory: the store's lock), and returns the writes it decided
        for them. Pages follow one another (each after the last) until
        `limit` writes are chosen, a page comes back short, or
        `CLAIM_PAGES` pages were offered; then the chosen writes are
        committed together, each a compare-and-swap as in `write_many`.
        Returns each write with its outcome. `choose` must not call the store,
        and may be called again with the same pages (a store that starts its
        transaction over after a broken connection offers them anew), so it
        keeps no state across calls but what it returns; the store commits
        the writes of the last pass only. Writes beyond `limit` are the
        caller's to avoid: the store commits what `choose` returned.
        """
        ...


#: The largest bound `audit_log` takes: a signed 64-bit integer, as the SQL stores keep one.
_MAX_BOUND: Final = 2**63 - 1


def check_audit_since(at: object) -> None:
    """Refuse a `RecentAudit.audit_since` instant that is not a whole number from 0 to 2**63 - 1.

    The refusal is `WORKLOAD_INVALID` naming `at`, before the store reads.
    """
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= _MAX_BOUND:
        raise errors.bad_argument(
            "at", f"audit_since's at must be a whole number from 0 to 2**63 - 1, not {at!r}"
        )


def check_audit_bounds(after: object, limit: object) -> None:
    """Refuse `Store.audit_log` bounds that are not whole numbers from 0 to 2**63 - 1.

    `limit` may also be None. The refusal is `WORKLOAD_INVALID` naming the
    argument (`InvalidArgument`, also a `ValueError`). Every store calls this
    before it reads, so that none reads a negative `after` as "the last
    records" or a negative `limit` as "all but the last".
    """
    for field, value in (("after", after), ("limit", limit)):
        if value is None and field == "limit":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_BOUND:
            raise errors.bad_argument(
                field,
                f"audit_log's {field} must be a whole number from 0 to 2**63 - 1, not {value!r}",
            )


def distinct_keys(writes: Sequence[Write]) -> None:
    """Refuse (`ValueError`) a batch that writes one key twice, before anything is written."""
    seen: set[str] = set()
    for write in writes:
        if write.key in seen:
            raise ValueError(f"a batch writes {write.key} twice")
        seen.add(write.key)


@dataclass(frozen=True, slots=True)
class PauseScope:
    """What a pause stops claims of: a tenant, or one application of it, or one definition.

    `application` None: every application of the tenant; `definition` None:
    every definition of the application (a definition needs an application).
    `concurrency_key`, when set, narrows the scope to the work of that
    concurrency key (in the tenant, or its application, or its definition).
    """

    tenant: str
    application: str | None = None
    definition: str | None = None
    concurrency_key: str | None = None

    @property
    def key(self) -> str:
        """The scope as one string: its audit records' key (`pause/TENANT/APP/DEFINITION`).

        `*` stands for every application or definition; each name is
        percent-encoded (`/`, `*` and `%` included), so two scopes never share
        a key. A scope of one concurrency key has it as a fourth part
        (`pause/TENANT/APP/DEFINITION/KEY`).
        """
        parts = [self.tenant, self.application, self.definition]
        if self.concurrency_key is not None:
            parts.append(self.concurrency_key)
        return "pause/" + "/".join("*" if part is None else quote(part, safe="") for part in parts)

    def covers(
        self,
        tenant: str,
        application: str,
        definition: str,
        concurrency_key: str | None = None,
    ) -> bool:
        """Does the scope include work of this tenant, application, definition and key?"""
        return (
            self.tenant == tenant
            and self.application in (None, application)
            and self.definition in (None, definition)
            and (self.concurrency_key is None or self.concurrency_key == concurrency_key)
        )


@dataclass(frozen=True, slots=True)
class PauseRecord:
    """A pause in force: its scope, since when, who paused it and why."""

    scope: PauseScope
    since: int
    actor: str
    reason: str | None = None
    request_id: str | None = None


def pause_from_row(row: Sequence[Any]) -> PauseRecord:
    """A `PauseRecord` from a row of the SQL stores' pause columns.

    The columns, in order: scope key, tenant, application, definition, since,
    actor, reason, request_id and concurrency_key (SQLite and PostgreSQL
    select them alike).
    """
    return PauseRecord(
        scope=PauseScope(row[1], row[2], row[3], row[8]),
        since=row[4],
        actor=row[5],
        reason=row[6],
        request_id=row[7],
    )


@runtime_checkable
class Pauses(Protocol):
    """A store that keeps operators' pauses of claiming, audited like every write.

    Such a store is the gate: `claim_candidates` and `claim_batch` never
    offer a document of a paused scope (its tenant; its tenant and
    application; or those and its definition, the `definition` index
    field), decided in the same query or critical section that finds them.
    """

    def set_pause(self, scope: PauseScope, pause: PauseRecord | None, audit: AuditRecord) -> bool:
        """Pause `scope` (`pause` given) or resume it (None), appending `audit`, atomically.

        Returns False, and writes nothing (no audit record either), when the
        scope already is in that condition (paused, or not paused).
        """
        ...

    def paused(self, tenant: str | None = None) -> list[PauseRecord]:
        """The pauses in force (of one tenant, or of all), by scope key."""
        ...


@runtime_checkable
class Purges(Protocol):
    """A store that deletes documents for retention, audited, without ever reusing a version.

    A purged key's last version is kept (a tombstone), so a document created
    again under that key continues from the next version: a key's versions
    still only grow, and a version still names one document. A write
    creates such a key only when its `expected_version` is the tombstone's
    version (the key absent, purged at exactly that version); a create
    expecting None is a `StoreConflict`, as a write expecting a version the
    key does not have is. (The authority reads the tombstone before it
    admits such a key again, and continues its fencing tokens past it.)
    """

    def purgeable(
        self, states: Sequence[str], after: str | None, limit: int
    ) -> Sequence[StoredDocument]:
        """Up to `limit` documents whose index state is one of `states`, by key, after `after`."""
        ...

    def purge(self, key: str, expected_version: int, audit: AuditRecord) -> bool:
        """Delete `key` if its committed version is `expected_version`, appending `audit`.

        Atomic: the document goes and the audit record (its `version` the
        deleted version + 1, as a write's would be) is appended, or nothing
        is written and it returns False (another writer changed the key, or
        it is gone). The version is kept as the key's tombstone.
        """
        ...


@runtime_checkable
class Tombstones(Protocol):
    """A store that says whether a key was ever purged: the tombstone its last purge left.

    The authority asks it before admitting a purged key again: the create
    names the tombstone as its expected version, and the new workload's
    fencing tokens continue past it. The periodic scheduler asks it, so that
    a tick whose workload was purged is not taken for one never admitted; an
    import asks it, so that a purged workload is not written back under
    versions its purge used. Required of a store that `Purges`.
    """

    def tombstone(self, key: str) -> int | None:
        """The version the last purge of `key` wrote (the deleted version + 1), or None.

        None when `key` was never purged. A key created again after its
        purge keeps its tombstone until it is purged again.
        """
        ...


class LocalWakeUps:
    """Wake-ups within one process: a store calls `notify` after each write that makes work READY.

    Only writes through the store object that owns it wake its signals; a
    waiter that must see other processes' writes too bounds its wait.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._counts: dict[tuple[str, str], int] = {}
        self._everyone = 0

    def notify(self, tenant: str, application: str) -> None:
        """Wake every signal of the scope."""
        with self._changed:
            key = (tenant, application)
            self._counts[key] = self._counts.get(key, 0) + 1
            self._changed.notify_all()

    def notify_all(self) -> None:
        """Wake every signal of every scope (a resumed pause may free work anywhere)."""
        with self._changed:
            self._everyone += 1
            self._changed.notify_all()

    def signal(self, tenant: str, application: str) -> WorkSignal:
        """A signal for the scope, woken by `notify` calls from now on."""
        return _LocalSignal(self, (tenant, application))

    def _count(self, key: tuple[str, str]) -> int:
        with self._changed:
            return self._counts.get(key, 0) + self._everyone


class _LocalSignal:
    def __init__(self, owner: LocalWakeUps, key: tuple[str, str]) -> None:
        self._owner = owner
        self._key = key
        self._seen = owner._count(key)

    def wait(self, timeout_s: float) -> bool:
        owner = self._owner

        def count() -> int:
            return owner._counts.get(self._key, 0) + owner._everyone

        with owner._changed:
            woken = owner._changed.wait_for(lambda: count() != self._seen, max(timeout_s, 0.0))
            self._seen = count()
        return woken

    def close(self) -> None:
        """Nothing to release."""
