"""`workwarden spec ...`: print the spec file's JSON Schema, validate spec files, show one.

- `spec schema` prints the JSON Schema (draft 2020-12) of the spec file, as
  stable JSON (sorted keys, indent 2), so a generated copy diffs cleanly.
- `spec validate FILE [FILE...]` prints every problem of each file as
  `FILE: FIELD: message`, one a line, on standard output, then one line
  `WORKLOAD_SPEC_INVALID: ...` on standard error, and exits 1 if there is
  any; a valid file gets a one-line summary and exit status 0.
- `spec show [FILE]` prints a readable summary of a spec (the shipped one by
  default): its states, transitions, policies and deadlines.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.spec import (
    Problem,
    Spec,
    check_spec_file,
    default_spec,
    load_spec,
    spec_json_schema,
    spec_summary,
)

__all__ = ["example_paths", "register", "render_spec", "summary_line"]


def register(subparsers: Any) -> None:
    """Add the `spec` command and its subcommands (`schema`, `validate`, `show`, `examples`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "spec",
        help="work with spec files",
        description="Print the spec file's JSON Schema, validate spec files, show a spec.",
    )
    commands = parser.add_subparsers(dest="spec_command", metavar="SUBCOMMAND", required=True)

    schema = commands.add_parser(
        "schema", help="print the JSON Schema (draft 2020-12) of the spec file"
    )
    schema.set_defaults(handler=_schema)

    validate = commands.add_parser(
        "validate",
        help="report every problem in spec files",
        description=(
            "Report every problem in each spec file, one a line as FILE: FIELD: message. "
            "Exit status 1 if any file has a problem."
        ),
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="a spec file (TOML)")
    validate.set_defaults(handler=_validate)

    show = commands.add_parser(
        "show", help="print a readable summary of a spec (the shipped spec by default)"
    )
    show.add_argument(
        "file", nargs="?", metavar="FILE", help="a spec file (TOML); the shipped spec by default"
    )
    show.set_defaults(handler=_show)

    examples = commands.add_parser(
        "examples",
        help="print the path of each example spec shipped in the package",
        description=(
            "Print the installed path of each example spec shipped in the package (pause,"
            " approval, claim starts, ...), one a line, to give to --spec or load_spec."
        ),
    )
    examples.set_defaults(handler=_examples)


def summary_line(spec: Spec) -> str:
    """What a valid spec declares, in one line: states, transitions, policies, error codes."""
    counts = spec_summary(spec)
    return (
        f"OK: {counts['states']} states, {counts['transitions']} transitions, "
        f"{counts['policies']} policies, {counts['errors']} error codes"
    )


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(spec_json_schema(), indent=2, sort_keys=True, ensure_ascii=False))
    return 0


def _print_problems(problems: Iterable[Problem]) -> None:
    for problem in problems:
        print(problem)


def _refused(problems: int, files: int, of: int) -> int:
    """The coded line on standard error that closes a report of problems; exit status 1."""
    print(
        f"{errors.SPEC_INVALID}: {problems} problem(s) in {files} of {of} spec file(s)",
        file=sys.stderr,
    )
    return 1


def _validate(args: argparse.Namespace) -> int:
    problems = failed = 0
    for file in args.files:
        found = check_spec_file(file)
        if found:
            _print_problems(found)
            problems += len(found)
            failed += 1
        else:
            print(f"{file}: {summary_line(load_spec(file))}")
    return _refused(problems, failed, len(args.files)) if failed else 0


def example_paths() -> list[Path]:
    """The example specs shipped in the package (`workwarden.specs.examples`), by name."""
    folder = resources.files("workwarden.specs.examples")
    return sorted(Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".toml"))


def _examples(args: argparse.Namespace) -> int:
    for path in example_paths():
        print(path)
    return 0


def _show(args: argparse.Namespace) -> int:
    if args.file is None:
        spec = default_spec()
    else:
        problems = check_spec_file(args.file)
        if problems:
            _print_problems(problems)
            return _refused(len(problems), 1, 1)
        spec = load_spec(args.file)
    print("\n".join(render_spec(spec)))
    return 0


def _columns(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows as lines of left-aligned columns (the last column is not padded)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append(indent + "  ".join([*cells, row[-1]]).rstrip())
    return lines


def _rule_outcome(spec: Spec, policy_name: str, index: int) -> str:
    rule = spec.policies[policy_name].rules[index].spec
    if rule.to is None:
        return "proceed"
    parts = [rule.to]
    if rule.direct:
        parts.append("(direct)")
    if rule.delay != "none":
        parts.append(f"(delay {rule.delay})")
    if rule.refuse is not None:
        parts.append(f"(refuse {rule.refuse})")
    return " ".join(parts)


def render_spec(spec: Spec) -> list[str]:
    """A readable summary of `spec`, as lines: states, transitions, policies, deadlines."""
    header = spec.data.spec
    lines = [
        f"spec {header.name} (seed {header.seed_version}, contract version "
        f"{header.contract_version}) from {spec.source}",
        f"{summary_line(spec)}",
        "",
        f"States ({len(spec.states)})",
    ]
    lines += _columns(
        [("STATE", "KIND", "MEANING")]
        + [(name, state.kind, state.meaning) for name, state in spec.states.items()]
    )
    lines += ["", f"Transitions ({len(spec.edges)})"]
    lines += _columns(
        [("FROM", "TO", "EVENT", "ACTORS", "OPERATIONS")]
        + [
            (
                edge.from_state,
                edge.to,
                edge.event,
                ",".join(edge.actors),
                ",".join(edge.operations) + (f"  [exit {edge.exit}]" if edge.exit else ""),
            )
            for edge in spec.data.transitions
        ]
    )
    lines += ["", f"Policies ({len(spec.policies)}; first matching rule decides)"]
    for name, policy in spec.policies.items():
        via = f", via {policy.spec.via}" if policy.spec.via is not None else ""
        lines.append(f"  {name}{via}: {policy.spec.meaning}")
        lines += _columns(
            [
                (
                    f"{rule.index + 1}.",
                    ", ".join(rule.spec.when) if rule.spec.when else "always",
                    "->",
                    _rule_outcome(spec, name, rule.index),
                    rule.spec.decision,
                )
                for rule in policy.rules
            ],
            indent="    ",
        )
    lines += [
        "",
        f"Deadlines (for work admitted at contract version {spec.deadline_contract_version} "
        "or later; first fallen in this order decides)",
    ]
    lines += _columns(
        [("KIND", "ANCHOR", "BOUNDS", "WHILE")]
        + [
            (
                kind,
                spec.deadline_kinds[kind].anchor,
                spec.deadline_kinds[kind].bounds,
                ", ".join(spec.deadline_kinds[kind].while_states),
            )
            for kind in spec.deadline_order
        ]
    )
    return lines
