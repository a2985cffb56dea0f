"""`workwarden demo`: a fleet of runtime workers against an embedded store, on a simulated clock.

Admits a few hundred workloads for two tenants (priorities, dependencies,
`not_before` instants, deadlines), then runs a fleet of `workwarden.runtime`
workers, an operator and a `Sweeper` against them tick by tick. The
workers' handlers follow a plan drawn for each attempt: complete, fail
with a known kind (`Retry`, `Fail`) or with an unknown effect, run slowly
(heartbeats keep the lease, with no handler code), crash (the worker is
gone with its claim; a fresh one takes its place later) or stall (the
worker stops stepping until its lease is lost and recovered; it then finds
`job.lost` and reports nothing). The operator cancels (the worker sees it
on its next heartbeat and confirms), times out and re-arms; the sweeper
recovers lost leases and enforces deadlines, and the survey cancels work
whose dependency can never be met. At the end every committed history is
checked against the spec (`decisions.check_history`), a summary is printed,
and the legal-transition diagram is written with each edge's observed count.

Deterministic under `--seed`, whatever the threads' scheduling. One
coordinator owns the clock (a `ManualClock` every worker reads) and the
random numbers. Each worker, the operator and the sweeper runs on a thread
of its own, and each tick the coordinator hands them their step one after
another in a fixed order (the operator before the workers on even ticks,
after them on odd ones); a handler runs, on its worker's thread, at the
tick its plan ends it (a `ManualExecutor` holds it until then). So which of
two writers to one workload loses the compare-and-swap (`WORKLOAD_CONFLICT`,
nothing of it written, the runtime calls again) is decided by the order,
and the summary (everything but the elapsed time and the file names) is
the same for the same seed.
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

from workwarden.runtime import App, Fail, Job, ManualClock, Retry, Sweeper, Worker
from workwarden.runtime.testing import ManualExecutor
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
)
from workwarden.statemachine import errors as codes
from workwarden.statemachine.diagram import write_diagrams
from workwarden.statemachine.properties.decisions import check_history, decisions_taken
from workwarden.storage import AuditRecord, ForwardingStore, IndexFields, Store, StoreConflict

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


def _pick_plan(rng: random.Random) -> str:
    roll = rng.random()
    for plan, weight in _PLANS:
        if roll < weight:
            return plan
        roll -= weight
    return "complete"


#: Ticks each plan's handler runs before it ends.
_RUN_TICKS = {"slow": 12}
_DEFINITIONS = ("send-invoice", "charge-card", "sync-ledger")


class _CountingStore(ForwardingStore):
    """Counts the writes that lost a compare-and-swap (nothing of them was written)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.conflicts = 0
        self._lock = threading.Lock()

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        try:
            return super().write(key, document, index, expected_version, audit)
        except StoreConflict:
            with self._lock:
                self.conflicts += 1
            raise


@dataclass
class _Attempt:
    """A handler call the plan holds: which plan, and the tick it ends at."""

    plan: str
    ends_at: int


@dataclass
class _DemoWorker:
    """One slot of the fleet: the runtime worker in it now, and what its plan says."""

    index: int
    base: str
    tenant: str
    executor: ManualExecutor
    worker: Worker
    generation: int = 0
    down_until: int = 0
    stalled_until: int = 0
    attempts: dict[str, _Attempt] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.base if self.generation == 0 else f"{self.base}#{self.generation}"


