"""Moving workloads between stores: export to JSON Lines, import from them.

The export format is one workload a line, sorted by key, without spaces and
ASCII only; the document is the stored JSON with its keys in their stored
order, so the same store always exports the same bytes:

    {"document":{...the workload...},"key":"wl_...","version":4}

`import_workloads` loads such lines into a store, idempotently. It reads and
checks every line first, then reads them again to write: what it keeps between
the two readings is a few numbers a line, never the workloads, so an export of
any size imports in memory that does not grow with the documents. A list is
read twice as it is, a one-pass iterator (a generator, a file object, standard
input) is copied to a temporary file as it is read, and any other iterable is
iterated again, each line's text checked against the first reading (a line that
changed stops the import there, `WORKLOAD_MIGRATION_CONFLICT` naming it).

A line is `WORKLOAD_INVALID` (naming it) unless its document is a workload valid under the spec, as
`validate-history` judges it (a state of the spec, not a transient one, a
history the table allows), with every number outside the caller's own JSON
(input, output, checkpoint states) a whole number from 0 to 2**53 - 1 and
its priority within an admission's: a document the core could not carry on
with is never stored. A workload already present with the
same document at the same version is skipped; one present with a different
document, or the same document at another version, or one this store
purged (its tombstone, `storage.base.Tombstones`: a purge export imported
back into the store it came from), is
`WORKLOAD_MIGRATION_CONFLICT`, and then nothing of the file is written. A
new workload is written with its index fields recomputed from the document
under the spec, and at the version it was exported at: a store's versions
count its writes from 1, so the import commits the document that many
times, each write audited with operation `import` (and a request id naming
this import of the workload, for `Store.find_request`). A store the
workloads went through therefore exports the same bytes again, and a
migration can be checked with `diff`. A version above `MAX_IMPORT_VERSION`
is refused as `WORKLOAD_INVALID` naming the line.

Each write is its own commit (the `Store` protocol has no transaction
spanning writes), so an import stopped part way (a signal, a crash, a
store that fails) leaves the workloads before the one it was writing
imported, and that one present with its document at a version below the
exported one. Running the same import again finishes it: a workload
present with the same document at a lower version that this import of it
wrote (its request id says so) is brought up to the exported version, not
refused.

Import into a store nothing else is writing. If another writer commits one
of the workloads while the import runs, the import stops there with
`WORKLOAD_MIGRATION_CONFLICT`; the workloads before it are imported, and
running the import again finishes the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from pydantic import ValidationError

from workwarden.runtime import arguments
from workwarden.statemachine import errors, inputs
from workwarden.statemachine.authority import invalid_from_validation, serialise
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.models import MAX_INSTANT, Workload
from workwarden.statemachine.properties.decisions import check_history
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import (
    AuditRecord,
    Store,
    StoreConflict,
    StoredDocument,
    StoreError,
    Tombstones,
)

__all__ = [
    "MAX_IMPORT_VERSION",
    "ImportReport",
    "export_line",
    "export_lines",
    "export_workloads",
    "import_workloads",
]

_FIELDS = frozenset({"key", "version", "document"})

#: The highest version an export line may give: each version is a commit of the import,
#: and a million writes is a heartbeat every ten seconds for over three months.
MAX_IMPORT_VERSION = 1_000_000


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What an import did: the workloads it wrote and those already present, by key."""

    imported: tuple[str, ...]
    skipped: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Line:
    number: int
    key: str
    version: int
    workload: Workload


def _storage_failure(exc: StoreError) -> errors.WorkloadError:
    return errors.WorkloadError(errors.STORAGE_FAILURE, f"store failure: {exc}")


def export_line(doc: StoredDocument) -> str:
    """One stored document as an export line (without its newline), as `export_lines` writes."""
    try:
        document = json.loads(doc.document)
    except ValueError:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE,
            f"stored document {doc.key} version {doc.version} is not JSON",
            {"workload_id": doc.key},
        ) from None
    return _line(doc.key, doc.version, document)


def _line(key: str, version: int, document: Any) -> str:
    return json.dumps(
        {"document": document, "key": key, "version": version},
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )


def export_lines(store: Store) -> Iterator[str]:
    """Every workload of `store` as one export line (without its newline), by key."""
    try:
        for doc in store.scan():
            yield export_line(doc)
    except StoreError as exc:
        raise _storage_failure(exc) from None


