"""Mutation testing of the decision modules, with each judge run on its own.

    nice -n 10 python -m bench.mutation --sample 40 --seed 0

Mutants are made by Cosmic Ray's mutation operators (`cosmic_ray.plugins`,
`cosmic_ray.mutating.mutate_code`: the `core/` operators, one occurrence
each) over the modules that hold the core's decisions. The tree is copied
first (`--work`, a fresh directory under /tmp): every mutant is written into
the copy, never into the working tree, and the judges import the copy (it
comes first on `PYTHONPATH`, ahead of the editable install). Each mutant is
then judged three times, separately, each with its own timeout:

- **checker**: `workwarden check` on a small universe (`CHECKER_ARGS`);
  killed when it reports a violation or fails;
- **stateful**: the stateful suite on the memory store with a short,
  derandomised Hypothesis profile (`STATEFUL_EXAMPLES` examples of
  `STATEFUL_STEPS` steps); killed when it fails;
- **tests**: the fast tests of the core (`CORE_TESTS`), killed when one fails.

Mutations inside type annotations are left out: under `from __future__
import annotations` they are never evaluated, so they cannot change behaviour.
A judge that times out counts as killing (the mutant hangs the core). A
mutant no judge kills is listed with its diff, for a reason to be given by
hand in `EQUIVALENT` (a mutant that cannot change behaviour) or left as a
gap. Results go to `bench/results/mutation.json` (sorted keys).
"""

from __future__ import annotations

import argparse
import ast as pyast
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: The modules that hold the core's decisions (paths under the statemachine package).
MODULES = (
    "core.py",
    "deadlines.py",
    "policies.py",
    "predicates.py",
    "replays.py",
    "admission.py",
    "steps.py",
)

#: The universe the checker judge explores: a few seconds per mutant.
CHECKER_ARGS = (
    "check",
    "--single",
    "--workers",
    "1",
    "--horizon-ms",
    "14",
    "--request-ids",
    "--engine",
    "compiled",
)

STATEFUL_EXAMPLES = 12
STATEFUL_STEPS = 25

#: The fast tests of the core (no process suites, no PostgreSQL).
CORE_TESTS = (
    "tests/test_policies.py",
    "tests/test_deadlines.py",
    "tests/test_failures.py",
    "tests/test_recovery.py",
    "tests/test_replays.py",
    "tests/test_fencing.py",
)

TIMEOUTS = {"checker": 240, "stateful": 240, "tests": 300}

#: Survivors judged by hand not to change behaviour: mutant id -> the reason.
EQUIVALENT: dict[str, str] = {
    "policies.py:core/ReplaceComparisonOperator_Eq_LtE:3": (
        "`delay <= 'initial'` in the elif after 'backoff': of the other values only"
        " 'initial' compares <= 'initial' ('none' sorts after it), so the branch is the same"
    ),
    "policies.py:core/ReplaceComparisonOperator_Eq_Is:1": (
        "`delay is 'initial'`: the spec's delay is a validated `Literal`, which pydantic"
        " hands back as the literal's own (interned) object, so `is` answers as `==`"
    ),
    "predicates.py:core/ReplaceComparisonOperator_Eq_Is:1": (
        "`effect is 'unknown'`: the effect is a validated `Literal` or the core's own"
        " constant, the interned object either way, so `is` answers as `==`"
    ),
    "steps.py:core/ReplaceComparisonOperator_Eq_Is:0": (
        "`kind is 'terminal'`: a state's kind is a validated `Literal`, the interned"
        " object, so `is` answers as `==`"
    ),
    "steps.py:core/ReplaceComparisonOperator_Eq_IsNot:1": (
        "the module's load-time self-check (every effect has its step) holds, so the"
        " assertion passes either way"
    ),
    "steps.py:core/ReplaceBinaryOperator_Mul_Div:0": (
        "`*` to `/` in `decide_by_policy`'s signature: every caller passes `facts` by"
        " position and the rest by keyword, which bind the same either way"
    ),
    "predicates.py:core/ReplaceTrueWithFalse:0": (
        "`Roles` not frozen: it is built once at spec load and nothing assigns to it"
    ),
    "core.py:core/ReplaceComparisonOperator_Eq_GtE:0": (
        "`phase >= 'live'`: a replay rule's phase is 'first' or 'live' (the rules are a"
        " table in `effects.py`, not spec data), and only 'live' compares >= 'live'"
    ),
    "predicates.py:core/ReplaceComparisonOperator_Eq_Is:2": (
        "`deadline_bounds is 'work'`: the bounds are a validated `Literal` of the spec, the"
        " interned object, so `is` answers as `==`"
    ),
    "predicates.py:core/ReplaceTrueWithFalse:2": (
        "`Facts` not frozen: the core builds a fresh one for each decision and nothing"
        " assigns to it"
    ),
    "steps.py:core/ReplaceComparisonOperator_Is_Eq:1": (
        "`kind == list` for `kind is list`: `kind` is a type, and types compare equal only"
        " to themselves"
    ),
    "admission.py:core/NumberReplacer:9": (
        "`edges_for(...)[0]` to `[-1]`: the admitting operation has exactly one edge out"
        " of the initial state (checked at load)"
    ),
}

