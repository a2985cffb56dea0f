"""`workwarden check --scheduling`: the scheduler's fairness bound and concurrency limit, checked.

Explores the scheduling universe (`workwarden.statemachine.check.scheduling`):
two or three tenants admitting work at any moment, workers claiming fairly
across them through `Authority.claim_fair`, one concurrency key with a limit,
a clock that may jump past every lease and a sweeper. Exits as `check` does:
0 when the exploration completed with nothing found, 1 when a property broke
(a trace is written for each, for `workwarden replay`), 3 when `--max-states`
stopped it first.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from workwarden.cli import OUTPUT_UNWRITABLE, check_output, write_output
from workwarden.statemachine import errors

T = TypeVar("T")

__all__ = [
    "check_trace_dir",
    "pick_mutant",
    "register_options",
    "replay_scheduling",
    "run_scheduling",
    "trace_dir",
]


def register_options(parser: argparse.ArgumentParser) -> None:
    """Add the scheduling universe's options to `workwarden check`."""
    group = parser.add_argument_group(
        "scheduling universe (with --scheduling; --workers, --lease-ms, --max-states apply too)"
    )
    group.add_argument(
        "--scheduling",
        action="store_true",
        help="check the fair-share bound and the concurrency limit instead of the core",
    )
    group.add_argument("--tenants", default=None, help="comma-separated tenant names (default a,b)")
    group.add_argument(
        "--admissions",
        default=None,
        help="comma-separated workloads each tenant admits, in tenant order (default 3,1)",
    )
    group.add_argument(
        "--limit",
        default=None,
        help="the concurrency limit of the workloads' key, 1..6, or 'none' (default 1)",
    )
    group.add_argument(
        "--ticks", type=int, default=None, help="how often the clock may jump past every lease"
    )


def _names(value: str, option: str) -> tuple[str, ...]:
    parts = tuple(part.strip() for part in value.split(","))
    if not all(parts):
        raise errors.bad_argument(option, f"{option} is a comma-separated list")
    return parts


def _counts(value: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in _names(value, option))
    except ValueError:
        raise errors.bad_argument(
            option, f"{option} is a comma-separated list of integers"
        ) from None


def _universe(args: argparse.Namespace) -> Any:
    from workwarden.statemachine.check.scheduling import SchedulingUniverse

    fields: dict[str, Any] = {}
    if args.tenants is not None:
        fields["tenants"] = _names(args.tenants, "--tenants")
    if args.admissions is not None:
        fields["admissions"] = _counts(args.admissions, "--admissions")
    elif "tenants" in fields:
        fields["admissions"] = (3,) + (1,) * (len(fields["tenants"]) - 1)
    if args.limit is not None:
        if args.limit == "none":
            fields["limit"] = None
        else:
            limits = _counts(args.limit, "--limit")
            if len(limits) != 1:
                raise errors.bad_argument("--limit", "--limit is one integer, 1..6, or 'none'")
            (fields["limit"],) = limits
    if args.ticks is not None:
        fields["ticks"] = args.ticks
    if args.workers is not None:
        fields["workers"] = args.workers
    if args.lease_ms is not None:
        fields["lease_ms"] = args.lease_ms
    return SchedulingUniverse(**fields)


def check_trace_dir(path: str) -> None:
    """Refuse, before any exploration and creating nothing, a `--trace-dir` no trace could
    be written into: `WORKWARDEN_OUTPUT_UNWRITABLE` when it is not a directory, or it (or,
    when missing, the nearest folder above it that exists) cannot be written."""
    target = Path(path)
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    reason = None
    if not existing.is_dir():
        reason = f"{existing} is not a directory"
    else:
        # A real probe (a folder made and removed at once): permissions alone
        # do not tell, in /proc or on a read-only file system.
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".workwarden-probe-", dir=existing))
        except OSError as exc:
            reason = f"{existing} cannot be written ({exc.strerror or exc})"
    if reason is not None:
        raise errors.WorkloadError(
            OUTPUT_UNWRITABLE,
            f"cannot write traces into --trace-dir {path}: {reason}",
            {"field": "--trace-dir", "path": path},
        )


def trace_dir(path: str) -> Path:
    """`--trace-dir`, made if missing (`WORKWARDEN_OUTPUT_UNWRITABLE` when it cannot be)."""
    out_dir = Path(path)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.WorkloadError(
            OUTPUT_UNWRITABLE,
            f"--trace-dir {out_dir}: cannot make the directory: {exc.strerror or exc}",
            {"field": "--trace-dir", "path": path},
        ) from None
    return out_dir


def pick_mutant(table: Mapping[str, T], name: str | None, what: str) -> T | None:
    """The mutant `name` of `table` (None for none); an unknown name is `WORKLOAD_INVALID`."""
    if name is None:
        return None
    mutant = table.get(name)
    if mutant is None:
        raise errors.WorkloadError(
            errors.INVALID,
            f"no {what} {name!r}; they are: {', '.join(sorted(table))}",
            {"field": "--mutant", "valid": sorted(table)},
        )
    return mutant