def export_workloads(store: Store, out: TextIO) -> int:
    """Write every workload of `store` to `out` as JSON Lines, by key; returns how many."""
    count = 0
    for line in export_lines(store):
        out.write(line + "\n")
        count += 1
    return count


def _invalid(
    number: int, message: str, details: dict[str, Any] | None = None
) -> errors.WorkloadError:
    return errors.WorkloadError(
        errors.INVALID, f"line {number}: {message}", {"line": number, **(details or {})}
    )


def _parse(number: int, text: str) -> _Line:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _invalid(number, f"not JSON ({exc})") from None
    except RecursionError:
        raise _invalid(number, "not JSON this reader takes (nested too deeply)") from None
    if not isinstance(data, dict) or set(data) != _FIELDS:
        raise _invalid(number, "an export line is an object with key, version and document")
    key, version, document = data["key"], data["version"], data["document"]
    if not isinstance(key, str) or not key:
        raise _invalid(number, "key must be a non-empty string")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _invalid(number, "version must be an integer from 1")
    if version > MAX_IMPORT_VERSION:
        raise _invalid(
            number,
            f"version {version} is above the most an import writes ({MAX_IMPORT_VERSION:,})",
            {"version": version, "maximum": MAX_IMPORT_VERSION},
        )
    try:
        workload = Workload.model_validate(document)
    except ValidationError as exc:
        refusal = invalid_from_validation(exc, "document")
        raise _invalid(number, refusal.message, refusal.details) from None
    if workload.workload_id != key:
        raise _invalid(number, f"key {key} is not the document's workload_id")
    out_of_range = _out_of_range(document)
    if out_of_range is not None:
        where, what = out_of_range
        raise _invalid(number, f"{where} {what}", {"field": f"document.{where}"})
    return _Line(number, key, version, workload)


#: The parts of a document that hold the caller's own JSON, whose numbers are theirs.
_CALLERS_JSON = frozenset({"input", "output", "state", "evidence"})


def _out_of_range(document: Any, path: str = "") -> tuple[str, str] | None:
    """The first number of `document` (outside the caller's JSON) the core cannot count
    with: its path, and what is wrong with it.

    Instants, counts, versions and fencing tokens are whole numbers from 0 to
    `MAX_INSTANT` (2**53 - 1), and `priority` is within an admission's range:
    a document holding another number would stop every later call on it.
    """
    if isinstance(document, dict):
        for name, value in document.items():
            if name in _CALLERS_JSON:
                continue
            where = f"{path}.{name}" if path else name
            if name == "priority" and path == "":
                if isinstance(value, int) and not -(2**31) <= value <= 2**31 - 1:
                    return where, "is outside -2**31 to 2**31 - 1"
                continue
            found = _out_of_range(value, where)
            if found is not None:
                return found
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found = _out_of_range(value, f"{path}[{index}]")
            if found is not None:
                return found
    elif (
        isinstance(document, int)
        and not isinstance(document, bool)
        and not 0 <= document <= MAX_INSTANT
    ):
        return path, f"is {document}, outside 0 to 2**53 - 1"
    return None


def _same(stored: str, workload: Workload) -> bool:
    """Is the stored document the same workload? (Key order and spacing aside.)"""
    try:
        present = Workload.model_validate_json(stored)
    except ValidationError:
        return False
    as_json: Any = json.loads(serialise(present))
    return bool(as_json == json.loads(serialise(workload)))


def _digest(document: str) -> str:
    return hashlib.sha256(document.encode("utf-8")).hexdigest()


def _request_id(line: _Line, document: str) -> str:
    """The request id of every write importing `line` (the same however often it is run)."""
    seed = f"import\x1f{line.key}\x1f{line.version}\x1f{_digest(document)}".encode()
    return "import_" + hashlib.sha256(seed).hexdigest()[:24]


def _present(store: Store, present: StoredDocument, line: _Line, text: str) -> str | None:
    """What to do with a line whose workload `store` holds already.

    "" to skip it (the same document at the same version), None to finish
    it (the same document at a lower version, written by an earlier run of
    this import that stopped), else the reason it conflicts.
    """
    if not _same(present.document, line.workload):
        return "is already present with different contents"
    if present.version == line.version:
        return ""
    if present.version < line.version:
        started = store.find_request(_request_id(line, text))
        if started is not None and started.key == line.key:
            return None
    return (
        f"is already present at version {present.version}, not at the export's"
        f" version {line.version}"
    )


