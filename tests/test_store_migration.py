"""Exporting a store to JSON Lines and importing it into another, from Python and the CLI.

The source is a SQLite store holding workloads in several states; the target
is each backend of `tests/backends.py` in turn. An export imported elsewhere
exports the same bytes, importing twice changes nothing, and a file that
conflicts with the target changes nothing and names the workload.

Then the schema upgrade: a SQLite file or a PostgreSQL database of schema
version 2 (no definition column, no pauses, no tombstones) opened by this
release is brought to version 3, each document's definition filled in from
the document, and pauses and purges work on it at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backends import BACKENDS
from pg import postgres_database, postgres_url
from support import CAPS, request, store_snapshot
from support import authority as make_authority
from workwarden.cli import main
from workwarden.migrate import (
    MAX_IMPORT_VERSION,
    export_lines,
    export_workloads,
    import_workloads,
)
from workwarden.statemachine import Timeouts, WorkloadError
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.models import Workload
from workwarden.statemachine.spec import default_spec
from workwarden.storage import (
    AuditRecord,
    ForwardingStore,
    IndexFields,
    SQLiteStore,
    Store,
    StoreFailure,
)
from workwarden.storage.base import Pauses, Purges, StoredDocument, Tombstones
from workwarden.storage.pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from workwarden.storage.pg_schema import TABLES as PG_TABLES
from workwarden.storage.pg_schema import OlderSchema, drop_schema_written_only_by
from workwarden.storage.postgres import PostgresStore
from workwarden.storage.sqlite_schema import SCHEMA_VERSION

NOW = 99_000


def populate(store: Store) -> list[str]:
    """Queued, deferred, leased, succeeded and retrying workloads, in two applications."""
    authority = make_authority(store)
    ids = []
    for number in range(6):
        changes: dict[str, Any] = {
            "idempotency_key": f"key-{number}",
            "priority": number % 3,
            "input": {"n": number, "text": "naïve ☃"},
            "timeouts": Timeouts(heartbeat_ms=5_000),
        }
        if number == 1:
            changes["not_before"] = 30_000
        if number == 5:
            changes["application_id"] = "other"
        ids.append(authority.admit(request(**changes), now=10_000 + number).workload.workload_id)
    leased = authority.claim(ids[2], "w1", CAPS, now=11_000, lease_ms=10_000)
    authority.start(ids[2], leased.fence, now=11_500)
    done = authority.claim(ids[3], "w2", CAPS, now=12_000, lease_ms=10_000)
    authority.start(ids[3], done.fence, now=12_500)
    authority.complete(ids[3], done.fence, "result-3", {"ok": True}, now=13_000)
    failed = authority.claim(ids[4], "w3", CAPS, now=12_000, lease_ms=10_000)
    authority.fail(ids[4], failed.fence, "timeout", "slow", now=12_100)
    return ids


@pytest.fixture
def source(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "source.db") as store:
        populate(store)
        yield store


@pytest.fixture(params=sorted(BACKENDS))
def target(request: pytest.FixtureRequest) -> Iterator[Store]:
    with BACKENDS[request.param]() as store:
        yield store


def exported(store: Store) -> str:
    out = io.StringIO()
    export_workloads(store, out)
    return out.getvalue()


def test_an_export_is_json_lines_sorted_by_key_and_the_same_every_time(
    source: SQLiteStore,
) -> None:
    text = exported(source)
    assert text == exported(source)
    assert text.isascii()
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    keys = [line["key"] for line in lines]
    assert keys == sorted(keys) == sorted(doc.key for doc in source.scan())
    for line in lines:
        stored = source.read(line["key"])
        assert stored is not None
        assert line == {
            "key": stored.key,
            "version": stored.version,
            "document": json.loads(stored.document),
        }


def test_an_export_imported_elsewhere_exports_the_same_bytes(
    source: SQLiteStore, target: Store
) -> None:
    text = exported(source)
    report = import_workloads(target, text.splitlines(), now=NOW)
    assert sorted(report.imported) == sorted(doc.key for doc in source.scan())
    assert report.skipped == ()
    assert exported(target) == text


def test_imported_workloads_answer_every_index_query_as_in_the_source(
    source: SQLiteStore, target: Store
) -> None:
    import_workloads(target, exported(source).splitlines(), now=NOW)
    for doc in source.scan():
        copy = target.read(doc.key)
        assert copy is not None
        assert (copy.version, copy.document, copy.index) == (doc.version, doc.document, doc.index)
    for now in (0, 10_003, 16_000, 30_000, 2**53 - 1):
        assert target.claim_candidates("t", "app", now, 100) == source.claim_candidates(
            "t", "app", now, 100
        )
        assert target.expired_leases(now, 100) == source.expired_leases(now, 100)
        assert target.deadlines_due(now, 100) == source.deadlines_due(now, 100)
    assert target.find_result("result-3") == source.find_result("result-3")


def test_every_imported_version_is_audited_as_an_import(source: SQLiteStore, target: Store) -> None:
    import_workloads(target, exported(source).splitlines(), now=NOW, actor="operator-7")
    records = list(target.audit_log())
    assert {(r.operation, r.actor, r.at) for r in records} == {("import", "operator-7", NOW)}
    for doc in target.scan():
        mine = [r for r in records if r.key == doc.key]
        assert [r.version for r in mine] == list(range(1, doc.version + 1))
        workload = Workload.model_validate_json(doc.document)
        assert {(r.tenant, r.application) for r in mine} == {
            (workload.tenant_id, workload.application_id)
        }


def test_importing_the_same_file_twice_changes_nothing(source: SQLiteStore, target: Store) -> None:
    lines = exported(source).splitlines()
    first = import_workloads(target, lines, now=NOW)
    before = store_snapshot(target)
    again = import_workloads(target, lines, now=NOW + 1)
    assert again.imported == ()
    assert sorted(again.skipped) == sorted(first.imported)
    assert store_snapshot(target) == before


def carry_on(store: Store) -> list[tuple[str, int, str]]:
    """Recover, enforce deadlines, then claim and complete whatever can be claimed."""
    authority = make_authority(store)
    authority.recover_expired(now=NOW)
    authority.enforce_deadlines(now=NOW)
    for application in ("app", "other"):
        while claim := authority.claim_next("t", application, "w9", CAPS, now=NOW, lease_ms=1_000):
            authority.start(claim.workload_id, claim.fence, now=NOW)
            result = f"r-{claim.workload_id}"
            authority.complete(claim.workload_id, claim.fence, result, {"ok": 1}, now=NOW)
    return [(doc.key, doc.version, doc.document) for doc in store.scan()]


def test_imported_workloads_carry_on_exactly_as_the_originals(
    source: SQLiteStore, target: Store
) -> None:
    import_workloads(target, exported(source).splitlines(), now=NOW)
    after = carry_on(source)
    assert carry_on(target) == after
    assert any('"state":"SUCCEEDED"' in document for _, _, document in after)


def overwrite(store: Store, key: str, workload: Workload) -> None:
    """Commit `workload` under `key` as the next version, as another writer would."""
    present = store.read(key)
    assert present is not None
    audit = AuditRecord("tx-other", key, 0, "other", "write", "t", "app", NOW, "digest")
    document = workload.model_dump_json(by_alias=True)
    index = index_fields(default_spec(), workload)
    store.write(key, document, index, present.version, audit)


def test_a_conflicting_file_imports_nothing_and_names_the_workload(
    source: SQLiteStore, target: Store
) -> None:
    lines = exported(source).splitlines()
    chosen = json.loads(lines[2])
    # The target already holds that workload, changed since the export.
    import_workloads(target, [lines[2]], now=NOW)
    workload = Workload.model_validate(chosen["document"])
    overwrite(target, chosen["key"], workload.model_copy(update={"updated_at": NOW}))
    before = store_snapshot(target)
    with pytest.raises(WorkloadError) as refused:
        import_workloads(target, lines, now=NOW)
    assert refused.value.code == "WORKLOAD_MIGRATION_CONFLICT"
    assert chosen["key"] in refused.value.message
    assert refused.value.details is not None
    assert refused.value.details["workload_id"] == chosen["key"]
    assert store_snapshot(target) == before


def test_a_workload_whose_result_id_is_taken_imports_nothing(
    source: SQLiteStore, target: Store
) -> None:
    lines = exported(source).splitlines()
    holder = next(line for line in lines if '"result_id":"result-3"' in line)
    # Another workload of the target already holds the same result id.
    other = Workload.model_validate(json.loads(holder)["document"])
    other = other.model_copy(update={"workload_id": "wl_somebody_else"})
    document = json.loads(other.model_dump_json(by_alias=True))
    line = json.dumps({"key": "wl_somebody_else", "version": 1, "document": document})
    import_workloads(target, [line], now=NOW)
    before = store_snapshot(target)
    with pytest.raises(WorkloadError) as refused:
        import_workloads(target, lines, now=NOW)
    assert refused.value.code == "WORKLOAD_MIGRATION_CONFLICT"
    assert "result-3" in refused.value.message
    assert store_snapshot(target) == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: an export line is an object"),
        ('{"key": "k", "version": 1}', "line 2: an export line is an object"),
        ('{"key": "", "version": 1, "document": {}}', "line 2: key must be"),
        ('{"key": "k", "version": 0, "document": {}}', "line 2: version must be"),
        ('{"key": "k", "version": true, "document": {}}', "line 2: version must be"),
        ('{"key": "k", "version": 1, "document": {"state": "READY"}}', "line 2: document."),
    ],
)
def test_a_malformed_line_is_refused_by_its_number_and_nothing_is_imported(
    source: SQLiteStore, target: Store, line: str, message: str
) -> None:
    lines = exported(source).splitlines()
    with pytest.raises(WorkloadError, match=message) as refused:
        import_workloads(target, [lines[0], line, *lines[1:]], now=NOW)
    assert refused.value.code == "WORKLOAD_INVALID"
    assert list(target.scan()) == []
    assert list(target.audit_log()) == []


def test_a_line_whose_key_is_not_its_workload_is_refused(
    source: SQLiteStore, target: Store
) -> None:
    first, second = exported(source).splitlines()[:2]
    swapped = json.loads(first)
    swapped["key"] = json.loads(second)["key"]
    with pytest.raises(WorkloadError, match=r"line 1: key .* is not the document's workload_id"):
        import_workloads(target, [json.dumps(swapped)], now=NOW)
    assert list(target.scan()) == []


def test_a_workload_twice_in_one_file_is_refused(source: SQLiteStore, target: Store) -> None:
    lines = exported(source).splitlines()
    with pytest.raises(WorkloadError, match=r"line 3: workload .* is also on line 1"):
        import_workloads(target, [lines[0], lines[1], lines[0]], now=NOW)
    assert list(target.scan()) == []


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"now": 2**53}, "now"),
        ({"now": 2**63}, "now"),
        ({"spec": "specs/workload.toml"}, "spec"),
        ({"store": None}, "store"),
        ({"store": "work.db"}, "store"),
    ],
)
def test_a_bad_argument_is_refused_naming_it_and_nothing_is_imported(
    source: SQLiteStore, target: Store, arguments: dict[str, Any], field: str
) -> None:
    before = store_snapshot(target)
    call: dict[str, Any] = {"store": target, "now": NOW, **arguments}
    store = call.pop("store")
    with pytest.raises(WorkloadError) as caught:
        import_workloads(store, exported(source).splitlines(), **call)
    assert caught.value.code == "WORKLOAD_INVALID"
    assert caught.value.details["field"] == field
    assert store_snapshot(target) == before


def test_blank_lines_are_ignored(source: SQLiteStore, target: Store) -> None:
    lines = export_lines(source)
    report = import_workloads(target, ["", *(f"{line}\n\n" for line in lines), "  "], now=NOW)
    assert len(report.imported) == len(list(source.scan()))


def _at_version(line: str, version: int) -> str:
    return json.dumps({**json.loads(line), "version": version})


@pytest.mark.parametrize("version", [MAX_IMPORT_VERSION + 1, 2**63 - 1])
def test_a_version_above_the_most_an_import_writes_is_refused_and_nothing_is_imported(
    source: SQLiteStore, target: Store, version: int
) -> None:
    lines = exported(source).splitlines()
    with pytest.raises(WorkloadError, match=r"line 2: version .* is above the most") as refused:
        import_workloads(target, [lines[0], _at_version(lines[1], version)], now=NOW)
    assert refused.value.code == "WORKLOAD_INVALID"
    assert list(target.scan()) == []
    assert list(target.audit_log()) == []


def test_the_same_workload_at_another_version_is_a_conflict_not_already_present(
    source: SQLiteStore, target: Store
) -> None:
    lines = exported(source).splitlines()
    import_workloads(target, lines, now=NOW)
    before = store_snapshot(target)
    key, version = json.loads(lines[2])["key"], json.loads(lines[2])["version"]
    for other in (version + 1, version - 1):
        if other < 1:
            continue
        with pytest.raises(WorkloadError) as refused:
            import_workloads(target, [*lines[:2], _at_version(lines[2], other)], now=NOW + 1)
        assert refused.value.code == "WORKLOAD_MIGRATION_CONFLICT"
        assert f"is already present at version {version}, not at" in refused.value.message
        assert refused.value.details is not None
        assert refused.value.details["workload_id"] == key
        assert store_snapshot(target) == before


class _StopsAfter(ForwardingStore):
    """A store whose writes stop succeeding after `count` of them, as a killed import's do."""

    def __init__(self, inner: Store, count: int) -> None:
        super().__init__(inner)
        self.count = count

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        if self.count == 0:
            raise StoreFailure("the import was stopped here")
        self.count -= 1
        return super().write(key, document, index, expected_version, audit)


