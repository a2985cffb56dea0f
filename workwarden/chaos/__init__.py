"""`workwarden chaos`: worker processes killed at random against one store, then the store audited.

`run_chaos(config)` admits workloads into an empty store (priorities,
dependencies, `not_before` instants, deadlines, and a plan per attempt:
complete, fail with a known or an unknown effect, stall past the lease, run
past the execution deadline, be cancelled by an operator), then starts four
worker processes and one sweeper process (lease recovery, deadline sweeps,
operator cancellations) against the store. Half of the workers (by default)
are batched: they claim several workloads with one `claim_many` and send
their reports with `report_many`, on the same store as the others, which make
one call per workload. For `seconds` it kills a random
one of them with SIGKILL every few hundred milliseconds and starts a fresh
one in its place under a new worker id. Then the kills stop and the
processes drain the store, within `drain_seconds`; then they are stopped and
the whole store and its audit log are checked (`workwarden.chaos.audit`).
What each process does is `workwarden.chaos.workers`.

Time is the wall clock in milliseconds: this and the demo are the only places
where real time drives the authority. Leases are short (300 to 1000 ms), so
killed workers' claims are recovered while the run goes on.

The processes share nothing but the store and a block of shared memory for
their counters and the stop flag, written without locks: a process killed
while holding a lock would leave it held. Each completion a worker was told
succeeded is appended to a file of its own, so the audit can check that every
acknowledged write is in the store.

No process outlives its run: however the run ends (done, refused, a store
that fails, an exception, Ctrl-C), its processes are stopped before
`run_chaos` returns or raises, and should the run's own process be killed
outright, each of them sees the pipe only that process writes to close and
stops within a few seconds. A store that fails while the run drains or audits
it is `WORKLOAD_STORAGE_FAILURE`: nothing was audited.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TextIO

from workwarden.chaos.audit import AuditFigures, Violation, audit_store
from workwarden.chaos.workers import (
    APPLICATION,
    CAPABILITIES,
    COUNTERS,
    TENANTS,
    sweeper_main,
    wall_ms,
    worker_main,
)
from workwarden.statemachine import (
    Authority,
    CreateWorkload,
    Dependency,
    Grant,
    GrantSigner,
    GrantVerifier,
    RetryPolicy,
    Subject,
    Timeouts,
    WorkloadError,
    default_spec,
    workload_id_for,
)
from workwarden.statemachine import errors as codes
from workwarden.statemachine.models import DEFAULT_RETRY_ON
from workwarden.storage import Store, StoreError, open_store

__all__ = [
    "MAX_SECONDS",
    "MAX_WORKERS",
    "MAX_WORKLOADS",
    "ChaosConfig",
    "ChaosReport",
    "PlannedRun",
    "check_config",
    "plan_workloads",
    "print_report",
    "run_chaos",
]

KEY_ID = "chaos-key"

#: The most workloads a run admits (it plans them all in memory first).
MAX_WORKLOADS = 1_000_000
#: The most worker processes a run starts (each a process of its own, besides the sweeper).
MAX_WORKERS = 64
#: The longest a run kills processes, or drains: a day (the run's grants last one).
MAX_SECONDS = 86_400.0

# The plan of an attempt, and how often each first plan is drawn. A workload
# whose first attempt does not complete completes at its second.
_PLANS = (
    ("complete", 0.68),
    ("fail_transient", 0.08),
    ("fail_validation", 0.04),
    ("fail_unknown", 0.07),
    ("stall", 0.05),
    ("slow", 0.05),
    ("cancel", 0.03),
)


@dataclass(frozen=True)
class ChaosConfig:
    """One chaos run: the store, how much work, how long to kill processes, how long to drain."""

    url: str
    workloads: int = 5_000
    seconds: float = 60.0
    seed: int = 7
    workers: int = 4
    drain_seconds: float = 120.0
    batched_workers: int | None = None
    """How many of the workers are batched (`claim_many`, `report_many`); None: half."""
    kill_every_ms: tuple[int, int] = (150, 450)

    def batched(self) -> int:
        """How many of the workers are batched: `batched_workers`, or half of them."""
        return self.workers // 2 if self.batched_workers is None else self.batched_workers


@dataclass
class ChaosReport:
    """What a chaos run did and what the audit of the store found."""

    config: ChaosConfig
    admitted: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    unexpected_exits: int = 0
    admit_seconds: float = 0.0
    kill_seconds: float = 0.0
    drain_seconds: float = 0.0
    drained: bool = False
    counters: Counter[str] = field(default_factory=Counter)
    figures: AuditFigures | None = None
    violations: list[Violation] = field(default_factory=list)


@dataclass(frozen=True)
class PlannedRun:
    """The admissions of a run, and what the sweeper's operator does to some of them."""

    requests: tuple[CreateWorkload, ...]
    ids: tuple[str, ...]
    cancellations: tuple[tuple[int, str], ...]
    dependents: tuple[tuple[str, str], ...]
    secret: bytes


