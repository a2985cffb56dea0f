"""Every backend passes the public conformance suite, and the suite catches broken ones.

The suite is `workwarden.storage.testing`; here it runs, check by check,
against each backend of `tests/backends.py`, through its class-based form,
against `ForwardingStore` wrapping a backend, and against two deliberately
broken stores that it must refuse, naming the check that caught each.
"""

from __future__ import annotations

import itertools
from contextlib import ExitStack
from pathlib import Path

import pytest

from backends import BACKENDS
from workwarden.storage import (
    AuditRecord,
    ForwardingStore,
    IndexFields,
    MemoryStore,
    SQLiteStore,
    Store,
)
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


def test_a_store_that_raises_fails_the_check_with_what_it_raised(tmp_path: Path) -> None:
    def closed_store() -> Store:
        store = SQLiteStore(tmp_path / "closed.db")
        store.close()
        return store

    with pytest.raises(ConformanceFailure) as caught:
        run_store_conformance(closed_store, checks=["versions_count_from_one"])
    assert "raised StoreFailure" in caught.value.failures["versions_count_from_one"]