class _FailsToRead(ForwardingStore):
    """A store whose second read fails, as one whose server went away does."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reads = 0

    def read(self, key: str) -> StoredDocument | None:
        self.reads += 1
        if self.reads > 1:
            raise StoreFailure("the server went away")
        return super().read(key)


def test_an_import_stopped_part_way_is_finished_by_running_it_again(
    source: SQLiteStore, target: Store
) -> None:
    lines = exported(source).splitlines()
    # Stopped in the middle of the versions of the workload with the most of them.
    versions = [json.loads(line)["version"] for line in lines]
    longest = versions.index(max(versions))
    stop_at = sum(versions[:longest]) + 1
    with pytest.raises(WorkloadError) as stopped:
        import_workloads(_StopsAfter(target, stop_at), lines, now=NOW)
    assert stopped.value.code == "WORKLOAD_STORAGE_FAILURE"
    partial = target.read(json.loads(lines[longest])["key"])
    assert partial is not None
    assert partial.version == 1 < versions[longest]

    report = import_workloads(target, lines, now=NOW + 1)

    assert exported(target) == exported(source)
    assert len(report.imported) == len(lines) - longest
    assert sorted(report.skipped) == sorted(json.loads(line)["key"] for line in lines[:longest])


def test_lines_given_once_as_an_iterator_import_as_a_list_of_them_does(
    source: SQLiteStore, target: Store
) -> None:
    # A generator is read once: the import keeps a copy to write from after checking
    # every line, and a line holding what a newline-separated copy could split (a
    # newline inside a string of the caller's, escaped or not) reads back the same.
    lines = exported(source).splitlines()
    taken: list[int] = []

    def once() -> Iterator[str]:
        for number, line in enumerate(lines):
            taken.append(number)
            yield line

    report = import_workloads(target, once(), now=NOW)
    assert taken == list(range(len(lines)))
    assert len(report.imported) == len(lines)
    assert exported(target) == exported(source)


class _Rereadable:
    """Lines read again each time they are iterated; the second reading can differ."""

    def __init__(self, first: list[str], second: list[str]) -> None:
        self.readings = [first, second]

    def __iter__(self) -> Iterator[str]:
        return iter(self.readings.pop(0) if len(self.readings) > 1 else self.readings[0])


def test_an_export_that_changes_between_the_check_and_the_writes_stops_at_the_changed_line(
    source: SQLiteStore, target: Store
) -> None:
    lines = exported(source).splitlines()
    changed = list(lines)
    changed[3] = changed[3].replace('"version":', '"version": ', 1)  # the same JSON, other text
    with pytest.raises(WorkloadError) as stopped:
        import_workloads(target, _Rereadable(lines, changed), now=NOW)
    assert stopped.value.code == "WORKLOAD_MIGRATION_CONFLICT"
    assert stopped.value.details["line"] == 4
    keys = [json.loads(line)["key"] for line in lines]
    assert list(stopped.value.details["imported"]) == keys[:3]
    assert [target.read(key) is not None for key in keys] == [True] * 3 + [False] * (len(keys) - 3)
    # Run again on the file as it now is, the import finishes.
    report = import_workloads(target, changed, now=NOW + 1)
    assert list(report.skipped) == keys[:3]
    assert exported(target) == exported(source)


def test_an_export_shorter_when_read_again_is_refused_after_the_lines_it_still_holds(
    source: SQLiteStore, target: Store
) -> None:
    lines = exported(source).splitlines()
    with pytest.raises(WorkloadError) as stopped:
        import_workloads(target, _Rereadable(lines, lines[:2]), now=NOW)
    assert stopped.value.code == "WORKLOAD_MIGRATION_CONFLICT"
    assert "shorter" in stopped.value.message
    assert len(stopped.value.details["imported"]) == 2


def test_a_malformed_line_is_refused_even_after_the_store_failed_on_an_earlier_one(
    source: SQLiteStore, target: Store
) -> None:
    # Every line is checked before a store failure is reported, as before any write.
    lines = exported(source).splitlines()
    lines.append("{not json")
    before = store_snapshot(target)
    with pytest.raises(WorkloadError) as refused:
        import_workloads(_FailsToRead(target), lines, now=NOW)
    assert refused.value.code == "WORKLOAD_INVALID"
    assert refused.value.details["line"] == len(lines)
    assert store_snapshot(target) == before
    with pytest.raises(WorkloadError) as failed:
        import_workloads(_FailsToRead(target), lines[:-1], now=NOW)
    assert failed.value.code == "WORKLOAD_STORAGE_FAILURE"
    assert store_snapshot(target) == before


def test_the_command_line_imports_from_standard_input(source: SQLiteStore, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    done = subprocess.run(
        [sys.executable, "-m", "workwarden", "import", "--store", str(copy), "--create", "-"],
        input=exported(source).encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"imported 6 workload(s)" in done.stdout
    with SQLiteStore(copy) as target:
        assert exported(target) == exported(source)


def test_the_command_line_names_the_offset_of_a_byte_that_is_not_utf8(
    source: SQLiteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = exported(source).encode()
    second = text.index(b"\n") + 1
    dump = tmp_path / "work.jsonl"
    dump.write_bytes(text[: second + 5] + b"\xff" + text[second + 5 :])
    copy = tmp_path / "copy.db"
    assert main(["import", "--store", str(copy), "--create", str(dump)]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"WORKWARDEN_INPUT_UNREADABLE: the export {dump} is not UTF-8 text"
        f" (byte {second + 5} is 0xff)"
    )
    assert not copy.exists()


# -- the command line -------------------------------------------------------------------


def test_the_command_line_exports_and_imports_between_files(
    source: SQLiteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "work.jsonl"
    assert main(["export", "--store", f"sqlite://{source.path}", "--out", str(dump)]) == 0
    assert dump.read_text(encoding="ascii") == exported(source)
    assert capsys.readouterr().err == f"exported 6 workload(s) to {dump}\n"
    copy = tmp_path / "copy.db"
    assert main(["import", "--store", str(copy), str(dump)]) == 1
    assert capsys.readouterr().err.startswith(f"WORKLOAD_STORE_NOT_FOUND: no store at {copy}")
    assert not copy.exists()
    assert main(["import", "--store", str(copy), "--create", str(dump)]) == 0
    assert "imported 6 workload(s), skipped 0 already present" in capsys.readouterr().out
    assert main(["import", "--store", f"sqlite:{copy}", str(dump)]) == 0
    assert "imported 0 workload(s), skipped 6 already present" in capsys.readouterr().out
    assert main(["export", "--store", str(copy)]) == 0
    assert capsys.readouterr().out == dump.read_text(encoding="ascii")


def test_an_export_written_as_utf8_with_line_separators_in_its_strings_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # JSON lets U+2028, U+2029 and U+0085 stand unescaped in a string, and tools that
    # rewrite JSON Lines as UTF-8 (`jq -c`) leave them so: only a newline ends a line.
    with SQLiteStore(tmp_path / "source.db") as source:
        make_authority(source).admit(
            request(input={"note": "one\u2028two\u2029three\x85four\x1cfive"}), now=10_000
        )
        text = exported(source)
    dump = tmp_path / "work.jsonl"
    dump.write_text(
        "".join(
            json.dumps(json.loads(line), ensure_ascii=False) + "\n" for line in text.splitlines()
        ),
        encoding="utf-8",
    )
    copy = tmp_path / "copy.db"
    assert main(["import", "--store", str(copy), "--create", str(dump)]) == 0, capsys.readouterr()
    assert "imported 1 workload(s)" in capsys.readouterr().out
    with SQLiteStore(copy) as target:
        assert exported(target) == text


def test_the_command_line_reports_a_conflict_and_imports_nothing(
    source: SQLiteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = exported(source).splitlines()
    copy = tmp_path / "copy.db"
    key = json.loads(lines[0])["key"]
    with SQLiteStore(copy) as target:
        import_workloads(target, lines[:1], now=NOW)
        present = target.read(key)
        assert present is not None
        workload = Workload.model_validate_json(present.document)
        overwrite(target, key, workload.model_copy(update={"priority": workload.priority + 1}))
        before = store_snapshot(target)
    dump = tmp_path / "work.jsonl"
    dump.write_text("\n".join(lines) + "\n", encoding="ascii")
    assert main(["import", "--store", str(copy), str(dump)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"WORKLOAD_MIGRATION_CONFLICT: workload {key} is already present")
    with SQLiteStore(copy) as target:
        assert store_snapshot(target) == before


def test_the_command_line_refuses_an_unknown_store_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--store", "ftp://example/store"]) == 1
    assert capsys.readouterr().err.startswith(
        "WORKLOAD_STORE_URL_INVALID: unknown store URL scheme 'ftp'"
    )


def test_the_command_line_refuses_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["import", "--store", "memory:", str(tmp_path / "missing.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("WORKWARDEN_INPUT_UNREADABLE: cannot read the export ")
    assert "missing.jsonl" in err


def test_a_refused_import_into_a_new_store_leaves_no_file_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "work.jsonl"
    dump.write_text('{"key": "k", "version": 1, "document": {"not": "a workload"}}\n')
    copy = tmp_path / "copy.db"
    assert main(["import", "--store", str(copy), "--create", str(dump)]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work.jsonl"]


def _workwarden_tables(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'workwarden%' ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.postgres
def test_a_refused_import_into_a_postgres_database_it_prepared_leaves_no_tables(
    source: SQLiteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "work.jsonl"
    dump.write_text(exported(source) + "{not json\n")
    with postgres_database(schema=False) as dsn:
        url = postgres_url(dsn)
        assert main(["import", "--store", url, "--create", str(dump)]) == 1
        assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: line ")
        assert _workwarden_tables(dsn) == []
        # Into the store another writer made and wrote to, a refused import drops nothing.
        with contextlib.closing(PostgresStore(dsn)) as store:
            populate(store)
            before = committed(store)
            assert main(["import", "--store", url, "--create", str(dump)]) == 1
            assert committed(store) == before
            with store.connection() as conn:
                assert not drop_schema_written_only_by(conn, "import")
            assert committed(store) == before
        assert len(_workwarden_tables(dsn)) == len(PG_TABLES)


def test_sigterm_stops_an_import_and_a_store_it_created_is_removed(
    source: SQLiteStore, tmp_path: Path
) -> None:
    lines = exported(source).splitlines()
    dump = tmp_path / "work.jsonl"
    # A long import: one workload written at its most versions, one commit each.
    dump.write_text(_at_version(lines[0], MAX_IMPORT_VERSION) + "\n", encoding="ascii")
    copy = tmp_path / "copy.db"
    importing = subprocess.Popen(
        [sys.executable, "-m", "workwarden", "import", "--store", str(copy), "--create", str(dump)],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not copy.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # well into its writes
    importing.send_signal(signal.SIGTERM)
    _, stderr = importing.communicate(timeout=60)
    assert importing.returncode == 143, stderr
    assert b"Traceback" not in stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("copy.db")] == []


# -- the schema upgrade: version 2 to version 3 ------------------------------------------


def committed(store: Store) -> list[tuple[str, int, str, Any]]:
    """Every document with its version, text and index fields, by key."""
    return [(doc.key, doc.version, doc.document, doc.index) for doc in store.scan()]


def works_after_the_upgrade(store: Store, before: list[tuple[str, int, str, Any]]) -> None:
    """The documents as they were, their definitions filled in; pauses and purges at work."""
    assert committed(store) == before
    assert {index.definition for _, _, _, index in before} == {"send"}
    assert isinstance(store, Pauses)
    assert isinstance(store, Purges)
    authority = make_authority(store)
    authority.pause("ops", NOW, tenant="t", application="app", definition="send")
    assert store.claim_candidates("t", "app", NOW, 100) == []
    authority.pause("ops", NOW, tenant="t", application="other", definition="other")
    assert [doc.key for doc in store.claim_candidates("t", "other", NOW, 100)] != []
    assert authority.resume("ops", NOW, tenant="t", application="app", definition="send")
    assert store.claim_candidates("t", "app", NOW, 100) != []
    done = next(doc for doc in store.scan() if doc.index.state == "SUCCEEDED")
    audit = AuditRecord("tx-purge", done.key, 0, "ops", "purge", "t", "app", NOW, "digest")
    assert store.purge(done.key, done.version, audit)
    assert store.find_result("result-3") is None
    again = AuditRecord("tx-again", done.key, 0, "ops", "import", "t", "app", NOW, "digest")
    # Created again by naming its tombstone (the purge's version), after it.
    assert isinstance(store, Tombstones)
    assert store.tombstone(done.key) == done.version + 1
    assert store.write(done.key, done.document, done.index, done.version + 1, again) == (
        done.version + 2
    )


def test_a_version_2_sqlite_file_is_brought_to_version_3_with_its_definitions(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v2.db"
    with SQLiteStore(path) as store:
        populate(store)
        before = committed(store)
    # What a file of schema version 2 was: no definition column, no pauses, no tombstones.
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TABLE pauses; DROP TABLE pause_versions; DROP TABLE tombstones;"
        " ALTER TABLE documents DROP COLUMN definition; UPDATE schema_version SET version = 2;"
    )
    conn.close()

    with SQLiteStore(path) as store:
        works_after_the_upgrade(store, before)
    conn = sqlite3.connect(path)
    # Brought to this release's version (3, or a later one that adds more).
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    conn.close()


def test_an_older_sqlite_file_opened_to_read_is_refused_as_older_until_a_write_upgrades_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "v2.db"
    with SQLiteStore(path) as store:
        populate(store)
        text = exported(store)
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TABLE pauses; DROP TABLE pause_versions; DROP TABLE tombstones;"
        " ALTER TABLE documents DROP COLUMN definition; UPDATE schema_version SET version = 2;"
    )
    conn.close()
    before = path.read_bytes()
    for command in (["export"], ["stats"], ["list", "t", "app"]):
        assert main([*command, "--store", str(path)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("WORKLOAD_STORE_UNUSABLE: "), err
        assert "schema version 2, older than this release's" in err
    assert path.read_bytes() == before
    # A command that writes brings it up to date; then it reads as it was.
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["import", "--store", str(path), str(empty)]) == 0
    assert main(["export", "--store", str(path)]) == 0
    assert capsys.readouterr().out.endswith(text)


def as_postgres_version_2(dsn: str) -> None:
    """Make the store's tables in `dsn` what schema version 2 had: no definition column, no
    pauses, no tombstones, and version 2 recorded."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE workwarden_pauses, workwarden_pause_versions")
        conn.execute("DROP TABLE workwarden_tombstones")
        conn.execute("ALTER TABLE workwarden_documents DROP COLUMN definition")
        conn.execute("DELETE FROM workwarden_schema_version")
        conn.execute("INSERT INTO workwarden_schema_version (version) VALUES (2)")