@dataclass
class _Operator:
    authority: Authority
    intents: list[tuple[str, str]] = field(default_factory=list)


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

    def in_turn(self, tasks: Sequence[tuple[int, Callable[[], None]]]) -> None:
        """Run the tasks on their threads one after another, in the order given."""
        for index, task in tasks:
            self.inboxes[index].put(task)
            failure = self.done.get()
            if failure is not None:
                raise failure

    def stop(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for thread in self.threads:
            thread.join()


def _handler(plan: str, job: Job) -> Any:
    """Every definition's handler: what the attempt's plan says (a cancelled one just stops)."""
    if job.cancel_requested:
        return None
    if plan == "slow":
        job.checkpoint({"stage": "rendered"})
    if plan == "fail_transient":
        raise Retry(kind="transient_connection", message="transient_connection in the demo")
    if plan == "fail_validation":
        raise Fail(kind="validation", effect="none", message="validation in the demo")
    if plan == "fail_unknown":
        raise Fail(kind="timeout", effect="unknown", message="timeout in the demo")
    return {"ok": True, "attempt": job.attempt}


class _Run:
    """One demo run: the coordinator's state and the steps of a tick."""

    def __init__(self, store: Store, seed: int, workloads: int, workers: int) -> None:
        self.rng = random.Random(seed)
        secret = bytes(self.rng.randrange(256) for _ in range(32))
        self.signer = GrantSigner("demo-key", secret)
        self.verifier = GrantVerifier({"demo-key": secret})
        self.spec = default_spec()
        self.store = _CountingStore(store)
        self.clock = ManualClock(START_MS)
        self.report = DemoReport(workloads=workloads, threads=workers + 2)
        self.app = App()
        for definition in _DEFINITIONS:
            self.app.handler(definition, needs=CAPABILITIES)(self._planned)
        self.plans: dict[tuple[str, int], str] = {}
        self.fleet = [self._slot(i) for i in range(workers)]
        self.operator = _Operator(Authority(self.store, grants=self.verifier))
        self.sweeper = Sweeper(
            Authority(self.store, grants=self.verifier), clock=self.clock, poll_ms=TICK_MS
        )
        self.admin = Authority(self.store, grants=self.verifier)
        self.ids: list[str] = []
        self.dead_letters: list[str] = []
        self.tick = 0
        self.at_rest = 0

    # -- the fleet ----------------------------------------------------------------------

    def _planned(self, job: Job) -> Any:
        plan = self.plans.get((job.workload_id, job.fence.token), "complete")
        return _handler(plan, job)

    def _new_worker(self, name: str, tenant: str, executor: ManualExecutor) -> Worker:
        return Worker(
            Authority(self.store, grants=self.verifier),
            self.app,
            tenant=tenant,
            application=APPLICATION,
            worker_id=name,
            lease_ms=LEASE_MS,
            clock=self.clock,
            executor=executor,
            poll_ms=TICK_MS,
        )

    def _slot(self, index: int) -> _DemoWorker:
        tenant = TENANTS[index % len(TENANTS)]
        base = f"{tenant}-worker-{index // len(TENANTS) + 1}"
        executor = ManualExecutor()
        return _DemoWorker(index, base, tenant, executor, self._new_worker(base, tenant, executor))

    def refused(self, exc: WorkloadError) -> None:
        self.report.refusals[exc.code] += 1

    # -- admission ----------------------------------------------------------------------

    def admit(self, count: int) -> None:
        for index in range(count):
            tenant = TENANTS[index % len(TENANTS)]
            parent = self.ids[-2] if index % 12 == 11 and len(self.ids) >= 2 else None
            request = _request(self.rng, self.signer, tenant, index, parent)
            self.ids.append(self.admin.admit(request, self.clock.now()).workload.workload_id)

    # -- a worker's step -----------------------------------------------------------------

    def step_worker(self, slot: _DemoWorker) -> None:
        """End the handlers whose plan says so, then let the runtime worker do what is due."""
        if slot.down_until > self.tick or slot.stalled_until > self.tick:
            return
        runtime = slot.worker
        for job in list(runtime.held):
            attempt = slot.attempts.get(job.workload_id)
            pending = [i for i, call in enumerate(slot.executor.pending) if call[2][1] is job]
            if attempt is None or not pending:
                continue
            if attempt.ends_at <= self.tick or job.cancel_requested or job.lost:
                slot.executor.run(pending[0])
        lost_before = runtime.counts.get("lost", 0)
        runtime.step()
        if slot.attempts and runtime.counts.get("lost", 0) > lost_before:
            stalled = [a for a in slot.attempts.values() if a.plan == "stall"]
            self.report.lease_losses += min(len(stalled), runtime.counts["lost"] - lost_before)
        held = {job.workload_id: job for job in runtime.held}
        for workload_id in [w for w in slot.attempts if w not in held]:
            del slot.attempts[workload_id]
        for workload_id, job in held.items():
            if workload_id not in slot.attempts:
                plan = _pick_plan(self.rng)
                self.plans[(workload_id, job.fence.token)] = plan
                slot.attempts[workload_id] = _Attempt(plan, self.tick + _RUN_TICKS.get(plan, 3))
                if plan == "stall":
                    slot.stalled_until = self.tick + 3 + STALL_TICKS
                if plan == "crash":
                    # The process dies holding its claim; a fresh one takes its place later.
                    self.report.crashes += 1
                    slot.generation += 1
                    slot.down_until = self.tick + RESTART_TICKS
                    slot.executor = ManualExecutor()
                    slot.attempts = {}
                    slot.worker = self._retire(runtime, slot)
                    return

    def _retire(self, old: Worker, slot: _DemoWorker) -> Worker:
        self._fold(old)
        return self._new_worker(slot.name, slot.tenant, slot.executor)

    def _fold(self, worker: Worker) -> None:
        for name in ("refused",):
            if worker.counts.get(name):
                self.report.refusals["refused by the authority"] += worker.counts[name]

    # -- the operator and the sweeper ------------------------------------------------------

    def operate(self) -> None:
        op = self.operator
        for action, target in op.intents:
            now = self.clock.now()
            try:
                if action == "retry":
                    op.authority.retry(target, "operator-1", now, "re-armed by the demo operator")
                elif action == "timeout":
                    op.authority.timeout(target, "operator-1", now)
                else:
                    op.authority.cancel(target, "operator-1", now)
            except WorkloadError as exc:
                self.refused(exc)
                continue
            self.report.operator[action] += 1
        op.intents = []

    def sweep(self) -> None:
        before = self.sweeper.counts.get("recovered", 0)
        self.sweeper.step()
        self.report.recoveries += self.sweeper.counts.get("recovered", 0) - before

    def survey(self) -> None:
        """Cancel orphans, note the dead letters and how many workloads are at rest (terminal)."""
        current = {w.workload_id: w for t in TENANTS for w in self.admin.list(t, APPLICATION)}
        now = self.clock.now()
        for workload in sorted(current.values(), key=lambda w: w.workload_id):
            if workload.state not in self.spec.roles.queued:
                continue
            for dependency in workload.dependencies:
                parent = current.get(dependency.workload_id)
                if (
                    parent is not None
                    and parent.state in self.spec.terminal_states
                    and parent.state != dependency.required_state
                ):
                    try:
                        self.admin.cancel(workload.workload_id, "orphan-sweeper", now)
                    except WorkloadError as exc:
                        self.refused(exc)
                    break
        self.dead_letters = sorted(i for i, w in current.items() if w.state == "DEAD_LETTER")
        self.at_rest = sum(1 for w in current.values() if w.state in self.spec.terminal_states)

    # -- the coordinator ------------------------------------------------------------------

    def plan_operator(self) -> None:
        held = sorted(job.workload_id for slot in self.fleet for job in slot.worker.held)
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
        self.clock.advance(TICK_MS)
        self.plan_operator()
        operator_index = len(self.fleet)
        workers: list[tuple[int, Callable[[], None]]] = [
            (slot.index, partial(self.step_worker, slot)) for slot in self.fleet
        ]
        operator: list[tuple[int, Callable[[], None]]] = [(operator_index, self.operate)]
        crew.in_turn(workers + operator if self.tick % 2 == 0 else operator + workers)
        crew.in_turn([(operator_index + 1, self.sweep)])

    def idle(self) -> bool:
        return all(not slot.worker.held for slot in self.fleet)

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
                    if self.at_rest == self.report.workloads and self.idle():
                        break
        finally:
            crew.stop()
        for slot in self.fleet:
            self._fold(slot.worker)
        self.report.conflicts = self.store.conflicts
        if self.store.conflicts:
            self.report.refusals[codes.CONFLICT] += self.store.conflicts

    def tally(self) -> None:
        report = self.report
        for tenant in TENANTS:
            for workload in self.admin.list(tenant, APPLICATION):
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
    written beside it unless `out_dir` says where. A store that already holds
    workloads is refused (`WORKLOAD_STORE_UNUSABLE`): the demo would report
    them as its own. A refused or stopped demo leaves no temporary directory, and
    no SQLite file it created: a demo stopped part way can be run again on the
    same `store_url`.
    """
    from workwarden.storage import SQLiteStore
    from workwarden.storage.urls import STORE_NOT_FOUND, STORE_UNUSABLE, open_store

    # A temporary directory only for what needs one (the store, the diagram),
    # removed again if the demo is refused or stopped.
    directory = None
    created: str | None = None
    if store_url is None or out_dir is None:
        directory = Path(tempfile.mkdtemp(prefix="workwarden-demo-"))
    try:
        if store_url is None:
            assert directory is not None
            url = f"sqlite://{(directory / 'demo.sqlite3').as_posix()}?synchronous=NORMAL"
        else:
            url = store_url
        try:
            store = open_store(url, mode="write")
        except WorkloadError as exc:
            if exc.code != STORE_NOT_FOUND:
                raise
            store = open_store(url, mode="create")
            if isinstance(store, SQLiteStore):
                created = store.path
        try:
            if next(iter(store.scan()), None) is not None:
                raise WorkloadError(
                    STORE_UNUSABLE,
                    "the demo needs an empty store (it reports every workload as its own);"
                    " this one holds workloads",
                )
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
    except BaseException:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if created is not None:
            for name in (created, created + "-wal", created + "-shm", created + "-journal"):
                Path(name).unlink(missing_ok=True)
        raise
    return 1 if report.invalid_histories else 0
