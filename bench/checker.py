"""The model checker's speed: distinct states per second on the default universe.

Runs the checker on `default_spec()` `--reps` times, one core, and reports
the states it explored, the wall time, states per second (target: 50,000 or
more), the peak resident memory and the memory per state. `--engine`
chooses the checker: `compiled` (what `workwarden check` runs: the compiled
model, `check_compiled`, then its refinement against the real core, timed
apart) or `reference` (`checker.check`, the core at every step). Each run is
its own process, so each peak is its own. `--workers`, `--workloads` and
`--max-states` change the universe (a chain of workloads, each depending on
the one before). `--profile` also writes a cProfile of one run to
`results/checker-profile.txt`.

    python -m bench.checker
    python -m bench.checker --engine reference --reps 1
    python -m bench.checker --workers 3 --workloads 3 --max-states 200000 --reps 1
    python -m bench.checker --processes 2 --reps 1
"""

from __future__ import annotations

import cProfile
import importlib
import io
import multiprocessing
import pstats
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    Sample,
    base_parser,
    command_line,
    machine,
    need_matplotlib,
    quiet_from,
    save,
    save_figure,
    summary,
)
from workwarden.statemachine import default_spec
from workwarden.statemachine.check.compiled import COMPILED_CACHE_LIMIT

__all__ = ["TARGET", "main"]

TARGET = 50_000
"""States per second the checker should reach on one core."""


def _check() -> Any:
    try:
        module = importlib.import_module("workwarden.statemachine.check.checker")
    except ImportError as exc:
        raise SystemExit(f"the model checker is not available: {exc}") from None
    return module.check


