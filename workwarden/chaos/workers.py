"""What each process of a chaos run does: the workers and the sweeper.

`worker_main` loops: claim the best claimable workload of either tenant
under a short lease (300, 600 or 1000 ms), start it, read its execution
context (the attempt's plan is in the input), checkpoint, then follow the
plan: complete, fail with a known or an unknown effect, stall past the lease
and report anyway, or run past the execution deadline. A worker asked to
cancel confirms the cancellation. A batched worker (`batched=True`) does the
same for up to `BATCH_LIMIT` workloads at once: it claims them with one
`claim_many`, under leases `BATCHED_LEASE_FACTOR` times as long, and sends
the reports of all of them (their starts, checkpoints, heartbeats,
completions and failure reports, confirmations) in one `report_many` each,
reading each attempt's plan from its claim's reply (which carries the input)
rather than from its execution context. `sweeper_main` loops: recover
expired leases, enforce deadlines, cancel what the operator planned to
cancel, and cancel work whose dependency ended in a state that can never
satisfy it.

Both read the wall clock (`wall_ms`) before every call. They count what
happens in their slot of a block of shared memory, without locks (a process
killed while holding a lock would leave it held), and stop when the shared
stop flag is set, or when the run's own process is gone (killed, even with
SIGKILL: the pipe `alive` then reads as closed), so that no worker outlives
its run. Each completion a worker is told succeeded is appended, as one line,
to a file of its own; a traceback is written beside it if the process dies of
an exception rather than a kill, and it then exits with status 1, printing
nothing: what the processes would print (a traceback, the database driver's
warnings) goes to a file of their own in the run's folder, never to the
terminal of the run. Ctrl-C is the run's to handle (it stops its processes):
they ignore SIGINT. A store that cannot be opened (a server down) is counted
as a store failure and opened again, as a worker's call that fails is.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workwarden.statemachine import Authority, Claim, GrantVerifier, WorkloadError, default_spec
from workwarden.statemachine import errors as codes
from workwarden.statemachine.batches import Report
from workwarden.statemachine.commands import (
    CheckpointCommand,
    CompleteCommand,
    ConfirmCancelCommand,
    FailCommand,
    HeartbeatCommand,
    StartCommand,
)
from workwarden.statemachine.models import ClaimReply, Result
from workwarden.storage import open_store

__all__ = [
    "APPLICATION",
    "BATCHED_LEASE_FACTOR",
    "BATCH_LIMIT",
    "CAPABILITIES",
    "COUNTERS",
    "OPERATOR",
    "TENANTS",
    "sweeper_main",
    "wall_ms",
    "worker_main",
]

TENANTS = ("acme", "globex")
APPLICATION = "chaos"
CAPABILITIES = ("chaos",)
LEASES_MS = (300, 600, 1000)
OPERATOR = "operator-chaos"
BATCH_LIMIT = 4
"""The most workloads a batched worker claims with one `claim_many`."""
BATCHED_LEASE_FACTOR = 2
"""A batched worker's leases are this many times a worker's (300 ms becomes 600 ms)."""
_FAILURES = {
    "fail_transient": ("transient_connection", "none"),
    "fail_validation": ("validation", "none"),
    "fail_unknown": ("timeout", "unknown"),
}

#: What each process counts, one slot per process, in shared memory.
COUNTERS = (
    "claims",
    "completions",
    "failures",
    "confirmed_cancellations",
    "stale_attempts",
    "recoveries",
    "deadline_timeouts",
    "operator_cancellations",
    "orphans_cancelled",
    "store_failures",
    "batch_claims",
    "batch_reports",
    *(
        f"refused {code}"
        for code in (
            codes.CONFLICT,
            codes.STALE_FENCE,
            codes.LEASE_EXPIRED,
            codes.CLAIM_INVALID,
            codes.TIMED_OUT,
            codes.TRANSITION_DENIED,
            codes.ATTEMPTS_EXHAUSTED,
        )
    ),
    "refused other",
)
_INDEX = {name: index for index, name in enumerate(COUNTERS)}


def wall_ms() -> int:
    """The wall clock, in integer milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class _Slot:
    """One process's counters in the shared block (written by that process only)."""

    def __init__(self, shared: Any, slot: int) -> None:
        self._shared = shared
        self._base = slot * len(COUNTERS)

    def add(self, name: str, amount: int = 1) -> None:
        self._shared[self._base + _INDEX[name]] += amount

    def refused(self, exc: WorkloadError) -> None:
        name = f"refused {exc.code}"
        self.add(name if name in _INDEX else "refused other")
        # A call whose outcome the store could not confirm is a store failure too.
        if exc.code in (codes.STORAGE_FAILURE, codes.OUTCOME_UNKNOWN):
            self.add("store_failures")