@pytest.mark.postgres
def test_an_older_postgres_database_opened_to_read_is_refused_and_left_as_it_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with postgres_database() as dsn:
        with contextlib.closing(PostgresStore(dsn)) as store:
            populate(store)
            text = exported(store)
        as_postgres_version_2(dsn)

        def tables() -> list[tuple[Any, ...]]:
            with psycopg.connect(dsn) as conn:
                return (
                    conn.execute(
                        "SELECT table_name, column_name FROM information_schema.columns"
                        " WHERE table_name LIKE 'workwarden_%' ORDER BY 1, 2"
                    ).fetchall()
                    + conn.execute(
                        "SELECT version FROM workwarden_schema_version ORDER BY 1"
                    ).fetchall()
                )

        before = tables()
        url = postgres_url(dsn)
        for command in (["export"], ["stats"], ["list", "t", "app"]):
            assert main([*command, "--store", url]) == 1
            err = capsys.readouterr().err
            assert err.startswith("WORKLOAD_STORE_UNUSABLE: "), err
            assert "schema version 2, older than this release's" in err
        with pytest.raises(OlderSchema):
            PostgresStore(dsn, upgrade=False)
        assert tables() == before
        # A store opened to write brings it up to date; then it reads as it was.
        PostgresStore(dsn).close()
        assert main(["export", "--store", url]) == 0
        assert capsys.readouterr().out.endswith(text)


