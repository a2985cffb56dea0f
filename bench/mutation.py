"""Mutation testing of the decision modules, with each judge run on its own.

    nice -n 10 python -m bench.mutation --sample 40 --seed 0

Mutants are made by Cosmic Ray's mutation operators (`cosmic_ray.plugins`,
`cosmic_ray.mutating.mutate_code`: the `core/` operators, one occurrence
each) over the modules that hold the core's decisions. The tree is copied
first (`--work`, a fresh directory under /tmp): every mutant is written into
the copy, never into the working tree, and the judges import the copy (it
comes first on `PYTHONPATH`, ahead of the editable install). Each mutant is
then judged three times, separately, each with its own timeout:

- **checker**: `workwarden check` on a few small universes (`CHECKER_RUNS`,
  or the first alone with `--checker base`); killed when one of them reports
  a violation or fails;
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

#: The universe the checker judge explored up to 2026-12-05 (`--checker base`).
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

#: The universes the checker judge explores, in order, each a few seconds; a
#: mutant is killed when any of them reports a violation or fails. Each adds
#: what the first lacks, as a maintainer's `workwarden check` runs in CI
#: would: two workers (whose ids compare both ways), a third attempt, a
#: second re-arm and a second operator call, a second workload depending on
#: the first (a queue deadline),
#: deadlines that fall after a lease expires and while work waits after a retry,
#: and the example specs' shapes (an operation with `then`,
#: moves, an operation the default spec lacks).
CHECKER_RUNS: dict[str, tuple[str, ...]] = {
    "base": CHECKER_ARGS,
    "two-workers": (*CHECKER_ARGS[:3], "2", *CHECKER_ARGS[4:]),
    "three-attempts": (
        *CHECKER_ARGS,
        *("--max-attempts", "3", "--rearms", "2", "--operator-actions", "2"),
    ),
    "dependent": ("check", *CHECKER_ARGS[2:5], "8", *CHECKER_ARGS[6:]),
    "deadlines": (*CHECKER_ARGS, "--first-timeouts", "claim_ms=8,execution_ms=12,queue_ms=5"),
    "claim-starts": (*CHECKER_ARGS, "--spec", "specs/examples/claim_starts.toml"),
    "pause": (*CHECKER_ARGS, "--spec", "specs/examples/pause.toml"),
    "approval": (*CHECKER_ARGS, "--spec", "specs/examples/approval.toml"),
}

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

TIMEOUTS = {"checker": 240, "stateful": 30, "tests": 120}

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
    "replays.py:core/ReplaceBinaryOperator_Add_FloorDiv:1": (
        "`sequence > recorded // 1` after `sequence == recorded + 1` has returned: for"
        " integers both refuse exactly the sequences from recorded + 2 on"
    ),
    "policies.py:core/NumberReplacer:5": (
        "`delay == -1` for `delay == 0` in the backoff loop's early stop: a zero delay stays"
        " zero when multiplied, so the loop (bounded by the retry count) returns the same"
    ),
    "policies.py:core/ReplaceComparisonOperator_Eq_Lt:1": (
        "`multiplier < 1` for `multiplier == 1` in the backoff loop's early stop: the spec"
        " refuses a multiplier below 1, and multiplying by 1 leaves the delay as it is"
    ),
    "steps.py:core/AddNot:2": (
        "`not kind in _ATOMS` in `json_copy`: atoms go to `copy.deepcopy`, which hands back"
        " the same immutable value; every other JSON value is a dict or a list, copied above"
    ),
    "steps.py:core/ReplaceComparisonOperator_GtE_Is:0": (
        "`previous is max_attempts` for `>=`: the operator's re-arms count one at a time and"
        " the one that reaches the maximum is refused, so the count never passes it; equal"
        " small integers are one object in CPython, so `is` answers as `==`"
    ),
    "predicates.py:core/ReplaceComparisonOperator_GtE_Is:0": (
        "`attempt_count is budget` for `>=`: a claim that would pass the budget is refused at"
        " equality, so the count never passes it; equal small integers are one object"
    ),
    "replays.py:core/ReplaceComparisonOperator_NotEq_Lt:1": (
        "`attempt.status < failed` for `!=` in the failure replay: a status sorting after it"
        " passes on to the error text and then to the attempt's failure event, which only a"
        " failure report writes, and that ends the attempt with the failed status itself"
    ),
    "policies.py:core/ReplaceComparisonOperator_Eq_Is:0": (
        "`delay is 'backoff'`: the rule's delay is a validated `Literal`, the interned"
        " object, so `is` answers as `==`"
    ),
    "policies.py:core/ReplaceComparisonOperator_Eq_Lt:0": (
        "`delay < 0` for `delay == 0` in the backoff loop's early stop: a delay is never"
        " negative, and a zero delay stays zero when multiplied, so the result is the same"
    ),
    "policies.py:core/ReplaceComparisonOperator_Eq_LtE:1": (
        "`multiplier <= 1` for `multiplier == 1`: the spec refuses a multiplier below 1"
    ),
    "policies.py:core/ReplaceOrWithAnd:1": (
        "`delay >= max and multiplier == 1` for `or`: the loop goes on multiplying past the"
        " cap, and the result is capped by `min` all the same (the loop is bounded by the"
        " retry count, which the attempt budget bounds); only the work done differs"
    ),
    "replays.py:core/ReplaceComparisonOperator_NotEq_Gt:1": (
        "`attempt.status > failed` for `!=` in the failure replay: as for `<` above, a"
        " status passed on still needs the attempt's failure event, which only a failure"
        " report writes, ending the attempt with the failed status itself"
    ),
    "steps.py:core/ReplaceBinaryOperator_BitOr_BitXor:5": (
        "the module's load-time self-check with `^` for `|`: `admit` has no step, so the"
        " symmetric difference is the union, and the check holds either way"
    ),
    "steps.py:core/ReplaceComparisonOperator_Eq_LtE:1": (
        "the module's load-time self-check with `<=` for `==`: it holds either way"
    ),
}

#: Survivors that are gaps of a judge, not equivalent: mutant id -> why that judge misses it.
GAPS: dict[str, str] = {
    "core.py:core/ReplaceComparisonOperator_IsNot_Is:0": (
        "a command naming an operation the spec lacks, or taking another command: every call"
        " of the universe names one of the spec's operations with its own command"
    ),
    "core.py:core/ReplaceComparisonOperator_IsNot_Is:6": (
        "a decision at an instant before the document's last change: only the racing writer"
        " makes one, and the judge's universes leave it out"
    ),
    "core.py:core/ReplaceOrWithAnd:4": (
        "the refusal code of the claim gate's diverting rule, which never decides (above)"
    ),
    "core.py:core/ReplaceUnaryOperator_USub_Not:0": (
        "the `started_at` of a claim's reply under `then` on a second attempt: the oracle"
        " compares the attempt a claim reply names, not its start"
    ),
    "admission.py:core/ReplaceComparisonOperator_Lt_NotEq:0": (
        "an admission after its grant expired: the universe's grant outlives every horizon"
    ),
    "admission.py:core/ReplaceComparisonOperator_NotEq_IsNot:1": (
        "a repeated admission naming a concurrency key: the core checker's requests name none"
        " (the scheduling checker's do, and it repeats no admission)"
    ),
    "steps.py:core/ReplaceFalseWithTrue:0": (
        "a recovery that answers `changed` for a lease it left alone: the stores hand a sweep"
        " only expired leases, which it always changes, and the racing writer, which asks"
        " about any, is left out of the judge's universes (a sweep's answer is held to the"
        " workloads it wrote, so the opposite slip is killed)"
    ),
    "steps.py:core/ReplaceOrWithAnd:4": (
        "recovery asked about a live lease: the store's own query hands it only expired ones,"
        " and the racing writer, which asks about any, is left out of the judge's universes"
    ),
    "core.py:core/ReplaceOrWithAnd:3": (
        "the claim gate's diverting rule (`claim.attempt_budget_exhausted`): no universe of"
        " the checker brings a workload to a claim with its budget spent (the checker lists"
        " the rule as never deciding), so a gate that never diverts goes unseen"
    ),
    "deadlines.py:core/ReplaceComparisonOperator_Lt_Gt:0": (
        "a document admitted under an older deadline contract: every universe admits under"
        " the spec's own `contract_version`, and no judge loads an older document"
    ),
    "predicates.py:core/AddNot:0": (
        "the queue deadline's anchor when a workload re-enters READY later than it left it:"
        " time must pass while it is held or dead-lettered, and the single-workload"
        " universes have no instant to move to then"
    ),
    "admission.py:core/ReplaceComparisonOperator_NotEq_Is:2": (
        "`requested_by is` for `!=` on a repeated admission: a false conflict only when the"
        " workload handed to the core is the very object its admission built from the same"
        " request; the checker, the stores and the authority always parse the document"
    ),
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


def _ident(mutant: dict[str, Any]) -> str:
    return f"{mutant['module']}:{mutant['operator']}:{mutant['occurrence']}"


def _diff(original: str, mutated: str, module: str) -> str:
    lines = difflib.unified_diff(
        original.splitlines(), mutated.splitlines(), f"a/{module}", f"b/{module}", n=0, lineterm=""
    )
    return "\n".join(line for line in lines if not line.startswith(("---", "+++")))


def _run(argv: list[Any], cwd: Path, site: Path, timeout: int) -> tuple[str, float]:
    """Run one judge; a judge given as a list of commands runs them in turn until one fails."""
    if argv and isinstance(argv[0], list):
        spent = 0.0
        for one in argv:
            outcome, seconds = _run(one, cwd, site, max(1, int(timeout - spent)))
            spent += seconds
            if outcome != "survived":
                return outcome, spent
        return "survived", spent
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


def _judges(tree: Path, site: Path, only: list[str], checker: list[str]) -> dict[str, list[Any]]:
    py = sys.executable
    judges: dict[str, list[Any]] = {
        "checker": [[py, "-m", "workwarden", *CHECKER_RUNS[name]] for name in checker],
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
    parser.add_argument(
        "--checker",
        default=",".join(CHECKER_RUNS),
        help=f"the checker judge's universes, in order (of {', '.join(CHECKER_RUNS)})",
    )
    parser.add_argument(
        "--ids", type=Path, default=None, help="judge only the mutants whose ids this file lists"
    )
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
        args.checker = ",".join(old.get("checker_runs", {"base": ()}))
        args.ids = old["sample"].get("ids")
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
    judges = _judges(tree, site, args.judges.split(","), args.checker.split(","))
    everything = _mutants(site)
    chosen = list(everything)
    if args.ids is not None:
        wanted = set(args.ids.read_text(encoding="utf-8").split())
        chosen = [m for m in everything if _ident(m) in wanted]
    elif args.sample and args.sample < len(chosen):
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
        ident = _ident(mutant)
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
        "command": "python -m bench.mutation "
        + (f"--ids {args.ids}" if args.ids else f"--sample {args.sample} --seed {args.seed}")
        + f" --judges {','.join(judges)} --checker {args.checker}",
        "date": time.strftime("%Y-%m-%d"),
        "mutants_total": total,
        "mutants_judged": len(results),
        "equivalent": {k: v for k, v in EQUIVALENT.items() if any(r["id"] == k for r in results)},
        "baseline": {
            name: {"outcome": o, "seconds": round(s, 1)} for name, (o, s) in baseline.items()
        },
        "checker_runs": {name: list(CHECKER_RUNS[name]) for name in args.checker.split(",")},
        "stateful": {"examples": STATEFUL_EXAMPLES, "steps": STATEFUL_STEPS},
        "core_tests": list(CORE_TESTS),
        "sample": {"drawn": args.sample, "seed": args.seed, "of": total}
        | ({"ids": str(args.ids)} if args.ids else {}),
        "scores": scores,
        "survivors": survivors,
        "results": results,
    }


if __name__ == "__main__":
    raise SystemExit(main())