def _record_crash(log_dir: str, name: str) -> None:
    # The run's folder is gone when the run itself is: nothing to record then.
    with contextlib.suppress(OSError):
        Path(log_dir, f"{name}.error").write_text(traceback.format_exc(), encoding="utf-8")


def _quiet(log_dir: str, name: str) -> None:
    """Leave Ctrl-C to the run, and send what this process prints to a file of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(Path(log_dir, f"{name}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)


def _stopping(stop: Any, alive: Any) -> bool:
    """Is the run over: the stop flag set, or the run's process gone (its pipe closed)?"""
    return bool(stop.value) or (alive is not None and alive.poll())


def _open(url: str, slot: _Slot, stop: Any, alive: Any) -> Any:
    """The store, opened again while it cannot be (each failure counted); None if the run
    ends first."""
    while not _stopping(stop, alive):
        try:
            return open_store(url)
        except WorkloadError as exc:
            if exc.code != codes.STORAGE_FAILURE:
                raise
            slot.add("store_failures")
            time.sleep(0.2)
    return None


def _acknowledge(fd: int, claim: Claim, result_id: str) -> None:
    # One write(2) of one short line to a file opened with O_APPEND: a
    # process killed around it leaves the line whole or absent.
    os.write(fd, f"{claim.workload_id} {claim.fencing_token} {result_id}\n".encode())


def _plan_of(work_input: Any, token: int) -> str:
    """The plan of the attempt under `token`: the input's plans in order, the last repeated."""
    plans = work_input.get("plans") if isinstance(work_input, dict) else None
    if not isinstance(plans, list) or not plans:
        return "complete"
    return str(plans[min(token, len(plans)) - 1])


def _attempt(
    authority: Authority, claim: Claim, slot: _Slot, rng: random.Random, fd: int, lease_ms: int
) -> None:
    """Run one claimed attempt to its planned end; refusals end it early."""
    wid, fence = claim.workload_id, claim.fence
    try:
        authority.start(wid, fence, wall_ms())
        context = authority.execution_context(
            wid, fence, wall_ms(), secret_references=("secret://chaos/db",)
        )
        plan = _plan_of(context.input, claim.fencing_token)
        authority.checkpoint(wid, fence, {"step": 1, "attempt": claim.fencing_token}, wall_ms())
        if plan == "stall":
            # Alive but stuck past the lease, then back as if nothing happened:
            # the authority must refuse whatever this stale worker reports.
            time.sleep(lease_ms * 1.5 / 1000)
            slot.add("stale_attempts")
        elif plan == "slow":
            until = wall_ms() + 400  # past the 250 ms execution deadline
            while wall_ms() < until:
                time.sleep(0.08)
                authority.heartbeat(wid, fence, wall_ms(), lease_ms)
        elif plan == "cancel":
            time.sleep(rng.uniform(0.05, 0.2))
            authority.heartbeat(wid, fence, wall_ms(), lease_ms)
        if plan in ("complete", "stall", "slow", "cancel"):
            result_id = f"result-{wid}-{claim.fencing_token}"
            authority.complete(wid, fence, result_id, {"ok": True}, wall_ms())
            slot.add("completions")
            _acknowledge(fd, claim, result_id)
            return
        kind, effect = _FAILURES[plan]
        authority.fail(wid, fence, kind, f"{kind} in the chaos run", wall_ms(), effect=effect)
        slot.add("failures")
    except WorkloadError as exc:
        slot.refused(exc)
        if exc.code == codes.TRANSITION_DENIED:
            # An operator asked for cancellation while this worker held the work.
            try:
                authority.confirm_cancel(wid, fence, wall_ms())
                slot.add("confirmed_cancellations")
            except WorkloadError as again:
                slot.refused(again)


