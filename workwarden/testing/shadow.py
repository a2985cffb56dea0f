"""A small shadow model of the authority, written apart from the core, to predict every call.

The stateful suite (`workwarden.testing`) holds the authority against this
model: before each call it asks the model what must happen (this call
succeeds; or it is refused with exactly this code; and what the committed
workload is afterwards), and fails when the authority does something else.

The model is deliberately independent. It calls neither `decide` nor the
policies, predicates, deadline table or machine of the spec: it states the
rules of the shipped spec (seed behaviour 0.15) again, each in a few lines,
over its own frozen records. So a bug in the core is not reproduced here; the
two disagree, and the suite reports the first call where they do. What it
covers: claimability (state, eligibility, capabilities, pauses), fencing (the claim,
its token, its lease), the attempt budget and operator re-arms, the failure,
recovery, deadline, operator-timeout and claim policies, the five deadlines,
backoff, result and failure replays, cancellation, idempotent admission, and
retention (a purged workload is gone; its scope admits afresh, at a version
above its tombstone, its fencing tokens continuing past it).
It does not model dependencies or secret checks (the suite does not use them).

Every prediction is pure: `ShadowModel.claim(...)` returns an `Outcome` and
changes nothing; `ShadowModel.apply(outcome)` commits it. A prepared call is
predicted when it is prepared and applied when it commits, unless its
workload moved on in between (then the commit must be `WORKLOAD_CONFLICT`).
Its records (`ShadowWorkload`, `Outcome`, ...) are in
`workwarden.testing.shadow_records`, and exported here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from workwarden.testing.shadow_records import (
    FailureReport,
    Lease,
    Outcome,
    ResultReport,
    ShadowPlan,
    ShadowWorkload,
)

__all__ = [
    "FailureReport",
    "Lease",
    "Outcome",
    "ResultReport",
    "ShadowModel",
    "ShadowPlan",
    "ShadowWorkload",
]

# The states, by what the model needs of them.
_READY = "READY"
_WORKING = ("CLAIMED", "RUNNING", "CHECKPOINTED")
_HELD = (*_WORKING, "CANCELLATION_REQUESTED")
_STARTED = ("RUNNING", "CHECKPOINTED")

# The error codes the model predicts.
NOT_FOUND = "WORKLOAD_NOT_FOUND"
KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
DENIED = "WORKLOAD_TRANSITION_DENIED"
EXHAUSTED = "WORKLOAD_ATTEMPTS_EXHAUSTED"
NOT_READY = "WORKLOAD_NOT_READY"
NOT_YET = "WORKLOAD_NOT_YET_ELIGIBLE"
CAPABILITY = "WORKLOAD_CAPABILITY_DENIED"
NO_CLAIM = "WORKLOAD_CLAIM_INVALID"
STALE = "WORKLOAD_STALE_FENCE"
EXPIRED = "WORKLOAD_LEASE_EXPIRED"
DUPLICATE = "WORKLOAD_RESULT_DUPLICATE"
RESULT_CONFLICT = "WORKLOAD_RESULT_CONFLICT"
RETRY_EXHAUSTED = "WORKLOAD_RETRY_EXHAUSTED"
TIMED_OUT = "WORKLOAD_TIMED_OUT"

_MULTIPLIER = {"fixed": 1, "exponential": 2}


def _fence_of(lease: Lease) -> tuple[str, str, int]:
    return (lease.worker, lease.claim_id, lease.token)


@dataclass
class ShadowModel:
    """The model's committed world: workloads by id, scopes, recorded result ids."""

    workloads: dict[str, ShadowWorkload] = field(default_factory=dict)
    scopes: dict[Any, str] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)
    #: Is claiming paused for the suite's work? (Its workloads share one scope.)
    paused: bool = False
    #: The tombstone version of each purged scope: a new admission follows it.
    tombstones: dict[Any, int] = field(default_factory=dict)

    # -- what the model knows ------------------------------------------------

    def copy(self) -> ShadowModel:
        """A scratch copy, to predict a batch's calls in turn without committing them."""
        return ShadowModel(
            dict(self.workloads),
            dict(self.scopes),
            dict(self.results),
            self.paused,
            dict(self.tombstones),
        )

    def version(self, key: str) -> int | None:
        """The committed version of `key`, or None when absent."""
        w = self.workloads.get(key)
        return w.version if w is not None else None

    @staticmethod
    def deadlines(w: ShadowWorkload) -> list[tuple[str, int]]:
        """The deadlines that apply now, in the order they are evaluated: (kind, instant)."""
        out: list[tuple[str, int]] = []
        overall = w.timeout("overall")
        if overall is not None and w.state in (_READY, *_WORKING):
            out.append(("overall", w.created_at + overall))
        queue = w.timeout("queue")
        if queue is not None and w.state == _READY:
            since = w.ready_since if w.eligible_at is None else max(w.ready_since, w.eligible_at)
            out.append(("queue", since + queue))
        claim = w.timeout("claim")
        if claim is not None and w.state == "CLAIMED" and w.lease is not None:
            out.append(("claim", w.lease.claimed_at + claim))
        execution = w.timeout("execution")
        if execution is not None and w.state in _STARTED and w.started_at is not None:
            out.append(("execution", w.started_at + execution))
        heartbeat = w.timeout("heartbeat")
        if heartbeat is not None and w.state in _WORKING and w.lease is not None:
            out.append(("heartbeat", w.lease.last_heartbeat + heartbeat))
        return out

    def fallen(self, w: ShadowWorkload, now: int) -> tuple[str, int] | None:
        """The first deadline that has fallen at `now` (at its instant exactly, never earlier)."""
        for kind, at in self.deadlines(w):
            if now >= at:
                return kind, at
        return None

    def next_deadline(self, w: ShadowWorkload) -> int | None:
        """The earliest instant at which a deadline of `w` falls, or None."""
        instants = [at for _, at in self.deadlines(w)]
        return min(instants) if instants else None

    # -- committing -----------------------------------------------------------

    def apply(self, outcome: Outcome, key: str | None = None) -> None:
        """Commit a predicted outcome (for an admission, under the id the authority gave it)."""
        if outcome.after is None:
            return
        target = key if key is not None else outcome.key
        assert target is not None, "an admission is applied under the id it was given"
        self.workloads[target] = outcome.after
        result = outcome.after.result
        if result is not None:
            self.results[result.result_id] = target

    def register_scope(self, scope: Any, key: str) -> None:
        """Record that `scope` admitted under `key`."""
        self.scopes[scope] = key

    # -- the transitions the model knows --------------------------------------

    def _write(self, w: ShadowWorkload, **changes: Any) -> ShadowWorkload:
        return replace(w, version=w.version + 1, **changes)

    def _to_ready(self, w: ShadowWorkload, now: int, *, delay: int | None) -> ShadowWorkload:
        """Back to READY at `now`; a `delay` sets the eligibility instant and counts a retry."""
        if delay is None:
            return self._write(w, state=_READY, lease=None, ready_since=now)
        return self._write(
            w,
            state=_READY,
            lease=None,
            ready_since=now,
            retries=w.retries + 1,
            eligible_at=now + delay,
        )

    def _dead(self, w: ShadowWorkload) -> ShadowWorkload:
        return self._write(w, state="DEAD_LETTER", lease=None)

    def _backoff(self, w: ShadowWorkload) -> int:
        retry = w.retries + 1
        delay: int = w.plan.initial_delay_ms * _MULTIPLIER[w.plan.backoff] ** (retry - 1)
        return min(delay, w.plan.max_delay_ms)

    def _time_out(self, w: ShadowWorkload, kind: str, now: int) -> ShadowWorkload:
        """A deadline fell: work-bounding ones dead-letter, others retry within the budget."""
        if kind in ("overall", "queue"):
            return self._dead(w)
        if "timeout" not in w.plan.retry_on or w.attempts >= w.budget:
            return self._dead(w)
        return self._to_ready(w, now, delay=w.plan.initial_delay_ms)

    def _deadline_first(self, key: str, w: ShadowWorkload, now: int) -> Outcome | None:
        """At a claim or a worker call: a fallen deadline times the workload out first."""
        fallen = self.fallen(w, now)
        if fallen is None:
            return None
        after = self._time_out(w, fallen[0], now)
        return Outcome(key, TIMED_OUT, after, after.state)

    @staticmethod
    def _fence(w: ShadowWorkload, fence: tuple[str, str, int], now: int) -> str | None:
        if w.lease is None:
            return NO_CLAIM
        if _fence_of(w.lease) != fence:
            return STALE
        if w.lease.expires_at <= now:
            return EXPIRED
        return None

    # -- admission ------------------------------------------------------------

    def admit(self, scope: Any, plan: ShadowPlan, now: int) -> Outcome:
        """Admit `plan` under `scope`: new, a replay of the same request, or a reused key."""
        key = self.scopes.get(scope)
        if key is not None:
            existing = self.workloads[key]
            if existing.plan.request != plan.request:
                return Outcome(key, KEY_REUSED)
            return Outcome(key, None, None, existing.state)
        tombstone = self.tombstones.get(scope, 0)
        after = ShadowWorkload(
            plan=plan,
            created_at=now,
            eligible_at=plan.not_before,
            ready_since=now,
            version=tombstone + 1,
            # A purged scope's tokens continue past its tombstone.
            token=tombstone,
        )
        return Outcome(None, None, after, _READY, created=True)

    # -- pauses and retention ---------------------------------------------------

    def purge(self, key: str) -> None:
        """Commit the purge of `key`: gone, its scope and result id free, its version a tombstone.

        A purge deletes at the document's version and writes its tombstone one above
        it; the key's next document follows the tombstone, so no version repeats.
        """
        w = self.workloads.pop(key)
        for scope in [s for s, k in self.scopes.items() if k == key]:
            del self.scopes[scope]
            self.tombstones[scope] = w.version + 1
        for result in [r for r, k in self.results.items() if k == key]:
            del self.results[result]

    # -- claims ---------------------------------------------------------------

    def claim(
        self, key: str, worker: str, capabilities: Iterable[str], lease_ms: int, now: int
    ) -> Outcome:
        """Claim by id: deadline, budget, READY, eligibility and capabilities, in that order."""
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        if self.paused:
            # The pause is read before anything is decided: nothing is written.
            return Outcome(key, NOT_READY)
        timed_out = self._deadline_first(key, w, now)
        if timed_out is not None:
            return timed_out
        held = w.lease
        if (
            held is not None
            and held.worker == worker
            and held.expires_at > now
            and w.started_at is None
        ):
            # The worker already holds it: a claim repeated after a lost reply.
            return Outcome(key, None, None, w.state)
        if w.state == _READY and w.attempts >= w.budget:
            after = self._dead(w)
            return Outcome(key, EXHAUSTED, after, after.state)
        if w.state != _READY:
            return Outcome(key, NOT_READY)
        if w.eligible_at is not None and w.eligible_at > now:
            return Outcome(key, NOT_YET)
        if not set(w.plan.capabilities) <= set(capabilities):
            return Outcome(key, CAPABILITY)
        token = w.token + 1
        after = self._write(
            w,
            state="CLAIMED",
            token=token,
            attempts=w.attempts + 1,
            started_at=None,
            lease=Lease(worker, "", token, now, now + lease_ms, now),
        )
        return Outcome(key, None, after, after.state, claimed=True)

    def claim_next(
        self, worker: str, capabilities: Iterable[str], lease_ms: int, now: int
    ) -> list[Outcome]:
        """The claim of the best candidate, after the candidates a claim dead-letters before it.

        Candidates are READY, eligible at `now`, within the worker's
        capabilities, not paused, by priority (highest first), then age, then id. (A
        claim_next without a request id always claims new work; the suite's
        repeats of a claim_next carry one.)
        """
        if self.paused:
            # A paused scope's work is never a candidate.
            return []
        held = set(capabilities)
        candidates = sorted(
            (
                (-w.plan.priority, w.created_at, key)
                for key, w in self.workloads.items()
                if w.state == _READY
                and (w.eligible_at is None or w.eligible_at <= now)
                and set(w.plan.capabilities) <= held
            ),
        )
        out: list[Outcome] = []
        for _, _, key in candidates:
            outcome = self.claim(key, worker, capabilities, lease_ms, now)
            out.append(outcome)
            if outcome.code is None:
                break
        return out

    # -- the holder's calls -----------------------------------------------------

    def _fenced(
        self, key: str, fence: tuple[str, str, int], now: int, *, deadline: bool = True
    ) -> tuple[ShadowWorkload | None, Outcome | None]:
        w = self.workloads.get(key)
        if w is None:
            return None, Outcome(key, NOT_FOUND)
        if deadline:
            timed_out = self._deadline_first(key, w, now)
            if timed_out is not None:
                return w, timed_out
        code = self._fence(w, fence, now)
        if code is not None:
            return w, Outcome(key, code)
        return w, None

    def start(self, key: str, fence: tuple[str, str, int], now: int) -> Outcome:
        """Start the claimed attempt."""
        w, refused = self._fenced(key, fence, now)
        if refused is not None or w is None:
            return refused or Outcome(key, NOT_FOUND)
        if w.started_at is not None:
            return Outcome(key, None, None, w.state)  # a start repeated: the attempt, again
        if w.state != "CLAIMED":
            return Outcome(key, DENIED)
        after = self._write(w, state="RUNNING", started_at=now)
        return Outcome(key, None, after, after.state)

    def heartbeat(self, key: str, fence: tuple[str, str, int], extend_ms: int, now: int) -> Outcome:
        """Extend the lease to `now + extend_ms` (in any held state)."""
        w, refused = self._fenced(key, fence, now)
        if refused is not None or w is None:
            return refused or Outcome(key, NOT_FOUND)
        assert w.lease is not None
        lease = replace(w.lease, expires_at=now + extend_ms, last_heartbeat=now)
        after = self._write(w, lease=lease)
        return Outcome(key, None, after, after.state)

    def execution_context(self, key: str, fence: tuple[str, str, int], now: int) -> Outcome:
        """Read through the fence: writes nothing unless a deadline has fallen."""
        w, refused = self._fenced(key, fence, now)
        if refused is not None or w is None:
            return refused or Outcome(key, NOT_FOUND)
        return Outcome(key, None, None, w.state)

    def checkpoint(self, key: str, fence: tuple[str, str, int], now: int) -> Outcome:
        """Record progress of a started attempt."""
        w, refused = self._fenced(key, fence, now)
        if refused is not None or w is None:
            return refused or Outcome(key, NOT_FOUND)
        if w.state not in _STARTED:
            return Outcome(key, DENIED)
        after = self._write(w, state="CHECKPOINTED")
        return Outcome(key, None, after, after.state)

    def complete(
        self, key: str, fence: tuple[str, str, int], result_id: str, output: Any, now: int
    ) -> Outcome:
        """Record the result: a replay of the same report answers again, without writing."""
        owner = self.results.get(result_id)
        if owner is not None and owner != key:
            return Outcome(key, DUPLICATE)
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        if w.result is not None and w.result.result_id == result_id:
            same = (w.result.worker, w.result.claim_id, w.result.token) == fence
            if same and w.result.output == output:
                return Outcome(key, None, None, w.state)
            return Outcome(key, RESULT_CONFLICT)
        _, refused = self._fenced(key, fence, now)
        if refused is not None:
            return refused
        if w.state not in _STARTED:
            return Outcome(key, DENIED)
        report = ResultReport(result_id, fence[0], fence[1], fence[2], output)
        after = self._write(w, state="SUCCEEDED", lease=None, result=report)
        return Outcome(key, None, after, after.state)

    def fail(
        self,
        key: str,
        fence: tuple[str, str, int],
        kind: str,
        error: str,
        effect: str | None,
        now: int,
    ) -> Outcome:
        """Report a failure; the same report repeated answers again, without writing."""
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        for report in w.failures:
            if (
                (report.worker, report.claim_id, report.token) == fence
                and report.error == error
                and report.kind == kind
                and (effect is None or effect == report.effect)
            ):
                return Outcome(key, None, None, w.state)
        _, refused = self._fenced(key, fence, now)
        if refused is not None:
            return refused
        if w.state not in _WORKING:
            return Outcome(key, DENIED)
        recorded = effect if effect is not None or w.state != "CLAIMED" else "none"
        failures = (*w.failures, FailureReport(*fence, kind, error, recorded))
        if recorded == "unknown":
            retryable = "worker_failure" in w.plan.retry_on
        else:
            retryable = kind in w.plan.retry_on
        if not retryable or w.attempts >= w.budget:
            after = replace(self._dead(w), failures=failures)
        else:
            after = replace(self._to_ready(w, now, delay=self._backoff(w)), failures=failures)
        return Outcome(key, None, after, after.state)

    def confirm_cancel(self, key: str, fence: tuple[str, str, int], now: int) -> Outcome:
        """The holder confirms a requested cancellation (no deadline applies)."""
        known = self.workloads.get(key)
        if known is not None and known.confirmed == fence:
            return Outcome(key, None, None, known.state)  # a confirmation repeated
        w, refused = self._fenced(key, fence, now, deadline=False)
        if refused is not None or w is None:
            return refused or Outcome(key, NOT_FOUND)
        if w.state != "CANCELLATION_REQUESTED":
            return Outcome(key, DENIED)
        after = self._write(w, state="CANCELLED", lease=None, confirmed=fence)
        return Outcome(key, None, after, after.state)

    # -- operators ----------------------------------------------------------------

    def cancel(self, key: str, now: int) -> Outcome:
        """Cancel queued or dead work; ask the holder to cancel held work."""
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        if w.state == "CANCELLATION_REQUESTED":
            return Outcome(key, None, None, w.state)
        if w.state in _WORKING:
            after = self._write(w, state="CANCELLATION_REQUESTED")
        elif w.state in (_READY, "DEAD_LETTER"):
            after = self._write(w, state="CANCELLED", lease=None)
        else:
            return Outcome(key, DENIED)
        return Outcome(key, None, after, after.state)

    def timeout(self, key: str, now: int) -> Outcome:
        """An operator times out queued or held work; it retries within the budget."""
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        if w.state not in (_READY, *_WORKING):
            return Outcome(key, DENIED)
        if "timeout" not in w.plan.retry_on or w.attempts >= w.budget:
            after = self._dead(w)
        else:
            after = self._to_ready(w, now, delay=w.plan.initial_delay_ms)
        return Outcome(key, None, after, after.state)

    def retry(self, key: str, now: int) -> Outcome:
        """An operator re-arms dead-lettered work: one more attempt, at most max_attempts times."""
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        if w.state != "DEAD_LETTER":
            return Outcome(key, DENIED)
        if w.rearms >= w.plan.max_attempts:
            return Outcome(key, RETRY_EXHAUSTED)
        after = self._write(
            w, state=_READY, lease=None, rearms=w.rearms + 1, eligible_at=now, ready_since=now
        )
        return Outcome(key, None, after, after.state)

    # -- sweeps ---------------------------------------------------------------------

    def recover(self, key: str, now: int) -> Outcome:
        """Recover one workload if its lease has expired at `now`."""
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        if w.lease is None or w.lease.expires_at > now or w.state not in _HELD:
            return Outcome(key, None, None, w.state)
        if w.state == "CANCELLATION_REQUESTED":
            after = self._write(w, state="CANCELLED", lease=None)
        elif "worker_failure" not in w.plan.retry_on or w.attempts >= w.budget:
            after = self._dead(w)
        else:
            after = self._to_ready(w, now, delay=None)
        return Outcome(key, None, after, after.state, changed=True)

    def enforce(self, key: str, now: int) -> Outcome:
        """Time one workload out if one of its deadlines has fallen at `now`."""
        w = self.workloads.get(key)
        if w is None:
            return Outcome(key, NOT_FOUND)
        fallen = self.fallen(w, now)
        if fallen is None:
            return Outcome(key, None, None, w.state)
        after = self._time_out(w, fallen[0], now)
        return Outcome(key, None, after, after.state, changed=True)

    def recover_all(self, now: int) -> list[Outcome]:
        """The recovery sweep: one outcome per workload it changes."""
        out = [self.recover(key, now) for key in sorted(self.workloads)]
        return [o for o in out if o.changed]

    def enforce_all(self, now: int) -> list[Outcome]:
        """The deadline sweep: one outcome per workload it changes."""
        out = [self.enforce(key, now) for key in sorted(self.workloads)]
        return [o for o in out if o.changed]
