"""The stateful suite's wall time under its `ci` Hypothesis profile.

Runs `python -m pytest -q -p no:cacheprovider tests/test_stateful.py
tests/test_stateful_mutants.py` (the files that exist) with
`WORKWARDEN_HYPOTHESIS_PROFILE=ci` and `WORKWARDEN_REQUIRE_POSTGRES=1`,
`--reps` times, and reports the wall time of each run and the median.

    python -m bench.stateful
    python -m bench.stateful --reps 3
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_DIR,
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

__all__ = ["SUITE", "main"]

SUITE = ("tests/test_stateful.py", "tests/test_stateful_mutants.py")
"""The stateful suite's files, relative to the repository."""


def _plot(path: Path, runs: list[dict[str, Any]]) -> None:
    plt = need_matplotlib()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar(range(1, len(runs) + 1), [r["seconds"] for r in runs], color="#4878a8")
    ax.set_xlabel("repetition")
    ax.set_ylabel("wall time, seconds")
    ax.set_title("Stateful suite, ci profile", fontsize=10)
    save_figure(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the harness; print and save the figures; return them."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "bench.stateful")
    parser.add_argument("--profile-name", default="ci", help="the Hypothesis profile")
    parser.add_argument(
        "--files", default=",".join(SUITE), help="comma-separated test files (those present run)"
    )
    args = parser.parse_args(argv)
    root = BENCH_DIR.parent
    # A file, or a test in one (`file::name`); only those whose file exists run.
    files = [f for f in args.files.split(",") if (root / f.split("::")[0]).exists()]
    if not files:
        raise SystemExit(f"none of {args.files} exists yet")
    env = {
        **os.environ,
        "WORKWARDEN_HYPOTHESIS_PROFILE": args.profile_name,
        "WORKWARDEN_REQUIRE_POSTGRES": "1",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    quiet = quiet_from(args)
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        load = quiet.wait()
        started = time.perf_counter()
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        last = (done.stdout.strip().splitlines() or [""])[-1]
        runs.append(
            {
                "seconds": round(seconds, 2),
                "load": round(load, 2),
                "rc": done.returncode,
                "summary": last,
            }
        )
        print(f"  rep {rep + 1}/{args.reps}: {seconds:.1f} s, {last} (load {load:.2f})", flush=True)
        if done.returncode != 0:
            print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
            raise SystemExit(f"the suite failed (exit {done.returncode})")
    wall = summary([Sample(r["seconds"], r["load"]) for r in runs])
    result = {
        "command": command_line("bench.stateful", argv),
        "suite": " ".join(["python -m pytest -q -p no:cacheprovider", *files]),
        "profile": args.profile_name,
        "machine": machine(),
        "seconds": wall,
        "runs": runs,
    }
    print(f"\nwall time median {wall['median']:.1f} s (load median {wall['load_median']:.2f})")
    name = args.name or "stateful"
    save(args.out, name, result)
    if not args.no_plot:
        _plot(args.out / "plots" / f"{name}.png", runs)
    return result


if __name__ == "__main__":
    main()
