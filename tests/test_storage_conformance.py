"""Every backend passes the public conformance suite, and the suite catches broken ones.

The suite is `workwarden.storage.testing`; here it runs, check by check,
against each backend of `tests/backends.py`, through its class-based form,
against `ForwardingStore` wrapping a backend, and against deliberately
broken stores that it must refuse, naming the check that caught each. The
check of concurrent `claim_batch` callers runs once more on SQLite and
PostgreSQL with each caller on its own store object (`reopen`), as separate
processes would be.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path

import pytest

from backends import BACKENDS
from pg import postgres_database
from workwarden.storage import (
    AuditRecord,
    ForwardingStore,
    IndexFields,
    MemoryStore,
    SQLiteStore,
    Store,
    StoreConflict,
    StoreFailure,
)
from workwarden.storage.base import (
    CandidateCursor,
    ChooseClaims,
    Pauses,
    Purges,
    StoredDocument,
    Tombstones,
    Write,
    WriteOutcome,
)
from workwarden.storage.postgres import PostgresStore
from workwarden.storage.testing import (
    CHECK_NAMES,
    ConformanceFailure,
    StoreConformance,
    run_store_conformance,
)


@pytest.mark.parametrize("check", CHECK_NAMES)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_passes_each_conformance_check(backend: str, check: str) -> None:
    with ExitStack() as stack:
        assert run_store_conformance(
            lambda: stack.enter_context(BACKENDS[backend]()), checks=[check]
        ) == (check,)


def test_the_whole_suite_runs_from_one_call() -> None:
    assert run_store_conformance(MemoryStore) == CHECK_NAMES


class TestTheConformanceClassRunsEveryCheck(StoreConformance):
    def make_store(self) -> Store:
        return MemoryStore()


def test_the_conformance_class_has_one_test_per_check() -> None:
    tests = {name for name in dir(StoreConformance) if name.startswith("test_")}
    assert tests == {f"test_{name}" for name in CHECK_NAMES}


def test_a_forwarding_store_passes_the_suite_over_a_memory_store() -> None:
    assert run_store_conformance(lambda: ForwardingStore(MemoryStore())) == CHECK_NAMES


def test_a_forwarding_store_passes_the_suite_over_a_sqlite_store(tmp_path: Path) -> None:
    numbers = itertools.count()
    assert (
        run_store_conformance(
            lambda: ForwardingStore(SQLiteStore(tmp_path / f"{next(numbers)}.db"))
        )
        == CHECK_NAMES
    )


def test_a_forwarding_store_writes_out_every_method_of_the_protocol() -> None:
    def public(cls: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("_")}

    assert public(ForwardingStore) == public(Store)
    assert isinstance(ForwardingStore(MemoryStore()), Store)


def test_an_unknown_check_name_is_refused() -> None:
    with pytest.raises(ValueError, match="no_such_check"):
        run_store_conformance(MemoryStore, checks=["no_such_check"])


class IgnoresTheExpectedVersion(MemoryStore):
    """Broken on purpose: every write wins, whatever version it expected."""

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        current = self.read(key)
        return super().write(
            key, document, index, None if current is None else current.version, audit
        )


class ForgetsTheAuditOfUpdates(MemoryStore):
    """Broken on purpose: an update writes its document but not its audit record."""

    def __init__(self) -> None:
        super().__init__()
        self._forgotten: set[int] = set()

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        version = super().write(key, document, index, expected_version, audit)
        if version > 1:
            self._forgotten.add(len(super().audit_log()))
        return version

    def audit_log(self, after: int = 0, limit: int | None = None) -> list[AuditRecord]:
        kept = [r for r in super().audit_log(after) if r.sequence not in self._forgotten]
        return kept if limit is None else kept[:limit]


def failures_of(factory: type[Store]) -> dict[str, str]:
    with pytest.raises(ConformanceFailure) as caught:
        run_store_conformance(factory)
    for name, why in caught.value.failures.items():
        assert f"- {name}: {why}" in str(caught.value)
    assert set(caught.value.passed) | set(caught.value.failures) == set(CHECK_NAMES)
    return caught.value.failures


def test_a_store_ignoring_the_expected_version_fails_the_suite() -> None:
    failures = failures_of(IgnoresTheExpectedVersion)
    assert {
        "require_absent_refuses_an_existing_key",
        "expected_version_must_match",
        "a_conflicting_write_changes_nothing",
        "concurrent_writers_win_once_per_version",
    } <= set(failures)
    assert "expected StoreConflict" in failures["expected_version_must_match"]


def test_a_store_writing_a_document_without_its_audit_record_fails_the_suite() -> None:
    failures = failures_of(ForgetsTheAuditOfUpdates)
    assert "each_write_appends_one_audit_record" in failures
    assert "number of audit records" in failures["each_write_appends_one_audit_record"]
    assert "expected_version_must_match" not in failures


class StaysOpenAfterClose(MemoryStore):
    """Broken on purpose: `close` releases nothing, and every later call still answers."""

    def close(self) -> None:
        pass


class CountsANegativeAfterFromTheEnd(MemoryStore):
    """Broken on purpose: `audit_log` slices its list, so `after=-3` is the last three records."""

    def audit_log(self, after: int = 0, limit: int | None = None) -> list[AuditRecord]:
        with self._lock:
            rows = list(self._audit[after:])
        return rows if limit is None else rows[:limit]


def test_a_store_still_answering_after_close_fails_the_suite() -> None:
    failures = failures_of(StaysOpenAfterClose)
    assert set(failures) == {"a_closed_store_refuses_reads_and_writes"}
    assert (
        "read after close: expected StoreFailure"
        in failures["a_closed_store_refuses_reads_and_writes"]
    )


def test_a_store_reading_a_negative_audit_bound_from_the_end_fails_the_suite() -> None:
    failures = failures_of(CountsANegativeAfterFromTheEnd)
    assert set(failures) == {"audit_log_refuses_a_negative_or_non_integer_bound"}
    assert (
        "audit_log(after=-1): expected WORKLOAD_INVALID, got 1 records"
        in failures["audit_log_refuses_a_negative_or_non_integer_bound"]
    )


class IgnoresTheListCursor(MemoryStore):
    """Broken on purpose: every page of `list_page` starts from the first document."""

    def list_page(
        self, tenant: str, application: str, limit: int, after: CandidateCursor | None = None
    ) -> Sequence[StoredDocument]:
        return super().list_page(tenant, application, limit)


def test_a_store_whose_list_pages_ignore_their_cursor_fails_the_suite() -> None:
    failures = failures_of(IgnoresTheListCursor)
    assert set(failures) == {"list_pages_walk_a_scope_in_list_order"}
    assert (
        "list_page walked by 1, against list" in failures["list_pages_walk_a_scope_in_list_order"]
    )


class AuditOfAPrefix(MemoryStore):
    """Broken on purpose: `audit_of` answers every key that starts with the one asked."""

    def audit_of(self, key: str) -> Sequence[AuditRecord]:
        return [record for record in self.audit_log() if record.key.startswith(key)]


def test_a_store_answering_other_keys_audit_records_fails_the_suite() -> None:
    failures = failures_of(AuditOfAPrefix)
    assert set(failures) == {"audit_of_a_key_is_its_records_of_the_log"}
    assert "a prefix of others" in failures["audit_of_a_key_is_its_records_of_the_log"]


class TailOldestFirst(MemoryStore):
    """Broken on purpose: `audit_tail` answers the last records oldest first."""

    def audit_tail(self, limit: int) -> Sequence[AuditRecord]:
        return list(reversed(super().audit_tail(limit)))


def test_a_store_whose_audit_tail_is_oldest_first_fails_the_suite() -> None:
    failures = failures_of(TailOldestFirst)
    assert set(failures) == {"recent_audit_is_the_end_of_the_log"}
    assert "audit_tail(5)" in failures["recent_audit_is_the_end_of_the_log"]


def test_a_closed_memory_store_fails_like_a_closed_sqlite_store(tmp_path: Path) -> None:
    memory, sqlite = MemoryStore(), SQLiteStore(tmp_path / "closed.db")
    for store in (memory, sqlite):
        store.close()
        with pytest.raises(StoreFailure, match="closed"):
            store.read("k")
        with pytest.raises(StoreFailure, match="closed"):
            store.audit_log()


def test_a_store_that_raises_fails_the_check_with_what_it_raised(tmp_path: Path) -> None:
    def closed_store() -> Store:
        store = SQLiteStore(tmp_path / "closed.db")
        store.close()
        return store

    with pytest.raises(ConformanceFailure) as caught:
        run_store_conformance(closed_store, checks=["versions_count_from_one"])
    assert "raised StoreFailure" in caught.value.failures["versions_count_from_one"]


def test_the_stateful_suites_factory_of_context_managers_runs_the_suite(tmp_path: Path) -> None:
    numbers = itertools.count()
    entered: list[Path] = []

    @contextmanager
    def fresh_store() -> Iterator[Store]:
        path = tmp_path / f"{next(numbers)}.db"
        entered.append(path)
        yield SQLiteStore(path)
        path.unlink()

    checks = ["versions_count_from_one", "a_closed_store_refuses_reads_and_writes"]
    assert run_store_conformance(fresh_store, checks=checks) == tuple(checks)
    assert len(entered) == 2
    assert not any(path.exists() for path in entered)


class RaisesOnClose(MemoryStore):
    """Broken on purpose: `close` closes, then raises."""

    def close(self) -> None:
        super().close()
        raise RuntimeError("the connection pool would not drain")


def test_a_factory_of_no_store_or_a_close_that_raises_fails_the_checks_naming_why() -> None:
    checks = ["versions_count_from_one", "expected_version_must_match"]
    with pytest.raises(ConformanceFailure) as caught:
        run_store_conformance(lambda: None, checks=checks)  # type: ignore[arg-type, return-value]
    assert set(caught.value.failures) == set(checks)
    assert "the factory returned NoneType, not a store" in str(caught.value)
    with pytest.raises(ConformanceFailure) as caught:
        run_store_conformance(lambda: MemoryStore, checks=checks)  # type: ignore[arg-type, return-value]
    assert "the factory returned the class MemoryStore, not a store" in str(caught.value)
    with pytest.raises(ConformanceFailure) as caught:
        run_store_conformance(RaisesOnClose, checks=checks)
    assert caught.value.failures == dict.fromkeys(
        checks, "closing the store raised RuntimeError: the connection pool would not drain"
    )


# -- batches: each caller on its own store object, and broken batch stores ---------------

Opened = tuple[Callable[[], Store], Callable[[Store], Store] | None]


@contextmanager
def sqlite_files(directory: Path) -> Iterator[Opened]:
    yield (
        lambda: SQLiteStore(directory / "store.db"),
        lambda store: SQLiteStore(directory / "store.db"),
    )


@contextmanager
def postgres_databases() -> Iterator[Opened]:
    with postgres_database() as dsn, ExitStack() as stack:
        yield (
            lambda: stack.enter_context(closing(PostgresStore(dsn))),
            lambda store: PostgresStore(dsn),
        )


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_concurrent_claim_batches_on_store_objects_of_their_own_never_share_a_document(
    backend: str, tmp_path: Path
) -> None:
    opened = sqlite_files(tmp_path) if backend == "sqlite" else postgres_databases()
    with opened as (factory, reopen):
        check = "concurrent_claim_batches_never_choose_one_document_twice"
        assert run_store_conformance(factory, checks=[check], reopen=reopen) == (check,)


class GoesOnAfterAConflictWritingNothing(MemoryStore):
    """Broken on purpose: after the first conflict of a batch, the rest are dropped as conflicts."""

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        outcomes: list[WriteOutcome] = []
        for write in writes:
            if outcomes and not isinstance(outcomes[-1], int):
                outcomes.append(StoreConflict("dropped"))
                continue
            outcomes += super().write_many([write])
        return outcomes


class OffersEveryCandidateAtOnce(MemoryStore):
    """Broken on purpose: `claim_batch` offers one page of every candidate, whatever `limit`."""

    def claim_batch(
        self, tenant: str, application: str, now: int, limit: int, choose: ChooseClaims
    ) -> list[tuple[Write, WriteOutcome]]:
        chosen = list(choose(self.claim_candidates(tenant, application, now, 10_000)))
        return list(zip(chosen, self.write_many(chosen), strict=True))


class ClaimsWithoutHoldingThePages(MemoryStore):
    """Broken on purpose: pages are read, chosen from and written in three separate steps."""

    def claim_batch(
        self, tenant: str, application: str, now: int, limit: int, choose: ChooseClaims
    ) -> list[tuple[Write, WriteOutcome]]:
        chosen = list(choose(self.claim_candidates(tenant, application, now, limit)))
        return list(zip(chosen, self.write_many(chosen), strict=True))


def test_a_batch_store_dropping_the_writes_after_a_conflict_fails_the_suite() -> None:
    failures = failures_of(GoesOnAfterAConflictWritingNothing)
    assert "write_many_conflict_leaves_the_others_committed" in failures
    assert (
        "the write after the conflicts"
        in failures["write_many_conflict_leaves_the_others_committed"]
    )


def test_a_batch_store_offering_every_candidate_at_once_fails_the_suite() -> None:
    failures = failures_of(OffersEveryCandidateAtOnce)
    assert {
        "claim_batch_offers_pages_in_claim_order",
        "claim_batch_stops_at_a_short_page",
    } <= set(failures)
    assert "CLAIM_PAGES" in failures["claim_batch_offers_pages_in_claim_order"]


def test_a_batch_store_not_holding_its_pages_offers_one_document_to_two_callers() -> None:
    check = "concurrent_claim_batches_never_choose_one_document_twice"
    # A race: the callers meet at a barrier and hold each page for 2 ms, so
    # the first tries nearly always overlap; five tries make a miss unheard of.
    for _ in range(5):
        try:
            run_store_conformance(ClaimsWithoutHoldingThePages, checks=[check])
        except ConformanceFailure as failure:
            why = failure.failures[check]
            break
    else:
        pytest.fail("five races of a store not holding its pages all passed the check")
    assert "offered to two claim_batch callers" in why


# -- pauses and purges: every backend offers them, and broken ones are caught -------------


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_keeps_pauses_and_purges_so_their_checks_run(backend: str) -> None:
    with BACKENDS[backend]() as store:
        assert isinstance(store, Pauses)
        assert isinstance(store, Purges)
        assert isinstance(store, Tombstones)


class ForgetsTombstones(MemoryStore):
    """Broken on purpose: a purged key's version is forgotten, so a new document starts at 1."""

    def purge(self, key: str, expected_version: int, audit: AuditRecord) -> bool:
        purged = super().purge(key, expected_version, audit)
        self._tombstones.clear()
        return purged


