"""The stateful suite's held calls: a writer's `prepare` held while others commit, then committed.

Each rule here reads and decides one call (an admission, a claim, an
operator's call, a sweep's step, a holder's call) without writing it; the
prepared call waits in the `prepared` Bundle until `commit` writes it, or
refuses it with WORKLOAD_CONFLICT when its workload moved on meanwhile. So
every read-decide-write race is run, without threads or sleeps.
"""

from __future__ import annotations

from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import consumes, multiple, precondition, rule

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority, Prepared
from workwarden.statemachine.commands import (
    AdmitCommand,
    AdmitReply,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    FailCommand,
    HeartbeatCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    SweepReply,
    TimeoutCommand,
)
from workwarden.statemachine.models import Claim, Fence
from workwarden.testing.admission_rules import AdmissionRules
from workwarden.testing.machine import PREPARED, WORKERS, WORKLOADS, WRITERS
from workwarden.testing.operator_rules import OperatorRules
from workwarden.testing.shadow import Outcome
from workwarden.testing.support import (
    ALLOWED,
    FAILURE_KINDS,
    LEASES,
    OPERATOR_TARGETS,
    SCOPES,
    SWEEPS,
    WORKER_CALLS,
    Held,
    Worker,
    WorkloadPlan,
    fence_tuple,
    shadow_plan,
    workload_plans,
)
from workwarden.testing.worker_rules import WorkerRules

__all__ = ["HeldCallRules"]


#: The refusals the store gives at a claim's write (its key's limit, its key's rate).
_STORE_GATES = frozenset({errors.CONCURRENCY_LIMITED, errors.RATE_LIMITED})


