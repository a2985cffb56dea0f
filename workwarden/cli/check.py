"""`workwarden check` and `workwarden replay`: the model checker and its counterexamples."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["register"]

_UNIVERSE_INTS = (
    "workers",
    "max_attempts",
    "lease_ms",
    "horizon_ms",
    "rearms",
    "operator_actions",
    "crashes",
    "racer_prepares",
    "checkpoints_per_attempt",
)


def _universe(args: argparse.Namespace, spec: Any) -> Any:
    from workwarden.statemachine.check.universe import Universe

    overrides: dict[str, Any] = {}
    for name in _UNIVERSE_INTS:
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    for flag in ("racer", "dependent"):
        if getattr(args, flag) is not None:
            overrides[flag] = getattr(args, flag)
    return Universe.from_spec(spec, **overrides)


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


def _print_report(report: Any, out: Any) -> None:
    d = report.to_dict()
    w = out.write
    w(f"workwarden check: {d['spec']}\n")
    w(f"  universe      {json.dumps(d['universe'], sort_keys=True)}\n")
    complete = "complete" if d["complete"] else "INCOMPLETE (stopped early)"
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
    w(f" (horizon cut {d['horizon_cut']})\n")
    for problem in d["policy_problems"]:
        w(f"  POLICY: {problem}\n")
    if d["violations"]:
        w(f"  VIOLATIONS: {len(d['violations'])}\n")
        for v in d["violations"]:
            w(f"    {v['property']}: {v['message']} ({len(v['trace'])} steps)\n")
            for number, step in enumerate(v["trace"], start=1):
                w(f"      {number:>3}. {json.dumps(step, sort_keys=True)}\n")
    else:
        w("  violations    0\n")


def _run_check(args: argparse.Namespace) -> int:
    from workwarden.statemachine.check.checker import check
    from workwarden.statemachine.check.mutants import MUTANTS
    from workwarden.statemachine.check.universe import Model
    from workwarden.statemachine.spec import load_spec

    spec = load_spec(args.spec)
    universe = _universe(args, spec)
    mutant = MUTANTS[args.mutant] if args.mutant else None
    if mutant is not None:
        spec = mutant.spec(spec)
        model = Model(
            spec,
            universe,
            decide_fn=mutant.decide_fn,
            authority_cls=mutant.authority_cls(),
            commit_checks_version=mutant.commit_checks_version,
        )
    else:
        model = Model(spec, universe)
    progress = _Progress(sys.stderr)
    report = check(spec, universe, model=model, max_states=args.max_states, progress=progress)
    progress.done()
    _print_report(report, sys.stdout)
    if args.json:
        Path(args.json).write_text(
            json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
    if report.violations:
        out_dir = Path(args.trace_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for finding in report.violations:
            trace = {
                "spec": args.spec,
                "mutant": args.mutant,
                "universe": universe.to_dict(),
                "property": finding.property,
                "message": finding.message,
                "steps": list(finding.trace),
            }
            path = out_dir / f"trace-{finding.property}.json"
            path.write_text(json.dumps(trace, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            print(f"  trace written: {path}  (workwarden replay {path})")
    return 0 if report.ok else 1


def _run_replay(args: argparse.Namespace) -> int:
    from workwarden.statemachine.check.mutants import MUTANTS
    from workwarden.statemachine.check.replay import replay_trace
    from workwarden.statemachine.check.universe import Model, Universe
    from workwarden.statemachine.spec import load_spec
    from workwarden.storage.urls import open_store

    trace = json.loads(Path(args.trace).read_text(encoding="utf-8"))
    spec = load_spec(trace.get("spec"))
    name = args.mutant or trace.get("mutant")
    mutant = MUTANTS[name] if name else None
    authority_cls = None
    if mutant is not None:
        spec = mutant.spec(spec)
        authority_cls = mutant.authority_cls()
    model = Model(spec, Universe.from_dict(trace["universe"]))
    store = open_store(args.store)
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
    finally:
        store.close()
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
    for name in _UNIVERSE_INTS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None)
    parser.add_argument(
        "--racer",
        dest="racer",
        action="store_true",
        default=None,
        help="add a writer that holds a prepared decision while others commit",
    )
    parser.add_argument("--no-racer", dest="racer", action="store_false")
    parser.add_argument(
        "--single",
        dest="dependent",
        action="store_false",
        default=None,
        help="one workload only (no second workload depending on it)",
    )
    parser.add_argument("--max-states", type=int, default=None, help="stop after this many states")
    parser.add_argument("--json", default=None, help="write the report as JSON to this file")
    parser.add_argument("--trace-dir", default=".", help="where counterexample traces go")
    parser.add_argument("--mutant", default=None, help="check a deliberately broken variant")
    parser.set_defaults(handler=_run_check)

    replay: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="run a checker trace through a real Authority on any store",
    )
    replay.add_argument("trace", help="a trace file written by workwarden check")
    replay.add_argument("--store", default="memory:", help="store URL (default memory:)")
    replay.add_argument("--mutant", default=None, help="replay against a broken variant")
    replay.set_defaults(handler=_run_replay)