def _mutant(name: str | None) -> Any:
    from workwarden.statemachine.check.scheduling import SCHEDULING_MUTANTS

    return pick_mutant(SCHEDULING_MUTANTS, name, "scheduling mutant")


def run_scheduling(
    args: argparse.Namespace, spec_file: str | None, json_path: Path | None
) -> tuple[bool, bool]:
    """Run `workwarden check --scheduling`: whether nothing was violated, and whether complete."""
    from workwarden.statemachine.check.scheduling import check_scheduling
    from workwarden.statemachine.spec import load_spec

    mutant = _mutant(args.mutant)
    universe = _universe(args)
    check_trace_dir(args.trace_dir)
    spec = load_spec(spec_file)
    report = check_scheduling(
        spec,
        universe,
        max_states=args.max_states if args.max_states is not None else 200_000,
        mutant=mutant,
    )
    d = report.to_dict()
    print(f"workwarden check --scheduling: {spec.source}")
    print(f"  universe      {json.dumps(d['universe'], sort_keys=True)}")
    print(f"  policy        {d['policy']}")
    status = "complete" if report.complete else "INCOMPLETE (--max-states)"
    print(f"  explored      {report.states:,} states, {report.transitions:,} transitions,")
    print(f"                depth {report.depth}, {report.claims:,} claims, {status}")
    print(f"  time          {report.seconds:.1f} s")
    for tenant in universe.tenants:
        print(
            f"  tenant {tenant:<6} largest wait {report.largest_wait[tenant]}"
            f" (bound {report.bounds[tenant]})"
        )
    traces: list[tuple[Path, str]] = []
    if report.violations:
        out_dir = trace_dir(args.trace_dir)
        for violation, steps in report.violations:
            print(f"  VIOLATION {violation.property}: {violation.message}")
            for number, step in enumerate(steps, 1):
                print(f"    {number:>3}. {step}")
            trace = {
                "scheduling": True,
                "spec": spec_file,
                "mutant": args.mutant,
                "universe": universe.to_dict(),
                "property": violation.property,
                "message": violation.message,
                "steps": [{"action": step} for step in steps],
            }
            path = out_dir / f"trace-{violation.property}.json"
            # Every file is refused before any is written (a folder of a trace's name):
            # a refused check leaves no report and no trace.
            check_output(str(path), "--trace-dir")
            traces.append((path, json.dumps(trace, indent=2, sort_keys=True) + "\n"))
    if json_path is not None:
        write_output(str(json_path), json.dumps(d, indent=2, sort_keys=True) + "\n", "--json")
    for path, text in traces:
        write_output(str(path), text, "--trace-dir")
        print(f"  trace written: {path}  (workwarden replay {path})")
    if report.violations:
        return False, report.complete
    if report.complete:
        print("  no violation: fair_share_bound and claims_within_concurrency_limits hold")
    return True, report.complete


def replay_scheduling(trace: dict[str, Any], spec_file: str | None, mutant_name: str | None) -> int:
    """Run a scheduling trace again from the start; 1 when it breaks a property, else 0."""
    from workwarden.statemachine.check.scheduling import SchedulingUniverse, replay
    from workwarden.statemachine.spec import load_spec

    data = trace.get("universe")
    steps = trace.get("steps")
    if not isinstance(data, dict) or not isinstance(steps, list):
        raise errors.bad_argument("trace", "a scheduling trace has a universe and its steps")
    if not isinstance(data.get("tenants"), list) or not isinstance(data.get("admissions"), list):
        # A string would be read as its letters' tuple: "ab" as tenants a and b.
        raise errors.bad_argument("trace", "a scheduling universe lists tenants and admissions")
    try:
        universe = SchedulingUniverse(
            tenants=tuple(data["tenants"]),
            admissions=tuple(data["admissions"]),
            workers=data["workers"],
            limit=data["limit"],
            ticks=data["ticks"],
            lease_ms=data["lease_ms"],
        )
    except (KeyError, TypeError):
        raise errors.bad_argument("trace", "not a scheduling universe") from None
    labels: list[str] = []
    for step in steps:
        label = step.get("action") if isinstance(step, dict) else None
        if not isinstance(label, str):
            raise errors.bad_argument("trace", "each step is an object with an action's label")
        labels.append(label)
    steps = labels
    found = replay(load_spec(spec_file), universe, labels, _mutant(mutant_name))
    for number, step in enumerate(steps, 1):
        print(f"  {number:>3}. {step}")
    if found:
        for violation in found:
            print(f"reproduced: {violation.property}: {violation.message}")
        return 1
    print("replayed every step; no property was violated")
    return 0