def _audit(line: _Line, version: int, document: str, at: int, actor: str) -> AuditRecord:
    key, workload = line.key, line.workload
    digest = _digest(document)
    seed = f"import\x1f{key}\x1f{version}\x1f{digest}".encode()
    return AuditRecord(
        transaction_id="tx_" + hashlib.sha256(seed).hexdigest()[:24],
        key=key,
        version=version,
        actor=actor,
        operation="import",
        tenant=workload.tenant_id,
        application=workload.application_id,
        at=at,
        digest=digest,
        attempt=workload.attempts[-1].attempt_id if workload.attempts else None,
        result=workload.result.result_id if workload.result is not None else None,
        request_id=_request_id(line, document),
    )


def import_workloads(
    store: Store,
    lines: Iterable[str],
    *,
    now: int,
    spec: Spec | None = None,
    actor: str = "import",
) -> ImportReport:
    """Import export lines into `store` at instant `now` (see the module docstring).

    `now` is an instant in ms, 0 to 2**53 - 1. Raises `WORKLOAD_INVALID` naming
    the argument for a bad `now`, a `spec` that is not a `Spec` or a `store`
    that is not a store, naming the line for a malformed one, and
    `WORKLOAD_MIGRATION_CONFLICT` naming the workload (details list every
    conflicting one) for a workload present with other contents or at
    another version; in both cases nothing is written. `lines` is read twice
    (a one-pass iterator through a temporary copy): see the module docstring.
    """
    # Checked before anything is read: each is used only once the lines are parsed.
    arguments.calls(store, "store", ("read", "write", "find_request", "find_result"), "a Store")
    inputs.check_now(now)
    if spec is not None and not isinstance(spec, Spec):
        raise errors.bad_argument(
            "spec", f"spec must be a Spec (load_spec(path)), not {type(spec).__name__}"
        )
    spec = spec if spec is not None else default_spec()
    with _readable_twice(lines) as again:
        plan = _plan(store, spec, again())
        return _write(store, spec, plan, again(), now, actor)


@dataclass(frozen=True, slots=True)
class _Planned:
    """A line to write, as the first reading found it: small, so a big export is not held."""

    key: str
    present_version: int  # 0: not present
    digest: str  # of the line's text, to know the second reading gives the same line


@dataclass(slots=True)
class _Plan:
    writes: dict[int, _Planned]  # by line number
    skipped: list[str]


def _lines_of(source: Iterable[str]) -> Iterator[tuple[int, str]]:
    """Each line that is not blank, with its number (from 1)."""
    for number, text in enumerate(source, start=1):
        if text.strip():
            yield number, text


@contextlib.contextmanager
def _readable_twice(lines: Iterable[str]) -> Iterator[Callable[[], Iterable[str]]]:
    """A way to read `lines` again: an import checks every line, then reads them again to write.

    A one-pass iterator (a generator, an open file, standard input) is copied
    as it is read the first time into a temporary file, which the second
    reading reads: the workloads are never all held in memory at once.
    Anything else iterable (a list, a file read again) is iterated again; the
    writes check that each line is the one that was checked.
    """
    if not isinstance(lines, Iterator):
        yield lambda: lines
        return
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:

        def spooled() -> Iterator[str]:
            # Each line as a JSON string: whatever it holds (a newline, an unpaired
            # surrogate), it reads back as the same text.
            for text in lines:
                spool.write(json.dumps(text) + "\n")
                yield text

        def again() -> Iterator[str]:
            spool.flush()
            spool.seek(0)
            for text in spool:
                yield json.loads(text)

        # Made now, run when read: the second reading starts once the first has ended.
        readings = iter((spooled(), again()))
        yield lambda: next(readings)