@pytest.mark.postgres
def test_a_version_2_postgres_database_is_brought_to_version_3_with_its_definitions() -> None:
    with postgres_database() as dsn:
        with contextlib.closing(PostgresStore(dsn)) as store:
            populate(store)
            before = committed(store)
        as_postgres_version_2(dsn)

        with contextlib.closing(PostgresStore(dsn)) as store:
            works_after_the_upgrade(store, before)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT max(version) FROM workwarden_schema_version").fetchone()
            assert row == (PG_SCHEMA_VERSION,)


def _edited(line: str, **changes: Any) -> str:
    data = json.loads(line)
    data["document"].update(changes)
    return json.dumps(data)


def _leased_line(source: SQLiteStore) -> str:
    """The export line of the workload that holds a lease (RUNNING)."""
    return next(line for line in exported(source).splitlines() if '"state":"RUNNING"' in line)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"state": "BOGUS"}, "not valid under the spec"),
        ({"state": "CREATED"}, "not valid under the spec"),
        ({"priority": 2**40}, r"priority is outside -2\*\*31 to 2\*\*31 - 1"),
        ({"attempt_count": -7}, r"attempt_count is -7, outside 0 to 2\*\*53 - 1"),
        ({"fencing_token": 2**70}, r"fencing_token is \d+, outside 0 to 2\*\*53 - 1"),
    ],
)
def test_a_document_the_core_could_not_carry_on_with_is_refused_and_nothing_is_imported(
    source: SQLiteStore, target: Store, changes: dict[str, Any], message: str
) -> None:
    lines = exported(source).splitlines()
    bad = _edited(_leased_line(source), **changes)
    with pytest.raises(WorkloadError, match=message) as refused:
        import_workloads(target, [lines[0], bad], now=NOW)
    assert refused.value.code == "WORKLOAD_INVALID"
    assert refused.value.details["line"] == 2
    assert list(target.scan()) == []
    assert list(target.audit_log()) == []