def _draw_plan(rng: random.Random) -> str:
    roll = rng.random()
    for plan, weight in _PLANS:
        if roll < weight:
            return plan
        roll -= weight
    return "complete"


def plan_workloads(count: int, seed: int, start_ms: int, seconds: float) -> PlannedRun:
    """The run's admissions, drawn from `seed`: the same arguments give the same plan."""
    rng = random.Random(seed)
    secret = rng.randbytes(32)
    signer = GrantSigner(KEY_ID, secret)
    span_ms = max(int(seconds * 1000), 1)
    signed = {
        tenant: signer.sign(
            Grant(
                id=f"grant-{tenant}",
                issuer=Subject(kind="human", id=f"{tenant}-admin"),
                subject=Subject(kind="service", id=f"{tenant}-api"),
                tenant_id=tenant,
                application_id=APPLICATION,
                issued_at=start_ms - 60_000,
                expires_at=start_ms + 86_400_000,
            )
        )
        for tenant in TENANTS
    }
    requests: list[CreateWorkload] = []
    ids: list[str] = []
    cancellations: list[tuple[int, str]] = []
    dependents: list[tuple[str, str]] = []
    by_tenant: dict[str, list[str]] = {tenant: [] for tenant in TENANTS}
    for index in range(count):
        tenant = TENANTS[index % len(TENANTS)]
        first = _draw_plan(rng)
        plans = [first] if first in ("fail_validation", "cancel") else [first, "complete"]
        timeouts = Timeouts()
        roll = rng.random()
        if first == "slow":
            timeouts = Timeouts(execution_ms=250)
        elif roll < 0.04:
            timeouts = Timeouts(queue_ms=rng.randrange(1_000, 4_000))
        elif roll < 0.07:
            timeouts = Timeouts(claim_ms=200)
        elif roll < 0.12:
            timeouts = Timeouts(heartbeat_ms=2_000)
        elif roll < 0.18:
            timeouts = Timeouts(overall_ms=rng.choice((2_000, span_ms + 120_000)))
        earlier = by_tenant[tenant][-50:]
        parent = rng.choice(earlier) if earlier and rng.random() < 0.05 else None
        not_before = start_ms + rng.randrange(span_ms) if rng.random() < 0.10 else None
        request = CreateWorkload(
            tenant_id=tenant,
            application_id=APPLICATION,
            environment="chaos",
            definition_id=rng.choice(("resize-image", "send-mail", "settle-ledger")),
            definition_revision="r1",
            trigger="chaos",
            input={"n": index, "plans": plans},
            requested_by=Subject(kind="service", id=f"{tenant}-api"),
            authorization_snapshot=signed[tenant],
            capability_snapshot=CAPABILITIES,
            priority=rng.choice((0, 0, 0, 1, 3)),
            idempotency_key=f"chaos-{index}",
            retry_policy=RetryPolicy(
                max_attempts=6,
                initial_delay_ms=50,
                max_delay_ms=500,
                backoff=rng.choice(("fixed", "exponential")),
                retry_on=DEFAULT_RETRY_ON,
            ),
            timeouts=timeouts,
            dependencies=(Dependency(workload_id=parent),) if parent is not None else (),
            not_before=not_before,
        )
        workload_id = workload_id_for(request)
        requests.append(request)
        ids.append(workload_id)
        by_tenant[tenant].append(workload_id)
        if first == "cancel":
            cancellations.append((start_ms + rng.randrange(span_ms), workload_id))
        if parent is not None:
            dependents.append((workload_id, parent))
    return PlannedRun(
        tuple(requests), tuple(ids), tuple(sorted(cancellations)), tuple(dependents), secret
    )


