"""`workwarden schema | vectors | conform | validate-history`: the reference, for other code.

- `schema [NAME] [--out DIR]`: the JSON Schemas (draft 2020-12) of the spec
  file, the workload document, every command and reply, the error object and
  the conformance protocol. With `--out`, every schema is written into DIR
  (`specs/schema/` holds the shipped copy); with NAME (`workload`,
  `command-fail`, ...), that one is printed; with neither, the names are listed.
- `vectors [--out FILE|DIR] [--coverage] [--spec FILE]`: the conformance vectors
  (JSON Lines, one scenario a line; `specs/vectors/workload.jsonl` is the
  shipped copy), and with `--coverage` which edges and policy rules they take.
  A spec that extends the shipped table (new states, edges or operations)
  gets the shipped scenarios that behave the same under it plus the model
  checker's witnesses for the rest (`extended_vectors`); an `--out` that is a
  directory receives `<spec name>.jsonl`.
- `conform --cmd 'PROGRAM ARGS' [--vectors FILE] [--spec FILE] [--junit FILE]`:
  runs the vectors against a program speaking the conformance protocol
  (`docs/conformance.md`); exit status 1 if any scenario fails. `--spec` is
  the spec the vectors were generated from, used to show a differing document
  field by field.
- `validate-history FILE | --store URL [--workload ID]`: checks recorded
  histories against the spec; exit status 1 if any is invalid.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from workwarden.cli import (
    INPUT_UNREADABLE,
    OUTPUT_UNWRITABLE,
    USAGE,
    check_output,
    output_directory,
    read_input,
    seconds,
    write_output,
)
from workwarden.statemachine import errors
from workwarden.statemachine.conformance.conform import (
    ScenarioResult,
    junit_xml,
    printable,
    run_conformance,
)
from workwarden.statemachine.conformance.runner import read_vectors, render_vectors
from workwarden.statemachine.conformance.schemas import (
    render_schema,
    schema_documents,
    write_schemas,
)
from workwarden.statemachine.conformance.vectors import (
    coverage,
    extended_vectors,
    extends_the_table,
    generate_vectors,
)
from workwarden.statemachine.models import Event, Workload
from workwarden.statemachine.properties.decisions import check_history, recorded_decisions
from workwarden.statemachine.spec import Spec, load_spec
from workwarden.storage import StoreError
from workwarden.storage.urls import open_store

__all__ = ["MAX_VECTOR_FILE_BYTES", "load_history_file", "register", "shipped_vectors_text"]

#: The longest `conform --timeout`, in seconds (an hour for one response).
_MAX_TIMEOUT = 3600.0

#: The largest vector file `conform` reads, in bytes (the shipped one is under 2 MiB).
MAX_VECTOR_FILE_BYTES = 256 * 1024 * 1024


def register(subparsers: Any) -> None:
    """Add the `schema`, `vectors`, `conform` and `validate-history` commands."""
    schema: argparse.ArgumentParser = subparsers.add_parser(
        "schema",
        help="the JSON Schemas of the spec, the documents, the commands and their replies",
        description=(
            "The JSON Schemas (draft 2020-12) of the spec file, the workload document, every "
            "command and its reply, the error object and the conformance protocol. "
            "With --out, write them all into DIR; with NAME, print one; else list the names."
        ),
    )
    schema.add_argument("name", nargs="?", metavar="NAME", help="print this schema (see the list)")
    schema.add_argument("--out", metavar="DIR", help="write every schema into DIR")
    schema.set_defaults(handler=_schema)

    vectors: argparse.ArgumentParser = subparsers.add_parser(
        "vectors",
        help="the conformance vectors (JSON Lines), and which edges and rules they take",
        description=(
            "Run every conformance scenario through the reference and write what each step "
            "must produce, one scenario a line (standard output unless --out). With "
            "--coverage, report which edges of the table and which policy rules they take."
        ),
    )
    vectors.add_argument(
        "--out",
        metavar="FILE|DIR",
        help="write the vectors to FILE, or to DIR/<spec name>.jsonl when DIR is a directory",
    )
    vectors.add_argument(
        "--coverage", action="store_true", help="report the edges and rules the vectors take"
    )
    vectors.add_argument("--spec", metavar="FILE", help="a spec file (the shipped spec by default)")
    vectors.set_defaults(handler=_vectors)

    conform: argparse.ArgumentParser = subparsers.add_parser(
        "conform",
        help="run the conformance vectors against another implementation",
        description=(
            "Run the conformance vectors against a program that speaks the conformance "
            "protocol (one JSON request a line on its stdin, one JSON response a line on its "
            "stdout; see docs/conformance.md). Exit status 1 if any scenario fails."
        ),
    )
    conform.add_argument(
        "--cmd", required=True, metavar="'PROGRAM ARGS'", help="the program to run (shell words)"
    )
    conform.add_argument(
        "--vectors", metavar="FILE", help="a vector file (the shipped vectors by default)"
    )
    conform.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML")
    conform.add_argument(
        "--spec",
        metavar="FILE",
        help="the spec the vectors were generated from, to show a differing document field by"
        " field (the shipped spec by default)",
    )
    conform.add_argument(
        "--timeout",
        type=seconds(at_most=_MAX_TIMEOUT),
        default=10.0,
        metavar="SECONDS",
        help=f"how long to wait for each response, more than 0 and at most {_MAX_TIMEOUT:g}"
        " (default 10)",
    )
    conform.add_argument(
        "-k", dest="select", metavar="TEXT", help="run only the scenarios whose name has TEXT"
    )
    conform.add_argument(
        "--quiet", action="store_true", help="print failed scenarios only, then the summary"
    )
    conform.set_defaults(handler=_conform)

    history: argparse.ArgumentParser = subparsers.add_parser(
        "validate-history",
        help="check recorded histories against the spec",
        description=(
            "Check recorded execution histories against the spec: legal edges, contiguous "
            "sequence, increasing fencing tokens, transient states left in the same commit, "
            "and every recorded decision the one its policy gives. FILE holds a workload "
            "document, a list of events, or JSON Lines of either (an export works); - reads "
            "standard input. Exit status 1 if any history is invalid."
        ),
    )
    history.add_argument("file", nargs="?", metavar="FILE", help="a history file; - for stdin")
    history.add_argument("--store", metavar="URL", help="read workloads from this store instead")
    history.add_argument(
        "--workload", metavar="ID", help="with --store: only this workload (default: every one)"
    )
    history.add_argument("--spec", metavar="FILE", help="a spec file (the shipped spec by default)")
    history.set_defaults(handler=_validate_history)


# -- schema and vectors ----------------------------------------------------------------------


def _new_directory(path: str, what: str) -> None:
    """Refuse directory `path` unless it exists, or its parent does (it is then made alone).

    Missing parents are never made: a mistyped path is refused
    (`WORKWARDEN_OUTPUT_UNWRITABLE`) instead of growing a tree of directories.
    """
    directory = Path(path)
    if directory.exists():
        return
    parent = directory.absolute().parent
    if not parent.is_dir():
        raise errors.WorkloadError(
            OUTPUT_UNWRITABLE,
            f"cannot create {what} {path}: its parent directory does not exist",
            {"path": path},
        )


def _schema(args: argparse.Namespace) -> int:
    if args.out is not None and args.name is not None:
        raise errors.WorkloadError(
            USAGE, "schema: give NAME (print one schema) or --out DIR (write them all), not both"
        )
    if args.out is not None:
        _new_directory(args.out, "schema directory")
        output_directory(args.out, "schema directory")
        for path in write_schemas(args.out):
            print(path)
        return 0
    documents = schema_documents()
    if args.name is None:
        for name in documents:
            print(name.removesuffix(".schema.json"))
        return 0
    name = args.name.removesuffix(".schema.json") + ".schema.json"
    if name not in documents:
        known = ", ".join(n.removesuffix(".schema.json") for n in documents)
        raise errors.WorkloadError(errors.INVALID, f"no schema {args.name!r}; known: {known}")
    sys.stdout.write(render_schema(documents[name]))
    return 0


def _vectors_path(out: str, spec: Spec) -> Path:
    """Where `--out` puts the vectors: the file named, or `<spec name>.jsonl` in a directory."""
    if not out:
        # An unset variable in a script: refused, not taken for this folder.
        raise errors.WorkloadError(OUTPUT_UNWRITABLE, "--out is empty: name a file or a directory")
    path = Path(out)
    if path.is_dir() or out.endswith(("/", "\\")):
        return path / f"{spec.data.spec.name}.jsonl"
    return path


def _vectors(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    target = _vectors_path(args.out, spec) if args.out is not None else None
    if target is not None:
        if target.parent.is_dir():
            check_output(str(target), "--out")
        elif args.out.endswith(("/", "\\")):
            # A directory named with a trailing / is made (after generating) if absent, and
            # only when its parent exists; a file's directory must exist.
            _new_directory(str(target.parent), "--out directory")
        else:
            check_output(str(target), "--out")
    if args.spec is not None and extends_the_table(spec):
        vectors = extended_vectors(spec)
    else:
        vectors = generate_vectors(spec, check_ends=args.spec is None)
    if target is not None:
        output_directory(str(target.parent), "--out directory")
        write_output(str(target), render_vectors(vectors), "--out")
        print(f"wrote {len(vectors)} scenarios to {target}", file=sys.stderr)
    elif not args.coverage:
        sys.stdout.write(render_vectors(vectors))
    if args.coverage:
        print("\n".join(coverage(spec, vectors).render(spec)))
    return 0


# -- conform -------------------------------------------------------------------------------


def shipped_vectors_text() -> str:
    """The vector file shipped with the package (`specs/vectors/workload.jsonl`)."""
    path = resources.files("workwarden.specs").joinpath("vectors").joinpath("workload.jsonl")
    return path.read_text(encoding="ascii")


def _vector_file_text(path: str) -> str:
    """The text of vector file `path` (`-`: standard input), read no further than the limit.

    `WORKWARDEN_INPUT_UNREADABLE` when it is larger than `MAX_VECTOR_FILE_BYTES`
    (a device such as `/dev/zero` never ends), and as `read_input` says otherwise.
    """
    what = "the vector file"
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_VECTOR_FILE_BYTES + 1)
        else:
            with open(path, "rb") as file:
                data = file.read(MAX_VECTOR_FILE_BYTES + 1)
    except OSError:
        return read_input(path, what)  # refused, in its words
    if len(data) > MAX_VECTOR_FILE_BYTES:
        raise errors.WorkloadError(
            INPUT_UNREADABLE,
            f"{what} {path} is larger than {MAX_VECTOR_FILE_BYTES} bytes",
            {"path": path},
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.WorkloadError(
            INPUT_UNREADABLE,
            f"{what} {path} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})",
            {"path": path},
        ) from None


def _conform(args: argparse.Namespace) -> int:
    try:
        argv = shlex.split(args.cmd)
    except ValueError as exc:
        raise errors.WorkloadError(
            errors.INVALID, f"--cmd {args.cmd!r}: cannot split into words: {exc}"
        ) from None
    if not argv:
        raise errors.WorkloadError(errors.INVALID, "--cmd names no program")
    if args.junit is not None:
        # Refused before any scenario runs, not after the whole run.
        check_output(args.junit, "the JUnit report")
    spec = load_spec(args.spec)
    text = _vector_file_text(args.vectors) if args.vectors is not None else shipped_vectors_text()
    try:
        vectors = read_vectors(text)
    except ValueError as exc:
        raise errors.WorkloadError(errors.INVALID, f"not a vector file: {exc}") from None
    if args.spec is not None:
        # The reference replays each scenario under --spec to show a document field by
        # field: under another spec than the vectors' own, it would replay something else.
        name = spec.data.spec.name
        for number, vector in enumerate(vectors, start=1):
            if vector.spec != name:
                raise errors.WorkloadError(
                    errors.INVALID,
                    f"the vector file's scenario {number} ({printable(vector.name)}) is of spec"
                    f" {vector.spec!r}, but --spec {args.spec} is spec {name!r}: give the spec"
                    " the vectors were generated from",
                    {"vectors_spec": vector.spec, "spec": name},
                )
    if args.select:
        vectors = [v for v in vectors if args.select in v.name]
    if not vectors:
        # Nothing run is not a pass: a -k typo or an empty file would turn CI green.
        raise errors.WorkloadError(
            errors.INVALID,
            f"no scenario to run (-k {args.select!r} matches none)"
            if args.select
            else "the vector file holds no scenario",
        )

    def show(result: ScenarioResult) -> None:
        if result.passed and args.quiet:
            return
        print("\n".join(result.render()), flush=True)

    results = run_conformance(argv, vectors, timeout=args.timeout, spec=spec, progress=show)
    failed = [r for r in results if not r.passed]
    if args.junit is not None:
        write_output(args.junit, junit_xml(results), "the JUnit report")
    print(
        f"\n{len(results) - len(failed)} of {len(results)} scenarios passed"
        + (f"; failed: {', '.join(printable(r.name) for r in failed)}" if failed else "")
    )
    return 1 if failed else 0


# -- validate-history ------------------------------------------------------------------------


def _history_of(value: Any, label: str) -> tuple[str, list[Event], Workload | None]:
    """A parsed JSON value as (label, events, workload document or None)."""
    if isinstance(value, dict) and "document" in value and "key" in value:
        value = value["document"]
    if isinstance(value, dict) and "execution_history" in value:
        workload = Workload.model_validate(value)
        return workload.workload_id, list(workload.execution_history), workload
    if isinstance(value, dict) and "events" in value:
        value = value["events"]
    if isinstance(value, list):
        return label, [Event.model_validate(event) for event in value], None
    raise ValueError('expected a workload document, a list of events, or {"events": [...]}')


def load_history_file(text: str, label: str) -> list[tuple[str, list[Event], Workload | None]]:
    """The histories in a file: one JSON value, or JSON Lines of them. `ValueError` if neither."""
    try:
        values = [json.loads(text)]
    except json.JSONDecodeError:
        values = []
        # Only a newline ends a line: U+2028, U+0085 and the like may stand unescaped in
        # a JSON string, where `str.splitlines` would cut it (a CR before one is whitespace).
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                values.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {number}: not JSON: {exc.msg}") from None
    out = []
    for number, value in enumerate(values, start=1):
        try:
            out.append(_history_of(value, label if len(values) == 1 else f"{label}:{number}"))
        except ValidationError as exc:
            first = exc.errors()[0]
            # An event that is not an object is the whole value's fault: no field to name.
            where = ".".join(str(part) for part in first["loc"]) + ": " if first["loc"] else ""
            raise ValueError(f"value {number}: {where}{first['msg']}") from None
    return out


def _store_histories(
    url: str, workload_id: str | None
) -> Iterator[tuple[str, list[Event], Workload]]:
    store = open_store(url, mode="read")
    try:
        if workload_id is not None:
            doc = store.read(workload_id)
            if doc is None:
                raise errors.WorkloadError(
                    errors.NOT_FOUND, f"the store has no workload {workload_id}"
                )
            docs = [doc]
        else:
            docs = list(store.scan())
    except StoreError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot read the store: {exc}"
        ) from None
    finally:
        store.close()
    for doc in docs:
        workload = Workload.model_validate_json(doc.document)
        yield doc.key, list(workload.execution_history), workload


def _validate_history(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.store is None):
        raise errors.WorkloadError(USAGE, "validate-history: give FILE or --store URL")
    if args.workload is not None and args.store is None:
        raise errors.WorkloadError(USAGE, "validate-history: --workload needs --store")
    spec = load_spec(args.spec)
    if args.store is not None:
        histories: list[tuple[str, list[Event], Workload | None]] = list(
            _store_histories(args.store, args.workload)
        )
    else:
        text = read_input(args.file, "the history file")
        try:
            histories = load_history_file(text, args.file)
        except ValueError as exc:
            raise errors.WorkloadError(errors.INVALID, f"{args.file}: {exc}") from None
        except RecursionError:
            raise errors.WorkloadError(
                errors.INVALID, f"{args.file}: JSON nested too deeply to read"
            ) from None
    if not histories:
        # Nothing checked is said, not left silent: an empty file, an empty store.
        where = (
            "the store holds no workload" if args.store is not None else f"{args.file} holds none"
        )
        print(f"no histories: {where}")
        return 0
    return _report(spec, histories)


def _report(spec: Spec, histories: list[tuple[str, list[Event], Workload | None]]) -> int:
    invalid = 0
    for label, events, workload in histories:
        problem = check_history(spec, events, workload)
        if problem is not None:
            invalid += 1
            print(f"INVALID {label}: {problem}")
            continue
        decisions = recorded_decisions(spec, events, workload)
        unsure = sorted({name for d in decisions for name in d.unknown})
        note = f"; not knowing {', '.join(unsure)}" if unsure else ""
        print(f"VALID {label}: {len(events)} events, {len(decisions)} decisions checked{note}")
    if len(histories) > 1:
        print(f"{len(histories) - invalid} of {len(histories)} histories valid")
    return 1 if invalid else 0