class _Batch:
    """The claims a batched worker holds, and what it sends for each in one `report_many`."""

    def __init__(
        self, authority: Authority, slot: _Slot, claims: Sequence[ClaimReply], fd: int
    ) -> None:
        self.authority = authority
        self.slot = slot
        self.fd = fd
        self.held: dict[str, Claim] = {claim.workload_id: claim for claim in claims}
        # The claim's reply carries the work: no execution context to read first.
        self.plans = {
            claim.workload_id: _plan_of(claim.input, claim.fencing_token) for claim in claims
        }
        self.cancelling: list[Claim] = []

    def report(self, of: Sequence[str], make: Callable[[Claim], Report]) -> list[tuple[Claim, Any]]:
        """One `report_many` of `make(claim)` for each held workload of `of`; each claim with
        its slot's answer. A refused report ends its attempt (the claim is no longer held);
        one refused because cancellation was requested is confirmed later."""
        claims = [self.held[wid] for wid in of if wid in self.held]
        if not claims:
            return []
        self.slot.add("batch_reports")
        answers = self.authority.report_many([make(claim) for claim in claims], wall_ms())
        out: list[tuple[Claim, Any]] = []
        for claim, answer in zip(claims, answers, strict=True):
            if isinstance(answer, WorkloadError):
                self.slot.refused(answer)
                del self.held[claim.workload_id]
                if answer.code == codes.TRANSITION_DENIED:
                    # An operator asked for cancellation while this worker held the work.
                    self.cancelling.append(claim)
                continue
            out.append((claim, answer))
        return out

    def planned(self, *plans: str) -> list[str]:
        """The held workloads whose attempt's plan is one of `plans`."""
        return sorted(wid for wid in self.held if self.plans.get(wid) in plans)

    def finish(self, of: Sequence[str]) -> None:
        """Complete or fail each of `of` as its plan says, in one `report_many`."""
        for claim, answer in self.report(of, self._final):
            del self.held[claim.workload_id]
            if isinstance(answer, Result):
                self.slot.add("completions")
                _acknowledge(self.fd, claim, answer.result_id)
            else:
                self.slot.add("failures")

    def _final(self, claim: Claim) -> Report:
        wid, fence = claim.workload_id, claim.fence
        plan = self.plans[wid]
        if plan in _FAILURES:
            kind, effect = _FAILURES[plan]
            error = f"{kind} in the chaos run"
            return FailCommand(workload_id=wid, fence=fence, kind=kind, error=error, effect=effect)
        result_id = f"result-{wid}-{claim.fencing_token}"
        return CompleteCommand(
            workload_id=wid, fence=fence, result_id=result_id, output={"ok": True}
        )

    def heartbeat_until(self, of: Sequence[str], until: int, lease_ms: int) -> None:
        """Heartbeat each of `of` every 80 ms, in one `report_many` each time, until `until`."""

        def beat(claim: Claim) -> Report:
            return HeartbeatCommand(
                workload_id=claim.workload_id, fence=claim.fence, extend_ms=lease_ms
            )

        while wall_ms() < until and any(wid in self.held for wid in of):
            time.sleep(0.08)
            self.report(of, beat)

    def confirm_cancellations(self) -> None:
        """Confirm, in one `report_many`, each cancellation an operator requested."""
        asked, self.cancelling = self.cancelling, []
        for claim in asked:
            self.held[claim.workload_id] = claim

        def confirm(claim: Claim) -> Report:
            return ConfirmCancelCommand(workload_id=claim.workload_id, fence=claim.fence)

        confirmed = self.report([claim.workload_id for claim in asked], confirm)
        self.slot.add("confirmed_cancellations", len(confirmed))
        self.cancelling = []


def _batched_attempts(
    authority: Authority,
    claims: Sequence[ClaimReply],
    slot: _Slot,
    rng: random.Random,
    fd: int,
    lease_ms: int,
) -> None:
    """Run claimed attempts to their planned ends together, their reports batched."""
    batch = _Batch(authority, slot, claims, fd)
    every = sorted(batch.held)
    batch.report(every, lambda c: StartCommand(workload_id=c.workload_id, fence=c.fence))
    batch.report(
        every,
        lambda c: CheckpointCommand(
            workload_id=c.workload_id, fence=c.fence, state={"step": 1, "attempt": c.fencing_token}
        ),
    )
    # What completes or fails at once goes first, so that the others' pauses cost it nothing.
    batch.finish(batch.planned("complete", *_FAILURES))
    slow, cancel = batch.planned("slow"), batch.planned("cancel")
    # Past the 250 ms execution deadline for the slow ones; a pause for the cancelled ones.
    batch.heartbeat_until(slow, wall_ms() + 400, lease_ms)
    if cancel:
        time.sleep(rng.uniform(0.05, 0.2))
        batch.heartbeat_until(cancel, wall_ms() + 1, lease_ms)
    batch.finish(slow + cancel)
    stalled = batch.planned("stall")
    if stalled:
        # Alive but stuck past the lease, then back as if nothing happened: the
        # authority must refuse whatever these stale reports say.
        time.sleep(lease_ms * 1.5 / 1000)
        slot.add("stale_attempts", len(stalled))
        batch.finish(stalled)
    batch.confirm_cancellations()


def _claim_batch(
    authority: Authority, tenants: Sequence[str], name: str, slot: _Slot, lease_ms: int, call: int
) -> list[ClaimReply]:
    """Up to `BATCH_LIMIT` claims with one `claim_many`, of the first tenant that has work."""
    for tenant in tenants:
        try:
            claims = list(
                authority.claim_many(
                    tenant,
                    APPLICATION,
                    name,
                    CAPABILITIES,
                    wall_ms(),
                    lease_ms,
                    BATCH_LIMIT,
                    request_id=f"{name}-batch-{call}",
                )
            )
        except WorkloadError as exc:
            slot.refused(exc)
            continue
        if claims:
            slot.add("batch_claims", len(claims))
            return claims
    return []


