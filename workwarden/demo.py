"""`workwarden demo`: a fleet of worker threads against an embedded store, on a simulated clock.

Admits a few hundred workloads for two tenants (priorities, dependencies,
`not_before` instants, deadlines), then runs worker threads, an operator
thread and a sweeper thread against them tick by tick. Workers claim, start,
read their context, checkpoint, heartbeat and complete; some crash, stall
until their lease is lost (and then try to finish anyway), or fail with a
known or an unknown effect. The operator cancels, times out and re-arms; the
sweeper recovers lost leases, enforces deadlines and cancels work whose
dependency can never be met. At the end every committed history is checked
against the spec (`decisions.check_history`), a summary is printed, and the
legal-transition diagram is written with each edge's observed count.

Deterministic under `--seed`, whatever the threads' scheduling. One
coordinator owns the clock and the random numbers, and runs each tick in
phases: (1) every worker and the operator *prepare* their planned call in
parallel, on threads, each with its own `Authority`; nothing is written in
this phase, so every thread decides on the same committed state; (2) the
prepared calls *commit* one thread at a time in a fixed order (workers
first on even ticks, the operator first on odd ones), so which of two
writers to one workload loses the compare-and-swap (`WORKLOAD_CONFLICT`,
nothing of it written) is decided by the order, not by the scheduler;
(3) idle workers claim through the scheduler in turn, in a fixed order;
(4) the sweeper runs. The threads do the reading, deciding and writing; the
phases only fix the order of the writes. So the summary (everything but the
elapsed time and the file names) is the same for the same seed.
"""

from __future__ import annotations

import queue
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from workwarden.statemachine import (
    Authority,
    CancelCommand,
    CheckpointCommand,
    Claim,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    CreateWorkload,
    Dependency,
    ExecutionContextCommand,
    FailCommand,
    Grant,
    GrantSigner,
    GrantVerifier,
    HeartbeatCommand,
    Prepared,
    RetryCommand,
    RetryPolicy,
    StartCommand,
    Subject,
    TimeoutCommand,
    Timeouts,
    Workload,
    WorkloadError,
    default_spec,
)
from workwarden.statemachine import errors as codes
from workwarden.statemachine.diagram import write_diagrams
from workwarden.statemachine.properties.decisions import check_history, decisions_taken
from workwarden.storage import Store

__all__ = ["DemoReport", "main_demo", "run_demo"]

TENANTS = ("acme", "globex")
APPLICATION = "billing"
CAPABILITIES = ("billing",)
TICK_MS = 250
LEASE_MS = 2_000
START_MS = 1_700_000_000_000
#: Ticks a stalled worker sleeps: long enough for its lease to run out and be recovered.
STALL_TICKS = LEASE_MS // TICK_MS + 4
#: Ticks a crashed worker's replacement takes to come up.
RESTART_TICKS = 4


