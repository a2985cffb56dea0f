"""`workwarden diagram`: write the legal-transition diagram of a spec, optionally with a history.

`workwarden diagram [SPEC | --spec FILE] [--out-dir DIR] [--format
dot,svg,png,mermaid] [--history STORE_URL WORKLOAD_ID] [--report FILE]
[--name NAME] [--view table|operator]` writes `<NAME>.dot`, `.svg`, `.png` and `.mmd` (the formats
asked for; dot, svg and mermaid by default) into DIR (`diagrams` by default).
SPEC (or `--spec FILE`; both only if they name the same file) is a spec file,
the shipped spec when omitted; NAME is the spec's name by default. `--report`
overlays a `workwarden check --json` report; one from a check that stopped
early is drawn as partial. `--history` draws one
stored workload's committed steps, numbered in order, on the diagram (NAME
then defaults to `<spec name>-<workload id>`). `--view operator` adds the
operator's purge and pause gate (NAME then defaults to `<spec
name>-operator`). The drawing itself is
`workwarden.statemachine.diagram`'s. Errors print as `CODE: message`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from typing import Any, NamedTuple

from pydantic import ValidationError

from workwarden.cli import INPUT_UNREADABLE, read_input
from workwarden.cli.check import spec_argument
from workwarden.statemachine import errors
from workwarden.statemachine.diagram import FORMATS, VIEWS, DiagramError, write_diagrams
from workwarden.statemachine.models import Event, Workload
from workwarden.statemachine.spec import load_spec
from workwarden.statemachine.spec_model import file_stem
from workwarden.storage import StoreError, open_store

__all__ = ["Report", "read_history", "read_report", "register"]

_DEFAULT_FORMATS = "dot,svg,mermaid"


def register(subparsers: Any) -> None:
    """Add the `diagram` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "diagram",
        help="write the legal-transition diagram of a spec (DOT, SVG, PNG, Mermaid)",
        description=(
            "Write the legal-transition diagram of a spec: states shaped by kind, edges "
            "labelled with their operations and coloured by actor class. With --history, "
            "one stored workload's steps are drawn on it, numbered in order."
        ),
    )
    parser.add_argument(
        "spec", nargs="?", metavar="SPEC", help="a spec file (TOML); the shipped spec by default"
    )
    parser.add_argument(
        "--spec",
        dest="spec_option",
        metavar="FILE",
        help="a spec file (the same as SPEC; give one or the other)",
    )
    parser.add_argument(
        "--out-dir", default="diagrams", metavar="DIR", help="where to write (default: diagrams)"
    )
    parser.add_argument(
        "--format",
        default=_DEFAULT_FORMATS,
        metavar="LIST",
        help=f"comma-separated, from {','.join(FORMATS)} (default: {_DEFAULT_FORMATS})",
    )
    parser.add_argument(
        "--history",
        nargs=2,
        metavar=("STORE_URL", "WORKLOAD_ID"),
        help="draw this workload's history: memory:, sqlite:///path, or postgresql://...",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help=(
            "a report written by `workwarden check --json`: edges no step takes are drawn "
            "dashed, states never at rest marked"
        ),
    )
    parser.add_argument(
        "--name",
        metavar="NAME",
        help=(
            "file name stem and graph name: not empty, no / or \\ or control character, not"
            " starting with . (default: the spec's name)"
        ),
    )
    parser.add_argument(
        "--view",
        choices=VIEWS,
        default="table",
        help=(
            "table: the transitions alone (default); operator: with the purge of "
            "finished work and the pause gate on the claims"
        ),
    )
    parser.set_defaults(handler=_run)


def read_history(url: str, workload_id: str) -> list[Event]:
    """The committed events of workload `workload_id` in the store at `url`.

    Raises `WorkloadError`: `WORKLOAD_NOT_FOUND` when the store has no such
    workload, `WORKLOAD_INVALID` for a URL no store answers to,
    `WORKLOAD_STORAGE_FAILURE` when the store cannot be opened or read or the
    stored document does not parse. Messages never repeat the URL, which may
    hold a password.
    """
    # Reading never creates (or writes) a store, where the resolver can say so.
    reads = "mode" in inspect.signature(open_store).parameters
    try:
        store = open_store(url, mode="read") if reads else open_store(url)
    except errors.WorkloadError:
        raise
    except ValueError as exc:
        raise errors.WorkloadError(
            errors.INVALID, f"--history: {exc}", {"field": "STORE_URL"}
        ) from None
    except StoreError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot open the store: {exc}"
        ) from None
    try:
        doc = store.read(workload_id)
    except StoreError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot read workload {workload_id}: {exc}"
        ) from None
    finally:
        store.close()
    if doc is None:
        raise errors.WorkloadError(
            errors.NOT_FOUND,
            f"the store has no workload {workload_id}",
            {"workload_id": workload_id},
        )
    try:
        workload = Workload.model_validate_json(doc.document)
    except ValidationError:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE,
            f"stored document {doc.key} version {doc.version} is not a workload",
            {"workload_id": workload_id},
        ) from None
    return list(workload.execution_history)


class Report(NamedTuple):
    """What a diagram draws of a checker report."""

    #: The edges no step took.
    unreachable: list[tuple[str, str]]
    #: The states no committed step left the work in.
    never_at_rest: list[str]
    #: Did the exploration complete? If not, the drawing is partial.
    complete: bool
    #: Every edge of the table the report was made of (`edges_taken` with
    #: `edges_never_taken`), when it says (None: a report of the two drawn fields alone).
    edges: frozenset[tuple[str, str]] | None = None
    #: The `[spec] name` of the spec checked, when the report says.
    spec_name: str | None = None