class HeldCallRules(WorkerRules, AdmissionRules, OperatorRules):
    """A writer's prepare held while others commit, and the commit that follows."""

    # -- interleaving: a writer's prepare held while others commit --------------------------------

    @precondition(lambda self: self._can_hold() and self._room())
    @rule(target=PREPARED, writer=WRITERS, scope=st.integers(0, 7), plan=workload_plans())
    def prepare_admission(self, writer: Authority, scope: int, plan: WorkloadPlan) -> Any:
        """A writer reads and decides an admission of an unused scope, and waits."""
        free = [s for s in SCOPES if s not in self._scopes]
        agent, key = free[scope % len(free)]
        request = plan.request(agent, key, self.now)
        outcome = (
            self.shadow.admit((agent, key), shadow_plan(plan, request), self.now)
            if self.shadow
            else None
        )
        command = AdmitCommand(request=request)
        label = f"admit {agent}/{key}"
        # The scope's tombstone as decided on: a purge since makes the commit a conflict.
        seen = self.shadow.tombstones.get((agent, key)) if self.shadow else None
        extra = ((agent, key), plan, request, seen)
        return self._prepare(writer, "admit", "", label, command, outcome, None, None, extra)

    @precondition(lambda self: self._can_hold() and bool(self._admitted))
    @rule(
        target=PREPARED,
        writer=WRITERS,
        pick=st.integers(0, 15),
        worker=WORKERS,
        call=st.sampled_from(("claim", "cancel", "timeout", "retry")),
        lease_ms=st.sampled_from(LEASES),
    )
    def prepare_on_workload(
        self, writer: Authority, pick: int, worker: Worker, call: str, lease_ms: int
    ) -> Any:
        """A writer reads and decides a claim (of READY work, when there is some) or an
        operator's cancel, timeout or re-arm (chosen as `operator` chooses), and waits."""
        key = self._in_state(OPERATOR_TARGETS.get(call, ("READY",)), pick)
        return self._hold(writer, call, key, worker, None, lease_ms)

    @precondition(lambda self: self._can_hold() and self._anything_due())
    @rule(target=PREPARED, writer=WRITERS, pick=st.integers(0, 15), sweep=st.sampled_from(SWEEPS))
    def prepare_sweep_step(self, writer: Authority, pick: int, sweep: str) -> Any:
        """A sweep reads and decides one workload it found due (an expired lease, a fallen
        deadline), and waits before writing: the race of a sweep with the worker's own calls.
        (When `sweep` finds nothing due, the other sweep takes the step.)"""
        if not self._due(sweep):
            sweep = SWEEPS[1 - SWEEPS.index(sweep)]
        due = self._due(sweep)
        return self._hold(writer, sweep, due[pick % len(due)], None, None, 0)

    @precondition(lambda self: self._can_hold() and self._holding())
    @rule(
        target=PREPARED,
        writer=WRITERS,
        pick=st.integers(0, 15),
        call=st.sampled_from(WORKER_CALLS),
        extend_ms=st.sampled_from(LEASES),
        kind=st.sampled_from(FAILURE_KINDS),
    )
    def prepare_worker_call(
        self, writer: Authority, pick: int, call: str, extend_ms: int, kind: str
    ) -> Any:
        """A writer reads and decides a holder's call, and waits."""
        worker, key, fence = self._pick_held(pick)
        return self._hold(writer, call, key, worker, fence, extend_ms, kind)

    def _hold(
        self,
        writer: Authority,
        call: str,
        key: str,
        worker: Worker | None,
        fence: Fence | None,
        lease_ms: int,
        kind: str = "transient_connection",
    ) -> Any:
        """Prepare `call` on `key` (a claim by `worker`; a worker call under `fence`)."""
        now = self.now
        shadow = self.shadow
        command: Command
        outcome: Outcome | None = None
        extra: tuple[Any, ...] = ()
        label = f"{call} {key}"
        if call == "claim":
            assert worker is not None
            command = ClaimCommand(
                workload_id=key,
                worker_id=worker.name,
                capabilities=worker.capabilities,
                lease_ms=lease_ms,
            )
            if shadow:
                outcome = shadow.claim(key, worker.name, worker.capabilities, lease_ms, now)
            label = f"claim {key} by {worker.name} for {lease_ms} ms"
            extra = (lease_ms,)
        elif call in OPERATOR_TARGETS:
            if call == "cancel":
                command = CancelCommand(workload_id=key, actor="operator-1")
            elif call == "timeout":
                command = TimeoutCommand(workload_id=key, actor="operator-1")
            else:
                command = RetryCommand(workload_id=key, actor="operator-1", reason="re-arm")
            outcome = self._predict_operator(call, key)
        elif call == "recover_expired":
            command = RecoverCommand(workload_id=key)
            outcome = shadow.recover(key, now) if shadow else None
        elif call == "enforce_deadlines":
            command = EnforceDeadlineCommand(workload_id=key)
            outcome = shadow.enforce(key, now) if shadow else None
        else:
            assert worker is not None
            assert fence is not None
            command, outcome, extra = self._worker_command(call, key, fence, lease_ms, kind)
            label = f"{call} {key} by {worker.name} (token {fence.token})"
        return self._prepare(writer, call, key, label, command, outcome, worker, fence, extra)

    def _worker_command(
        self, call: str, key: str, fence: Fence, extend_ms: int, kind: str
    ) -> tuple[Command, Outcome | None, tuple[Any, ...]]:
        now = self.now
        shadow = self.shadow
        fenced = fence_tuple(fence)
        if call == "start":
            command: Command = StartCommand(workload_id=key, fence=fence)
            return command, shadow.start(key, fenced, now) if shadow else None, ()
        if call == "heartbeat":
            command = HeartbeatCommand(workload_id=key, fence=fence, extend_ms=extend_ms)
            return command, shadow.heartbeat(key, fenced, extend_ms, now) if shadow else None, ()
        if call == "checkpoint":
            command = CheckpointCommand(workload_id=key, fence=fence, state={"step": 5})
            return command, shadow.checkpoint(key, fenced, now) if shadow else None, ()
        if call == "complete":
            rid = self._result_id(key, fence)
            data = {"output": 7}
            command = CompleteCommand(workload_id=key, fence=fence, result_id=rid, output=data)
            outcome = shadow.complete(key, fenced, rid, data, now) if shadow else None
            return command, outcome, (rid, data)
        if call == "fail":
            command = FailCommand(workload_id=key, fence=fence, kind=kind, error="held failure")
            outcome = shadow.fail(key, fenced, kind, "held failure", None, now) if shadow else None
            return command, outcome, (kind, "held failure", None)
        command = ConfirmCancelCommand(workload_id=key, fence=fence)
        return command, shadow.confirm_cancel(key, fenced, now) if shadow else None, ()

    def _prepare(
        self,
        writer: Authority,
        op: str,
        key: str,
        label: str,
        command: Command,
        outcome: Outcome | None,
        worker: Worker | None,
        fence: Fence | None,
        extra: tuple[Any, ...],
    ) -> Any:
        if outcome is not None and outcome.code is not None and not self._records(outcome.code):
            at_prepare: Outcome | None = outcome
        else:
            at_prepare = Outcome(key) if outcome is not None else None
        allowed = ALLOWED[op]
        reply, error = self._call(
            op, f"prepare {label}", lambda: writer.prepare(command, self.now), at_prepare, allowed
        )
        if error is not None:
            if worker is not None:
                self._after_worker_call(worker, key, error)
            return multiple()
        assert isinstance(reply, Prepared)
        version = self.shadow.version(reply.key) if self.shadow else None
        self._pending += 1
        note(f"    held (decided on version {version})")
        return Held(
            op,
            f"{label} (prepared at {self.now})",
            reply.key,
            reply,
            outcome,
            version,
            worker,
            fence,
            extra,
        )

    @rule(target=WORKLOADS, held=consumes(PREPARED))
    def commit(self, held: Held) -> Any:
        """A held call commits: WORKLOAD_CONFLICT if its workload moved on since it was decided."""
        return self._commit(held)

    def _commit(self, held: Held) -> Any:
        self._pending -= 1
        outcome = held.outcome
        predicted: Outcome | None = None
        if self.shadow is not None and outcome is not None:
            moved = outcome.writes and self.shadow.version(held.key) != held.version
            if held.op == "admit" and outcome.writes:
                # Its scope admitted and purged since the decision: the create expects
                # the tombstone it saw, which no longer holds (its tokens would restart).
                moved = moved or self.shadow.tombstones.get(held.extra[0]) != held.extra[3]
            predicted = Outcome(held.key, errors.CONFLICT) if moved else outcome
        # A commit may meet what the store checks at the write: another writer
        # first (a conflict), or its key's limit or rate reached meanwhile.
        allowed = frozenset({errors.CONFLICT}) | {
            code for code in ALLOWED[held.op] if self._records(code) or code in _STORE_GATES
        }
        reply, error = self._call(
            held.op, f"commit {held.label}", held.prepared.commit, predicted, allowed
        )
        if error is not None and error.code == errors.CONFLICT:
            return multiple()
        return self._committed(held, predicted, reply, error)

    def _committed(
        self, held: Held, predicted: Outcome | None, reply: Any, error: errors.WorkloadError | None
    ) -> Any:
        worker = held.worker
        if held.op == "admit":
            if error is None and isinstance(reply, AdmitReply) and reply.created:
                scope, plan, request, _ = held.extra
                return self._admitted_as(held.key, scope, plan, request, predicted)
            return multiple()
        if held.op == "claim":
            if isinstance(reply, Claim) and worker is not None:
                self._granted(worker, held.key, reply, held.extra[0], predicted)
            else:
                self._settle(predicted, error)
            return multiple()
        if isinstance(reply, StateReply) and predicted is not None:
            self._expect(
                reply.state == predicted.state,
                f"{held.label} answered {reply.state}, the shadow model decides {predicted.state}",
                "shadow_model",
            )
        self._settle(predicted, error)
        if worker is not None and held.fence is not None:
            finished = held.op in ("complete", "fail", "confirm_cancel")
            if error is None and held.op == "complete":
                self._results.append((held.key, held.fence, *held.extra))
            if error is None and held.op == "fail" and isinstance(reply, StateReply):
                self._failures.append((held.key, held.fence, *held.extra))
            if worker.held.get(held.key) == held.fence:
                self._after_worker_call(worker, held.key, error, finished=finished)
        if isinstance(reply, SweepReply):
            note(f"    changed={reply.changed} state={reply.state}")
        return multiple()