def _peak_mib() -> float:
    """This process's peak resident memory, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_run(
    check: Any,
    max_states: int | None = None,
    engine: str = "reference",
    universe: dict[str, Any] | None = None,
    processes: int = 1,
) -> dict[str, Any]:
    """One exploration: states, seconds, states per second, peak memory and per state.

    With `processes` above 1 (compiled only), the check's helper processes ask
    the core; their CPU time and the largest one's peak memory are reported
    apart (`helper_cpu_seconds`, `helper_peak_mib`)."""
    from workwarden.statemachine.check.universe import Universe

    spec = default_spec()
    bounds = Universe.from_spec(spec, **(universe or {}))
    baseline = _peak_mib()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    refine_seconds = walk_seconds = None
    started = time.perf_counter()
    cpu_started = time.process_time()
    if engine == "compiled":
        from workwarden.statemachine.check.compiled import CompiledModel
        from workwarden.statemachine.check.compiled_check import check_compiled
        from workwarden.statemachine.check.refinement import refine
        from workwarden.statemachine.check.universe import Model

        compiled = CompiledModel(Model(spec, bounds, cache_limit=COMPILED_CACHE_LIMIT))
        report = check_compiled(spec, compiled=compiled, max_states=max_states, processes=processes)
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        if report.complete:
            report.refinement += refine(compiled, report)
        refine_seconds = round(time.perf_counter() - started - seconds, 3)
        # The same exploration again with every table entry in place: what the
        # tables cost to walk, apart from asking the core for them.
        asked = list(compiled.misses)
        walked = time.perf_counter()
        again = check_compiled(spec, compiled=compiled, max_states=max_states, liveness=False)
        walk_seconds = round(time.perf_counter() - walked, 3)
        if again.states != report.states or compiled.misses != asked:
            raise RuntimeError("the second walk of the full tables asked the core again")
    else:
        report = check(spec, bounds, max_states=max_states)
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
    states = int(report.states)
    peak = _peak_mib()
    helped = resource.getrusage(resource.RUSAGE_CHILDREN)
    helper_cpu = helped.ru_utime + helped.ru_stime - children.ru_utime - children.ru_stime
    return {
        "engine": engine,
        "universe": bounds.to_dict(),
        "states": states,
        "transitions": int(getattr(report, "transitions", 0)),
        "seconds": round(seconds, 3),
        "states_per_s": states / seconds if seconds > 0 else 0.0,
        # On a shared machine the wall time counts the other processes' turns too.
        "cpu_seconds": round(cpu_seconds, 3),
        "states_per_cpu_s": states / cpu_seconds if cpu_seconds > 0 else 0.0,
        "refine_seconds": refine_seconds,
        # Compiled only: the exploration again over the full tables (no liveness search).
        "walk_seconds": walk_seconds,
        "walk_states_per_s": states / walk_seconds if walk_seconds else None,
        "peak_mib": round(peak, 1),
        "kib_per_state": round((peak - baseline) * 1024 / states, 2) if states else 0.0,
        "complete": bool(getattr(report, "complete", True)),
        "ok": bool(getattr(report, "ok", True)),
        "refinement_failures": len(getattr(report, "refinement", [])),
        "tables": getattr(report, "tables", {}),
        "processes": processes,
        "helper_cpu_seconds": round(helper_cpu, 3) if processes > 1 else None,
        "helper_peak_mib": round(helped.ru_maxrss / 1024, 1) if processes > 1 else None,
    }


def _isolated(
    max_states: int | None, engine: str, universe: dict[str, Any], processes: int
) -> dict[str, Any]:
    """`one_run` in a fresh process (its own peak memory, nothing cached from the last)."""
    # Not a pool's process: a pool's processes may not fork the check's helpers.
    context = multiprocessing.get_context("spawn")
    results = context.SimpleQueue()
    child = context.Process(
        target=_run_in_child, args=(results, max_states, engine, universe, processes)
    )
    child.start()
    result: dict[str, Any] = results.get()
    child.join()
    return result


def _run_in_child(
    results: Any, max_states: int | None, engine: str, universe: dict[str, Any], processes: int
) -> None:
    results.put(one_run(_check(), max_states, engine, universe, processes))


def _plot(path: Path, runs: list[dict[str, Any]]) -> None:
    plt = need_matplotlib()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    rates = [r["states_per_s"] for r in runs]
    ax.bar(range(1, len(rates) + 1), rates, color="#4878a8", label="states per second")
    ax.axhline(TARGET, color="#c03030", linestyle="dotted", label=f"target {TARGET:,}")
    ax.set_xlabel("repetition")
    ax.set_ylabel("distinct states per second")
    ax.set_title(f"Model checker, default universe ({runs[0]['states']:,} states)", fontsize=10)
    ax.legend(fontsize=8)
    save_figure(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the harness; print and save the figures; return them."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "bench.checker")
    parser.add_argument("--profile", action="store_true", help="also profile one run")
    parser.add_argument(
        "--max-states", type=int, default=None, help="stop each run after this many states"
    )
    parser.add_argument("--engine", choices=("compiled", "reference"), default="compiled")
    parser.add_argument("--workers", type=int, default=None, help="workers in the universe")
    parser.add_argument(
        "--workloads", type=int, default=None, help="workloads in the chain of the universe"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="compiled: helper processes asking the core (`workwarden check --processes`)",
    )
    args = parser.parse_args(argv)
    check = _check()
    quiet = quiet_from(args)
    universe = {
        name: value
        for name, value in (("workers", args.workers), ("workloads", args.workloads))
        if value is not None
    }
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        load = quiet.wait()
        run = _isolated(args.max_states, args.engine, universe, args.processes)
        run["load"] = round(load, 2)
        runs.append(run)
        print(
            f"  rep {rep + 1}/{args.reps}: {run['states']:,} states in {run['seconds']:.2f} s,"
            f" {run['states_per_s']:,.0f} states/s ({run['cpu_seconds']:.1f} s of CPU,"
            f" {run['states_per_cpu_s']:,.0f} states per CPU second),"
            f" peak {run['peak_mib']:,.0f} MiB,"
            f" {run['kib_per_state']:.2f} KiB/state, complete {run['complete']},"
            f" refinement {run['refine_seconds']} s,"
            f" walking the full tables {run['walk_seconds']} s (load {load:.2f})"
            + (
                f"; {args.processes} helpers: {run['helper_cpu_seconds']:.1f} s of CPU,"
                f" the largest peak {run['helper_peak_mib']:,.0f} MiB"
                if args.processes > 1
                else ""
            ),
            flush=True,
        )
    rate = summary([Sample(r["states_per_s"], r["load"]) for r in runs])
    result = {
        "command": command_line("bench.checker", argv),
        "machine": machine(),
        "engine": args.engine,
        "states": runs[0]["states"],
        "states_per_s": rate,
        "target": TARGET,
        "runs": runs,
    }
    print(
        f"\nstates/s median {rate['median']:,.0f} (target {TARGET:,});"
        f" load median {rate['load_median']:.2f}, max {rate['load_max']:.2f}"
    )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(one_run, check, args.max_states, args.engine, universe, args.processes)
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(30)
        path = args.out / "results" / "checker-profile.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.getvalue())
        print(f"profile: {path}")
    name = args.name or "checker"
    save(args.out, name, result)
    if not args.no_plot:
        _plot(args.out / "plots" / f"{name}.png", runs)
    return result


if __name__ == "__main__":
    main()