def _plan(store: Store, spec: Spec, lines: Iterable[str]) -> _Plan:
    """Read and check every line; what to write, what to skip; refuse a bad line or a conflict.

    A malformed line is refused before a store failure and a store failure
    before a conflict, as if every line were checked before the store is
    read: a store that fails is not read again, and the lines after it are
    still checked.
    """
    tombstones = store if isinstance(store, Tombstones) else None
    plan = _Plan(writes={}, skipped=[])
    seen: dict[str, int] = {}
    conflicts: list[dict[str, str]] = []
    results: dict[str, str] = {}
    failure: StoreError | None = None
    for number, text in _lines_of(lines):
        line = _parse(number, text)
        if line.key in seen:
            raise _invalid(number, f"workload {line.key} is also on line {seen[line.key]}")
        seen[line.key] = number
        problem = check_history(spec, line.workload.execution_history, line.workload)
        if problem is not None:
            raise _invalid(
                line.number,
                f"workload {line.key} is not valid under the spec: {problem}",
                {"workload_id": line.key, "sequence": problem.sequence},
            )
        if failure is not None:
            continue
        try:
            conflict = _classify(store, tombstones, line, text, plan, results)
        except StoreError as exc:
            failure = exc
            continue
        if conflict is not None:
            conflicts.append({"workload_id": line.key, "reason": conflict})
    if failure is not None:
        raise _storage_failure(failure)
    if conflicts:
        first = conflicts[0]
        raise errors.WorkloadError(
            errors.MIGRATION_CONFLICT,
            f"workload {first['workload_id']} {first['reason']}; nothing was imported",
            {"workload_id": first["workload_id"], "conflicts": conflicts},
        )
    return plan


def _classify(
    store: Store,
    tombstones: Tombstones | None,
    line: _Line,
    text: str,
    plan: _Plan,
    results: dict[str, str],
) -> str | None:
    """Plan `line`'s write or skip; the reason it conflicts, if it does."""
    document = serialise(line.workload)
    planned = _Planned(line.key, 0, _digest(text))
    present = store.read(line.key)
    if present is not None:
        reason = _present(store, present, line, document)
        if reason == "":
            plan.skipped.append(line.key)
        elif reason is None:
            plan.writes[line.number] = dataclasses.replace(planned, present_version=present.version)
        return reason or None
    buried = tombstones.tombstone(line.key) if tombstones is not None else None
    if buried is not None:
        return (
            f"was purged from this store (its tombstone is version {buried}): a purged"
            " workload is not written back under the versions its purge used"
        )
    plan.writes[line.number] = planned
    result = line.workload.result
    if result is None:
        return None
    owner = results.get(result.result_id) or store.find_result(result.result_id)
    results[result.result_id] = line.key
    if owner is not None:
        return f"holds result id {result.result_id}, which belongs to workload {owner}"
    return None


def _write(
    store: Store, spec: Spec, plan: _Plan, lines: Iterable[str], now: int, actor: str
) -> ImportReport:
    """Write what `plan` says, reading the lines again."""
    imported: list[str] = []
    for number, text in _lines_of(lines):
        planned = plan.writes.get(number)
        if planned is None:
            continue
        if _digest(text) != planned.digest:
            raise errors.WorkloadError(
                errors.MIGRATION_CONFLICT,
                f"line {number} changed while the import ran; the workloads before it were"
                " imported, import again to finish",
                {"line": number, "workload_id": planned.key, "imported": imported},
            )
        # The line the first reading checked (its digest says so): parsed again,
        # not checked again.
        data = json.loads(text)
        line = _Line(
            number, data["key"], data["version"], Workload.model_validate(data["document"])
        )
        document = serialise(line.workload)
        index = index_fields(spec, line.workload)
        try:
            for version in range(planned.present_version + 1, line.version + 1):
                audit = _audit(line, version, document, now, actor)
                store.write(line.key, document, index, None if version == 1 else version - 1, audit)
        except StoreConflict:
            raise errors.WorkloadError(
                errors.MIGRATION_CONFLICT,
                f"workload {line.key} was written by another writer during the import;"
                " the workloads before it were imported, import again to finish",
                {"workload_id": line.key, "imported": imported},
            ) from None
        except StoreError as exc:
            raise _storage_failure(exc) from None
        imported.append(line.key)
    if len(imported) != len(plan.writes):
        raise errors.WorkloadError(
            errors.MIGRATION_CONFLICT,
            "the export was shorter when read again to write; the workloads read were"
            " imported, import again to finish",
            {"imported": imported},
        )
    return ImportReport(imported=tuple(imported), skipped=tuple(plan.skipped))
