"""`workwarden demo`: the whole lifecycle at work on an embedded store, on a simulated clock.

Admits a few hundred workloads for two tenants (priorities, dependencies,
`not_before` instants, deadlines), then runs a fleet of workers against them
tick by tick: workers claim, start, checkpoint, heartbeat and complete, and
some crash, lose their lease, fail with a known or an unknown effect; an
operator cancels and re-arms; a sweeper recovers lost leases and enforces
deadlines. At the end every committed history is checked against the spec and
a summary is printed. The same `--seed` gives the same run.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from workwarden.statemachine import (
    Authority,
    Claim,
    CreateWorkload,
    Dependency,
    Grant,
    GrantSigner,
    GrantVerifier,
    RetryPolicy,
    Subject,
    Timeouts,
    Workload,
    WorkloadError,
    default_spec,
)
from workwarden.statemachine import errors as codes
from workwarden.statemachine.history import validate_workload
from workwarden.storage import Store

__all__ = ["DemoReport", "run_demo"]

TENANTS = ("acme", "globex")
APPLICATION = "billing"
TICK_MS = 250
LEASE_MS = 2_000
START_MS = 1_700_000_000_000


@dataclass
class _Worker:
    name: str
    tenant: str
    claim: Claim | None = None
    plan: str = "complete"
    steps: int = 0
    generation: int = 0


@dataclass
class DemoReport:
    """What a demo run did and found."""

    workloads: int = 0
    ticks: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    recoveries: int = 0
    crashes: int = 0
    conflicts: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    invalid_histories: list[str] = field(default_factory=list)
    seconds: float = 0.0
    store: str = ""


def _request(
    rng: random.Random, signer: GrantSigner, tenant: str, index: int, now: int, parent: str | None
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
    timeouts = Timeouts()
    roll = rng.random()
    if roll < 0.15:
        timeouts = Timeouts(execution_ms=rng.choice((1_500, 4_000)))
    elif roll < 0.22:
        timeouts = Timeouts(overall_ms=rng.choice((8_000, 20_000)))
    elif roll < 0.27:
        timeouts = Timeouts(queue_ms=6_000)
    not_before = now + rng.randrange(1_000, 15_000) if rng.random() < 0.15 else None
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
        capability_snapshot=("billing",),
        priority=rng.choice((0, 0, 0, 1, 2, 5)),
        idempotency_key=f"invoice-{index}",
        retry_policy=RetryPolicy(max_attempts=3, initial_delay_ms=500, max_delay_ms=4_000),
        timeouts=timeouts,
        dependencies=(Dependency(workload_id=parent),) if parent is not None else (),
        not_before=not_before,
    )


_PLANS = (
    ("complete", 0.70),
    ("fail_transient", 0.08),
    ("fail_validation", 0.04),
    ("fail_unknown", 0.05),
    ("crash", 0.05),
    ("stall", 0.05),
    ("slow", 0.03),
)


def _pick_plan(rng: random.Random) -> str:
    roll = rng.random()
    for plan, weight in _PLANS:
        if roll < weight:
            return plan
        roll -= weight
    return "complete"


def _step(authority: Authority, worker: _Worker, rng: random.Random, now: int, report: DemoReport) -> None:
    claim = worker.claim
    if claim is None:
        got = authority.claim_next(worker.tenant, APPLICATION, worker.name, ("billing",), now, LEASE_MS)
        if got is not None:
            worker.claim = got
            worker.plan = _pick_plan(rng)
            worker.steps = 0
            report.attempts += 1
        return
    wid, fence = claim.workload_id, claim.fence
    worker.steps += 1
    plan = worker.plan
    if plan == "crash" and worker.steps == 2:
        # The process dies: its claim is forgotten, a fresh worker takes its place.
        report.crashes += 1
        worker.generation += 1
        worker.name = f"{worker.name.split('#')[0]}#{worker.generation}"
        worker.claim = None
        return
    if plan == "stall" and worker.steps >= 2:
        # Alive but stuck: never heartbeats again; the lease runs out.
        if worker.steps > 20:
            worker.claim = None
        return
    if worker.steps == 1:
        authority.start(wid, fence, now)
    elif worker.steps == 2:
        context = authority.execution_context(wid, fence, now)
        authority.checkpoint(wid, fence, {"stage": "prepared", "seen": len(context.checkpoints)}, now)
    elif worker.steps == 3 or (plan == "slow" and worker.steps < 12):
        authority.heartbeat(wid, fence, now, LEASE_MS)
    elif plan.startswith("fail"):
        kind, effect = {
            "fail_transient": ("transient_connection", "none"),
            "fail_validation": ("validation", "none"),
            "fail_unknown": ("timeout", "unknown"),
        }[plan]
        authority.fail(wid, fence, kind, f"{kind} during demo", now, effect=effect)
        worker.claim = None
    else:
        authority.complete(wid, fence, f"result-{wid}-{fence.token}", {"ok": True}, now)
        worker.claim = None


def _operator(authority: Authority, rng: random.Random, ids: list[str], now: int) -> None:
    target = rng.choice(ids)
    roll = rng.random()
    if roll >= 0.03:
        return
    workload = authority.get(target)
    if roll < 0.004:
        if workload.state in ("READY", "CLAIMED", "RUNNING", "CHECKPOINTED"):
            authority.cancel(target, "operator-1", now)
    elif workload.state == "DEAD_LETTER":
        authority.retry(target, "operator-1", now, reason="checked by the demo operator")


def _cancel_orphans(
    authority: Authority, current: dict[str, Workload], terminal: frozenset[str], now: int
) -> None:
    """Cancel waiting work whose dependency finished in a state that can never satisfy it."""
    for workload in current.values():
        if workload.state != "READY":
            continue
        for dependency in workload.dependencies:
            parent = current.get(dependency.workload_id)
            if parent is not None and parent.state in terminal:
                if parent.state != dependency.required_state:
                    authority.cancel(workload.workload_id, "operator-1", now)
                    break


def run_demo(
    *,
    store: Store,
    seed: int = 7,
    workloads: int = 300,
    workers: int = 6,
    max_ticks: int = 2_000,
    out: TextIO | None = None,
    label: str = "",
) -> DemoReport:
    """Run the demo on `store`; returns the report (also printed to `out`)."""
    rng = random.Random(seed)
    secret = bytes(rng.randrange(256) for _ in range(32))
    signer = GrantSigner("demo-key", secret)
    authority = Authority(store, grants=GrantVerifier({"demo-key": secret}))
    spec = default_spec()
    report = DemoReport(workloads=workloads, store=label)
    started = time.perf_counter()
    now = START_MS
    ids: list[str] = []
    for index in range(workloads):
        tenant = TENANTS[index % len(TENANTS)]
        parent = ids[-2] if index % 12 == 11 and len(ids) >= 2 else None
        admitted = authority.admit(_request(rng, signer, tenant, index, now, parent), now)
        ids.append(admitted.workload.workload_id)
    fleet = [_Worker(name=f"worker-{i}", tenant=TENANTS[i % len(TENANTS)]) for i in range(workers)]
    show = out is not None and out.isatty()
    for tick in range(max_ticks):
        now += TICK_MS
        report.ticks = tick + 1
        order = list(fleet)
        rng.shuffle(order)
        for worker in order:
            try:
                _step(authority, worker, rng, now, report)
            except WorkloadError as exc:
                report.refusals[exc.code] += 1
                if exc.code == codes.CONFLICT:
                    report.conflicts += 1
                worker.claim = None
        try:
            _operator(authority, rng, ids, now)
        except WorkloadError as exc:
            report.refusals[exc.code] += 1
        report.recoveries += len(authority.recover_expired(now))
        authority.enforce_deadlines(now)
        if tick % 8 == 0:
            current = {w.workload_id: w for t in TENANTS for w in authority.list(t, APPLICATION)}
            _cancel_orphans(authority, current, spec.terminal_states, now)
            states = Counter(w.state for w in current.values())
            finished = sum(n for s, n in states.items() if spec.states[s].kind == "terminal")
            if show and out is not None:
                filled = int(30 * finished / max(workloads, 1))
                bar = "#" * filled + "." * (30 - filled)
                out.write(f"\r  [{bar}] {finished}/{workloads} finished, tick {tick + 1}")
                out.flush()
            if finished == workloads and all(w.claim is None for w in fleet):
                break
    if show and out is not None:
        out.write("\n")
    for tenant in TENANTS:
        for workload in authority.list(tenant, APPLICATION):
            report.outcomes[workload.state] += 1
            for event in workload.execution_history:
                decision = event.evidence.get("decision")
                if decision is not None:
                    report.decisions[f"{event.from_state}->{event.to} {decision}"] += 1
            problem = validate_workload(spec, workload)
            if problem is not None:
                report.invalid_histories.append(f"{workload.workload_id}: {problem}")
    report.seconds = time.perf_counter() - started
    if out is not None:
        _print(report, out)
    return report


def _print(report: DemoReport, out: TextIO) -> None:
    write = out.write
    write(f"workwarden demo: {report.workloads} workloads, {report.ticks} ticks of {TICK_MS} ms ")
    write(f"({report.seconds:.1f} s) on {report.store}\n\n")
    write("  outcome                     count\n")
    for state, count in sorted(report.outcomes.items()):
        write(f"  {state:<26} {count:>6}\n")
    write("\n  decision by rule                                   count\n")
    for decision, count in sorted(report.decisions.items()):
        write(f"  {decision:<48} {count:>6}\n")
    write("\n")
    write(f"  attempts {report.attempts}, recoveries {report.recoveries}, ")
    write(f"worker crashes {report.crashes}, conflicts lost {report.conflicts}\n")
    if report.refusals:
        refused = ", ".join(f"{code} {n}" for code, n in sorted(report.refusals.items()))
        write(f"  refusals: {refused}\n")
    total = sum(report.outcomes.values())
    if report.invalid_histories:
        write(f"\n  INVALID histories: {len(report.invalid_histories)} of {total}\n")
        for line in report.invalid_histories[:10]:
            write(f"    {line}\n")
    else:
        write(f"\n  every history valid against the spec: {total} of {total}\n")


def default_store_path() -> Path:
    """A fresh SQLite file in a new temporary directory."""
    return Path(tempfile.mkdtemp(prefix="workwarden-demo-")) / "demo.sqlite3"


def main_demo(store_url: str | None, seed: int, workloads: int, workers: int) -> int:
    """Run the demo from the command line; exit 1 if any history is invalid."""
    from workwarden.storage.urls import open_store

    url = store_url or f"sqlite:///{default_store_path()}"
    store = open_store(url)
    try:
        report = run_demo(
            store=store,
            seed=seed,
            workloads=workloads,
            workers=workers,
            out=sys.stdout,
            label=url,
        )
    finally:
        store.close()
    return 1 if report.invalid_histories else 0
