"""Running a checker trace through a real `Authority` on any store.

A trace (written by `workwarden check` for every violation it finds) is the
universe it was found in and a numbered list of actions. `replay_trace`
admits the universe's workloads into a fresh store, takes each action
through a real `Authority` — workers keep the fences their claims returned,
the racing writer holds a `prepare` and commits it later, a `move` is the
spec's operation of effect `move` it names (`Authority.execute` of an
`OperatorCommand`), an `admit` the requester's admission sent again — and
checks the same properties as the checker after every step. A trace that
shows a violation in the checker shows it here too. A call the core answers
by raising anything but a coded `WorkloadError` is recorded as the checker
records it (`universe.raised`) and reported under `spec_refinement`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority, Prepared
from workwarden.statemachine.check.checker import _step_violations, state_violations
from workwarden.statemachine.check.oracle import PROPERTY
from workwarden.statemachine.check.universe import (
    _CLAIM_GONE,
    _VERIFIER,
    APPLICATION,
    CAPABILITY,
    RAISED,
    TENANT,
    Action,
    CheckState,
    Model,
    Pending,
    Step,
    Universe,
    WorkerHold,
    raised,
    worker_name,
)
from workwarden.statemachine.commands import (
    AdmitCommand,
    ClaimNextCommand,
    EnforceDeadlineCommand,
    RecoverCommand,
)
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import Store, StoreError

__all__ = ["ReplayResult", "replay_trace", "trace_commands"]

_T = TypeVar("_T")


class _CoreRaised(Exception):
    """An authority's call raised something other than a coded `WorkloadError`."""


def _asking(call: Callable[[], _T]) -> _T:
    """`call()`, an authority's call; what it raises but a coded refusal is `_CoreRaised`."""
    try:
        return call()
    except (errors.WorkloadError, StoreError):
        raise
    except Exception as exc:
        # The core crashed: recorded as the model records it (`universe.raised`).
        raise _CoreRaised(raised(exc)) from exc


@dataclass
class ReplayResult:
    """What replaying a trace showed: each step's outcome and the first violation."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    violation: tuple[int, str, str] | None = None

    @property
    def reproduced(self) -> bool:
        """Did the replay show a violation?"""
        return self.violation is not None


def _action(step: dict[str, Any]) -> Action:
    return Action(
        label=step["action"],
        actor=step.get("actor", ""),
        slot=step.get("slot", -1),
        worker=step.get("worker", -1),
        arg=step.get("arg", ""),
        to=step.get("to", -1),
    )


def _offered(model: Model, state: CheckState, action: Action) -> bool:
    """Does the universe offer `action` in `state`? Its actor only labels it; the clock
    may jump to any later instant (the model jumps only to the next one that matters, the
    ones between change nothing)."""
    if action.label == "jump":
        return action.to > state.now and (action.slot, action.worker, action.arg) == (-1, -1, "")

    def key(a: Action) -> tuple[str, int, int, str, int]:
        return (a.label, a.slot, a.worker, a.arg, a.to)

    return key(action) in {key(a) for a in model.actions(state)}


class _Replayer:
    """Takes a trace's actions through a real authority, recording the commands it sends."""

    def __init__(self, model: Model, store: Store, authority_cls: type[Authority]) -> None:
        self.model = model
        self.store = store
        self.authority = authority_cls(store, grants=_VERIFIER, spec=model.spec)
        self.racer = authority_cls(store, grants=_VERIFIER, spec=model.spec)
        self.now = 0
        self.workers: list[WorkerHold] = [(None, None) for _ in model.worker_names]
        self.prepared: Prepared | None = None
        self.prepared_slot = -1
        self.crashes = 0
        self.prepares = 0
        #: Every command sent, with its instant, in order (sweeps one per workload).
        self.sent: list[tuple[Any, int]] = []

    def docs(self) -> tuple[str | None, ...]:
        out: list[str | None] = []
        for wid in self.model.ids:
            doc = self.store.read(wid)
            out.append(None if doc is None else doc.document)
        return tuple(out)

    def state(self) -> CheckState:
        pending = None
        if self.prepared is not None:
            pending = Pending(slot=self.prepared_slot, document=None, refusal=None)
        return CheckState(
            self.now, self.docs(), tuple(self.workers), pending, self.crashes, self.prepares
        )

    def admit(self) -> None:
        for request in self.model.requests:
            self.sent.append((AdmitCommand(request=request), 0))
            self.authority.admit(request, 0)

    def _sweep(self, due: Any, make: Any) -> None:
        for key in list(due(self.now, 1_000)):
            command = make(workload_id=key)
            self.sent.append((command, self.now))
            try:
                _asking(partial(self.authority.execute, command, self.now))
            except errors.WorkloadError as exc:
                if exc.code != errors.CONFLICT:
                    raise

    def take(self, action: Action) -> str | None:
        """Take one action through the real authority; returns the refusal code, if any."""
        label = action.label
        model = self.model
        try:
            if label == "jump":
                self.now = action.to
            elif label == "crash":
                held, _ = self.workers[action.worker]
                self.workers[action.worker] = (None, held)
                self.crashes += 1
            elif label == "claim_next":
                request = model.claim_request(self.state(), action.worker) or None
                self.sent.append(
                    (
                        ClaimNextCommand(
                            tenant_id=TENANT,
                            application_id=APPLICATION,
                            worker_id=worker_name(action.worker),
                            capabilities=(CAPABILITY,),
                            lease_ms=model.universe.lease_ms,
                            request_id=request,
                        ),
                        self.now,
                    )
                )
                claim = _asking(
                    lambda: self.authority.claim_next(
                        TENANT,
                        APPLICATION,
                        worker_name(action.worker),
                        (CAPABILITY,),
                        self.now,
                        model.universe.lease_ms,
                        request_id=request,
                    )
                )
                if claim is not None:
                    _, lost = self.workers[action.worker]
                    slot = model.ids.index(claim.workload_id)
                    hold = (slot, claim.claim_id, claim.worker_id, claim.fencing_token)
                    self.workers[action.worker] = (hold, lost)
            elif label == "recover_expired":
                self._sweep(self.store.expired_leases, RecoverCommand)
            elif label == "enforce_deadlines":
                self._sweep(self.store.deadlines_due, EnforceDeadlineCommand)
            elif label.startswith("prepare_"):
                self._prepare(action)
            elif label == "commit":
                prepared, self.prepared = self.prepared, None
                assert prepared is not None
                _asking(prepared.commit)
            else:
                command = model._command(self.state(), action)
                self.sent.append((command, self.now))
                reply = _asking(lambda: self.authority.execute(command, self.now))
                if label == "claim":
                    _, lost = self.workers[action.worker]
                    hold = (action.slot, reply.claim_id, reply.worker_id, reply.fencing_token)
                    self.workers[action.worker] = (hold, lost)
                elif label == "move":
                    # An operation of effect `move`: no worker's hold changes.
                    pass
                else:
                    self._keep_or_release(action, None)
        except errors.WorkloadError as exc:
            if action.worker >= 0 and label not in ("claim", "claim_next", "crash"):
                self._keep_or_release(action, exc.code)
            return exc.code
        except _CoreRaised as exc:
            return str(exc)
        return None

    def _keep_or_release(self, action: Action, refusal: str | None) -> None:
        # Only a worker's own call through its fence lets the fence go (as in the
        # model): an operator's or a sweeper's call names no worker.
        if action.worker < 0 or action.label.startswith(("stale_", "prepare_")):
            return
        held, _ = self.workers[action.worker]
        if held is None:
            return
        w = self.model.workload(self.docs()[held[0]])
        still = (
            w is not None and w.current_claim is not None and w.current_claim.claim_id == held[1]
        )
        if refusal in _CLAIM_GONE or not still:
            self.workers[action.worker] = (None, held)

    def _prepare(self, action: Action) -> None:
        kind = action.label.removeprefix("prepare_")
        wid = self.model.ids[action.slot]
        if kind == "recover":
            command: Any = RecoverCommand(workload_id=wid)
        elif kind == "enforce":
            command = EnforceDeadlineCommand(workload_id=wid)
        else:
            command = self.model._command(
                self.state(), Action("complete", "", action.slot, action.worker)
            )
        self.prepared = _asking(lambda: self.racer.prepare(command, self.now))
        self.prepared_slot = action.slot
        self.prepares += 1


