"""The stateful suite's worker calls: what a holder of a claim does with its fence.

Start, heartbeat, execution context, checkpoint, completion (and its
replays), failure reports, confirming a cancellation, and `work`: a worker
working like a normal worker through a whole attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import Claim, Fence, Result
from workwarden.testing.claim_rules import ClaimRules
from workwarden.testing.machine import WORKERS, WORKLOADS, WRITERS
from workwarden.testing.shadow import Outcome
from workwarden.testing.support import (
    ALLOWED,
    FAILURE_KINDS,
    HOLDER_CALLS,
    LEASES,
    REPLAYS,
    Worker,
    fence_tuple,
)

__all__ = ["WorkerRules"]


class WorkerRules(ClaimRules):
    """The holder's fenced calls, reports sent again, and a worker's whole attempt."""

    # -- the holder's calls -----------------------------------------------------------------------

    @precondition(lambda self: self._holding())
    @rule(
        writer=WRITERS,
        pick=st.integers(0, 15),
        call=st.sampled_from(HOLDER_CALLS),
        extend_ms=st.sampled_from(LEASES),
    )
    def holder_call(self, writer: Authority, pick: int, call: str, extend_ms: int) -> None:
        """The holder of a claim makes one call with its fence, whatever state the work is in:
        start, heartbeat (extend the lease), execution_context (read input and checkpoints),
        checkpoint, or confirm_cancel."""
        worker, key, fence = self._pick_held(pick)
        self._holder(writer, worker, key, fence, call, extend_ms, call)

    def _holder(
        self,
        writer: Authority,
        worker: Worker,
        key: str,
        fence: Fence,
        call: str,
        extend_ms: int,
        how: str,
    ) -> None:
        if call == "start":
            self._start(writer, worker, key, fence, how)
        elif call == "heartbeat":
            self._heartbeat(writer, worker, key, fence, extend_ms, how)
        elif call == "execution_context":
            self._execution_context(writer, worker, key, fence, how)
        elif call == "checkpoint":
            self._checkpoint(writer, worker, key, fence, extend_ms % 7, how)
        else:
            self._confirm_cancel(writer, worker, key, fence, how)

    def _worker_call(
        self,
        op: str,
        worker: Worker,
        key: str,
        fence: Fence,
        how: str,
        call: Callable[[], Any],
        outcome: Outcome | None,
        *,
        detail: str = "",
        check: Callable[[Any], None] | None = None,
    ) -> None:
        """A fenced call of `worker`: made, held to the prediction (and `check`), then settled."""
        reply, error = self._call(
            op,
            f"{how} {key} by {worker.name} (token {fence.token}){detail}",
            call,
            outcome,
            ALLOWED[op],
        )
        if check is not None:
            check(reply)
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error)

    def _start(self, writer: Authority, worker: Worker, key: str, fence: Fence, how: str) -> None:
        outcome = self.shadow.start(key, fence_tuple(fence), self.now) if self.shadow else None
        self._worker_call(
            "start", worker, key, fence, how, lambda: writer.start(key, fence, self.now), outcome
        )

    def _heartbeat(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, extend_ms: int, how: str
    ) -> None:
        outcome = (
            self.shadow.heartbeat(key, fence_tuple(fence), extend_ms, self.now)
            if self.shadow
            else None
        )

        def lease_extended(reply: Any) -> None:
            if isinstance(reply, Claim):
                self._expect(
                    reply.expires_at == self.now + extend_ms,
                    f"heartbeat lease ends {reply.expires_at}",
                )

        self._worker_call(
            "heartbeat",
            worker,
            key,
            fence,
            how,
            lambda: writer.heartbeat(key, fence, self.now, extend_ms),
            outcome,
            detail=f" for {extend_ms} ms",
            check=lease_extended,
        )

    def _execution_context(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, how: str
    ) -> None:
        outcome = (
            self.shadow.execution_context(key, fence_tuple(fence), self.now)
            if self.shadow
            else None
        )
        self._worker_call(
            "execution_context",
            worker,
            key,
            fence,
            how,
            lambda: writer.execution_context(key, fence, self.now),
            outcome,
        )

    def _checkpoint(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, step: int, how: str
    ) -> None:
        outcome = self.shadow.checkpoint(key, fence_tuple(fence), self.now) if self.shadow else None
        self._worker_call(
            "checkpoint",
            worker,
            key,
            fence,
            how,
            lambda: writer.checkpoint(key, fence, {"step": step}, self.now),
            outcome,
        )

    @precondition(lambda self: self._holding())
    @rule(writer=WRITERS, pick=st.integers(0, 15), output=st.integers(0, 2))
    def complete(self, writer: Authority, pick: int, output: int) -> None:
        """The holder records its result."""
        worker, key, fence = self._pick_held(pick)
        self._complete(writer, worker, key, fence, output, "complete")

    def _complete(
        self,
        writer: Authority,
        worker: Worker,
        key: str,
        fence: Fence,
        output: int,
        how: str,
        result_id: str | None = None,
        value: Any = None,
        allowed: frozenset[str] | None = None,
    ) -> None:
        rid = result_id or self._result_id(key, fence)
        data = value if value is not None else {"output": output}
        outcome = (
            self.shadow.complete(key, fence_tuple(fence), rid, data, self.now)
            if self.shadow
            else None
        )
        reply, error = self._call(
            "complete",
            f"{how} {key} by {worker.name} (token {fence.token}) as {rid}",
            lambda: writer.complete(key, fence, rid, data, self.now),
            outcome,
            allowed if allowed is not None else ALLOWED["complete"],
        )
        if isinstance(reply, Result):
            self._expect(
                reply.result_id == rid and reply.workload_id == key, f"result {reply.result_id}"
            )
            entry = (key, fence, rid, data)
            if entry not in self._results:
                self._results.append(entry)
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error, finished=True)

    @precondition(lambda self: bool(self._results or self._failures))
    @rule(
        writer=WRITERS,
        pick=st.integers(0, 15),
        report=st.sampled_from(REPLAYS),
        workload=WORKLOADS,
    )
    def report_again(self, writer: Authority, pick: int, report: str, workload: str) -> None:
        """A worker sends a recorded report again. `completion`: the same completion answers
        the recorded result, nothing written; `other output`: the same result id with another
        output is WORKLOAD_RESULT_CONFLICT; `taken id`: another workload's recorded result id
        is WORKLOAD_RESULT_DUPLICATE; `failure`: the same failure report answers again,
        nothing written. (A report of a kind not recorded yet falls back to the other kind.)"""
        if (report == "failure" and self._failures) or not self._results:
            key, fence, kind, message, effect = self._failures[pick % len(self._failures)]
            worker = self._worker_named(fence.worker_id)
            how = "replay the failure of"
            self._fail_call(writer, worker, key, fence, kind, effect, message, how)
            return
        key, fence, rid, data = self._results[pick % len(self._results)]
        worker = self._worker_named(fence.worker_id)
        owned = [entry for entry in self._results if entry[0] != workload]
        if report == "taken id" and owned:
            _, fence, rid, data = owned[pick % len(owned)]
            allowed = frozenset({errors.RESULT_DUPLICATE})
            self._complete(writer, worker, workload, fence, 0, "complete", rid, data, allowed)
        elif report == "other output":
            value = {"output": data["output"] + 10}
            allowed = frozenset({errors.RESULT_CONFLICT})
            how = "complete with another output"
            self._complete(writer, worker, key, fence, 0, how, rid, value, allowed)
        else:
            how = "replay the completion of"
            self._complete(writer, worker, key, fence, 0, how, rid, data, frozenset())

    @precondition(lambda self: self._holding())
    @rule(
        writer=WRITERS,
        pick=st.integers(0, 15),
        kind=st.sampled_from(FAILURE_KINDS),
        effect=st.sampled_from((None, "none", "unknown")),
        message=st.sampled_from(("connection reset", "worker crashed")),
    )
    def fail(
        self, writer: Authority, pick: int, kind: str, effect: str | None, message: str
    ) -> None:
        """The holder reports a failure of some kind, with its effect none, unknown or omitted."""
        worker, key, fence = self._pick_held(pick)
        self._fail_call(writer, worker, key, fence, kind, effect, message, "fail")

    def _fail_call(
        self,
        writer: Authority,
        worker: Worker,
        key: str,
        fence: Fence,
        kind: str,
        effect: str | None,
        message: str,
        how: str,
    ) -> None:
        outcome = (
            self.shadow.fail(key, fence_tuple(fence), kind, message, effect, self.now)
            if self.shadow
            else None
        )
        reply, error = self._call(
            "fail",
            f"{how} {key} by {worker.name} (token {fence.token}): {kind}, effect {effect}",
            lambda: writer.fail(key, fence, kind, message, self.now, effect=effect),
            outcome,
            ALLOWED["fail"],
        )
        if error is None:
            if outcome is not None:
                self._expect(
                    reply == outcome.state,
                    f"fail answered {reply}, the shadow model decides {outcome.state}",
                    "shadow_model",
                )
            entry = (key, fence, kind, message, effect)
            if entry not in self._failures:
                self._failures.append(entry)
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error, finished=True)

    def _confirm_cancel(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, how: str
    ) -> None:
        outcome = (
            self.shadow.confirm_cancel(key, fence_tuple(fence), self.now) if self.shadow else None
        )
        _, error = self._call(
            "confirm_cancel",
            f"{how} {key} by {worker.name} (token {fence.token})",
            lambda: writer.confirm_cancel(key, fence, self.now),
            outcome,
            ALLOWED["confirm_cancel"],
        )
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error, finished=True)

    @precondition(lambda self: bool(self._admitted))
    @rule(
        writer=WRITERS,
        worker=WORKERS,
        steps=st.integers(1, 4),
        ending=st.sampled_from(("complete", "fail", "checkpoint", "crash")),
    )
    def work(self, writer: Authority, worker: Worker, steps: int, ending: str) -> None:
        """A worker works like a normal worker: holding no claim, it first asks for the next
        workload (claim_next, 1 s lease; when none is eligible yet, it waits until the next
        one is, and asks again); then it makes the next `steps` calls of the attempt
        on a claim it holds, each for the state it finds the work in (start it, checkpoint
        it, and with the last step complete it or report a transient failure, as `ending`
        says; confirm a requested cancellation), and stops once it no longer holds the claim.
        With `ending="crash"` it crashes after its last call, leaving its lease to lapse."""
        if not worker.held:
            self._claim_next(writer, worker, 1000)
        eligible = [i.eligible_at for i in self._index.values() if i.eligible_at is not None]
        later = [at for at in eligible if at > self.now]
        if not worker.held and later and all(at > self.now for at in eligible):
            self.now = min(later)
            note(f"[{self.now}] {worker.name} waits until the next workload is eligible")
            self._claim_next(writer, worker, 1000)
        if not worker.held:
            return
        key, fence = min(worker.held.items())
        for step in range(steps):
            if worker.held.get(key) != fence:
                return
            try:
                state = writer.get(key).state
            except errors.WorkloadError as exc:
                # A purge took the work from under a claim its worker never learnt it lost.
                if exc.code != errors.NOT_FOUND or key not in getattr(self, "_purged", {}):
                    raise
                note(f"    {key} was purged: {worker.name} lets its claim go")
                worker.drop(key)
                return
            last = step == steps - 1
            if state == "CLAIMED":
                self._start(writer, worker, key, fence, "work: start")
            elif state == "CANCELLATION_REQUESTED":
                self._confirm_cancel(writer, worker, key, fence, "work: confirm_cancel")
            elif last and ending == "fail":
                self._fail_call(
                    writer, worker, key, fence, "transient_connection", None, "flaky", "work: fail"
                )
            elif state in ("RUNNING", "CHECKPOINTED") and not (last and ending == "complete"):
                self._checkpoint(writer, worker, key, fence, step, "work: checkpoint")
            else:
                self._complete(writer, worker, key, fence, 1, "work: complete")
        if ending == "crash":
            note(f"    {worker.name} crashes, forgetting {sorted(worker.held)}")
            for held in sorted(worker.held):
                worker.drop(held)