class IgnoresDefinitionPauses(MemoryStore):
    """Broken on purpose: the claim gate sees the pauses of tenants and applications only."""

    def _claimable(self, tenant: str, application: str, now: int) -> list[StoredDocument]:
        kept = self._pauses
        self._pauses = {key: p for key, p in kept.items() if p.scope.definition is None}
        try:
            return super()._claimable(tenant, application, now)
        finally:
            self._pauses = kept


class ForgetsTombstonesWithoutSaying(ForgetsTombstones):
    """Broken on purpose, as `ForgetsTombstones`, and offering no `Tombstones` to be asked."""

    tombstone = None  # type: ignore[assignment]


class CreatesOverTombstones(MemoryStore):
    """Broken on purpose: a create expecting "never written" of a purged key is taken.

    The authority then could not tell it must continue the purged workload's
    fencing tokens (it learns of the purge from the conflict).
    """

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        if expected_version is None and self.read(key) is None:
            expected_version = self.tombstone(key)
        return super().write(key, document, index, expected_version, audit)


def test_a_store_that_purges_but_keeps_no_tombstones_fails_the_suite() -> None:
    assert not isinstance(ForgetsTombstonesWithoutSaying(), Tombstones)
    failures = failures_of(ForgetsTombstonesWithoutSaying)
    assert set(failures) == {"a_key_created_again_after_a_purge_continues_its_versions"}
    assert (
        "a store that purges says each purged key's tombstone"
        in failures["a_key_created_again_after_a_purge_continues_its_versions"]
    )


def test_a_store_creating_a_purged_key_unaware_of_its_purge_fails_the_suite() -> None:
    failures = failures_of(CreatesOverTombstones)
    assert set(failures) == {"a_key_created_again_after_a_purge_continues_its_versions"}
    assert (
        "a create of a purged key expecting None (its tombstone is 3)"
        in failures["a_key_created_again_after_a_purge_continues_its_versions"]
    )


def test_a_store_whose_tombstones_say_a_purged_key_was_never_purged_fails_the_suite() -> None:
    failures = failures_of(ForgetsTombstones)
    assert set(failures) == {"a_key_created_again_after_a_purge_continues_its_versions"}
    assert (
        "the tombstone of a key purged at version 2: expected 3, got None"
        in failures["a_key_created_again_after_a_purge_continues_its_versions"]
    )


def test_a_store_offering_work_of_a_paused_definition_fails_the_suite() -> None:
    failures = failures_of(IgnoresDefinitionPauses)
    assert set(failures) == {"claims_leave_out_paused_scopes_at_each_level"}
    assert (
        "while pause/t/a/d1 is paused" in failures["claims_leave_out_paused_scopes_at_each_level"]
    )
