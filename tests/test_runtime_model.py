"""The worker's own logic on a simulated clock, against the stateful suite's store and invariants.

A Hypothesis state machine drives a real `Worker` and a real `Sweeper`
step by step, deterministically and without threads: the clock is a
`ManualClock`, handlers wait in a `ManualExecutor` until a rule ends them
(returning, `Retry`, `Fail`, another exception, after a checkpoint or
not), and the store is the stateful suite's `RecordingStore` behind a
switch that takes it down or loses the reply of a write that committed.
Operators cancel and time out, the clock steps and leaps, and the worker is
stopped.

After every step, the committed store must satisfy every always-property
of `workwarden.statemachine.properties` (`check_store`), and the runtime's
own promises must hold: a result is recorded only under the id derived from
its attempt's fence; the worker never holds more than its concurrency; an
attempt the worker knows lost is never reported; stepped within a
heartbeat interval with the store up, no held attempt's lease runs out and
a requested cancellation is seen; a stopped worker claims nothing more.
"""

from __future__ import annotations

from typing import Any

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from support import SwitchedStore as SwitchedBase
from workwarden import App, Fail, Job, Retry, Sweeper, Worker
from workwarden.runtime import ManualClock, result_id_for
from workwarden.runtime.testing import ManualExecutor
from workwarden.statemachine import Authority, Fence, Workload, WorkloadError, default_spec
from workwarden.statemachine.properties.invariants import check_store
from workwarden.storage import (
    MemoryStore,
)
from workwarden.testing.support import (
    AGENTS,
    APPLICATION,
    START,
    TENANT,
    VERIFIER,
    RecordingStore,
    workload_plans,
)

SPEC = default_spec()
LEASE = 3_000
HEARTBEAT = LEASE // 3
OUTCOMES = (
    "return",
    "retry",
    "fail_none",
    "fail_unknown",
    "raise",
    "checkpoint_return",
    "checkpoint_raise",
)


class SwitchedStore(SwitchedBase):
    """The recording store behind the switch (`tests/support.py`)."""

    def __init__(self, inner: RecordingStore) -> None:
        super().__init__(inner)


class WorkerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.recording = RecordingStore(MemoryStore())
        self.store = SwitchedStore(self.recording)
        self.operator = Authority(self.recording, grants=VERIFIER)
        self.clock = ManualClock(START)
        self.executor = ManualExecutor()
        self.outcome = "return"
        app = App()

        @app.handler("send", needs=("email", "gpu"))
        def send(job: Job) -> Any:
            outcome = self.outcome
            if outcome.startswith("checkpoint"):
                job.checkpoint({"attempt": job.attempt})
            if outcome in ("raise", "checkpoint_raise"):
                raise RuntimeError("the handler broke")
            if outcome == "retry":
                raise Retry(kind="transient_connection", after_ms=100)
            if outcome == "fail_none":
                raise Fail(kind="invalid_input", effect="none")
            if outcome == "fail_unknown":
                raise Fail(kind="timeout", effect="unknown")
            return {"attempt": job.attempt}

        self.worker = Worker(
            Authority(self.store, grants=VERIFIER),
            app,
            tenant=TENANT,
            application=APPLICATION,
            worker_id="worker-1",
            concurrency=2,
            lease_ms=LEASE,
            clock=self.clock,
            executor=self.executor,
            sleep=lambda seconds: self.clock.advance(max(1, int(seconds * 1000))),
            backoff_base_ms=50,
            backoff_cap_ms=800,
        )
        self.sweeper = Sweeper(Authority(self.store, grants=VERIFIER), clock=self.clock)
        self.admitted = 0
        self.last_step: int | None = None
        self.cancelled_at: dict[str, int] = {}
        self.claims_at_stop: int | None = None
        self.lost_fences: set[tuple[str, int]] = set()

    # -- the world ----------------------------------------------------------------

    @initialize(plans=st.lists(workload_plans(), min_size=1, max_size=3))
    def some_work(self, plans: list[Any]) -> None:
        for plan in plans:
            self.admit(plan, AGENTS[0])

    @rule(plan=workload_plans(), agent=st.sampled_from(AGENTS))
    def admit(self, plan: Any, agent: str) -> None:
        self.admitted += 1
        now = self.clock.now()
        self.operator.admit(plan.request(agent, f"key-{self.admitted}", now), now)

    @rule(ms=st.sampled_from((1, 50, 50, HEARTBEAT - 1, HEARTBEAT, HEARTBEAT, LEASE + 1)))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def leap_to_the_workers_next_instant(self) -> None:
        due = self.worker._next_due(self.clock.now())
        if due > self.clock.now():
            self.clock.instant = due

    @precondition(lambda self: not self.store.down)
    @rule()
    def take_the_store_down(self) -> None:
        self.store.down = True

    @precondition(lambda self: self.store.down)
    @rule()
    def bring_the_store_back(self) -> None:
        self.store.down = False

    @rule()
    def lose_next_reply(self) -> None:
        self.store.lose_next_reply = True

    @precondition(lambda self: self.admitted > 0)
    @rule(data=st.data(), operation=st.sampled_from(("cancel", "timeout")))
    def operator_acts(self, data: st.DataObject, operation: str) -> None:
        workloads = self.operator.list(TENANT, APPLICATION)
        target = data.draw(st.sampled_from([w.workload_id for w in workloads]))
        now = self.clock.now()
        try:
            if operation == "cancel":
                state = self.operator.cancel(target, "operator-1", now)
                if state in SPEC.roles.cancelling:
                    self.cancelled_at.setdefault(target, now)
            else:
                self.operator.timeout(target, "operator-1", now)
        except WorkloadError as exc:
            note(f"{operation} {target}: {exc}")

    # -- the runtime ----------------------------------------------------------------

    @rule()
    def step_worker(self) -> None:
        before = self.clock.now()
        was_down, losing = self.store.down, self.store.lose_next_reply
        claimed = self.worker.counts.get("claimed", 0)
        self.worker.step()
        # A reply lost under this step is a store failure, as a store that is down is.
        down = was_down or (losing and not self.store.lose_next_reply)
        for held in self.worker._held:
            if held.job is not None and held.job.lost:
                self.lost_fences.add((held.workload_id, held.fence.token))
        if self.claims_at_stop is not None:
            assert self.worker.counts.get("claimed", 0) == claimed, "a stopped worker claimed"
        stepped_in_time = self.last_step is not None and before - self.last_step <= HEARTBEAT
        if not down and not self.store.down and stepped_in_time:
            self._check_kept_leases(before)
        self.last_step = before if not down else None

    def _check_kept_leases(self, now: int) -> None:
        for held in self.worker._held:
            job = held.job
            if held.phase != "run" or job is None or job.lost:
                continue
            if held.future is not None and held.future.done():
                continue
            workload = self.operator.get(held.workload_id)
            claim = workload.current_claim
            if claim is None or claim.fencing_token != held.fence.token:
                continue
            assert claim.expires_at > now, f"{held.workload_id}: the lease ran out under a step"
            requested = self.cancelled_at.get(held.workload_id)
            asked = workload.state in SPEC.roles.cancelling and requested is not None
            if asked and requested is not None and now >= requested + HEARTBEAT:
                assert job.cancel_requested, "a requested cancellation was not seen"

    @rule()
    def step_worker_once_more(self) -> None:
        self.step_worker()

    @precondition(lambda self: self.executor.pending)
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def finish_a_handler(self, data: st.DataObject, outcome: str) -> None:
        index = data.draw(st.integers(0, len(self.executor.pending) - 1))
        self.outcome = outcome
        self.executor.run(index)
        if data.draw(st.booleans(), label="the worker steps at once"):
            self.step_worker()

    @rule()
    def sweep(self) -> None:
        self.sweeper.step()

    @rule()
    def stop_worker(self) -> None:
        self.worker.stop(grace_s=0)
        if self.claims_at_stop is None:
            self.claims_at_stop = self.worker.counts.get("claimed", 0)

    # -- what must hold ---------------------------------------------------------------

    @invariant()
    def the_store_satisfies_every_always_property(self) -> None:
        docs = list(self.recording.scan())
        violations = check_store(SPEC, docs, self.recording.audit_log(), self.recording.versions)
        assert violations == [], violations

    @invariant()
    def results_carry_the_id_of_their_attempts_fence_and_no_lost_attempt_completed(self) -> None:
        for doc in self.recording.scan():
            workload = Workload.model_validate_json(doc.document)
            if workload.result is None:
                continue
            attempt = next(
                a for a in workload.attempts if a.attempt_id == workload.result.attempt_id
            )
            fence = Fence(
                claim_id=attempt.claim_id, worker_id=attempt.worker_id, token=attempt.fencing_token
            )
            assert workload.result.result_id == result_id_for(fence)
            assert (workload.workload_id, attempt.fencing_token) not in self.lost_fences

    @invariant()
    def the_worker_holds_at_most_its_concurrency(self) -> None:
        assert len(self.worker._held) <= self.worker.concurrency


WorkerMachine.TestCase.settings = settings(
    settings.get_profile("ci"), max_examples=60, stateful_step_count=40
)
TestWorkerMachine = WorkerMachine.TestCase