# -- the processes ----------------------------------------------------------------


# -- the run ----------------------------------------------------------------------


class _Fleet:
    """The worker and sweeper processes, by slot; the last slot is the sweeper's."""

    def __init__(self, config: ChaosConfig, planned: PlannedRun, log_dir: str) -> None:
        self.config = config
        self.planned = planned
        self.log_dir = log_dir
        self.context = multiprocessing.get_context("forkserver")
        # Children fork from a server that has imported everything once.
        self.context.set_forkserver_preload(["workwarden.chaos.workers"])
        self.slots = config.workers + 1
        self.shared = self.context.RawArray("q", self.slots * len(COUNTERS))
        self.stop = self.context.RawValue("b", 0)
        self.generation = [0] * self.slots
        self.processes: list[BaseProcess | None] = [None] * self.slots
        # Only this process holds the writing end: when it is gone, however it
        # ended, the processes read the pipe as closed and stop.
        self.alive, self._alive_writer = self.context.Pipe(duplex=False)

    def batched(self, slot: int) -> bool:
        """Is the worker of `slot` batched? (The last of the workers' slots are.)"""
        workers = self.config.workers
        return workers - self.config.batched() <= slot < workers

    def name(self, slot: int) -> str:
        if slot == self.slots - 1:
            role = "sweeper"
        else:
            role = f"{'batched-' if self.batched(slot) else ''}worker-{slot}"
        return f"{role}.{self.generation[slot]}"

    def start(self, slot: int) -> None:
        self.generation[slot] += 1
        name = self.name(slot)
        if slot == self.slots - 1:
            target: Any = sweeper_main
            args: tuple[Any, ...] = (
                self.config.url,
                slot,
                name,
                self.planned.cancellations,
                self.planned.dependents,
                self.shared,
                self.stop,
                self.log_dir,
                self.alive,
            )
        else:
            target = worker_main
            args = (
                self.config.url,
                slot,
                name,
                self.config.seed,
                self.shared,
                self.stop,
                self.log_dir,
                self.batched(slot),
                self.alive,
            )
        process = self.context.Process(target=target, args=args, name=name, daemon=True)
        process.start()
        self.processes[slot] = process

    def halt(self) -> None:
        """Kill every process still running and close the pipe that says the run is alive."""
        for process in self.processes:
            if process is not None and process.exitcode is None:
                process.kill()
                process.join()
        self.alive.close()
        self._alive_writer.close()

    def kill(self, slot: int) -> None:
        process = self.processes[slot]
        if process is not None:
            process.kill()
            process.join()

    def exited(self) -> list[int]:
        """Slots whose process ended by itself."""
        return [
            slot
            for slot, process in enumerate(self.processes)
            if process is not None and process.exitcode is not None
        ]

    def stop_all(self, timeout_s: float) -> None:
        self.stop.value = 1
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            if process is not None:
                process.join(max(deadline - time.monotonic(), 0.0))
                if process.exitcode is None:
                    process.kill()
                    process.join()

    def counters(self) -> Counter[str]:
        totals: Counter[str] = Counter()
        for slot in range(self.slots):
            for index, name in enumerate(COUNTERS):
                totals[name] += int(self.shared[slot * len(COUNTERS) + index])
        return totals