def worker_main(
    url: str,
    slot_index: int,
    name: str,
    seed: int,
    shared: Any,
    stop: Any,
    log_dir: str,
    batched: bool = False,
    alive: Any = None,
) -> None:
    """A worker process: claim, start, read, checkpoint, then follow the attempt's plan.

    `batched`: claim up to `BATCH_LIMIT` workloads at once (`claim_many`) and send
    their reports together (`report_many`). `alive`: the read end of a pipe only
    the run's process writes to; the worker stops when it reads as closed.
    """
    try:
        _quiet(log_dir, name)
        slot = _Slot(shared, slot_index)
        rng = random.Random(f"{seed}/{name}")
        fd = os.open(Path(log_dir, f"{name}.acks"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        store = _open(url, slot, stop, alive)
        if store is None:
            return
        authority = Authority(store, grants=GrantVerifier.without_signatures())
        tenants = list(TENANTS)
        calls = 0
        while not _stopping(stop, alive):
            rng.shuffle(tenants)
            lease_ms = rng.choice(LEASES_MS)
            if batched:
                # Each of its claims waits while it reports on all of them: longer leases.
                lease_ms *= BATCHED_LEASE_FACTOR
                calls += 1
                claims = _claim_batch(authority, tenants, name, slot, lease_ms, calls)
                if not claims:
                    time.sleep(0.02)
                    continue
                slot.add("claims", len(claims))
                _batched_attempts(authority, claims, slot, rng, fd, lease_ms)
                continue
            claim: Claim | None = None
            for tenant in tenants:
                try:
                    claim = authority.claim_next(
                        tenant, APPLICATION, name, CAPABILITIES, wall_ms(), lease_ms
                    )
                except WorkloadError as exc:
                    slot.refused(exc)
                if claim is not None:
                    break
            if claim is None:
                time.sleep(0.02)
                continue
            slot.add("claims")
            _attempt(authority, claim, slot, rng, fd, lease_ms)
        store.close()
    except BaseException:  # noqa: BLE001 - recorded for the audit; the run reports it
        _record_crash(log_dir, name)
        raise SystemExit(1) from None


def _cancel_orphans(
    authority: Authority, pending: dict[str, str], terminal: frozenset[str], slot: _Slot
) -> None:
    """Cancel waiting work whose dependency ended in a state that can never satisfy it."""
    for child, parent in list(pending.items()):
        mine = authority.get(child)
        if mine.state in terminal:
            del pending[child]
            continue
        theirs = authority.get(parent)
        if mine.state == "READY" and theirs.state in terminal and theirs.state != "SUCCEEDED":
            authority.cancel(child, OPERATOR, wall_ms())
            slot.add("orphans_cancelled")
            del pending[child]


def sweeper_main(
    url: str,
    slot_index: int,
    name: str,
    cancellations: Sequence[tuple[int, str]],
    dependents: Sequence[tuple[str, str]],
    shared: Any,
    stop: Any,
    log_dir: str,
    alive: Any = None,
) -> None:
    """The sweeper process: recover expired leases, enforce deadlines, act as the operator.

    `alive`: as `worker_main`'s."""
    try:
        _quiet(log_dir, name)
        slot = _Slot(shared, slot_index)
        store = _open(url, slot, stop, alive)
        if store is None:
            return
        authority = Authority(store, grants=GrantVerifier.without_signatures())
        terminal = default_spec().terminal_states
        due = list(cancellations)
        pending = dict(dependents)
        last_orphan_pass = 0
        while not _stopping(stop, alive):
            try:
                slot.add("recoveries", len(authority.recover_expired(wall_ms())))
                slot.add("deadline_timeouts", len(authority.enforce_deadlines(wall_ms())))
                while due and due[0][0] <= wall_ms():
                    _, workload_id = due.pop(0)
                    try:
                        authority.cancel(workload_id, OPERATOR, wall_ms())
                        slot.add("operator_cancellations")
                    except WorkloadError as exc:
                        slot.refused(exc)
                if wall_ms() - last_orphan_pass >= 300:
                    _cancel_orphans(authority, pending, terminal, slot)
                    last_orphan_pass = wall_ms()
            except WorkloadError as exc:
                slot.refused(exc)
            time.sleep(0.05)
        store.close()
    except BaseException:  # noqa: BLE001 - recorded for the audit; the run reports it
        _record_crash(log_dir, name)
        raise SystemExit(1) from None
