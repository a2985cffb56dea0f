"""What each process of a chaos run does: the workers and the sweeper.

`worker_main` loops: claim the best claimable workload of either tenant
under a short lease (300, 600 or 1000 ms), start it, read its execution
context (the attempt's plan is in the input), checkpoint, then follow the
plan: complete, fail with a known or an unknown effect, stall past the
lease and report anyway, or run past the execution deadline. A worker asked
to cancel confirms the cancellation. `sweeper_main` loops: recover expired
leases, enforce deadlines, cancel what the operator planned to cancel, and
cancel work whose dependency ended in a state that can never satisfy it.

Both read the wall clock (`wall_ms`) before every call. They count what
happens in their slot of a block of shared memory, without locks (a process
killed while holding a lock would leave it held), and stop when the shared
stop flag is set. Each completion a worker is told succeeded is appended, as
one line, to a file of its own; a traceback is written beside it if the
process dies of an exception rather than a kill.
"""

from __future__ import annotations

import os
import random
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workwarden.statemachine import Authority, Claim, GrantVerifier, WorkloadError, default_spec
from workwarden.statemachine import errors as codes
from workwarden.storage import open_store

__all__ = [
    "APPLICATION",
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
        if exc.code == codes.STORAGE_FAILURE:
            self.add("store_failures")


def _record_crash(log_dir: str, name: str) -> None:
    Path(log_dir, f"{name}.error").write_text(traceback.format_exc(), encoding="utf-8")


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
        kind, effect = {
            "fail_transient": ("transient_connection", "none"),
            "fail_validation": ("validation", "none"),
            "fail_unknown": ("timeout", "unknown"),
        }[plan]
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


def worker_main(
    url: str, slot_index: int, name: str, seed: int, shared: Any, stop: Any, log_dir: str
) -> None:
    """A worker process: claim, start, read, checkpoint, then follow the attempt's plan."""
    try:
        slot = _Slot(shared, slot_index)
        rng = random.Random(f"{seed}/{name}")
        fd = os.open(Path(log_dir, f"{name}.acks"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        store = open_store(url)
        authority = Authority(store, grants=GrantVerifier.without_signatures())
        tenants = list(TENANTS)
        while not stop.value:
            rng.shuffle(tenants)
            lease_ms = rng.choice(LEASES_MS)
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
    except BaseException:
        _record_crash(log_dir, name)
        raise


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
) -> None:
    """The sweeper process: recover expired leases, enforce deadlines, act as the operator."""
    try:
        slot = _Slot(shared, slot_index)
        store = open_store(url)
        authority = Authority(store, grants=GrantVerifier.without_signatures())
        terminal = default_spec().terminal_states
        due = list(cancellations)
        pending = dict(dependents)
        last_orphan_pass = 0
        while not stop.value:
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
    except BaseException:
        _record_crash(log_dir, name)
        raise