def test_the_callers_own_numbers_are_imported_as_they_are(target: Store) -> None:
    authority = make_authority(target)
    wid = authority.admit(
        request(input={"big": 2**70, "negative": -5}), now=10_000
    ).workload.workload_id
    line = next(iter(export_lines(target)))
    with BACKENDS["memory"]() as elsewhere:
        report = import_workloads(elsewhere, [line], now=NOW)
        assert report.imported == (wid,)


def test_a_purge_export_imported_back_into_the_purged_store_is_a_conflict_that_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        authority = make_authority(store)
        wid = authority.admit(request(), now=10_000).workload.workload_id
        claim = authority.claim(wid, "w", CAPS, now=10_020, lease_ms=1_000)
        authority.start(wid, claim.fence, now=10_030)
        authority.complete(wid, claim.fence, "r-1", {"ok": True}, now=10_040)
    out = tmp_path / "purged.jsonl"
    argv = [
        *("purge", "--store", str(db), "--older-than", "0"),
        *("--export", str(out), "--now", "10050"),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    with SQLiteStore(db) as store:
        before = store_snapshot(store)
    assert main(["import", "--store", str(db), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"WORKLOAD_MIGRATION_CONFLICT: workload {wid} was purged from this store")
    assert "nothing was imported" in err.splitlines()[0]
    with SQLiteStore(db) as store:
        assert store_snapshot(store) == before