def _admit(store: Store, planned: PlannedRun, now: int) -> None:
    authority = Authority(store, grants=GrantVerifier({KEY_ID: planned.secret}))
    for request in planned.requests:
        authority.admit(request, now)


def _non_terminal(store: Store, terminal: frozenset[str]) -> int:
    return sum(1 for doc in store.scan() if doc.index.state not in terminal)


def check_config(config: ChaosConfig) -> None:
    """Refuse (`WORKLOAD_INVALID`) a run that could not be made, before anything is opened."""
    if not 1 <= config.workloads <= MAX_WORKLOADS or not 1 <= config.workers <= MAX_WORKERS:
        raise codes.bad_argument(
            "workloads",
            f"a chaos run needs 1 to {MAX_WORKLOADS:,} workloads and 1 to {MAX_WORKERS} workers",
        )
    if not 0 <= config.batched() <= config.workers:
        raise codes.bad_argument(
            "batched_workers", f"batched_workers must be 0 to the {config.workers} workers"
        )
    for name in ("seconds", "drain_seconds"):
        value = getattr(config, name)
        if not 0 < value <= MAX_SECONDS:
            raise codes.bad_argument(name, f"{name} must be above 0 and at most {MAX_SECONDS:g}")


def run_chaos(config: ChaosConfig, out: TextIO | None = None) -> ChaosReport:
    """Run the chaos test described by `config`; returns the report (also printed to `out`).

    Its processes are stopped before it returns or raises, whatever happened.
    """
    check_config(config)
    report = ChaosReport(config=config)
    spec = default_spec()
    rng = random.Random(config.seed)
    with tempfile.TemporaryDirectory(prefix="workwarden-chaos-") as log_dir:
        store = open_store(config.url, mode="create")
        try:
            if next(iter(store.scan()), None) is not None:
                raise codes.bad_argument(
                    "url", "a chaos run needs an empty store; this one holds workloads"
                )
            started = time.perf_counter()
            start_ms = wall_ms()
            planned = plan_workloads(config.workloads, config.seed, start_ms, config.seconds)
            _admit(store, planned, start_ms)
            report.admitted = len(planned.ids)
            report.admit_seconds = time.perf_counter() - started
        except StoreError as exc:
            raise WorkloadError(codes.STORAGE_FAILURE, f"the store failed: {exc}") from None
        finally:
            store.close()
        _progress(out, f"admitted {report.admitted} workloads in {report.admit_seconds:.1f} s")

        fleet = _Fleet(config, planned, log_dir)
        try:
            _kill_phase(config, fleet, rng, report)
            _progress(out, f"kill phase over: {sum(report.kills.values())} kills")
            _drain_and_audit(config, fleet, spec, planned, log_dir, report)
        finally:
            fleet.halt()
        report.violations += _crashes(log_dir)
    if out is not None:
        print_report(report, out)
    return report


def _kill_phase(
    config: ChaosConfig, fleet: _Fleet, rng: random.Random, report: ChaosReport
) -> None:
    for slot in range(fleet.slots):
        fleet.start(slot)
    started = time.perf_counter()
    low, high = config.kill_every_ms
    while time.perf_counter() - started < config.seconds:
        time.sleep(rng.uniform(low, high) / 1000)
        for slot in fleet.exited():
            report.unexpected_exits += 1
            fleet.start(slot)
        victim = rng.randrange(fleet.slots)
        fleet.kill(victim)
        report.kills["sweeper" if victim == fleet.slots - 1 else "worker"] += 1
        fleet.start(victim)
    report.kill_seconds = time.perf_counter() - started


