"""The bounded universe the model checker explores: its states, its actions, one step.

A universe is two (by default) workloads, the second depending on the first,
admitted at instant 0; a few workers; an operator; a sweeper; and one racing
writer that may hold a prepared decision while others commit. Time moves only
to instants where something can change (a lease expiry, a deadline, an
eligibility instant) and to the millisecond before each, up to a horizon, so
every boundary race is in the universe and the universe stays finite.

A state is plain hashable data: the instant, each workload's committed
document (its JSON text), what each worker holds (its current fence and the
last fence it lost), and the racing writer's pending write. Single-workload
commands are decided by the pure core; the scheduler and the sweeps run
through a real `Authority` over a `MemoryStore` holding the state's documents.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.authority import Authority, serialise
from workwarden.statemachine.commands import (
    AdmitCommand,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    TimeoutCommand,
)
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.grants import Grant, GrantSigner, GrantVerifier, Subject
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.models import (
    Claim,
    CreateWorkload,
    Dependency,
    Fence,
    RetryPolicy,
    Timeouts,
    Workload,
)
from workwarden.statemachine.predicates import operator_retries
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord
from workwarden.storage.memory import MemoryStore

__all__ = [
    "CHECKER_KEY",
    "CHECKER_KEY_ID",
    "Action",
    "CheckState",
    "Model",
    "Pending",
    "Step",
    "Universe",
    "WorkerHold",
]

TENANT = "t"
APPLICATION = "app"
CAPABILITY = "cap"
#: The key the checker's universe signs its admissions with (public: vectors
#: made from the checker's traces name it).
CHECKER_KEY_ID = "checker"
CHECKER_KEY = b"checker-signing-key-0123456789ab"
_SIGNER = GrantSigner(CHECKER_KEY_ID, CHECKER_KEY)
_VERIFIER = GrantVerifier({CHECKER_KEY_ID: CHECKER_KEY})
_REQUESTER = Subject(kind="service", id="requester")


@dataclass(frozen=True)
class Universe:
    """The bounds of an exploration. Every field can be set in the spec's `[check]` table."""

    workers: int = 2
    max_attempts: int = 2
    lease_ms: int = 10
    horizon_ms: int = 60
    rearms: int = 1
    operator_actions: int = 1
    crashes: int = 0
    racer_prepares: int = 1
    checkpoints_per_attempt: int = 2
    initial_delay_ms: int = 3
    max_delay_ms: int = 6
    dependent: bool = True
    racer: bool = False
    stale_workers: bool = True
    first_timeouts: dict[str, int] = field(default_factory=lambda: {"claim_ms": 8})
    second_timeouts: dict[str, int] = field(default_factory=lambda: {"queue_ms": 8, "claim_ms": 4})
    second_retry_on: tuple[str, ...] = ("transient_connection",)
    first_retry_on: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The universe as JSON-ready data (for reports and traces)."""
        return {
            "workers": self.workers,
            "max_attempts": self.max_attempts,
            "lease_ms": self.lease_ms,
            "horizon_ms": self.horizon_ms,
            "rearms": self.rearms,
            "operator_actions": self.operator_actions,
            "crashes": self.crashes,
            "racer_prepares": self.racer_prepares,
            "checkpoints_per_attempt": self.checkpoints_per_attempt,
            "initial_delay_ms": self.initial_delay_ms,
            "max_delay_ms": self.max_delay_ms,
            "dependent": self.dependent,
            "racer": self.racer,
            "stale_workers": self.stale_workers,
            "first_timeouts": dict(self.first_timeouts),
            "second_timeouts": dict(self.second_timeouts),
            "second_retry_on": list(self.second_retry_on),
            "first_retry_on": None if self.first_retry_on is None else list(self.first_retry_on),
        }

    @classmethod
    def from_spec(cls, spec: Spec, **overrides: Any) -> Universe:
        """The universe of the spec's `[check]` table, with `overrides` applied."""
        settings = {k: v for k, v in spec.data.check.model_dump().items() if v is not None}
        settings.update(overrides)
        return cls.from_dict(settings)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Universe:
        """A universe from `to_dict` output (unknown keys are an error)."""
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise errors.WorkloadError(
                errors.INVALID, f"unknown universe settings: {sorted(unknown)}"
            )
        values = dict(data)
        for name in ("second_retry_on", "first_retry_on"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values)


