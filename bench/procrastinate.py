"""Against Procrastinate: the same jobs through each, on the same PostgreSQL server.

Eight worker processes per run. Each first puts its share of the jobs in
(Procrastinate: `defer_async` of a no-op task; workwarden: `admit`); once
every process has, each works until nothing is left (Procrastinate: its
worker, `concurrency=1`, `wait=False`, fetching and finishing jobs;
workwarden: `claim_next`, `start`, `complete`). The runs alternate
Procrastinate, workwarden as built by default (an authority remembers its
latest writes), and workwarden reading before every call (`remember=0`),
each on a fresh database of the same server (a private
cluster with `fsync=on`, started by the harness). It reports jobs per second
end to end (and for each phase), the ratio of workwarden to Procrastinate
(target 1.5 or more), and workwarden's first-try claim rate: the share of
claims won by the first compare-and-swap of their `claim_next` call.

    python -m bench.procrastinate                        # 20,000 jobs, 5 repetitions
    python -m bench.procrastinate --jobs 2000 --systems workwarden

Procrastinate is installed only by the `bench` extra; without it, run
`--systems workwarden,workwarden-reading`.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    Sample,
    alternate,
    base_parser,
    command_line,
    machine,
    need_matplotlib,
    quiet_from,
    save,
    save_figure,
    summary,
)
from bench.jobs import (
    BARRIER_TIMEOUT_S,
    prepare_database,
    procrastinate_worker,
    workwarden_worker,
)
from bench.pgserver import Server, server
from workwarden.statemachine.authority import DEFAULT_REMEMBER

__all__ = ["main"]

SYSTEMS = ("procrastinate", "workwarden", "workwarden-reading")


def _count_done(system: str, dsn: str) -> int:
    query = (
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        if system == "procrastinate"
        else "SELECT count(*) FROM workwarden_documents WHERE state = 'SUCCEEDED'"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row is not None else 0


class Runs:
    """Runs of each system on fresh databases of one server."""

    def __init__(self, pg: Server, jobs: int, workers: int) -> None:
        self.pg = pg
        self.jobs = jobs
        self.workers = workers
        self.details: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
        self._context = multiprocessing.get_context("spawn")
        self._run = 0

    def run(self, system: str) -> float:
        """One run of `system`; jobs per second end to end."""
        self._run += 1
        db, dsn = self.pg.create_database()
        try:
            prepare_database(system, dsn)
            keys = [f"job-{self._run}-{i:08d}" for i in range(self.jobs)]
            target = procrastinate_worker if system == "procrastinate" else workwarden_worker
            remember = 0 if system == "workwarden-reading" else DEFAULT_REMEMBER
            barrier = self._context.Barrier(self.workers + 1)
            out = self._context.Queue()
            processes = [
                self._context.Process(
                    target=target,
                    args=(dsn, w, keys[w :: self.workers], remember, barrier, out),
                )
                for w in range(self.workers)
            ]
            for process in processes:
                process.start()
            barrier.wait(BARRIER_TIMEOUT_S)  # every worker is up
            started = time.perf_counter()
            barrier.wait(BARRIER_TIMEOUT_S)  # every job is in
            enqueued = time.perf_counter()
            barrier.wait(BARRIER_TIMEOUT_S)  # every job is done
            finished = time.perf_counter()
            reports = [out.get(timeout=60) for _ in processes]
            for process in processes:
                process.join(60)
            failed = [p.exitcode for p in processes if p.exitcode != 0]
            if failed:
                raise RuntimeError(f"{system}: worker processes failed: {failed}")
            done = _count_done(system, dsn)
            if done != self.jobs:
                raise RuntimeError(f"{system}: {done} of {self.jobs} jobs finished")
        finally:
            self.pg.drop_database(db)
        claims = sum(r["done"] for r in reports)
        self.details[system].append(
            {
                "enqueue_per_s": round(self.jobs / (enqueued - started), 1),
                "drain_per_s": round(self.jobs / (finished - enqueued), 1),
                "seconds": round(finished - started, 2),
                "first_try_claim_rate": (
                    round(sum(r["first_try"] for r in reports) / claims, 4)
                    if system != "procrastinate" and claims
                    else None
                ),
                "claim_conflicts": sum(r["claim_conflicts"] for r in reports),
                "client_cpu_ms_per_job": round(
                    1000 * sum(r["cpu_s"] for r in reports) / self.jobs, 3
                ),
            }
        )
        return self.jobs / (finished - started)


def _plot(path: Path, result: dict[str, Any]) -> None:
    plt = need_matplotlib()
    systems = list(result["systems"])
    medians = [result["systems"][s]["jobs_per_s"]["median"] for s in systems]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colours = {
        "procrastinate": "#d08030",
        "workwarden": "#4878a8",
        "workwarden-reading": "#7aa6d0",
    }
    ax.bar(range(len(systems)), medians, color=[colours.get(s, "#777777") for s in systems])
    for x, value in enumerate(medians):
        ax.text(x, value * 1.01, f"{value:,.0f}", ha="center", fontsize=9)
    if "procrastinate" in result["systems"]:
        base = result["systems"]["procrastinate"]["jobs_per_s"]["median"]
        ax.axhline(base, color="#d08030", linestyle="dotted", label="Procrastinate")
        ax.axhline(base * 1.5, color="#c03030", linestyle="--", label="target: 1.5 x Procrastinate")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(systems)), systems)
    ax.set_ylabel("jobs per second, end to end (median)")
    ax.set_title(
        f"{result['jobs']:,} no-op jobs, {result['workers']} worker processes, one PostgreSQL",
        fontsize=10,
    )
    save_figure(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the harness; print and save the figures; return them."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "bench.procrastinate")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=", ".join(SYSTEMS))
    parser.add_argument("--pg-fsync", choices=("on", "off"), default="on")
    parser.add_argument("--server-dsn", default=None, help="use this server, not a private one")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    if "procrastinate" in systems:
        try:
            import procrastinate  # noqa: F401 - only checking that it is there
        except ImportError:
            raise SystemExit(
                'Procrastinate is not installed: pip install -e ".[bench]"'
                " (or pass --systems workwarden,workwarden-reading)"
            ) from None
    quiet = quiet_from(args)
    with server(args.server_dsn, fsync=args.pg_fsync == "on") as pg:
        settings = pg.settings()
        runs = Runs(pg, args.jobs, args.workers)
        samples = alternate(
            args.reps, {s: (lambda s=s: runs.run(s)) for s in systems}, quiet, log=print
        )
    result = _result(args, argv, systems, samples, runs, settings)
    _print(result)
    name = args.name or "procrastinate"
    save(args.out, name, result)
    if not args.no_plot:
        _plot(args.out / "plots" / f"{name}.png", result)
    return result


def _result(
    args: Any,
    argv: Sequence[str] | None,
    systems: list[str],
    samples: dict[str, list[Sample]],
    runs: Runs,
    settings: dict[str, str],
) -> dict[str, Any]:
    per_system: dict[str, Any] = {}
    for system in systems:
        details = runs.details[system]
        rates = [
            d["first_try_claim_rate"] for d in details if d["first_try_claim_rate"] is not None
        ]
        per_system[system] = {
            "jobs_per_s": summary(samples[system]),
            "enqueue_per_s": summary([Sample(d["enqueue_per_s"], 0.0) for d in details]),
            "drain_per_s": summary([Sample(d["drain_per_s"], 0.0) for d in details]),
            "client_cpu_ms_per_job": summary(
                [Sample(d["client_cpu_ms_per_job"], 0.0) for d in details]
            ),
            "first_try_claim_rate": summary([Sample(r, 0.0) for r in rates]) if rates else None,
            "runs": details,
        }
    ratios: dict[str, float] = {}
    if "procrastinate" in per_system:
        base = per_system["procrastinate"]["jobs_per_s"]["median"]
        for system in systems:
            if system != "procrastinate" and base:
                ratios[system] = round(per_system[system]["jobs_per_s"]["median"] / base, 3)
    return {
        "command": command_line("bench.procrastinate", argv),
        "machine": machine(),
        "postgres": settings,
        "jobs": args.jobs,
        "workers": args.workers,
        "systems": per_system,
        "ratio_to_procrastinate": ratios,
    }


def _print(result: dict[str, Any]) -> None:
    print()
    print(
        "| system | jobs/s end to end | enqueue/s | drain/s | first-try claims"
        " | client CPU ms/job | ratio to Procrastinate | load (median/max) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for system, s in result["systems"].items():
        rate = s["first_try_claim_rate"]
        first = "" if rate is None else f"{rate['median']:.1%}"
        ratio = result["ratio_to_procrastinate"].get(system)
        against = "" if ratio is None else f"{ratio:.2f}"
        print(
            f"| {system} | {s['jobs_per_s']['median']:,.0f} | {s['enqueue_per_s']['median']:,.0f}"
            f" | {s['drain_per_s']['median']:,.0f} | {first}"
            f" | {s['client_cpu_ms_per_job']['median']:.2f} | {against}"
            f" | {s['jobs_per_s']['load_median']:.2f}/{s['jobs_per_s']['load_max']:.2f} |"
        )


if __name__ == "__main__":
    main()