def _drain_and_audit(
    config: ChaosConfig,
    fleet: _Fleet,
    spec: Any,
    planned: PlannedRun,
    log_dir: str,
    report: ChaosReport,
) -> None:
    """Let the processes drain the store, stop them, and audit the store."""
    lost = "the store failed while the run drained and audited it, so nothing was audited"
    started = time.perf_counter()
    try:
        store = open_store(config.url)
    except WorkloadError as exc:
        raise WorkloadError(exc.code, f"{lost}: {exc.message}", exc.details) from None
    try:
        while time.perf_counter() - started < config.drain_seconds:
            for slot in fleet.exited():
                report.unexpected_exits += 1
                fleet.start(slot)
            if _non_terminal(store, spec.terminal_states) == 0:
                report.drained = True
                break
            time.sleep(0.5)
        report.drain_seconds = time.perf_counter() - started
        fleet.stop_all(timeout_s=15.0)
        report.counters = fleet.counters()
        figures, violations = audit_store(store, spec, planned.ids, _acknowledgements(log_dir))
    except StoreError as exc:
        raise WorkloadError(codes.STORAGE_FAILURE, f"{lost}: {exc}") from None
    finally:
        with contextlib.suppress(StoreError):
            store.close()
    report.figures = figures
    report.violations = violations


def _acknowledgements(log_dir: str) -> list[tuple[str, int, str]]:
    acks: list[tuple[str, int, str]] = []
    for path in sorted(Path(log_dir).glob("*.acks")):
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split(" ")
            if len(parts) == 3 and parts[1].isdigit():
                acks.append((parts[0], int(parts[1]), parts[2]))
    return acks


def _crashes(log_dir: str) -> list[Violation]:
    return [
        Violation(None, f"process {path.stem} raised an exception", (path.read_text(),), None)
        for path in sorted(Path(log_dir).glob("*.error"))
    ]


def _progress(out: TextIO | None, line: str) -> None:
    if out is not None:
        out.write(f"  {line}\n")
        out.flush()


def print_report(report: ChaosReport, out: TextIO) -> None:
    """The run's figures, then every violation with its workload's history and audit record."""
    config, figures = report.config, report.figures
    write = out.write
    write(
        f"workwarden chaos: {report.admitted} workloads, {config.workers} workers"
        f" ({config.batched()} batched) and 1 sweeper on {_redact(config.url)},"
        f" seed {config.seed}\n"
    )
    kills = sum(report.kills.values())
    write(
        f"  kills        {kills} in {report.kill_seconds:.1f} s (workers {report.kills['worker']},"
        f" sweeper {report.kills['sweeper']}); unexpected exits {report.unexpected_exits}\n"
    )
    write(
        f"  drain        {'done' if report.drained else 'NOT DONE'} in"
        f" {report.drain_seconds:.1f} s\n"
    )
    if figures is not None:
        outcomes = ", ".join(f"{state} {n}" for state, n in sorted(figures.outcomes.items()))
        write(f"  outcomes     {outcomes}\n")
        write(
            f"  audit        {figures.audit_records} records; claims {figures.claims},"
            f" recoveries {figures.recoveries}, deadline timeouts {figures.deadline_timeouts},"
            f" completions {figures.completions}\n"
        )
        missing = sum(
            1 for v in report.violations if v.property == "acknowledged_completions_are_stored"
        )
        stored = "every one in the store" if not missing else f"{missing} NOT in the store"
        write(f"  acknowledged {figures.acknowledged} completions, {stored}\n")
    counters = report.counters
    write(
        f"  batches      {counters['batch_claims']} claims by claim_many,"
        f" {counters['batch_reports']} report_many calls\n"
    )
    write(
        f"  conflicts    {counters['refused ' + codes.CONFLICT]};"
        f" stale fences refused {counters['refused ' + codes.STALE_FENCE]},"
        f" expired leases refused {counters['refused ' + codes.LEASE_EXPIRED]},"
        f" claims gone {counters['refused ' + codes.CLAIM_INVALID]},"
        f" timed out at a call {counters['refused ' + codes.TIMED_OUT]},"
        f" store failures {counters['store_failures']}\n"
    )
    write(f"  violations   {len(report.violations)}\n")
    for violation in report.violations:
        write(f"\n{violation}\n")


def _redact(url: str) -> str:
    """A store URL without a password."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url
