"""The stateful suite's crashes: workers that forget their claims and come back with old fences."""

from __future__ import annotations

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import Fence
from workwarden.testing.machine import WORKERS, WRITERS
from workwarden.testing.support import HOLDER_CALLS, Worker
from workwarden.testing.worker_rules import WorkerRules

__all__ = ["CrashRules"]


class CrashRules(WorkerRules):
    """Workers that crash, stale workers that complete, and fences brought back from the dead."""

    # -- workers that crash and come back ---------------------------------------------------------

    @precondition(lambda self: self._holding())
    @rule(worker=WORKERS)
    def crash(self, worker: Worker) -> None:
        """A worker crashes and restarts: it forgets every claim it held."""
        note(f"[{self.now}] {worker.name} crashes, forgetting {sorted(worker.held)}")
        for key in sorted(worker.held):
            worker.drop(key)

    def _superseded(self) -> list[tuple[str, Fence]]:
        """Every fence a later claim of the same workload has replaced, by workload."""
        return [
            (key, fence) for key, fences in sorted(self._grants.items()) for fence in fences[:-1]
        ]

    def _stale_while_running(self) -> list[tuple[str, Fence]]:
        """Replaced fences of workloads whose newer attempt is running (last snapshot)."""
        return [
            (key, fence)
            for key, fence in self._superseded()
            if key in self._parsed and self._parsed[key][1].state in ("RUNNING", "CHECKPOINTED")
        ]

    @precondition(lambda self: bool(self._stale_while_running()))
    @rule(writer=WRITERS, pick=st.integers(0, 15), output=st.integers(0, 2))
    def complete_as_a_stale_worker(self, writer: Authority, pick: int, output: int) -> None:
        """While a newer claim's attempt runs, the worker whose claim it replaced completes
        under its old fence: WORKLOAD_STALE_FENCE, and nothing written."""
        stale = self._stale_while_running()
        key, fence = stale[pick % len(stale)]
        worker = self._worker_named(fence.worker_id)
        self._complete(writer, worker, key, fence, output, "stale complete")

    @precondition(lambda self: any(w.old for w in self._workers))
    @rule(writer=WRITERS, pick=st.integers(0, 15), call=st.sampled_from((*HOLDER_CALLS, "fail")))
    def resurrect(self, writer: Authority, pick: int, call: str) -> None:
        """A worker comes back with a fence it gave up or forgot, and makes a call with it."""
        old = self._old_claims()
        worker, key, fence = old[pick % len(old)]
        how = f"resurrected {call}"
        if call == "fail":
            self._fail_call(writer, worker, key, fence, "worker_failure", None, "late", how)
        else:
            self._holder(writer, worker, key, fence, call, 500, how)