def read_report(path: str) -> Report:
    """The unreached edges, the states never at rest and the completeness of a checker report.

    A file that cannot be read is `WORKWARDEN_INPUT_UNREADABLE`; one that is
    not a report written by `workwarden check --json` is `WORKLOAD_INVALID`,
    saying which field is wrong.
    """
    if not path:
        raise errors.WorkloadError(
            INPUT_UNREADABLE, "--report is empty: name a file", {"path": path}
        )
    text = read_input(path, "--report")

    def refuse(why: str) -> errors.WorkloadError:
        return errors.WorkloadError(
            errors.INVALID, f"--report {path}: not a checker report ({why})", {"field": "report"}
        )

    try:
        report = json.loads(text)
    except RecursionError:
        raise refuse("JSON nested too deeply to read") from None
    except ValueError as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else "not JSON"
        raise refuse(f"not JSON: {message}") from None
    if not isinstance(report, dict):
        raise refuse(f"a JSON object was expected, not {_json_kind(report)}")
    edges_taken = report.get("edges_never_taken")
    states = report.get("never_at_rest")
    complete = report.get("complete", True)
    if not isinstance(edges_taken, list) or not all(
        isinstance(edge, str) and len(edge.split(" -> ")) == 2 for edge in edges_taken
    ):
        raise refuse('edges_never_taken must be a list of "A -> B" strings')
    if not isinstance(states, list) or not all(isinstance(state, str) for state in states):
        raise refuse("never_at_rest must be a list of state names")
    if not isinstance(complete, bool):
        raise refuse("complete must be true or false")
    taken = report.get("edges_taken")
    if taken is not None and (
        not isinstance(taken, dict)
        or not all(isinstance(edge, str) and len(edge.split(" -> ")) == 2 for edge in taken)
    ):
        raise refuse('edges_taken must be an object of "A -> B" edges')
    spec_name = report.get("spec_name")
    if spec_name is not None and not isinstance(spec_name, str):
        raise refuse("spec_name must be the name of a spec")
    unreachable = [(a, b) for a, b in (edge.split(" -> ") for edge in edges_taken)]
    table = None
    if taken is not None:
        table = frozenset(unreachable) | {(a, b) for a, b in (e.split(" -> ") for e in taken)}
    return Report(unreachable, list(states), complete, table, spec_name)


def _same_spec(report: Report, path: str, spec: Any) -> None:
    """Refuse a report of another spec than the one drawn (`DIAGRAM_INPUT_INVALID`): its
    overlay would mark states and edges of a table it did not explore."""
    name = spec.data.spec.name
    why = None
    if report.spec_name is not None and report.spec_name != name:
        why = f"it is a check of the spec {report.spec_name!r}"
    elif report.edges is not None and report.edges != set(spec.edges):
        lacks = sorted(set(spec.edges) - report.edges)
        extra = sorted(report.edges - set(spec.edges))
        if lacks:
            why = f"the spec drawn has the edge {lacks[0][0]} -> {lacks[0][1]}, the report none"
        else:
            why = f"the report has the edge {extra[0][0]} -> {extra[0][1]}, the spec drawn none"
    if why is not None:
        raise DiagramError(
            "DIAGRAM_INPUT_INVALID",
            f"--report {path} is not a check of the spec drawn ({name!r}): {why}; "
            "draw it on the spec it checked (SPEC or --spec)",
        )


def _json_kind(value: Any) -> str:
    kinds = ((list, "a list"), (str, "a string"), (bool, "a boolean"), (int, "a number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null or a number")


def _formats(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(FORMATS))
    if not chosen or unknown:
        raise DiagramError(
            "DIAGRAM_INPUT_INVALID",
            f"--format {text!r}: choose one or more of {','.join(FORMATS)}",
        )
    return chosen


def _run(args: argparse.Namespace) -> int:
    try:
        formats = _formats(args.format)
        spec = load_spec(spec_argument(args.spec, args.spec_option))
        history: list[Event] = []
        name = args.name
        if name is not None:
            try:
                file_stem(name)
            except ValueError as exc:
                raise DiagramError("DIAGRAM_INPUT_INVALID", f"--name {name!r}: {exc}") from None
        if args.history is not None:
            url, workload_id = args.history
            history = read_history(url, workload_id)
            if name is None:
                # File-name safe: the id may hold any printable character.
                name = f"{spec.data.spec.name}-{re.sub(r'[^A-Za-z0-9._-]', '_', workload_id)}"
        if args.view != "table" and name is None:
            name = f"{spec.data.spec.name}-{args.view}"
        if not args.out_dir:
            # An unset variable in a script: refused, not taken for this folder.
            raise DiagramError("DIAGRAM_WRITE_FAILED", "--out-dir is empty: name a directory")
        report = Report([], [], True)
        if args.report is not None:
            report = read_report(args.report)
            _same_spec(report, args.report, spec)
        written = write_diagrams(
            spec,
            args.out_dir,
            formats=formats,
            name=name,
            history=history,
            unreachable_edges=report.unreachable,
            never_at_rest=report.never_at_rest,
            partial=not report.complete,
            view=args.view,
        )
    except DiagramError as exc:
        print(f"{exc.code}: {exc.message}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