#: Survivors that are gaps of a judge, not equivalent: mutant id -> why that judge misses it.
GAPS: dict[str, str] = {
    "replays.py:core/ReplaceBinaryOperator_Add_BitOr:0": (
        "a checkpoint call that names its sequence: the stateful suite never sends one (the"
        " checker's workers do, and send a recorded one again)"
    ),
    "replays.py:core/ReplaceComparisonOperator_Eq_GtE:5": (
        "a repeated completion under the recorded result id, by the same worker and claim id"
        " but with a lower fencing token: only a forged fence has those (a claim id names one"
        " token), and no judge forges a fence"
    ),
    "replays.py:core/ReplaceComparisonOperator_Eq_Is:3": (
        "`produced_by is worker_id`: the stateful suite never repeats a completion with a"
        " worker id built apart from the one recorded (the checker's repeated calls are built"
        " anew, so it tells)"
    ),
    "replays.py:core/ReplaceComparisonOperator_Eq_Lt:12": (
        "a checkpoint call that names its sequence, sent again: the stateful suite never sends one"
    ),
    "replays.py:core/ReplaceUnaryOperator_Delete_USub:0": (
        "the replay of a lost confirm_cancel reply: the stateful suite never repeats a"
        " confirmation (the checker's stale workers do)"
    ),
    "steps.py:core/ReplaceBinaryOperator_Add_LShift:4": (
        "the re-arm event's `attempt_budget` evidence text: no decision reads it, so only a"
        " judge that compares the stated budget (the checker's oracle) sees it"
    ),
}

_STATEFUL = f"""
from hypothesis import HealthCheck, settings
from workwarden.storage import MemoryStore
from workwarden.testing import run_authority_machine
run_authority_machine(MemoryStore, settings=settings(
    max_examples={STATEFUL_EXAMPLES}, stateful_step_count={STATEFUL_STEPS}, deadline=None,
    database=None, derandomize=True, suppress_health_check=list(HealthCheck)))
"""


