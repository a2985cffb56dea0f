"""`workwarden check` and `workwarden replay`: the model checker and its counterexamples.

`workwarden check [SPEC | --spec FILE] [bounds...] [--json FILE]` explores the
spec's core in a bounded universe and exits 0 when the exploration completed
with nothing found, 1 when it found a violation (a trace is written for each,
for `workwarden replay`), and 3 when it stopped early (`--max-states`) with
nothing found so far: a partial exploration proves nothing. Bad input (an
unknown mutant, an unwritable output, a spec given twice) is one line
`CODE: message` with exit status 1, as for every command.

`--engine compiled` (the default) explores the compiled model and then holds
it to the real core (`refinement.refine`, `--samples` random walks besides
the witnesses and counterexamples); a disagreement is printed as a
REFINEMENT FAILURE with its trace (written as `trace-refinement.json`) and
exits 1. `--engine reference` runs the core at every step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from workwarden.cli import (
    OUTPUT_UNWRITABLE,
    at_least,
    between,
    check_output,
    read_input,
    stopped_by_sigterm,
    write_output,
)
from workwarden.statemachine import errors
from workwarden.statemachine.check.abstraction import MAX_SYMMETRIC_WORKERS

__all__ = ["EXIT_INCOMPLETE", "EXIT_VIOLATION", "register", "spec_argument"]

#: `workwarden check`'s exit status when it found a violation (or a policy problem).
EXIT_VIOLATION = 1
#: `workwarden check`'s exit status when the exploration stopped before it was complete.
EXIT_INCOMPLETE = 3

_UNIVERSE_INTS = (
    "workers",
    "workloads",
    "max_attempts",
    "lease_ms",
    "horizon_ms",
    "rearms",
    "operator_actions",
    "moves",
    "crashes",
    "racer_prepares",
    "checkpoints_per_attempt",
)


#: The least each bound may be (as in the `[check]` table); the others start at 0.
_UNIVERSE_MINIMUM = {
    "workers": 1,
    "workloads": 1,
    "max_attempts": 1,
    "lease_ms": 1,
    "horizon_ms": 1,
}
#: The most each bound may be. Workers are renamed in every order to reduce their
#: symmetry (`MAX_SYMMETRIC_WORKERS`: 8! orders); more than a few workloads, or counts
#: and instants past these, make a universe no machine explores, and past them building
#: the first state alone would take hours or fail.
_UNIVERSE_MAXIMUM = {
    "workers": MAX_SYMMETRIC_WORKERS,
    "workloads": 26,
    "lease_ms": 1_000_000,
    "horizon_ms": 1_000_000,
    "initial_delay_ms": 1_000_000,
    "max_delay_ms": 1_000_000,
}
_COUNT_MAXIMUM = 100
DEFAULT_SAMPLES = 16
"""The random traces the compiled engine replays without `--samples`."""
MAX_SAMPLES = 100_000
"""The most random traces `--samples` replays."""
MAX_PROCESSES = 64
"""The most helper processes `--processes` forks."""
_UNIVERSE_BOOLS = ("dependent", "racer", "stale_workers", "request_ids")


def _least(name: str) -> int:
    return _UNIVERSE_MINIMUM.get(name, 0)


def _most(name: str) -> int:
    return _UNIVERSE_MAXIMUM.get(name, _COUNT_MAXIMUM)


def _universe_problem(universe: Any) -> str | None:
    """What is wrong with a universe read from a trace (None: nothing)."""
    for name in (*_UNIVERSE_INTS, "initial_delay_ms", "max_delay_ms"):
        value, least, most = getattr(universe, name), _least(name), _most(name)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            return f"{name} must be a whole number from {least} to {most:,}, not {value!r}"
    for name in _UNIVERSE_BOOLS:
        if not isinstance(getattr(universe, name), bool):
            return f"{name} must be true or false"
    for name in ("first_timeouts", "second_timeouts"):
        value = getattr(universe, name)
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in value.items()
        ):
            return f"{name} must be an object of deadlines in milliseconds"
    for name in ("second_retry_on", "first_retry_on"):
        value = getattr(universe, name)
        if not (value is None or all(isinstance(item, str) for item in value)):
            return f"{name} must be a list of failure names"
    return None


def _universe(args: argparse.Namespace, spec: Any) -> Any:
    from workwarden.statemachine.check.universe import Universe

    overrides: dict[str, Any] = {}
    for name in _UNIVERSE_INTS:
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    for flag in ("racer", "dependent", "request_ids"):
        if getattr(args, flag) is not None:
            overrides[flag] = getattr(args, flag)
    if args.first_timeouts is not None:
        overrides["first_timeouts"] = _timeouts(args.first_timeouts)
    return Universe.from_spec(spec, **overrides)


def _timeouts(text: str) -> dict[str, int]:
    """`--first-timeouts`: `KIND_ms=N` pairs, comma-separated (`claim_ms=8,execution_ms=12`);
    the values bounded as the `[check]` table's `first_timeouts` are."""
    from pydantic import ValidationError

    from workwarden.statemachine.models import Timeouts
    from workwarden.statemachine.spec_model import CheckSpec

    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in Timeouts.model_fields or not value.strip().isdigit():
            known = ", ".join(Timeouts.model_fields)
            raise errors.WorkloadError(
                errors.INVALID,
                f"--first-timeouts: {part!r} is not NAME=MILLISECONDS with NAME one of {known}",
                {"field": "--first-timeouts"},
            )
        out[name] = int(value)
    try:
        CheckSpec.model_validate({"first_timeouts": out})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise errors.WorkloadError(
            errors.INVALID,
            f"--first-timeouts: {first['loc'][-1]}: {first['msg']}",
            {"field": "--first-timeouts"},
        ) from None
    return out