@dataclass
class DemoReport:
    """What a demo run did and found. `summary()` is the part the seed determines."""

    workloads: int = 0
    ticks: int = 0
    threads: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    edges: Counter[tuple[str, str]] = field(default_factory=Counter)
    attempts: int = 0
    recoveries: int = 0
    crashes: int = 0
    lease_losses: int = 0
    conflicts: int = 0
    operator: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    invalid_histories: list[str] = field(default_factory=list)
    seconds: float = 0.0
    store: str = ""
    diagrams: list[Path] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Everything the seed determines, as plain data (no times, no paths)."""
        return {
            "workloads": self.workloads,
            "ticks": self.ticks,
            "outcomes": dict(sorted(self.outcomes.items())),
            "decisions": {f"{p} {d}": n for (p, d), n in sorted(self.decisions.items())},
            "edges": {f"{a}->{b}": n for (a, b), n in sorted(self.edges.items())},
            "attempts": self.attempts,
            "recoveries": self.recoveries,
            "crashes": self.crashes,
            "lease_losses": self.lease_losses,
            "conflicts": self.conflicts,
            "operator": dict(sorted(self.operator.items())),
            "refusals": dict(sorted(self.refusals.items())),
            "invalid_histories": list(self.invalid_histories),
        }


# -- the work -----------------------------------------------------------------------------


def _request(
    rng: random.Random, signer: GrantSigner, tenant: str, index: int, parent: str | None
) -> CreateWorkload:
    requester = Subject(kind="service", id=f"{tenant}-api")
    grant = Grant(
        id=f"grant-{tenant}",
        issuer=Subject(kind="human", id=f"{tenant}-admin"),
        subject=requester,
        tenant_id=tenant,
        application_id=APPLICATION,
        capabilities=("workload:execute",),
        issued_at=START_MS - 1,
        expires_at=START_MS + 86_400_000,
    )
    roll = rng.random()
    timeouts = Timeouts()
    if roll < 0.15:
        timeouts = Timeouts(execution_ms=rng.choice((1_500, 4_000)))
    elif roll < 0.22:
        timeouts = Timeouts(overall_ms=rng.choice((8_000, 20_000)))
    elif roll < 0.27:
        timeouts = Timeouts(queue_ms=6_000)
    elif roll < 0.32:
        timeouts = Timeouts(heartbeat_ms=1_500)
    retry_on: tuple[str, ...] = ("timeout", "transient_connection", "worker_failure")
    if rng.random() < 0.1:
        retry_on = ("transient_connection",)
    return CreateWorkload(
        tenant_id=tenant,
        application_id=APPLICATION,
        environment="production",
        definition_id=rng.choice(("send-invoice", "charge-card", "sync-ledger")),
        definition_revision="r1",
        trigger="demo",
        input={"invoice": index, "amount_cents": rng.randrange(100, 100_000)},
        requested_by=requester,
        authorization_snapshot=signer.sign(grant),
        capability_snapshot=CAPABILITIES,
        priority=rng.choice((0, 0, 0, 1, 2, 5)),
        idempotency_key=f"invoice-{index}",
        retry_policy=RetryPolicy(
            max_attempts=3, initial_delay_ms=500, max_delay_ms=4_000, retry_on=retry_on
        ),
        timeouts=timeouts,
        dependencies=(Dependency(workload_id=parent),) if parent is not None else (),
        not_before=START_MS + rng.randrange(1_000, 15_000) if rng.random() < 0.15 else None,
    )


_PLANS = (
    ("complete", 0.66),
    ("fail_transient", 0.08),
    ("fail_validation", 0.04),
    ("fail_unknown", 0.06),
    ("crash", 0.05),
    ("stall", 0.06),
    ("slow", 0.05),
)

_FAILURES = {
    "fail_transient": ("transient_connection", "none"),
    "fail_validation": ("validation", "none"),
    "fail_unknown": ("timeout", "unknown"),
}


def _pick_plan(rng: random.Random) -> str:
    roll = rng.random()
    for plan, weight in _PLANS:
        if roll < weight:
            return plan
        roll -= weight
    return "complete"


@dataclass
class _Worker:
    index: int
    base: str
    tenant: str
    authority: Authority
    generation: int = 0
    claim: Claim | None = None
    plan: str = "complete"
    steps: int = 0
    down_until: int = 0
    prepared: Prepared | None = None
    claimed_now: bool = False

    @property
    def name(self) -> str:
        return self.base if self.generation == 0 else f"{self.base}#{self.generation}"


@dataclass
class _Operator:
    authority: Authority
    intents: list[tuple[str, str]] = field(default_factory=list)
    prepared: list[tuple[str, Prepared]] = field(default_factory=list)


class _Crew:
    """Threads that run the tasks the coordinator hands them, and report back."""

    def __init__(self, size: int) -> None:
        self.inboxes: list[queue.Queue[Callable[[], None] | None]] = [
            queue.Queue() for _ in range(size)
        ]
        self.done: queue.Queue[BaseException | None] = queue.Queue()
        self.threads = [
            threading.Thread(target=self._loop, args=(inbox,), name=f"demo-{i}", daemon=True)
            for i, inbox in enumerate(self.inboxes)
        ]
        for thread in self.threads:
            thread.start()

    def _loop(self, inbox: queue.Queue[Callable[[], None] | None]) -> None:
        while (task := inbox.get()) is not None:
            try:
                task()
            except BaseException as exc:  # noqa: BLE001 -- handed to the coordinator, which raises it
                self.done.put(exc)
            else:
                self.done.put(None)

    def _wait(self, count: int) -> None:
        failures = [exc for exc in (self.done.get() for _ in range(count)) if exc is not None]
        if failures:
            raise failures[0]

    def parallel(self, tasks: Sequence[tuple[int, Callable[[], None]]]) -> None:
        """Run the tasks on their threads at once; return when all are done."""
        for index, task in tasks:
            self.inboxes[index].put(task)
        self._wait(len(tasks))

    def in_turn(self, tasks: Sequence[tuple[int, Callable[[], None]]]) -> None:
        """Run the tasks on their threads one after another, in the order given."""
        for index, task in tasks:
            self.inboxes[index].put(task)
            self._wait(1)

    def stop(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for thread in self.threads:
            thread.join()


class _Run:
    """One demo run: the coordinator's state and the phases of a tick."""

    def __init__(self, store: Store, seed: int, workloads: int, workers: int) -> None:
        self.rng = random.Random(seed)
        secret = bytes(self.rng.randrange(256) for _ in range(32))
        self.signer = GrantSigner("demo-key", secret)
        verifier = GrantVerifier({"demo-key": secret})
        self.spec = default_spec()
        self.store = store
        self.now = START_MS
        self.report = DemoReport(workloads=workloads, threads=workers + 2)
        self.fleet = [
            _Worker(
                index=i,
                base=f"{TENANTS[i % len(TENANTS)]}-worker-{i // len(TENANTS) + 1}",
                tenant=TENANTS[i % len(TENANTS)],
                authority=Authority(store, grants=verifier),
            )
            for i in range(workers)
        ]
        self.operator = _Operator(Authority(store, grants=verifier))
        self.sweeper = Authority(store, grants=verifier)
        self.ids: list[str] = []
        self.dead_letters: list[str] = []
        self.lock = threading.Lock()
        self.tick = 0
        self.at_rest = 0

    def refused(self, exc: WorkloadError) -> None:
        with self.lock:
            self.report.refusals[exc.code] += 1
            if exc.code == codes.CONFLICT:
                self.report.conflicts += 1

    # -- admission ----------------------------------------------------------------------

    def admit(self, count: int) -> None:
        authority = self.sweeper
        for index in range(count):
            tenant = TENANTS[index % len(TENANTS)]
            parent = self.ids[-2] if index % 12 == 11 and len(self.ids) >= 2 else None
            request = _request(self.rng, self.signer, tenant, index, parent)
            self.ids.append(authority.admit(request, self.now).workload.workload_id)

    # -- phase 1: prepare ---------------------------------------------------------------

    def _worker_command(self, worker: _Worker, workload: Workload) -> Command:
        """The worker's next call: its plan's next step, or confirming a requested cancel."""
        claim = worker.claim
        assert claim is not None
        wid, fence = claim.workload_id, claim.fence
        if workload.state == "CANCELLATION_REQUESTED":
            return ConfirmCancelCommand(workload_id=wid, fence=fence)
        step, plan = worker.steps, worker.plan
        if step == 1:
            return StartCommand(workload_id=wid, fence=fence)
        if step == 2:
            return ExecutionContextCommand(workload_id=wid, fence=fence)
        if step == 3:
            return CheckpointCommand(workload_id=wid, fence=fence, state={"stage": "prepared"})
        if plan == "slow" and step < 12:
            if step % 3 == 0:
                return CheckpointCommand(workload_id=wid, fence=fence, state={"stage": step})
            return HeartbeatCommand(workload_id=wid, fence=fence, extend_ms=LEASE_MS)
        if step == 4 and plan != "stall":
            return HeartbeatCommand(workload_id=wid, fence=fence, extend_ms=LEASE_MS)
        if plan in _FAILURES:
            kind, effect = _FAILURES[plan]
            return FailCommand(
                workload_id=wid, fence=fence, kind=kind, error=f"{kind} in the demo", effect=effect
            )
        return CompleteCommand(
            workload_id=wid,
            fence=fence,
            result_id=f"result-{wid}-{fence.token}",
            output={"ok": True, "attempt": fence.token},
        )

    def prepare_worker(self, worker: _Worker) -> None:
        worker.prepared = None
        claim = worker.claim
        if claim is None or worker.claimed_now or worker.down_until > self.tick:
            return
        worker.steps += 1
        if worker.plan == "crash" and worker.steps == 2:
            return  # the coordinator retires it after this phase
        if worker.plan == "stall" and 3 <= worker.steps < 3 + STALL_TICKS:
            return  # alive but stuck: no heartbeat, so the lease runs out
        try:
            workload = worker.authority.get(claim.workload_id)
            command = self._worker_command(worker, workload)
            worker.prepared = worker.authority.prepare(command, self.now)
        except WorkloadError as exc:
            self.refused(exc)
            self._drop(worker)

    def prepare_operator(self) -> None:
        op = self.operator
        op.prepared = []
        for action, target in op.intents:
            command: Command
            if action == "retry":
                reason = "re-armed by the demo operator"
                command = RetryCommand(workload_id=target, actor="operator-1", reason=reason)
            elif action == "timeout":
                command = TimeoutCommand(workload_id=target, actor="operator-1")
            else:
                command = CancelCommand(workload_id=target, actor="operator-1")
            try:
                op.prepared.append((action, op.authority.prepare(command, self.now)))
            except WorkloadError as exc:
                self.refused(exc)
        op.intents = []

    # -- phase 2: commit ------------------------------------------------------------------

    def _drop(self, worker: _Worker) -> None:
        if worker.plan == "stall" and worker.steps >= 3 + STALL_TICKS:
            with self.lock:
                self.report.lease_losses += 1
        worker.claim = None
        worker.prepared = None

    def commit_worker(self, worker: _Worker) -> None:
        prepared, worker.prepared = worker.prepared, None
        if prepared is None:
            return
        command_finishes = prepared.operation in ("complete", "fail", "confirm_cancel")
        try:
            prepared.commit()
        except WorkloadError as exc:
            self.refused(exc)
            if exc.code == codes.CONFLICT:
                worker.steps -= 1  # decided on an old version: try the same step again
                return
            self._drop(worker)
            return
        if command_finishes:
            worker.claim = None

    def commit_operator(self) -> None:
        for action, prepared in self.operator.prepared:
            try:
                prepared.commit()
            except WorkloadError as exc:
                self.refused(exc)
                continue
            with self.lock:
                self.report.operator[action] += 1
        self.operator.prepared = []

    # -- phase 3: claim -------------------------------------------------------------------

    def claim(self, worker: _Worker) -> None:
        got = worker.authority.claim_next(
            worker.tenant, APPLICATION, worker.name, CAPABILITIES, self.now, LEASE_MS
        )
        if got is not None:
            worker.claim = got
            worker.steps = 0
            worker.claimed_now = True

    # -- phase 4: sweep -------------------------------------------------------------------

    def sweep(self) -> None:
        self.report.recoveries += len(self.sweeper.recover_expired(self.now))
        self.sweeper.enforce_deadlines(self.now)

    def survey(self) -> None:
        """Cancel orphans, note the dead letters and how many workloads are at rest (terminal)."""
        current = {w.workload_id: w for t in TENANTS for w in self.sweeper.list(t, APPLICATION)}
        for workload in sorted(current.values(), key=lambda w: w.workload_id):
            if workload.state != "READY":
                continue
            for dependency in workload.dependencies:
                parent = current.get(dependency.workload_id)
                if (
                    parent is not None
                    and parent.state in self.spec.terminal_states
                    and parent.state != dependency.required_state
                ):
                    try:
                        self.sweeper.cancel(workload.workload_id, "orphan-sweeper", self.now)
                    except WorkloadError as exc:
                        self.refused(exc)
                    break
        self.dead_letters = sorted(i for i, w in current.items() if w.state == "DEAD_LETTER")
        self.at_rest = sum(1 for w in current.values() if w.state in self.spec.terminal_states)

    # -- the coordinator ------------------------------------------------------------------

    def plan_operator(self) -> None:
        held = sorted(w.claim.workload_id for w in self.fleet if w.claim is not None)
        roll = self.rng.random()
        if roll < 0.03 and held:
            self.operator.intents.append(("cancel", self.rng.choice(held)))
        elif roll < 0.04:
            self.operator.intents.append(("cancel", self.rng.choice(self.ids)))
        elif roll < 0.05 and held:
            self.operator.intents.append(("timeout", self.rng.choice(held)))
        if self.dead_letters and self.rng.random() < 0.05:
            self.operator.intents.append(("retry", self.rng.choice(self.dead_letters)))

    def tick_once(self, crew: _Crew) -> None:
        self.now += TICK_MS
        self.plan_operator()
        for worker in self.fleet:
            worker.claimed_now = False
        operator_index = len(self.fleet)
        crew.parallel(
            [(w.index, partial(self.prepare_worker, w)) for w in self.fleet]
            + [(operator_index, self.prepare_operator)]
        )
        for worker in self.fleet:
            if worker.plan == "crash" and worker.steps == 2 and worker.claim is not None:
                # The process died holding its claim; a fresh one takes its place later.
                self.report.crashes += 1
                worker.claim = None
                worker.generation += 1
                worker.down_until = self.tick + RESTART_TICKS
        workers: list[tuple[int, Callable[[], None]]] = [
            (w.index, partial(self.commit_worker, w)) for w in self.fleet
        ]
        operator: list[tuple[int, Callable[[], None]]] = [(operator_index, self.commit_operator)]
        crew.in_turn(workers + operator if self.tick % 2 == 0 else operator + workers)
        idle = [w for w in self.fleet if w.claim is None and w.down_until <= self.tick]
        crew.in_turn([(w.index, partial(self.claim, w)) for w in idle])
        for worker in self.fleet:
            if worker.claimed_now:
                worker.plan = _pick_plan(self.rng)
        crew.in_turn([(operator_index + 1, self.sweep)])

    def run(self, max_ticks: int, progress: Callable[[int, int], None] | None) -> None:
        crew = _Crew(len(self.fleet) + 2)
        try:
            for tick in range(1, max_ticks + 1):
                self.tick = tick
                self.report.ticks = tick
                self.tick_once(crew)
                if self.tick % 8 == 0:
                    crew.in_turn([(len(self.fleet) + 1, self.survey)])
                    if progress is not None:
                        progress(self.at_rest, self.tick)
                    if self.at_rest == self.report.workloads and all(
                        w.claim is None for w in self.fleet
                    ):
                        break
        finally:
            crew.stop()

    def tally(self) -> None:
        report = self.report
        for tenant in TENANTS:
            for workload in self.sweeper.list(tenant, APPLICATION):
                history = workload.execution_history
                report.outcomes[workload.state] += 1
                report.attempts += workload.attempt_count
                report.decisions.update(decisions_taken(self.spec, history))
                report.edges.update((e.from_state, e.to) for e in history if e.from_state)
                problem = check_history(self.spec, history, workload)
                if problem is not None:
                    report.invalid_histories.append(f"{workload.workload_id}: {problem}")


