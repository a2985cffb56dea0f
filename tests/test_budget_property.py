"""A property over random histories: the attempt budget holds and every event is a legal edge.

Hypothesis drives one workload through random sequences of claims, starts,
heartbeats, failures of every kind and effect, completions, lease losses (the
recovery sweep after time advances), operator timeouts, operator re-arms and
deadline sweeps, under random retry policies and timeouts. Worker calls present
any fence ever handed out, stale ones included. After every step:

* `attempt_count <= attempt_budget` (max_attempts plus operator re-arms), and
  one attempt record per counted attempt;
* the history's sequence numbers run 1, 2, 3, ... without a gap, each event
  continues from the state the previous one reached, and each is an edge of the
  spec that the recorded actor class may take;
* the workload rests in no transient state, holds a claim exactly while a
  worker may, and the store has one audit record per committed version.

Every refusal must be one the operation can legitimately give; anything else
fails the property. The store is a `MemoryStore`, directly, to keep it fast.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)

from support import CAPS, request
from support import authority as make_authority
from workwarden.statemachine import Fence, RetryPolicy, Timeouts, Workload, WorkloadError
from workwarden.statemachine.predicates import attempt_budget
from workwarden.storage import MemoryStore

KINDS = ("timeout", "transient_connection", "worker_failure", "validation")
HELD = frozenset({"CLAIMED", "RUNNING", "CHECKPOINTED", "CANCELLATION_REQUESTED"})
FENCED = frozenset(
    {
        "WORKLOAD_CLAIM_INVALID",
        "WORKLOAD_STALE_FENCE",
        "WORKLOAD_LEASE_EXPIRED",
        "WORKLOAD_TIMED_OUT",
        "WORKLOAD_TRANSITION_DENIED",
    }
)
CLAIM_REFUSALS = frozenset(
    {
        "WORKLOAD_NOT_READY",
        "WORKLOAD_NOT_YET_ELIGIBLE",
        "WORKLOAD_ATTEMPTS_EXHAUSTED",
        "WORKLOAD_TIMED_OUT",
    }
)

policies = st.builds(
    lambda max_attempts, initial, extra, backoff, retry_on: RetryPolicy(
        max_attempts=max_attempts,
        initial_delay_ms=initial,
        max_delay_ms=initial + extra,
        backoff=backoff,
        retry_on=tuple(retry_on),
    ),
    st.integers(1, 4),
    st.integers(0, 2_000),
    st.integers(0, 4_000),
    st.sampled_from(["fixed", "exponential"]),
    # Often every kind, so that budgets, not policies, end the work.
    st.one_of(st.just(frozenset(KINDS)), st.sets(st.sampled_from(KINDS))),
)
# Each deadline is usually absent: a present one soon ends the work.
maybe_ms = st.one_of(st.none(), st.none(), st.none(), st.integers(1, 20_000))
steps = st.integers(0, 600)
silences = st.one_of(st.integers(0, 2_000), st.integers(0, 30_000))
leases = st.one_of(st.integers(1, 1_000), st.integers(1_000, 30_000))
timeouts = st.builds(
    Timeouts,
    queue_ms=maybe_ms,
    claim_ms=maybe_ms,
    execution_ms=maybe_ms,
    heartbeat_ms=maybe_ms,
    overall_ms=st.one_of(st.none(), st.none(), st.none(), st.integers(1, 120_000)),
)


class AttemptBudgetMachine(RuleBasedStateMachine):
    """One workload, one authority over a MemoryStore, and every fence ever handed out."""

    fences = Bundle("fences")

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.authority = make_authority(self.store)
        self.spec = self.authority.spec
        self.now = 10_000
        self.workload_id = ""
        self.results = 0

    @initialize(policy=policies, limits=timeouts)
    def admit(self, policy: RetryPolicy, limits: Timeouts) -> None:
        admitted = self.authority.admit(request(retry_policy=policy, timeouts=limits), now=self.now)
        self.workload_id = admitted.workload.workload_id

    def _call(self, allowed: frozenset[str], call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except WorkloadError as exc:
            if exc.code not in allowed:
                raise
            return None

    def _advance(self, by: int) -> int:
        self.now += by
        return self.now

    # -- the worker ------------------------------------------------------------

    @rule(target=fences, advance=steps, lease=leases)
    def claim(self, advance: int, lease: int) -> Any:
        now = self._advance(advance)
        claim = self._call(
            CLAIM_REFUSALS, self.authority.claim, self.workload_id, "w", CAPS, now, lease
        )
        return multiple() if claim is None else claim.fence

    def _pick(self, fence: Fence, current: bool) -> Fence:
        """The current claim's fence when `current` and there is one, else `fence`."""
        if current:
            claim = self.authority.get(self.workload_id).current_claim
            if claim is not None:
                return claim.fence
        return fence

    @rule(fence=fences, current=st.booleans(), advance=steps)
    def start(self, fence: Fence, current: bool, advance: int) -> None:
        fence = self._pick(fence, current)
        self._call(FENCED, self.authority.start, self.workload_id, fence, self._advance(advance))

    @rule(fence=fences, current=st.booleans(), advance=steps, extend=leases)
    def heartbeat(self, fence: Fence, current: bool, advance: int, extend: int) -> None:
        fence = self._pick(fence, current)
        now = self._advance(advance)
        self._call(FENCED, self.authority.heartbeat, self.workload_id, fence, now, extend)

    @rule(fence=fences, current=st.booleans(), advance=steps)
    def checkpoint(self, fence: Fence, current: bool, advance: int) -> None:
        fence = self._pick(fence, current)
        now = self._advance(advance)
        self._call(FENCED, self.authority.checkpoint, self.workload_id, fence, {"at": now}, now)

    @rule(
        fence=fences,
        current=st.booleans(),
        advance=steps,
        kind=st.sampled_from(KINDS),
        effect=st.sampled_from([None, "none", "unknown"]),
        error=st.sampled_from(["boom", "no route"]),
    )
    def fail(
        self, fence: Fence, current: bool, advance: int, kind: str, effect: str | None, error: str
    ) -> None:
        fence = self._pick(fence, current)
        now = self._advance(advance)
        self._call(
            FENCED, self.authority.fail, self.workload_id, fence, kind, error, now, effect=effect
        )

    @rule(fence=fences, current=st.booleans(), advance=steps)
    def complete(self, fence: Fence, current: bool, advance: int) -> None:
        fence = self._pick(fence, current)
        self.results += 1
        self._call(
            FENCED | {"WORKLOAD_RESULT_CONFLICT"},
            self.authority.complete,
            self.workload_id,
            fence,
            f"result-{self.results}",
            {"n": self.results},
            self._advance(advance),
        )

    # -- time, sweeps and operators ----------------------------------------------

    @rule(silence=silences, sweep=st.sampled_from(["recovery", "deadlines", "both"]))
    def time_passes(self, silence: int, sweep: str) -> None:
        """Time advances; the recovery sweep finds lost leases, the deadline sweep fallen ones."""
        workload = self.authority.get(self.workload_id)
        if sweep != "deadlines" and workload.current_claim is not None:
            # A worker that died leaves its lease to expire: reach the expiry at least.
            self.now = max(self.now, workload.current_claim.expires_at)
        now = self._advance(silence)
        if sweep != "deadlines":
            recovered = self.authority.recover_expired(now)
            assert recovered in ([], [self.workload_id])
            if recovered:
                after = self.authority.get(self.workload_id)
                assert after.current_claim is None
                assert after.attempts[-1].status == "WORKER_LOST"
                assert "decision" in after.execution_history[-1].evidence
        if sweep != "recovery":
            swept = self.authority.enforce_deadlines(now)
            assert swept in ([], [self.workload_id])
            if swept:
                after = self.authority.get(self.workload_id)
                assert "decision" in after.execution_history[-1].evidence
                assert after.state in ("READY", "DEAD_LETTER")

    @rule(
        advance=steps,
        # Re-arms more often than timeouts: a timeout of READY work only delays it.
        action=st.sampled_from(["timeout", "retry", "retry", "retry"]),
        reason=st.sampled_from([None, "checked", "x" * 300]),
    )
    def operator(self, advance: int, action: str, reason: str | None) -> None:
        now = self._advance(advance)
        if action == "timeout":
            self._call(
                frozenset({"WORKLOAD_TRANSITION_DENIED"}),
                self.authority.timeout,
                self.workload_id,
                "operator",
                now,
            )
        else:
            self._call(
                frozenset({"WORKLOAD_TRANSITION_DENIED", "WORKLOAD_RETRY_EXHAUSTED"}),
                self.authority.retry,
                self.workload_id,
                "operator",
                now,
                reason,
            )

    # -- what must hold after every step -----------------------------------------

    def _workload(self) -> Workload:
        return self.authority.get(self.workload_id)

    @invariant()
    def the_attempt_budget_holds(self) -> None:
        w = self._workload()
        assert w.attempt_count <= attempt_budget(w)
        assert len(w.attempts) == w.attempt_count
        assert w.fencing_token == w.attempt_count, "one fencing token per claim"

    @invariant()
    def the_history_is_contiguous_and_every_event_is_a_legal_edge(self) -> None:
        w = self._workload()
        history = w.execution_history
        assert [e.sequence for e in history] == list(range(1, len(history) + 1))
        assert history[0].from_state == "CREATED"
        reached = "CREATED"
        for event in history:
            assert event.from_state == reached
            edge = self.spec.edge(event.from_state, event.to)
            assert edge is not None, f"{event.from_state} -> {event.to} is not in the spec"
            assert event.actor_class in edge.actors
            assert event.type == edge.event
            if event.actor_class == "system" and event.from_state in ("FAILED", "TIMED_OUT"):
                assert "decision" in event.evidence
            reached = event.to
        assert reached == w.state

    @invariant()
    def the_workload_rests_in_a_stable_state_and_holds_a_claim_only_while_held(self) -> None:
        w = self._workload()
        assert self.spec.states[w.state].kind != "transient"
        assert (w.current_claim is not None) == (w.state in HELD)
        live = [a for a in w.attempts if a.status in ("CLAIMED", "RUNNING", "CHECKPOINTED")]
        assert len(live) == (1 if w.state in HELD else 0)
        if live:
            assert live[0] is w.attempts[-1]
        assert (w.result is not None) == (w.state == "SUCCEEDED")
        doc = self.store.read(self.workload_id)
        assert doc is not None
        assert len(self.store.audit_log()) == doc.version


TestAttemptBudget = AttemptBudgetMachine.TestCase
TestAttemptBudget.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