_BOUND_HELP = {
    "workloads": "workloads admitted, each depending on the one before (not with --single)",
    "moves": "operations of effect move (pause, resume, approve...) per workload in one path",
    "operator_actions": "operator calls (cancel, timeout, retry) in one path",
}


class _Progress:
    """A one-line progress display on a terminal; silent otherwise."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.started = time.perf_counter()

    def __call__(self, states: int, transitions: int, depth: int) -> None:
        if not self.enabled:
            return
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        bar = "#" * min(30, depth) + "." * max(0, 30 - depth)
        self.stream.write(
            f"\r  [{bar}] depth {depth:>3}  {states:>9,} states  {transitions:>10,} transitions"
            f"  {states / elapsed:>8,.0f} states/s"
        )
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\n")


def spec_argument(positional: str | None, option: str | None) -> str | None:
    """The spec file a command was given, positionally or with `--spec` (None: the shipped one).

    Both may be given only when they name the same file; otherwise the call is
    `WORKLOAD_INVALID`.
    """
    if positional is not None and option is not None and positional != option:
        raise errors.WorkloadError(
            errors.INVALID,
            f"two spec files given: {positional} and --spec {option}; give one",
            {"field": "--spec"},
        )
    return option if option is not None else positional


def _mutant(name: str | None) -> Any:
    """The mutant called `name` (None for none); an unknown name is `WORKLOAD_INVALID`."""
    from workwarden.cli.check_scheduling import pick_mutant
    from workwarden.statemachine.check.mutants import MUTANTS

    return pick_mutant(MUTANTS, name, "mutant")


def _writable_file(path: str, option: str) -> Path:
    """`path` as a file that can be written, checked before any work is done (and not made:
    a refused check leaves no file behind)."""
    if not path:
        # An unset variable in a script: refused, not taken for "no report".
        raise errors.WorkloadError(
            OUTPUT_UNWRITABLE, f"{option} is empty: name a file", {"path": path}
        )
    check_output(path, option)
    return Path(path)


def _write(path: Path, text: str, option: str) -> None:
    """Write `text` to `path` whole: beside it, then moved over it (`output_file`)."""
    write_output(str(path), text, option)


def _print_report(report: Any, out: Any) -> None:
    d = report.to_dict()
    w = out.write
    w(f"workwarden check: {d['spec']}\n")
    w(f"  universe      {json.dumps(d['universe'], sort_keys=True)}\n")
    complete = (
        "complete"
        if d["complete"]
        else "INCOMPLETE (stopped early: a partial exploration proves nothing)"
    )
    w(f"  explored      {d['states']:,} states, {d['transitions']:,} transitions, ")
    w(f"depth {d['depth']}, {d['seconds']:.1f} s, {d['states_per_second']:,.0f} states/s, ")
    w(f"{complete}\n")
    taken = len(d["edges_taken"])
    total = taken + len(d["edges_never_taken"])
    w(f"  edges taken   {taken} of {total}\n")
    for edge in d["edges_never_taken"]:
        w(f"    never taken: {edge}\n")
    w(f"  never at rest {', '.join(d['never_at_rest']) or '(none)'}\n")
    for policy, rules in d["rules_never_taken"].items():
        for rule in rules:
            w(f"    rule never deciding: {policy}.{rule}\n")
    w(f"  terminal states unreached: {', '.join(d['terminal_unreached']) or '(none)'}\n")
    w(f"  states that cannot finish: {d['cannot_finish']}")
    w(f" (cut off by the bounds {d['horizon_cut']})\n")
    for problem in d["policy_problems"]:
        w(f"  POLICY: {problem}\n")
    w(f"  engine        {d['engine']}")
    tables = d["tables"]
    if tables:
        w(f" ({tables['classes']:,} document classes, {tables['entries']:,} table entries")
        if "asked" in tables:
            w(f": {tables['asked']:,} asked of the core, {sum(tables['shared']):,} shared")
        if tables.get("processes", 1) > 1:
            w(f"; {tables['processes']} helper processes")
        w(")")
    w("\n")
    for failure in d["refinement"]:
        w(f"  REFINEMENT FAILURE: {failure['message']} ({len(failure['trace'])} steps)\n")
        for number, step in enumerate(failure["trace"], start=1):
            w(f"      {number:>3}. {json.dumps(step, sort_keys=True)}\n")
    if d["violations"]:
        w(f"  VIOLATIONS: {len(d['violations'])}\n")
        for v in d["violations"]:
            w(f"    {v['property']}: {v['message']} ({len(v['trace'])} steps)\n")
            for number, step in enumerate(v["trace"], start=1):
                w(f"      {number:>3}. {json.dumps(step, sort_keys=True)}\n")
    else:
        w("  violations    0\n")


def _run_check(args: argparse.Namespace) -> int:
    # SIGTERM ends a check as Ctrl-C does: its helper processes are stopped, no report or
    # trace is written, and the status is 143.
    with stopped_by_sigterm():
        return _checked(args)


def _named_mutant(name: str | None) -> None:
    """Refuse `--mutant ""` (an unset variable in a script), which would check the real
    core while the command line says a mutant."""
    if name == "":
        raise errors.bad_argument("--mutant", "--mutant is empty: name a mutant, or leave it out")


#: The options of the core's universe and engine, by the name `args` holds them under,
#: with the flag a user types; the scheduling universe has none of them.
_CORE_ONLY = {
    **{name: f"--{name.replace('_', '-')}" for name in _UNIVERSE_INTS},
    "racer": "--racer/--no-racer",
    "request_ids": "--request-ids/--no-request-ids",
    "dependent": "--single",
    "first_timeouts": "--first-timeouts",
    "engine": "--engine",
    "samples": "--samples",
    "processes": "--processes",
}
#: The bounds the scheduling universe reads as well (its help says so).
_SHARED = ("workers", "lease_ms")


def _refuse_core_options(args: argparse.Namespace) -> None:
    """Refuse, with `--scheduling`, an option only the core's universe reads: it would be
    silently ignored, and the report would not be of the universe the command line says."""
    for name, flag in _CORE_ONLY.items():
        if name not in _SHARED and getattr(args, name) is not None:
            raise errors.bad_argument(
                flag.split("/")[0],
                f"{flag} is an option of the core's universe, not of --scheduling "
                "(which reads --workers, --lease-ms and --max-states)",
            )


def _checked(args: argparse.Namespace) -> int:
    from workwarden.statemachine.check.checker import check
    from workwarden.statemachine.check.universe import Model
    from workwarden.statemachine.spec import load_spec

    _named_mutant(args.mutant)
    spec_file = spec_argument(args.spec, args.spec_option)
    if args.scheduling:
        from workwarden.cli.check_scheduling import run_scheduling

        _refuse_core_options(args)

        json_file = _writable_file(args.json, "--json") if args.json is not None else None
        clean, complete = run_scheduling(args, spec_file, json_file)
        return EXIT_VIOLATION if not clean else 0 if complete else EXIT_INCOMPLETE
    scheduling_only = ("tenants", "admissions", "limit", "ticks")
    given = [name for name in scheduling_only if getattr(args, name) is not None]
    if given:
        raise errors.bad_argument(
            f"--{given[0]}",
            f"--{given[0]} is an option of the scheduling universe: add --scheduling",
        )
    mutant = _mutant(args.mutant)
    args.engine = args.engine or "compiled"
    args.samples = DEFAULT_SAMPLES if args.samples is None else args.samples
    args.processes = 1 if args.processes is None else args.processes
    if not 0 <= args.samples <= MAX_SAMPLES:
        raise errors.WorkloadError(
            errors.INVALID, f"--samples must be 0 to {MAX_SAMPLES:,}", {"field": "--samples"}
        )
    _check_processes(args)
    json_path = _writable_file(args.json, "--json") if args.json is not None else None
    from workwarden.cli.check_scheduling import check_trace_dir

    check_trace_dir(args.trace_dir)
    spec = load_spec(spec_file)
    universe = _universe(args, spec)
    # The compiled engine asks its model only where a table lacks an entry.
    limits: dict[str, Any] = {}
    if args.engine == "compiled":
        from workwarden.statemachine.check.compiled import COMPILED_CACHE_LIMIT

        limits["cache_limit"] = COMPILED_CACHE_LIMIT
    if mutant is not None:
        spec = mutant.spec(spec)
        model = Model(
            spec,
            universe,
            decide_fn=mutant.decide_fn,
            authority_cls=mutant.authority_cls(),
            commit_checks_version=mutant.commit_checks_version,
            **limits,
        )
    else:
        model = Model(spec, universe, **limits)
    progress = _Progress(sys.stderr)
    if args.engine == "reference":
        report = check(spec, universe, model=model, max_states=args.max_states, progress=progress)
        progress.done()
    else:
        report = _check_compiled(args, spec, universe, model, mutant, progress)
    _print_report(report, sys.stdout)
    traces: list[tuple[Path, dict[str, Any]]] = []
    if report.violations or report.refinement:
        from workwarden.cli.check_scheduling import trace_dir

        out_dir = trace_dir(args.trace_dir)
        for finding in [*report.violations, *report.refinement[:1]]:
            trace = {
                "spec": spec_file,
                "mutant": args.mutant,
                "universe": universe.to_dict(),
                "property": finding.property,
                "message": finding.message,
                "steps": list(finding.trace),
            }
            path = out_dir / f"trace-{finding.property}.json"
            # Every file is refused before any is written (a folder of a trace's name):
            # a refused check leaves no report and no trace.
            check_output(str(path), "--trace-dir")
            traces.append((path, trace))
    if json_path is not None:
        _write(json_path, json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n", "--json")
    for path, trace in traces:
        _write(path, json.dumps(trace, indent=2, sort_keys=True) + "\n", "--trace-dir")
        print(f"  trace written: {path}  (workwarden replay {path})")
    if not report.ok:
        return EXIT_VIOLATION
    if not report.complete:
        print(
            f"  stopped after {report.states:,} states (--max-states): raise the limit or "
            "shrink the universe for a complete check",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return 0


def _check_processes(args: argparse.Namespace) -> None:
    """`--processes`: 1 to `MAX_PROCESSES`, more than 1 only with the compiled engine, where
    fork is."""
    from workwarden.statemachine.check import compiled

    if not 1 <= args.processes <= MAX_PROCESSES:
        raise errors.WorkloadError(
            errors.INVALID,
            f"--processes must be 1 to {MAX_PROCESSES}",
            {"field": "--processes"},
        )
    if args.processes > 1 and args.engine != "compiled":
        raise errors.WorkloadError(
            errors.INVALID,
            "--processes above 1 needs the compiled engine (--engine compiled)",
            {"field": "--processes"},
        )
    if args.processes > 1 and not compiled.can_fork():
        raise errors.WorkloadError(
            errors.INVALID,
            "--processes above 1 forks helper processes, which this system cannot",
            {"field": "--processes"},
        )


def _check_compiled(
    args: argparse.Namespace, spec: Any, universe: Any, model: Any, mutant: Any, progress: Any
) -> Any:
    """Explore through the compiled model, then hold it to the real core (`refinement.refine`)."""
    from workwarden.statemachine.check.compiled import CompiledModel
    from workwarden.statemachine.check.compiled_check import check_compiled
    from workwarden.statemachine.check.refinement import refine

    compiled = CompiledModel(model)
    report = check_compiled(
        spec,
        universe,
        compiled=compiled,
        max_states=args.max_states,
        progress=progress,
        processes=args.processes,
    )
    progress.done()
    if not report.refinement:
        report.refinement += refine(
            compiled,
            report,
            samples=args.samples,
            authority_cls=None if mutant is None else mutant.authority_cls(),
            wrap_store=None if mutant is None else mutant.wrap_store,
        )
    return report


def _read_trace(path: str) -> dict[str, Any]:
    """A trace file written by `workwarden check`; anything else is `WORKLOAD_INVALID`."""

    def bad(message: str) -> errors.WorkloadError:
        return errors.WorkloadError(errors.INVALID, f"trace {path}: {message}", {"field": "TRACE"})

    text = read_input(path, "trace")
    try:
        trace = json.loads(text)
    except RecursionError:
        raise bad("JSON nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        lines = [line for line in text.splitlines() if line.strip()]
        hint = ""
        if len(lines) > 1:
            try:
                json.loads(lines[0])
                hint = " (it looks like JSON Lines; a trace is one JSON object)"
            except json.JSONDecodeError:
                pass
        raise bad(f"not JSON: {exc.msg} at line {exc.lineno}{hint}") from None
    if not isinstance(trace, dict):
        raise bad(f"expected a JSON object, found {type(trace).__name__}")
    missing = [key for key in ("universe", "steps") if key not in trace]
    if missing:
        raise bad(f"not a checker trace: no {' or '.join(missing)}")
    steps = trace["steps"]
    if not isinstance(trace["universe"], dict) or not isinstance(steps, list):
        raise bad("not a checker trace: universe must be an object and steps a list")
    for number, step in enumerate(steps, start=1):
        if not isinstance(step, dict) or not isinstance(step.get("action"), str):
            raise bad(f"step {number} is not an action (an object with an action name)")
        for key in ("slot", "worker", "to", "now"):
            value = step.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"step {number}: {key} must be a whole number")
        for key in ("actor", "arg"):
            if not isinstance(step.get(key, ""), str):
                raise bad(f"step {number}: {key} must be text")
    spec = trace.get("spec")
    if spec is not None and not isinstance(spec, str):
        raise bad("spec must be the path of a spec file, or null")
    mutant = trace.get("mutant")
    if mutant is not None and not isinstance(mutant, str):
        raise bad("mutant must be a mutant's name, or null")
    return trace


def _check_steps(model: Any, trace: dict[str, Any], path: str) -> None:
    """Refuse a trace whose steps name workloads, workers or actions the universe lacks."""
    from workwarden.statemachine.check.universe import CALL_ARGS

    known = {
        "jump", "crash", "claim", "claim_next", "start", "heartbeat", "execution_context",
        "checkpoint", "complete", "fail", "confirm_cancel", "stale_complete", "stale_heartbeat",
        "stale_confirm_cancel", "stale_fail", "claim_again", "cancel", "timeout", "retry",
        "recover_expired", "enforce_deadlines", "prepare_recover", "prepare_enforce",
        "prepare_complete", "commit", "move", "admit", "forged_heartbeat", "forged_complete",
        "forged_fail", "forged_confirm_cancel",
    }  # fmt: skip
    moves = dict(model.moves)
    for number, step in enumerate(trace["steps"], start=1):
        label = step["action"]
        problem = None
        if label not in known:
            problem = f"unknown action {label!r}"
        elif label == "move" and step.get("arg") not in moves:
            valid = ", ".join(moves) or "none in this spec"
            problem = f"move {step.get('arg')!r} is not an operation of effect move ({valid})"
        elif label in CALL_ARGS and step.get("arg", "") not in CALL_ARGS[label][0]:
            forms, what = CALL_ARGS[label]
            valid = ", ".join(repr(form) for form in forms)
            problem = f"{label} {step.get('arg', '')!r} is not {what} ({valid})"
        elif not -1 <= step.get("slot", -1) < len(model.ids):
            problem = f"slot {step['slot']} names no workload of the universe"
        elif not -1 <= step.get("worker", -1) < len(model.worker_names):
            problem = f"worker {step['worker']} names no worker of the universe"
        if problem is not None:
            raise errors.WorkloadError(
                errors.INVALID, f"trace {path}: step {number}: {problem}", {"field": "TRACE"}
            )


def _open_store(url: str) -> tuple[Any, str | None]:
    """The store at `url`, and the SQLite file this call created (None: it made none); a
    URL no store answers to, or one that fails to open, is coded."""
    from workwarden.storage import SQLiteStore, StoreError
    from workwarden.storage.urls import STORE_NOT_FOUND, open_store

    try:
        try:
            return open_store(url, mode="write"), None
        except errors.WorkloadError as exc:
            if exc.code != STORE_NOT_FOUND:
                raise
        # A replay admits the trace's workloads into an empty store: one it may create.
        store = open_store(url, mode="create")
        return store, store.path if isinstance(store, SQLiteStore) else None
    except errors.WorkloadError:
        raise
    except ValueError as exc:
        raise errors.WorkloadError(
            errors.INVALID, f"--store: {exc}", {"field": "--store"}
        ) from None
    except StoreError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot open the store: {exc}"
        ) from None


def _remove_created(path: str | None) -> None:
    """Remove the SQLite file (and its side files) a replay created, if it created one."""
    if path is not None:
        for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-journal"):
            Path(name).unlink(missing_ok=True)


def _refuse_work(store: Any, what: str) -> None:
    """Close `store` and refuse it (`WORKLOAD_STORE_UNUSABLE`) unless it holds no workload."""
    from workwarden.storage import StoreError
    from workwarden.storage.urls import STORE_UNUSABLE

    try:
        holds = next(iter(store.scan()), None) is not None
    except StoreError as exc:
        store.close()
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot read the store: {exc}"
        ) from None
    if holds:
        store.close()
        raise errors.WorkloadError(
            STORE_UNUSABLE, f"{what} needs an empty store; this one holds workloads"
        )


def _replay_spec(named: str | None, option: str | None) -> str | None:
    """The spec a trace is replayed under: the one it names, unless `--spec` is given.

    A trace names its spec as `check` was given it, relative to where `check` ran; from
    elsewhere that path names nothing, or another file. So `--spec` agrees with the trace
    when it is the same path, names the same file by another path, or the trace's path
    names no file from here; a `--spec` naming another file than the one the trace's path
    names is `WORKLOAD_INVALID`.
    """
    if named is None or option is None or named == option:
        return option if option is not None else named
    try:
        if not Path(named).exists() or Path(named).samefile(option):
            return option
    except (OSError, ValueError):
        return option  # `--spec` itself cannot be read: `load_spec` says why
    raise errors.WorkloadError(
        errors.INVALID,
        f"the trace was checked under the spec {named}, and --spec {option} is another "
        "file; give --spec only to name the trace's spec where its path does not reach",
        {"field": "--spec"},
    )


def _run_replay(args: argparse.Namespace) -> int:
    from workwarden.statemachine.check.replay import replay_trace
    from workwarden.statemachine.check.universe import Model, Universe
    from workwarden.statemachine.spec import load_spec

    _named_mutant(args.mutant)
    trace = _read_trace(args.trace)
    if trace.get("scheduling") is True:
        from workwarden.cli.check_scheduling import replay_scheduling

        if args.store != "memory:":
            raise errors.bad_argument(
                "--store", "a scheduling trace replays on the memory store it was explored on"
            )
        spec_file = _replay_spec(trace.get("spec"), args.spec)
        return replay_scheduling(trace, spec_file, args.mutant or trace.get("mutant"))
    mutant = _mutant(args.mutant or trace.get("mutant"))
    spec = load_spec(_replay_spec(trace.get("spec"), args.spec))
    authority_cls = None
    if mutant is not None:
        spec = mutant.spec(spec)
        authority_cls = mutant.authority_cls()
    try:
        universe = Universe.from_dict(trace["universe"])
    except TypeError as exc:
        raise errors.WorkloadError(
            errors.INVALID, f"trace {args.trace}: not a checker universe: {exc}"
        ) from None
    problem = _universe_problem(universe)
    if problem is not None:
        raise errors.WorkloadError(
            errors.INVALID,
            f"trace {args.trace}: not a checker universe: {problem}",
            {"field": "TRACE"},
        )
    model = Model(spec, universe)
    _check_steps(model, trace, args.trace)
    store, created = _open_store(args.store)
    try:
        _refuse_work(store, "a replay")
        if mutant is not None and mutant.wrap_store is not None:
            store = mutant.wrap_store(store)
        try:
            result = replay_trace(
                spec,
                trace,
                store,
                model=model,
                **({"authority_cls": authority_cls} if authority_cls else {}),
            )
        except errors.WorkloadError as exc:
            if exc.code != errors.INVALID or "step" not in (exc.details or {}):
                raise
            raise errors.WorkloadError(
                exc.code, f"trace {args.trace}: {exc.message}", exc.details
            ) from None
        finally:
            store.close()
    except BaseException:
        # A replay refused or stopped part way leaves no store it created, so it can be
        # run again on the same --store.
        _remove_created(created)
        raise
    for step in result.steps:
        refused = f"  -> {step['refusal']}" if step["refusal"] else ""
        shown = {k: v for k, v in step.items() if k not in ("step", "refusal")}
        print(f"  {step['step']:>3}. {json.dumps(shown, sort_keys=True)}{refused}")
    if result.violation is not None:
        number, prop, message = result.violation
        print(f"reproduced at step {number}: {prop}: {message}")
        return 1
    print("replayed every step; no property was violated")
    return 0


def register(subparsers: Any) -> None:
    """Add the `check` and `replay` subcommands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check",
        help="explore the pure core exhaustively in a bounded universe",
        description=(
            "Breadth-first, explicit-state exploration of the spec's core in a bounded "
            "universe: invariants, edge and rule coverage, states never at rest, policy "
            "totality, liveness. The universe comes from the spec's [check] table, then "
            "these options."
        ),
    )
    parser.add_argument("spec", nargs="?", default=None, help="spec file (default: shipped)")
    parser.add_argument(
        "--spec",
        dest="spec_option",
        metavar="FILE",
        default=None,
        help="spec file (the same as the positional SPEC; give one or the other)",
    )
    for name in _UNIVERSE_INTS:
        least, most = _least(name), _most(name)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=between(least, most),
            default=None,
            metavar="N",
            help=f"{_BOUND_HELP[name]} ({least} to {most:,})"
            if name in _BOUND_HELP
            else f"{least} to {most:,}",
        )
    parser.add_argument(
        "--racer",
        dest="racer",
        action="store_true",
        default=None,
        help="add a writer that holds a prepared decision while others commit",
    )
    parser.add_argument("--no-racer", dest="racer", action="store_false")
    parser.add_argument(
        "--request-ids",
        dest="request_ids",
        action="store_true",
        default=None,
        help=(
            "claims and the operator's calls carry request ids and are sent again, as after "
            "a lost reply"
        ),
    )
    parser.add_argument("--no-request-ids", dest="request_ids", action="store_false")
    parser.add_argument(
        "--first-timeouts",
        metavar="NAME=MS,...",
        default=None,
        help=(
            "the first workload's deadlines, e.g. claim_ms=8,execution_ms=12 (replaces the "
            "[check] table's first_timeouts)"
        ),
    )
    parser.add_argument(
        "--single",
        dest="dependent",
        action="store_false",
        default=None,
        help="one workload only (no second workload depending on it)",
    )
    parser.add_argument(
        "--max-states",
        type=at_least(1),
        default=None,
        help=f"stop after this many states (the check then exits {EXIT_INCOMPLETE}: incomplete)",
    )
    parser.add_argument("--json", default=None, help="write the report as JSON to this file")
    parser.add_argument("--trace-dir", default=".", help="where counterexample traces go")
    parser.add_argument("--mutant", default=None, help="check a deliberately broken variant")
    parser.add_argument(
        "--engine",
        choices=("compiled", "reference"),
        default=None,
        help=(
            "compiled: explore the spec compiled into tables and hold them to the real core "
            "(the default); reference: run the core at every step"
        ),
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help=(
            "random traces of the compiled model replayed through the real core (compiled) "
            f"(default: {DEFAULT_SAMPLES})"
        ),
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help=(
            "compiled: ask the real core for each level's missing table entries in this "
            "many helper processes (forked; POSIX only); the report is the same (default: 1)"
        ),
    )
    from workwarden.cli.check_scheduling import register_options

    register_options(parser)
    parser.set_defaults(handler=_run_check)

    replay: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="run a checker trace through a real Authority on any store",
    )
    replay.add_argument("trace", help="a trace file written by workwarden check")
    replay.add_argument("--store", default="memory:", help="store URL (default memory:)")
    replay.add_argument("--mutant", default=None, help="replay against a broken variant")
    replay.add_argument(
        "--spec",
        default=None,
        metavar="FILE",
        help=(
            "the spec file (default: the one the trace names; by any path, the same file, "
            "unless the trace's path names none from here)"
        ),
    )
    replay.set_defaults(handler=_run_replay)