def run_demo(
    *,
    store: Store,
    seed: int = 7,
    workloads: int = 300,
    workers: int = 6,
    max_ticks: int = 2_000,
    out: TextIO | None = None,
    label: str = "",
    out_dir: Path | None = None,
) -> DemoReport:
    """Run the demo on `store`; returns the report (also printed to `out`).

    With `out_dir`, the diagram with each edge's observed count is written there.
    """
    started = time.perf_counter()
    run = _Run(store, seed, workloads, workers)
    run.report.store = label
    run.admit(workloads)
    show = out is not None and out.isatty()

    def progress(finished: int, tick: int) -> None:
        if show and out is not None:
            filled = int(30 * finished / max(workloads, 1))
            bar = "#" * filled + "." * (30 - filled)
            out.write(f"\r  [{bar}] {finished}/{workloads} at rest, tick {tick}")
            out.flush()

    run.run(max_ticks, progress)
    if show and out is not None:
        out.write("\n")
    run.tally()
    if out_dir is not None:
        formats = ["dot", "mermaid"] + (["svg"] if shutil.which("dot") else [])
        run.report.diagrams = write_diagrams(
            run.spec,
            out_dir,
            formats=formats,
            name="demo-observed",
            observed_counts=dict(run.report.edges),
        )
    run.report.seconds = time.perf_counter() - started
    if out is not None:
        _print(run.report, out)
    return run.report


