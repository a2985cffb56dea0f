"""The model checker's speed: distinct states per second on the default universe.

Runs `workwarden.statemachine.check.checker.check(default_spec())` (what `workwarden
check` runs) `--reps` times in this process, one core, and reports the states
it explored, the wall time and states per second (target: 50,000 or more).
`--profile` also writes a cProfile of one run to `results/checker-profile.txt`.

    python -m bench.checker
    python -m bench.checker --reps 3 --profile
"""

from __future__ import annotations

import cProfile
import importlib
import io
import pstats
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

__all__ = ["TARGET", "main"]

TARGET = 50_000
"""States per second the checker should reach on one core."""


def _check() -> Any:
    try:
        module = importlib.import_module("workwarden.statemachine.check.checker")
    except ImportError as exc:
        raise SystemExit(f"the model checker is not available: {exc}") from None
    return module.check


def one_run(check: Any, max_states: int | None = None) -> dict[str, Any]:
    """One exploration of the default universe: states, seconds, states per second."""
    spec = default_spec()
    started = time.perf_counter()
    report = check(spec) if max_states is None else check(spec, max_states=max_states)
    seconds = time.perf_counter() - started
    states = int(report.states)
    return {
        "states": states,
        "transitions": int(getattr(report, "transitions", 0)),
        "seconds": round(seconds, 3),
        "states_per_s": states / seconds if seconds > 0 else 0.0,
        "complete": bool(getattr(report, "complete", True)),
        "ok": bool(getattr(report, "ok", True)),
    }


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
    args = parser.parse_args(argv)
    check = _check()
    quiet = quiet_from(args)
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        load = quiet.wait()
        run = one_run(check, args.max_states)
        run["load"] = round(load, 2)
        runs.append(run)
        print(
            f"  rep {rep + 1}/{args.reps}: {run['states']:,} states in {run['seconds']:.2f} s,"
            f" {run['states_per_s']:,.0f} states/s (load {load:.2f})",
            flush=True,
        )
    rate = summary([Sample(r["states_per_s"], r["load"]) for r in runs])
    result = {
        "command": command_line("bench.checker", argv),
        "machine": machine(),
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
        profiler.runcall(one_run, check, args.max_states)
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