WorkerHold = tuple[tuple[int, str, str, int] | None, tuple[int, str, str, int] | None]
"""What a worker holds: (slot, claim id, worker id, token) of its fence, and of the last it lost."""


@dataclass(frozen=True, slots=True)
class Pending:
    """The racing writer's prepared write: decided on a version, not yet committed."""

    slot: int
    document: str | None
    refusal: str | None
    stale: bool = False


@dataclass(frozen=True, slots=True)
class CheckState:
    """One state of the universe."""

    now: int
    docs: tuple[str | None, ...]
    workers: tuple[WorkerHold, ...]
    pending: Pending | None = None
    crashes: int = 0
    prepares: int = 0


@dataclass(frozen=True, slots=True)
class Action:
    """One step an actor may take, named for traces: `label` and its arguments."""

    label: str
    actor: str
    slot: int = -1
    worker: int = -1
    arg: str = ""
    to: int = -1


@dataclass(frozen=True)
class Step:
    """The outcome of an action: the next state, what it refused, what it wrote."""

    state: CheckState
    refusal: str | None
    wrote: tuple[int, ...]
    decision_docs: tuple[tuple[int, str | None, str | None], ...] = ()
    cut: bool = False
    noop: bool = False


def _request(universe: Universe, index: int, parent: str | None) -> CreateWorkload:
    grant = Grant(
        id="grant",
        issuer=Subject(kind="human", id="ops"),
        subject=_REQUESTER,
        tenant_id=TENANT,
        application_id=APPLICATION,
        issued_at=0,
        expires_at=2**40,
    )
    timeouts = universe.first_timeouts if index == 0 else universe.second_timeouts
    if index == 0:
        first = universe.first_retry_on
        retry_on = RetryPolicy().retry_on if first is None else tuple(sorted(set(first)))
    else:
        retry_on = tuple(sorted(set(universe.second_retry_on)))
    return CreateWorkload(
        tenant_id=TENANT,
        application_id=APPLICATION,
        environment="check",
        definition_id=f"def-{index}",
        definition_revision="r1",
        trigger="check",
        input={"n": index},
        requested_by=_REQUESTER,
        authorization_snapshot=_SIGNER.sign(grant),
        capability_snapshot=(CAPABILITY,),
        priority=1 if index == 0 else 0,
        idempotency_key=f"w{index}",
        retry_policy=RetryPolicy(
            max_attempts=universe.max_attempts,
            initial_delay_ms=universe.initial_delay_ms,
            max_delay_ms=universe.max_delay_ms,
            retry_on=retry_on,
        ),
        timeouts=Timeouts(**timeouts),
        dependencies=(Dependency(workload_id=parent),) if parent is not None else (),
    )


def worker_name(index: int) -> str:
    """The id of worker `index` (upper-case letters keep ids distinct from other text)."""
    return f"worker-{chr(ord('A') + index)}"


_FAIL_VARIANTS = {
    "transient/none": ("transient_connection", "none"),
    "transient/unknown": ("transient_connection", "unknown"),
    "validation/none": ("validation", "none"),
}


#: Refusals after which a worker knows its claim is gone.
_CLAIM_GONE = frozenset(
    {errors.CLAIM_INVALID, errors.STALE_FENCE, errors.LEASE_EXPIRED, errors.TIMED_OUT}
)