def _rows(rows: Sequence[tuple[str, str]], header: tuple[str, str]) -> list[str]:
    width = max(len(r[0]) for r in [header, *rows])
    return [f"  {a:<{width}}  {b:>7}" for a, b in [header, *rows]]


def _print(report: DemoReport, out: TextIO) -> None:
    lines = [
        f"workwarden demo: {report.workloads} workloads for {len(TENANTS)} tenants, "
        f"{report.threads} threads, {report.ticks} ticks of {TICK_MS} ms simulated "
        f"({report.seconds:.1f} s) on {report.store}",
        "",
    ]
    lines += _rows([(s, str(n)) for s, n in sorted(report.outcomes.items())], ("outcome", "count"))
    lines.append("")
    lines += _rows(
        [(f"{p}: {d}", str(n)) for (p, d), n in sorted(report.decisions.items())],
        ("decision by rule (policy: decision)", "count"),
    )
    lines.append("")
    lines += _rows(
        [
            ("attempts (claims)", str(report.attempts)),
            ("recoveries of lost leases", str(report.recoveries)),
            ("worker crashes", str(report.crashes)),
            ("leases lost by stalled workers", str(report.lease_losses)),
            ("conflicts lost (nothing written)", str(report.conflicts)),
        ]
        + [(f"operator {a}", str(n)) for a, n in sorted(report.operator.items())],
        ("event", "count"),
    )
    if report.refusals:
        lines.append("")
        lines += _rows(
            [(code, str(n)) for code, n in sorted(report.refusals.items())],
            ("refusal", "count"),
        )
    total = sum(report.outcomes.values())
    lines.append("")
    if report.invalid_histories:
        lines.append(f"INVALID histories: {len(report.invalid_histories)} of {total}")
        lines += [f"  {line}" for line in report.invalid_histories[:10]]
    else:
        lines.append(f"every history valid against the spec: {total} of {total}")
    for path in report.diagrams:
        lines.append(f"diagram with observed counts: {path}")
    out.write("\n".join(lines) + "\n")


def main_demo(
    store_url: str | None,
    seed: int,
    workloads: int,
    workers: int,
    out_dir: str | None = None,
) -> int:
    """Run the demo from the command line; exit 1 if any history is invalid.

    Without `store_url`, the store is a fresh SQLite file in a new temporary
    directory (at `synchronous=NORMAL`: it is thrown away), and the diagram is
    written beside it unless `out_dir` says where.
    """
    from workwarden.storage.urls import open_store

    if store_url is None:
        directory = Path(tempfile.mkdtemp(prefix="workwarden-demo-"))
        url = f"sqlite:///{directory / 'demo.sqlite3'}?synchronous=NORMAL"
    else:
        directory = Path(tempfile.mkdtemp(prefix="workwarden-demo-"))
        url = store_url
    store = open_store(url)
    try:
        report = run_demo(
            store=store,
            seed=seed,
            workloads=workloads,
            workers=workers,
            out=sys.stdout,
            label=url.split("?")[0] if not url.startswith("postgres") else "PostgreSQL",
            out_dir=Path(out_dir) if out_dir is not None else directory,
        )
    finally:
        store.close()
    return 1 if report.invalid_histories else 0