def replay_trace(
    spec: Spec,
    trace: dict[str, Any],
    store: Store,
    *,
    model: Model | None = None,
    authority_cls: type[Authority] = Authority,
) -> ReplayResult:
    """Replay `trace` (as written by `workwarden check`) on an empty `store`.

    A step that cannot be taken where the steps before it leave the universe (a
    trace edited by hand) is `WORKLOAD_INVALID` naming it, in `details["step"]`.
    """
    universe = Universe.from_dict(trace["universe"])
    model = model or Model(spec, universe)
    replayer = _Replayer(model, store, authority_cls)
    replayer.admit()
    result = ReplayResult()
    for number, raw in enumerate(trace["steps"], start=1):
        action = _action(raw)
        before = replayer.state()
        try:
            if not _offered(model, before, action):
                # A step edited by hand can still be a call the authority answers (a
                # clock going back, a crash past the bound, a claim by worker -1,
                # Python's last): replayed, it would prove nothing of the universe.
                raise LookupError("not a step the universe offers here")
            refusal = replayer.take(action)
        except (AssertionError, LookupError) as exc:
            # The authority's own failures are recorded above (`_asking`): this is the
            # step itself, one the steps before it leave no way to take (a worker call
            # by a worker that holds nothing, a commit with no decision held, ...).
            raise errors.WorkloadError(
                errors.INVALID,
                f"step {number}: {action.label} cannot be taken where the steps before it"
                f" leave the universe{f' ({exc})' if str(exc) else ''}",
                {"field": "TRACE", "step": number},
            ) from None
        after = replayer.state()
        changes = tuple(
            (slot, before.docs[slot], after.docs[slot])
            for slot in range(len(after.docs))
            if before.docs[slot] != after.docs[slot]
        )
        step = Step(after, refusal, tuple(slot for slot, _, _ in changes), changes)
        result.steps.append({"step": number, **raw, "refusal": refusal})
        problems = _step_violations(model, before, action, step)
        if refusal is not None and refusal.startswith(RAISED):
            problems.append((PROPERTY, f"{action.label}: the core {refusal}"))
        for doc in after.docs:
            w = model.workload(doc)
            if w is not None:
                problems += state_violations(model.spec, w)
        if problems and result.violation is None:
            name, message = problems[0]
            result.violation = (number, name, message)
            break
    return result


def trace_commands(spec: Spec, universe: Universe, steps: list[dict[str, Any]]) -> list[Any]:
    """The commands a trace sends, with their instants, from the admissions on.

    The trace is run on a fresh `MemoryStore`; a sweep becomes one command per
    workload it found due, the scheduler one `ClaimNextCommand`. Traces with a
    racing writer are refused: a held decision has no place in one sequence.
    """
    if any(step["action"].startswith(("prepare_", "commit")) for step in steps):
        raise ValueError("a trace with a racing writer is not one sequence of commands")
    from workwarden.storage.memory import MemoryStore

    model = Model(spec, universe)
    replayer = _Replayer(model, MemoryStore(), Authority)
    replayer.admit()
    for raw in steps:
        replayer.take(_action(raw))
    return list(replayer.sent)