class Model:
    """The transition system of one universe under one spec.

    `decide_fn` and `authority_cls` are the parts a deliberately broken
    variant replaces; `commit_checks_version` False makes the racing writer's
    commit ignore that its version went stale (a store that ignores the
    expected version).
    """

    def __init__(
        self,
        spec: Spec,
        universe: Universe | None = None,
        *,
        decide_fn: Callable[[Spec, Workload | None, Command, int], Decision] = decide,
        authority_cls: type[Authority] = Authority,
        commit_checks_version: bool = True,
    ) -> None:
        self.spec = spec
        self.universe = universe or Universe()
        self.decide_fn = decide_fn
        self.authority_cls = authority_cls
        self.commit_checks_version = commit_checks_version
        count = 2 if self.universe.dependent else 1
        requests: list[CreateWorkload] = []
        for index in range(count):
            parent = workload_id_for(requests[0]) if index == 1 else None
            requests.append(_request(self.universe, index, parent))
        self.requests = tuple(requests)
        self.ids = tuple(workload_id_for(r) for r in self.requests)
        self._parse = lru_cache(maxsize=200_000)(self._parse_uncached)
        self._memo: dict[tuple[Any, ...], tuple[str | None, str | None]] = {}
        self._store_memo: dict[
            tuple[Any, ...],
            tuple[tuple[str | None, ...], str | None, tuple[int, str, str, int] | None],
        ] = {}
        names = [worker_name(i) for i in range(self.universe.workers)]
        self.worker_names = tuple(names)
        self._swap = (
            {self.worker_names[0]: self.worker_names[1], self.worker_names[1]: self.worker_names[0]}
            if len(self.worker_names) == 2
            else {}
        )
        u = self.universe
        durations = [u.lease_ms, u.initial_delay_ms, u.max_delay_ms]
        durations += list(u.first_timeouts.values()) + list(u.second_timeouts.values())
        self._clamp = max(durations) + 1
        saturation = 1
        delay = u.initial_delay_ms
        while delay < u.max_delay_ms and saturation < 64:
            delay *= 2
            saturation += 1
        self._retry_saturation = saturation
        self._project = lru_cache(maxsize=400_000)(self._project_uncached)

    # -- documents -------------------------------------------------------

    def _parse_uncached(self, document: str) -> Workload:
        return Workload.model_validate_json(document)

    def workload(self, document: str | None) -> Workload | None:
        """The workload a state's document holds (parsed once, cached)."""
        return None if document is None else self._parse(document)

    def initial(self) -> CheckState:
        """Both workloads admitted at instant 0; workers hold nothing."""
        docs: list[str | None] = []
        for request in self.requests:
            decision = self.decide_fn(self.spec, None, AdmitCommand(request=request), 0)
            assert decision.workload is not None
            docs.append(serialise(decision.workload))
        workers: tuple[WorkerHold, ...] = tuple((None, None) for _ in self.worker_names)
        return CheckState(now=0, docs=tuple(docs), workers=workers)

    # -- symmetry ----------------------------------------------------------

    # -- the abstraction --------------------------------------------------

    def _project_uncached(self, document: str, now: int) -> tuple[Any, ...]:
        """What of a document decides its future, with instants relative to `now`.

        Kept: the state, the counters the budget and the backoff read (the
        retry count only up to where the backoff reaches its cap), the current
        claim and attempt, and the anchor of every deadline the workload has.
        Instants are relative to `now` and clamped beyond the largest duration
        of the universe (an instant that long ago compares the same way with
        every `now + duration`). Left out: event times and past attempts, which
        no decision reads unless a worker still holds their fence (those are
        added by `canonical`).
        """
        w = self.workload(document)
        assert w is not None
        bound = self._clamp

        def rel(instant: int | None) -> int | None:
            if instant is None:
                return None
            return max(instant - now, -bound)

        if w.state in self.spec.terminal_states:
            # At rest: only an exit edge (an operator's re-arm or close) leaves it,
            # and those read no instant, only the budget's counters.
            operator = sum(1 for e in w.execution_history if e.evidence.get("retry") == "operator")
            return (w.state, w.attempt_count, operator)
        t = w.timeouts
        ready_since = w.created_at
        operator = 0
        for event in w.execution_history:
            if event.to == "READY":
                ready_since = event.at
            if event.evidence.get("retry") == "operator":
                operator += 1
        claim = w.current_claim
        attempt = w.attempts[-1] if w.attempts else None
        return (
            w.state,
            w.attempt_count,
            min(w.retry_count, self._retry_saturation),
            operator,
            _checkpoints_this_attempt(w),
            rel(w.next_attempt_at),
            rel(w.created_at) if t.overall_ms is not None else None,
            rel(ready_since) if t.queue_ms is not None and w.state == "READY" else None,
            None
            if claim is None
            else (
                claim.worker_id,
                rel(claim.expires_at),
                rel(claim.claimed_at) if t.claim_ms is not None else None,
                rel(claim.last_heartbeat) if t.heartbeat_ms is not None else None,
            ),
            None
            if attempt is None
            else (
                attempt.status,
                rel(attempt.started_at) if t.execution_ms is not None else None,
            ),
        )

    def _fence_facts(self, document: str | None, token: int) -> tuple[Any, ...]:
        """What a held fence's attempt tells a later call: its outcome and report."""
        w = self.workload(document)
        if w is None:
            return ()
        for attempt in w.attempts:
            if attempt.fencing_token != token:
                continue
            kind = effect = None
            for event in w.execution_history:
                if event.to == "FAILED" and event.evidence.get("attempt_id") == attempt.attempt_id:
                    kind, effect = event.evidence.get("failure_kind"), event.evidence.get("effect")
            produced = w.result is not None and w.result.provenance.get("fencing_token") == str(
                token
            )
            return (w.fencing_token - token, attempt.status, attempt.error, kind, effect, produced)
        return ()

    def canonical(self, state: CheckState) -> tuple[CheckState, bytes]:
        """The state, and the hash of its abstraction with worker symmetry reduced.

        States with equal hashes have the same future; the first one found
        (breadth first: the one with the shortest trace) stands for all.
        """
        docs = tuple(None if d is None else self._project(d, state.now) for d in state.docs)
        pending = state.pending
        pend = (
            None
            if pending is None
            else (
                pending.slot,
                pending.refusal,
                pending.stale,
                None if pending.document is None else self._project(pending.document, state.now),
            )
        )
        holds = tuple(
            tuple(
                None if h is None else (h[0], self._fence_facts(state.docs[h[0]], h[3]))
                for h in hold
            )
            for hold in state.workers
        )
        key = repr((docs, holds, pend, state.crashes, state.prepares))
        if self._swap:
            mirror = repr((docs, tuple(reversed(holds)), pend, state.crashes, state.prepares))
            a, b = self.worker_names
            # Worker ids appear in the key only as quoted strings: exchange them there.
            mirror = (
                mirror.replace(f"'{a}'", "'\x00'")
                .replace(f"'{b}'", f"'{a}'")
                .replace("'\x00'", f"'{b}'")
            )
            key = min(key, mirror)
        return state, hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest()

    # -- actions -----------------------------------------------------------

    def actions(self, state: CheckState) -> Iterator[Action]:
        """Every action enabled in `state`, in a fixed order."""
        u = self.universe
        docs = [self.workload(d) for d in state.docs]
        for k, (held, lost) in enumerate(state.workers):
            name = worker_name(k)
            if held is None:
                yield Action("claim_next", name, worker=k)
                # By id only the first workload: a claim by id ignores dependencies,
                # and running the dependent one beside it only multiplies states.
                if docs and docs[0] is not None and self._takes(docs[0], "claim"):
                    yield Action("claim", name, slot=0, worker=k)
            else:
                slot = held[0]
                w = docs[slot]
                assert w is not None
                if self._takes(w, "start"):
                    yield Action("start", name, slot=slot, worker=k)
                yield Action("heartbeat", name, slot=slot, worker=k)
                yield Action("execution_context", name, slot=slot, worker=k)
                if (
                    self._takes(w, "checkpoint")
                    and _checkpoints_this_attempt(w) < u.checkpoints_per_attempt
                ):
                    yield Action("checkpoint", name, slot=slot, worker=k)
                if self._takes(w, "complete"):
                    yield Action("complete", name, slot=slot, worker=k)
                if self._takes(w, "fail"):
                    for variant in _FAIL_VARIANTS:
                        yield Action("fail", name, slot=slot, worker=k, arg=variant)
                if self._takes(w, "confirm_cancel"):
                    yield Action("confirm_cancel", name, slot=slot, worker=k)
                if state.crashes < u.crashes:
                    yield Action("crash", name, slot=slot, worker=k)
            if lost is not None and u.stale_workers:
                w = docs[lost[0]]
                if w is not None and w.current_claim is not None and self._takes(w, "complete"):
                    yield Action("stale_complete", name, slot=lost[0], worker=k)
                if w is not None and w.current_claim is not None:
                    yield Action("stale_heartbeat", name, slot=lost[0], worker=k)
        operator_used = sum(
            1 for w in docs if w is not None for e in w.execution_history if e.actor == "operator"
        )
        for slot, w in enumerate(docs):
            if w is None or operator_used >= u.operator_actions:
                continue
            yield Action("cancel", "operator", slot=slot)
            yield Action("timeout", "operator", slot=slot)
            if operator_retries(w) < u.rearms:
                yield Action("retry", "operator", slot=slot)
        yield Action("recover_expired", "sweeper")
        yield Action("enforce_deadlines", "sweeper")
        if u.racer:
            if state.pending is None and state.prepares < u.racer_prepares:
                for slot in range(len(docs)):
                    yield Action("prepare_recover", "racer", slot=slot)
                    yield Action("prepare_enforce", "racer", slot=slot)
                for k, (held, _) in enumerate(state.workers):
                    if held is not None:
                        yield Action("prepare_complete", "racer", slot=held[0], worker=k)
            elif state.pending is not None:
                yield Action("commit", "racer", slot=state.pending.slot)
        for instant in self.interesting_instants(state, docs):
            yield Action("jump", "clock", to=instant)

    def _takes(self, workload: Workload, operation: str) -> bool:
        """Does the table let `operation` leave the workload's state?"""
        return bool(self.spec.edges_for(workload.state, operation))

    def interesting_instants(self, state: CheckState, docs: list[Workload | None]) -> list[int]:
        """Instants after `now` where something can change, and the millisecond before each."""
        marks: set[int] = set()
        for w in docs:
            if w is None:
                continue
            index = index_fields(self.spec, w)
            for at in (index.lease_expires_at, index.next_deadline_at):
                if at is not None:
                    marks.add(at)
            if w.next_attempt_at is not None and w.state == "READY":
                marks.add(w.next_attempt_at)
        ahead = sorted(at for at in marks if at > state.now)
        if not ahead:
            return []
        # Only the next instant and the millisecond before it: later instants
        # are reached through it, so every boundary stays in the universe.
        nearest = ahead[0]
        return [at for at in (nearest - 1, nearest) if at > state.now]

    # -- one step ----------------------------------------------------------

    def step(self, state: CheckState, action: Action) -> Step:
        """Take `action` in `state`."""
        label = action.label
        if label == "jump":
            if action.to > self.universe.horizon_ms:
                return Step(state, None, (), cut=True)
            return Step(replace(state, now=action.to), None, ())
        if label == "crash":
            held, _ = state.workers[action.worker]
            crashed = replace(state, crashes=state.crashes + 1)
            return Step(self._with_worker(crashed, action.worker, (None, held)), None, ())
        if label in ("claim_next", "recover_expired", "enforce_deadlines"):
            return self._store_step(state, action)
        if label.startswith("prepare_"):
            return self._prepare(state, action)
        if label == "commit":
            return self._commit(state)
        command = self._command(state, action)
        slot = action.slot
        before = state.docs[slot]
        document, refusal = self._decide(before, command, state.now)
        docs = list(state.docs)
        wrote: tuple[int, ...] = ()
        if document is not None and document != before:
            docs[slot] = document
            wrote = (slot,)
        next_state = replace(state, docs=tuple(docs))
        if wrote and state.pending is not None and state.pending.slot == slot:
            next_state = replace(next_state, pending=replace(state.pending, stale=True))
        next_state = self._after_worker_call(next_state, action, refusal, document)
        return Step(next_state, refusal, wrote, ((slot, before, document),))

    def _decide(
        self, before: str | None, command: Command, now: int
    ) -> tuple[str | None, str | None]:
        """The document a command writes (None: nothing) and the code it refuses with, memoised."""
        key = (before, command.model_dump_json(), now)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        try:
            decision = self.decide_fn(self.spec, self.workload(before), command, now)
        except errors.WorkloadError as exc:
            outcome: tuple[str | None, str | None] = (None, exc.code)
        else:
            document = serialise(decision.workload) if decision.workload is not None else None
            refusal = decision.refusal.code if decision.refusal is not None else None
            outcome = (document, refusal)
        self._memo[key] = outcome
        return outcome

    def _fence_of(self, state: CheckState, action: Action, *, stale: bool = False) -> Fence:
        held, lost = state.workers[action.worker]
        hold = lost if stale else held
        assert hold is not None
        return Fence(claim_id=hold[1], worker_id=hold[2], token=hold[3])

    def _command(self, state: CheckState, action: Action) -> Command:
        label, slot = action.label, action.slot
        wid = self.ids[slot]
        if label == "claim":
            return ClaimCommand(
                workload_id=wid,
                worker_id=worker_name(action.worker),
                capabilities=(CAPABILITY,),
                lease_ms=self.universe.lease_ms,
            )
        if label in ("cancel", "timeout", "retry"):
            if label == "cancel":
                return CancelCommand(workload_id=wid, actor="operator")
            if label == "timeout":
                return TimeoutCommand(workload_id=wid, actor="operator")
            return RetryCommand(workload_id=wid, actor="operator")
        stale = label.startswith("stale_")
        fence = self._fence_of(state, action, stale=stale)
        base = label.removeprefix("stale_")
        if base == "start":
            return StartCommand(workload_id=wid, fence=fence)
        if base == "heartbeat":
            return HeartbeatCommand(workload_id=wid, fence=fence, extend_ms=self.universe.lease_ms)
        if base == "execution_context":
            return ExecutionContextCommand(workload_id=wid, fence=fence)
        if base == "checkpoint":
            return CheckpointCommand(workload_id=wid, fence=fence, state={"step": 1})
        if base == "complete":
            return CompleteCommand(
                workload_id=wid,
                fence=fence,
                result_id=f"result-{slot}-{fence.worker_id}-{fence.token}",
                output={"ok": True},
            )
        if base == "fail":
            kind, effect = _FAIL_VARIANTS[action.arg]
            return FailCommand(
                workload_id=wid,
                fence=fence,
                kind=kind,
                error="failed",
                effect="unknown" if effect == "unknown" else "none",
            )
        if base == "confirm_cancel":
            return ConfirmCancelCommand(workload_id=wid, fence=fence)
        raise AssertionError(f"no command for {label}")

    def _with_worker(self, state: CheckState, index: int, hold: WorkerHold) -> CheckState:
        workers = list(state.workers)
        workers[index] = hold
        return replace(state, workers=tuple(workers))

    def _after_worker_call(
        self, state: CheckState, action: Action, refusal: str | None, document: str | None
    ) -> CheckState:
        """A worker keeps its fence while its call succeeds, and lets it go when refused or done."""
        if action.worker < 0 or action.label.startswith("stale_"):
            return state
        held, lost = state.workers[action.worker]
        if action.label == "claim":
            if refusal is None and document is not None:
                claim = self.workload(document)
                assert claim is not None
                assert claim.current_claim is not None
                c = claim.current_claim
                return self._with_worker(
                    state,
                    action.worker,
                    ((action.slot, c.claim_id, c.worker_id, c.fencing_token), lost),
                )
            return state
        if held is None:
            return state
        w = self.workload(state.docs[held[0]])
        still = (
            w is not None and w.current_claim is not None and w.current_claim.claim_id == held[1]
        )
        if refusal in _CLAIM_GONE or not still:
            return self._with_worker(state, action.worker, (None, held))
        return state

    def _store(self, docs: tuple[str | None, ...]) -> MemoryStore:
        store = MemoryStore()
        for slot, document in enumerate(docs):
            w = self.workload(document)
            if w is None or document is None:
                continue
            audit = AuditRecord(
                "seed", self.ids[slot], 0, "checker", "seed", TENANT, APPLICATION, 0, ""
            )
            store.write(self.ids[slot], document, index_fields(self.spec, w), None, audit)
        return store

    def _store_step(self, state: CheckState, action: Action) -> Step:
        key = ("store", state.docs, action.label, action.worker, state.now)
        cached = self._store_memo.get(key)
        if cached is None:
            cached = self._run_store_step(state, action)
            self._store_memo[key] = cached
        docs, refusal, hold = cached
        wrote = tuple(s for s in range(len(docs)) if docs[s] != state.docs[s])
        next_state = replace(state, docs=docs)
        if state.pending is not None and state.pending.slot in wrote:
            next_state = replace(next_state, pending=replace(state.pending, stale=True))
        if hold is not None:
            _, lost = state.workers[action.worker]
            next_state = self._with_worker(next_state, action.worker, (hold, lost))
        changes = tuple((s, state.docs[s], docs[s]) for s in wrote)
        return Step(next_state, refusal, wrote, changes)

    def _run_store_step(
        self, state: CheckState, action: Action
    ) -> tuple[tuple[str | None, ...], str | None, tuple[int, str, str, int] | None]:
        store = self._store(state.docs)
        authority = self.authority_cls(store, grants=_VERIFIER, spec=self.spec)
        refusal: str | None = None
        claimed: Claim | None = None
        try:
            if action.label == "claim_next":
                claimed = authority.claim_next(
                    TENANT,
                    APPLICATION,
                    worker_name(action.worker),
                    (CAPABILITY,),
                    state.now,
                    self.universe.lease_ms,
                )
            elif action.label == "recover_expired":
                authority.recover_expired(state.now)
            else:
                authority.enforce_deadlines(state.now)
        except errors.WorkloadError as exc:
            refusal = exc.code
        docs: list[str | None] = []
        for slot, before in enumerate(state.docs):
            current = store.read(self.ids[slot])
            docs.append(current.document if current is not None else before)
        hold = None
        if claimed is not None:
            hold = (
                self.ids.index(claimed.workload_id),
                claimed.claim_id,
                claimed.worker_id,
                claimed.fencing_token,
            )
        return tuple(docs), refusal, hold

    def _prepare(self, state: CheckState, action: Action) -> Step:
        label = action.label.removeprefix("prepare_")
        slot = action.slot
        wid = self.ids[slot]
        command: Command
        if label == "recover":
            command = RecoverCommand(workload_id=wid)
        elif label == "enforce":
            command = EnforceDeadlineCommand(workload_id=wid)
        else:
            command = self._command(state, replace(action, label="complete"))
        document, refusal = self._decide(state.docs[slot], command, state.now)
        if document is None:
            # A prepared call that would write nothing has no race to lose.
            return Step(state, refusal, (), noop=True)
        pending = Pending(slot=slot, document=document, refusal=refusal)
        return Step(replace(state, pending=pending, prepares=state.prepares + 1), None, ())

    def _commit(self, state: CheckState) -> Step:
        pending = state.pending
        assert pending is not None
        cleared = replace(state, pending=None)
        if pending.document is None:
            return Step(cleared, pending.refusal, ())
        if pending.stale and self.commit_checks_version:
            return Step(cleared, errors.CONFLICT, ())
        docs = list(state.docs)
        before = docs[pending.slot]
        docs[pending.slot] = pending.document
        return Step(
            replace(cleared, docs=tuple(docs)),
            pending.refusal,
            (pending.slot,),
            ((pending.slot, before, pending.document),),
        )


def _checkpoints_this_attempt(w: Workload) -> int:
    if not w.attempts:
        return 0
    attempt = w.attempts[-1].attempt_id
    return sum(1 for c in w.checkpoints if c.attempt_id == attempt)