def _snapshot(work: Path) -> tuple[Path, Path]:
    """Copy the tree to `work`: `tree` (tests, bench, config) and `site` (the package)."""
    if work.exists():
        shutil.rmtree(work)
    tree = work / "tree"
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc", "results", "plots")
    for part in ("tests", "bench", "specs"):
        shutil.copytree(ROOT / part, tree / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    site = work / "site" / "workwarden"
    shutil.copytree(ROOT / "workwarden", site, ignore=ignore)
    for part in ("statemachine", "storage", "specs"):
        shutil.copytree(ROOT / part, site / part, ignore=ignore)
    return tree, site


def _annotations(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The spans of the module's type annotations (never evaluated: `from __future__`)."""
    spans = []
    for node in pyast.walk(pyast.parse(source)):
        hints: list[pyast.expr | None] = []
        if isinstance(node, (pyast.FunctionDef, pyast.AsyncFunctionDef)):
            hints.append(node.returns)
            every = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            every += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
            hints += [a.annotation for a in every]
        elif isinstance(node, pyast.AnnAssign):
            hints.append(node.annotation)
        for hint in hints:
            if hint is not None and hint.end_lineno is not None and hint.end_col_offset is not None:
                spans.append(
                    ((hint.lineno, hint.col_offset), (hint.end_lineno, hint.end_col_offset))
                )
    return spans


def _in_annotation(
    start: tuple[int, int], spans: list[tuple[tuple[int, int], tuple[int, int]]]
) -> bool:
    """Is a mutation at `start` inside an annotation (so it cannot change behaviour)?"""
    return any(first <= start < last for first, last in spans)


def _mutants(site: Path) -> list[dict[str, Any]]:
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.plugins import get_operator, operator_names

    # The core operators that take no arguments (VariableInserter and
    # VariableReplacer need the names of variables to plant).
    names = sorted(n for n in operator_names() if n.startswith("core/") and "Variable" not in n)
    out: list[dict[str, Any]] = []
    for module in MODULES:
        path = site / "statemachine" / module
        source = path.read_text(encoding="utf-8")
        tree = get_ast(source)
        hints = _annotations(source)
        for name in names:
            operator = get_operator(name)()
            positions = [
                start for node in ast_nodes(tree) for start, _ in operator.mutation_positions(node)
            ]
            for occurrence, start in enumerate(positions):
                if _in_annotation(start, hints):
                    continue
                out.append({"module": module, "operator": name, "occurrence": occurrence})
    return out


def _diff(original: str, mutated: str, module: str) -> str:
    lines = difflib.unified_diff(
        original.splitlines(), mutated.splitlines(), f"a/{module}", f"b/{module}", n=0, lineterm=""
    )
    return "\n".join(line for line in lines if not line.startswith(("---", "+++")))


def _run(argv: list[str], cwd: Path, site: Path, timeout: int) -> tuple[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{site.parent}{os.pathsep}{cwd}{os.pathsep}{cwd / 'tests'}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    started = time.perf_counter()
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - started
    return ("survived" if done.returncode == 0 else "killed"), time.perf_counter() - started


def _judges(tree: Path, site: Path, only: list[str]) -> dict[str, list[str]]:
    py = sys.executable
    judges = {
        "checker": [py, "-m", "workwarden", *CHECKER_ARGS],
        "stateful": [py, "-c", _STATEFUL],
        "tests": [
            py,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-m",
            "not postgres",
            *CORE_TESTS,
        ],
    }
    return {name: argv for name, argv in judges.items() if name in only}


def main(argv: list[str] | None = None) -> int:
    """Run the mutation campaign; write `bench/results/mutation.json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=40, help="mutants drawn (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/workwarden-mutation"))
    parser.add_argument("--judges", default="checker,stateful,tests")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mutation.json")
    parser.add_argument(
        "--resummarise",
        action="store_true",
        help="recompute the scores of --out with the current EQUIVALENT list, judging nothing",
    )
    args = parser.parse_args(argv)
    if args.resummarise:
        old = json.loads(args.out.read_text(encoding="utf-8"))
        args.sample, args.seed = old["sample"]["drawn"], old["sample"]["seed"]
        baseline = {n: (b["outcome"], b["seconds"]) for n, b in old["baseline"].items()}
        judged = [n for n in ("checker", "stateful", "tests") if n in old["scores"]]
        report = summarise(old["results"], judged, old["mutants_total"], args, baseline)
        report["date"] = old["date"]
        args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(json.dumps(report["scores"], indent=2, sort_keys=True))
        return 0
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    tree, site = _snapshot(args.work)
    judges = _judges(tree, site, args.judges.split(","))
    everything = _mutants(site)
    chosen = list(everything)
    if args.sample and args.sample < len(chosen):
        chosen = sorted(random.Random(args.seed).sample(range(len(everything)), args.sample))
        chosen = [everything[i] for i in chosen]
    # The unmutated tree must pass every judge, or no kill means anything.
    baseline = {name: _run(cmd, tree, site, TIMEOUTS[name]) for name, cmd in judges.items()}
    print("baseline", baseline, flush=True)
    results: list[dict[str, Any]] = []
    for number, mutant in enumerate(chosen, 1):
        path = site / "statemachine" / mutant["module"]
        original = path.read_text(encoding="utf-8")
        operator = get_operator(mutant["operator"])()
        mutated = mutate_code(original, operator, mutant["occurrence"])
        ident = f"{mutant['module']}:{mutant['operator']}:{mutant['occurrence']}"
        if mutated is None or mutated == original:
            continue
        record: dict[str, Any] = {"id": ident, "diff": _diff(original, mutated, mutant["module"])}
        try:
            path.write_text(mutated, encoding="utf-8")
            for name, cmd in judges.items():
                outcome, seconds = _run(cmd, tree, site, TIMEOUTS[name])
                record[name] = outcome
                record[f"{name}_seconds"] = round(seconds, 1)
        finally:
            path.write_text(original, encoding="utf-8")
        results.append(record)
        print(number, len(chosen), ident, {n: record[n] for n in judges}, flush=True)
        # Written after every mutant: a run stopped early keeps what it judged.
        report = summarise(results, list(judges), len(everything), args, baseline)
        args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    report = summarise(results, list(judges), len(everything), args, baseline)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(report["scores"], indent=2, sort_keys=True))
    return 0


def summarise(
    results: list[dict[str, Any]],
    judges: list[str],
    total: int,
    args: argparse.Namespace,
    baseline: dict[str, tuple[str, float]],
) -> dict[str, Any]:
    """Kill shares per judge among the mutants not judged equivalent, and the survivors."""
    live = [r for r in results if r["id"] not in EQUIVALENT]
    scores: dict[str, Any] = {}
    for name in judges:
        killed = sum(1 for r in live if r[name] in ("killed", "timeout"))
        scores[name] = {
            "killed": killed,
            "of": len(live),
            "share": round(killed / len(live), 3) if live else None,
        }
    survivors = {
        name: [
            {
                "id": r["id"],
                "diff": r["diff"],
                "reason": EQUIVALENT.get(r["id"]) or GAPS.get(r["id"], "a gap, not yet explained"),
                "equivalent": r["id"] in EQUIVALENT,
            }
            for r in results
            if r[name] == "survived"
        ]
        for name in judges
    }
    return {
        "command": "nice -n 10 python -m bench.mutation "
        f"--sample {args.sample} --seed {args.seed} --judges {','.join(judges)}",
        "date": time.strftime("%Y-%m-%d"),
        "mutants_total": total,
        "mutants_judged": len(results),
        "equivalent": {k: v for k, v in EQUIVALENT.items() if any(r["id"] == k for r in results)},
        "baseline": {
            name: {"outcome": o, "seconds": round(s, 1)} for name, (o, s) in baseline.items()
        },
        "checker_args": list(CHECKER_ARGS),
        "stateful": {"examples": STATEFUL_EXAMPLES, "steps": STATEFUL_STEPS},
        "core_tests": list(CORE_TESTS),
        "sample": {"drawn": args.sample, "seed": args.seed, "of": total},
        "scores": scores,
        "survivors": survivors,
        "results": results,
    }


if __name__ == "__main__":
    raise SystemExit(main())
