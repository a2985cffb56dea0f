"""The bounded universe the model checker explores: its states, its actions, one step.

A universe is two (by default) workloads, the second depending on the first,
admitted at instant 0; a few workers; an operator; a sweeper; the requester,
which may repeat an admission at any later instant (its reply lost); and one
racing writer that may hold a prepared decision while others commit. The operator
also takes every operation the spec adds with the effect `move` (read from
the operations table: whichever edge out of a workload's state the operation
may take), up to `Universe.moves` of them per workload. Time moves only
to instants where something can change (a lease expiry, a deadline, an
eligibility instant) and to the millisecond before each, up to a horizon, so
every boundary race is in the universe and the universe stays finite.

A state is plain hashable data: the instant, each workload's committed
document (its JSON text), what each worker holds (its current fence and the
last fence it lost), and the racing writer's pending write (the types, and
the `Universe` of bounds, are `workwarden.statemachine.check.state`; they
are importable from here too). Single-workload
commands are decided by the pure core; the scheduler and the sweeps run
through a real `Authority` over a `MemoryStore` holding the state's documents.

What of a state decides its future (the abstraction the checker keys states
by, and each document read once) is `workwarden.statemachine.check.abstraction`.
The model also keeps the core's decision on a (document, command, instant)
and a store step's outcome on (documents, action, instant): the core and the
authority are deterministic, so a kept answer is the answer; these caches
are bounded (`CACHE_LIMIT`) and what they drop is only worked out again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.authority import Authority, serialise
from workwarden.statemachine.check.abstraction import (
    CACHE_LIMIT,
    Abstraction,
    DocumentFacts,
    StateKey,
    keep,
)
from workwarden.statemachine.check.state import CheckState, Pending, Universe, WorkerHold
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
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    TimeoutCommand,
)
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.grants import Grant, GrantSigner, GrantVerifier, Subject
from workwarden.statemachine.models import (
    DEFAULT_RETRY_ON,
    Claim,
    ClaimReply,
    CreateWorkload,
    Dependency,
    ExecutionContext,
    Fence,
    RetryPolicy,
    Timeouts,
    Workload,
)
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord
from workwarden.storage.memory import MemoryStore

__all__ = [
    "BORROWED_REQUEST",
    "CACHE_LIMIT",
    "CALL_ARGS",
    "CHECKER_KEY",
    "CHECKER_KEY_ID",
    "CHECKPOINT_VARIANTS",
    "CLAIM_AGAIN_VARIANTS",
    "CONTEXT_VARIANTS",
    "DOC_PHASES",
    "DOC_PHASES_BEFORE_SWEEPS",
    "FAIL_VARIANTS",
    "FORGED_VARIANTS",
    "OTHER_OUTPUT",
    "RAISED",
    "REQUEST_AGAIN",
    "REUSED_RESULT",
    "STALE_FAIL_VARIANTS",
    "SWEEPS",
    "Action",
    "CheckState",
    "Model",
    "Pending",
    "StateKey",
    "Step",
    "Universe",
    "WorkerHold",
    "called",
    "claim_request_of",
    "raised",
    "reply_fact",
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


@dataclass(frozen=True, slots=True)
class Action:
    """One step an actor may take, named for traces: `label` and its arguments."""

    label: str
    actor: str
    slot: int = -1
    worker: int = -1
    arg: str = ""
    to: int = -1

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its fields (a checker's helper processes send many): a frozen
        # dataclass with slots is otherwise restored field by field, much slower.
        return (Action, (self.label, self.actor, self.slot, self.worker, self.arg, self.to))


@dataclass(frozen=True)
class Step:
    """The outcome of an action: the next state, what it refused, what it wrote."""

    state: CheckState
    refusal: str | None
    wrote: tuple[int, ...]
    decision_docs: tuple[tuple[int, str | None, str | None], ...] = ()
    cut: bool = False
    noop: bool = False
    #: What the reply of a call says that its document does not (see `reply_fact`).
    reply: tuple[str, str] | None = None


def reply_fact(reply: Any) -> tuple[str, str] | None:
    """What a reply says beyond the document it wrote: an admission's `created`, the attempt
    an execution context or a claim names, the state a state reply names (a replay's may be an
    earlier one than the document's); None for the others."""
    if isinstance(reply, AdmitReply):
        return ("created", str(reply.created))
    if isinstance(reply, ExecutionContext):
        return ("attempt_id", reply.attempt_id)
    if isinstance(reply, ClaimReply):
        return ("claim_attempt", reply.attempt_id)
    if isinstance(reply, StateReply):
        return ("state", reply.state)
    return None


def called(label: str) -> str:
    """The operation an action of this label calls: a stale worker's or an impostor's call
    is the worker's call of that name (`stale_complete` and `forged_complete` call
    `complete`)."""
    return label.removeprefix("stale_").removeprefix("forged_")


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
        retry_on = DEFAULT_RETRY_ON if first is None else tuple(sorted(set(first)))
    else:
        retry_on = tuple(sorted(set(universe.second_retry_on)))
    return CreateWorkload(
        tenant_id=TENANT,
        application_id=APPLICATION,
        environment="check",
        definition_id=f"def-{index}",
        definition_revision="r1",
        trigger="check",
        # The first's input an object, a later one's a list: the core copies either.
        input={"n": index} if index == 0 else [index],
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


#: What a worker's checkpoint call names, by the action's `arg`: no sequence
#: (""), the next sequence ("next": the workload's checkpoints so far plus one),
#: or the sequence of its attempt's last recorded checkpoint again ("repeat": the
#: same call sent again after its reply was lost, with the same state).
CHECKPOINT_VARIANTS = ("", "next", "repeat")

#: What a worker holding a claim names when it sends a claim again, by the action's
#: `arg`: the request id its claim was made with ("same": the repeat after a lost
#: reply), or another that sorts before or after it (a new request while it holds one).
CLAIM_AGAIN_VARIANTS = ("same", "before", "after")

#: The secret references an execution context call names, by the action's `arg`:
#: none, one reference under the spec's prefix, the bare prefix, and text under
#: another scheme (the last two refused with `SECRET_REJECTED`).
CONTEXT_VARIANTS = ("", "reference", "bare", "other")

#: The `arg` of a claim by a worker holding nothing under the request id another
#: worker's live claim was made with (two workers whose request ids collide).
BORROWED_REQUEST = "borrowed"

#: The operator calls that carry request ids, and are sent again, under `request_ids`.
_OPERATOR_CALLS = ("cancel", "timeout", "retry")

#: The `arg` of an operator call that sends the operator's last request id again.
REQUEST_AGAIN = "again"

#: The `arg` of a stale worker's completion sent under the result id another
#: claim recorded (a worker reusing one result id across its attempts).
REUSED_RESULT = "reused"

#: The `arg` of a worker's completion sent again under its own recorded result id
#: with another output (not the report it made: a conflict).
OTHER_OUTPUT = "other-output"

#: How an impostor forges a fence out of one a workload's document shows (its
#: current claim's, or else its last attempt's), by the action's `arg`: another
#: worker id that sorts before or after the holder's, or the holder's id with a
#: fencing token one below or one above.
FORGED_VARIANTS = ("worker<", "worker>", "token<", "token>")

#: The worker ids an impostor presents: one sorting before every worker's name
#: (`worker_name` uses upper-case letters) and one after.
_IMPOSTORS = {"worker<": "worker-0", "worker>": "worker-z"}

#: The calls an impostor makes with a forged fence, each in every form: a
#: heartbeat while a claim is live (the fence check), and the calls whose replays
#: compare a fence with a recorded attempt or result once there is one to compare
#: with (a result; a last attempt that ended failed or cancelled).
_FORGED_CALLS = ("heartbeat", "complete", "fail", "confirm_cancel")

#: The progress every checkpoint of the universe records.
_CHECKPOINT_STATE = {"step": 1}

#: The start of a step's refusal when the core raised something other than a
#: `WorkloadError`: every refusal is a coded `WorkloadError`, so the oracle
#: reports such a step whatever the spec answers.
RAISED = "raised "


def raised(exc: Exception) -> str:
    """The refusal a step records when the core raised `exc`, not a `WorkloadError`."""
    return f"{RAISED}{type(exc).__name__}: {exc}"


_FAIL_VARIANTS = {
    "transient/none": ("transient_connection", "none"),
    "transient/unknown": ("transient_connection", "unknown"),
    "validation/none": ("validation", "none"),
}

#: The failure reports a worker makes, by the action's `arg` (kind/effect).
FAIL_VARIANTS = tuple(_FAIL_VARIANTS)

#: The failure reports a worker sends again once its attempt ended failed: each
#: report, and one with another error text ("+error": not the report it made).
STALE_FAIL_VARIANTS = (*FAIL_VARIANTS, f"{FAIL_VARIANTS[0]}+error")

#: The calls whose `arg` says which form of the call is sent: the forms, and what
#: the call is (for a trace that names another form).
CALL_ARGS: dict[str, tuple[tuple[str, ...], str]] = {
    "checkpoint": (CHECKPOINT_VARIANTS, "a checkpoint call"),
    "execution_context": (CONTEXT_VARIANTS, "an execution context call"),
    "claim_again": ((*CLAIM_AGAIN_VARIANTS, BORROWED_REQUEST), "a claim sent again"),
    **dict.fromkeys(_OPERATOR_CALLS, (("", REQUEST_AGAIN), "an operator call")),
    "fail": (FAIL_VARIANTS, "a failure report"),
    "stale_fail": (STALE_FAIL_VARIANTS, "a failure report sent again"),
    "stale_complete": (("", REUSED_RESULT, OTHER_OUTPUT), "a completion sent again"),
    **{f"forged_{call}": (FORGED_VARIANTS, "a forged fence") for call in _FORGED_CALLS},
}


#: Who calls an operation of effect `move` in the universe, by the operation's actor
#: class (a worker's is the first worker's, which needs no claim to call it).
_MOVE_ACTORS = {"operator": "operator", "system": "sweeper"}


#: Refusals after which a worker knows its claim is gone.
_CLAIM_GONE = frozenset(
    {errors.CLAIM_INVALID, errors.STALE_FENCE, errors.LEASE_EXPIRED, errors.TIMED_OUT}
)


_CommandKey = tuple[str, int, int, tuple[int, str, str, int] | None, str]
"""What a command is made from: (operation, slot, worker, fence held, argument)."""


#: The phases of the calls on one document (`Model.doc_offers`): the operator's calls,
#: the operator's requests sent again, the moves, the admissions sent again, the
#: impostor's; the sweeps come between the third and the fourth.
DOC_PHASES = 5
DOC_PHASES_BEFORE_SWEEPS = 3
_NO_OFFERS: tuple[tuple[Action, ...], ...] = ((),) * DOC_PHASES

#: The sweeps, offered in every state, between the third and the fourth phase.
SWEEPS = (Action("recover_expired", "sweeper"), Action("enforce_deadlines", "sweeper"))


#: The least each whole-number bound of a universe may be (the others start at 0).
_LEAST_BOUND = {"workers": 1, "workloads": 1, "max_attempts": 1, "lease_ms": 1, "horizon_ms": 1}


def _refuse_bounds(universe: Universe) -> None:
    """`WORKLOAD_INVALID` naming the first bound of `universe` that is not a whole number
    from its least: a universe of no worker, or of a negative horizon, explores next to
    nothing and would be reported complete and clean."""
    for name in (
        "workers", "workloads", "max_attempts", "lease_ms", "horizon_ms", "rearms",
        "operator_actions", "moves", "crashes", "racer_prepares", "checkpoints_per_attempt",
        "initial_delay_ms", "max_delay_ms",
    ):  # fmt: skip
        value, least = getattr(universe, name), _LEAST_BOUND.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise errors.bad_argument(
                name, f"a universe's {name} is a whole number, {least} or more, not {value!r}"
            )


class Model:
    """The transition system of one universe under one spec.

    `decide_fn` and `authority_cls` are the parts a deliberately broken
    variant replaces; `commit_checks_version` False makes the racing writer's
    commit ignore that its version went stale (a store that ignores the
    expected version). `cache_limit` bounds each of the model's caches (see
    `CACHE_LIMIT`): a smaller one saves memory and costs time, nothing else.
    """

    def __init__(
        self,
        spec: Spec,
        universe: Universe | None = None,
        *,
        decide_fn: Callable[[Spec, Workload | None, Command, int], Decision] = decide,
        authority_cls: type[Authority] = Authority,
        commit_checks_version: bool = True,
        cache_limit: int = CACHE_LIMIT,
        symmetry: bool = True,
    ) -> None:
        self.spec = spec
        self.cache_limit = cache_limit
        self.universe = universe or Universe()
        _refuse_bounds(self.universe)
        self.decide_fn = decide_fn
        self.authority_cls = authority_cls
        self.commit_checks_version = commit_checks_version
        count = max(1, self.universe.workloads) if self.universe.dependent else 1
        requests: list[CreateWorkload] = []
        for index in range(count):
            # A chain: each workload depends on the one admitted before it.
            parent = workload_id_for(requests[index - 1]) if index >= 1 else None
            requests.append(_request(self.universe, index, parent))
        self.requests = tuple(requests)
        self.ids = tuple(workload_id_for(r) for r in self.requests)
        self._seed_audits = tuple(
            AuditRecord("seed", wid, 0, "checker", "seed", TENANT, APPLICATION, 0, "")
            for wid in self.ids
        )
        names = [worker_name(i) for i in range(self.universe.workers)]
        self.worker_names = tuple(names)
        self.abstraction = Abstraction(
            spec, self.universe, self.worker_names, cache_limit, symmetry=symmetry
        )
        """What of a state decides its future: documents read once, states as keys (with
        the workers' symmetry reduced; `symmetry=False` keeps states that differ only in
        which worker is which apart, to check the reduction against)."""
        # Caches, each keyed by everything its value is computed from (see `keep`).
        self._memo: dict[
            tuple[str | None, _CommandKey, int],
            tuple[str | None, str | None, tuple[str, str] | None],
        ] = {}
        self._store_memo: dict[
            tuple[Any, ...],
            tuple[tuple[str | None, ...], str | None, tuple[int, str, str, int] | None, str],
        ] = {}
        self._commands: dict[_CommandKey, Command] = {}
        self._spare_store: tuple[tuple[str | None, ...], MemoryStore] | None = None
        self._takes_memo: dict[tuple[str, str], bool] = {}
        #: The operations the spec adds with the effect `move`, in the table's
        #: order, each with the actor that calls it in this universe.
        self.moves: tuple[tuple[str, str], ...] = tuple(
            (name, _MOVE_ACTORS.get(op.actor, worker_name(0)))
            for name, op in spec.operations.items()
            if op.spec.effect == "move"
        )
        self._held = frozenset(n for n, s in spec.states.items() if s.kind == "held")
        confirm = spec.operations.get("confirm_cancel")
        self._confirm_status = confirm.spec.attempt_status if confirm is not None else None
        fail = spec.operations.get("fail")
        self._fail_status = fail.spec.attempt_status if fail is not None else None
        #: The attempt status a forged call's replay compares with, by call.
        self._forged_status = {"fail": self._fail_status, "confirm_cancel": self._confirm_status}

    # -- the initial state -------------------------------------------------

    def initial(self) -> CheckState:
        """Both workloads admitted at instant 0; workers hold nothing."""
        docs: list[str | None] = []
        for request in self.requests:
            decision = self.decide_fn(self.spec, None, AdmitCommand(request=request), 0)
            assert decision.workload is not None
            docs.append(serialise(decision.workload))
        workers: tuple[WorkerHold, ...] = tuple((None, None) for _ in self.worker_names)
        return CheckState(now=0, docs=tuple(docs), workers=workers)

    # -- the abstraction --------------------------------------------------

    def workload(self, document: str | None) -> Workload | None:
        """The workload a state's document holds (parsed once, cached)."""
        return self.abstraction.workload(document)

    def canonical(self, state: CheckState) -> tuple[CheckState, StateKey]:
        """The state, and its abstraction as a key (see `Abstraction.canonical`)."""
        return self.abstraction.canonical(state)

    # -- actions -----------------------------------------------------------

    def facts(self, state: CheckState) -> list[DocumentFacts | None]:
        """What the model reads of each document of `state` (None: no document there)."""
        return [None if d is None else self.abstraction.doc(d) for d in state.docs]

    def actions(self, state: CheckState) -> Iterator[Action]:
        """Every action enabled in `state`, in a fixed order."""
        u = self.universe
        docs = self.facts(state)
        for k in range(len(state.workers)):
            yield from self.worker_actions(state, docs, k)
        operator_used = sum(info.operator_events for info in docs if info is not None)
        left = operator_used < u.operator_actions
        offers = [
            _NO_OFFERS if info is None else self.doc_offers(slot, info, left)
            for slot, info in enumerate(docs)
        ]
        for phase in range(DOC_PHASES_BEFORE_SWEEPS):
            for offer in offers:
                yield from offer[phase]
        yield from SWEEPS
        for phase in range(DOC_PHASES_BEFORE_SWEEPS, DOC_PHASES):
            for offer in offers:
                yield from offer[phase]
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
        for instant in self._next_instants(state.now, docs):
            yield Action("jump", "clock", to=instant)

    def worker_actions(
        self, state: CheckState, docs: list[DocumentFacts | None], k: int
    ) -> Iterator[Action]:
        """The calls of worker `k` in `state` (`docs`: its documents' facts), in order:
        its claims when it holds nothing, else its calls through the fence it holds;
        then its calls through the fence it lost."""
        u = self.universe
        takes = self._takes
        held, lost = state.workers[k]
        name = self.worker_names[k]
        if held is None:
            yield Action("claim_next", name, worker=k)
            # By id only the first workload: a claim by id ignores dependencies,
            # and running the dependent one beside it only multiplies states.
            first = docs[0] if docs else None
            if first is not None and takes(first.workload.state, "claim"):
                yield Action("claim", name, slot=0, worker=k)
            if u.request_ids:
                for slot, info in enumerate(docs):
                    if info is not None and info.claim_id is not None:
                        # Another worker's live claim: its request id, by this one.
                        yield Action("claim_again", name, slot=slot, worker=k, arg=BORROWED_REQUEST)
        else:
            slot = held[0]
            info = docs[slot]
            assert info is not None
            at = info.workload.state
            if u.request_ids and info.claim_id == held[1]:
                # The claim sent again by the worker holding it.
                for variant in CLAIM_AGAIN_VARIANTS:
                    yield Action("claim_again", name, slot=slot, worker=k, arg=variant)
            if takes(at, "start"):
                yield Action("start", name, slot=slot, worker=k)
            yield Action("heartbeat", name, slot=slot, worker=k)
            for variant in CONTEXT_VARIANTS:
                yield Action("execution_context", name, slot=slot, worker=k, arg=variant)
            if takes(at, "checkpoint") and info.checkpoints < u.checkpoints_per_attempt:
                yield Action("checkpoint", name, slot=slot, worker=k)
                yield Action("checkpoint", name, slot=slot, worker=k, arg="next")
            if info.checkpoints and info.claim_id == held[1]:
                # Its attempt recorded a checkpoint: the call sent again.
                yield Action("checkpoint", name, slot=slot, worker=k, arg="repeat")
            if takes(at, "complete"):
                yield Action("complete", name, slot=slot, worker=k)
            if takes(at, "fail"):
                for variant in _FAIL_VARIANTS:
                    yield Action("fail", name, slot=slot, worker=k, arg=variant)
            if takes(at, "confirm_cancel"):
                yield Action("confirm_cancel", name, slot=slot, worker=k)
            if state.crashes < u.crashes:
                yield Action("crash", name, slot=slot, worker=k)
        if lost is not None and u.stale_workers:
            info = docs[lost[0]]
            if info is not None and info.claim_id is not None:
                if takes(info.workload.state, "complete"):
                    yield Action("stale_complete", name, slot=lost[0], worker=k)
                yield Action("stale_heartbeat", name, slot=lost[0], worker=k)
            elif info is not None and info.workload.result is not None:
                # A result is recorded: the worker sends its completion again
                # (its reply lost); where another claim produced the result, its
                # own under the recorded result id; where it did, one with
                # another output.
                yield Action("stale_complete", name, slot=lost[0], worker=k)
                made = info.workload.result.provenance.get("fencing_token")
                again = REUSED_RESULT if made != str(lost[3]) else OTHER_OUTPUT
                yield Action("stale_complete", name, slot=lost[0], worker=k, arg=again)
            if info is not None and self._ended_as(info.workload, lost[3], self._confirm_status):
                # Its attempt ended cancelled: the confirmation sent again.
                yield Action("stale_confirm_cancel", name, slot=lost[0], worker=k)
            if info is not None and self._ended_as(info.workload, lost[3], self._fail_status):
                # Its attempt ended failed: a failure report sent again (the one it
                # sent is a replay; another kind, effect or error text is not).
                for variant in STALE_FAIL_VARIANTS:
                    yield Action("stale_fail", name, slot=lost[0], worker=k, arg=variant)

    def doc_offers(
        self, slot: int, info: DocumentFacts, operator_left: bool
    ) -> tuple[tuple[Action, ...], ...]:
        """The calls on the document of `slot` alone, phase by phase (`DOC_PHASES`).

        They read that document's facts and whether the operator's budget
        (counted over every document) has calls left: the operator's calls,
        the operator's last request sent again, the spec's moves, an
        admission sent again and an impostor's calls. `actions` offers the
        phases one after the other, each for every document in turn, the
        sweeps between the third and the fourth.
        """
        u = self.universe
        w = info.workload
        operator: list[Action] = []
        if operator_left:
            operator.append(Action("cancel", "operator", slot=slot))
            operator.append(Action("timeout", "operator", slot=slot))
            if info.operator_retries < u.rearms:
                operator.append(Action("retry", "operator", slot=slot))
        again: list[Action] = []
        if u.request_ids and _operator_request(w) is not None:
            # The operator's last request sent again: as the call it made (a
            # replay), or as another call under the same request id.
            again = [
                Action(call, "operator", slot=slot, arg=REQUEST_AGAIN) for call in _OPERATOR_CALLS
            ]
        # Beyond the budget a move is offered only out of a held state, where the
        # step is cut off by the bound (see `step`).
        moves = [
            Action("move", actor, slot=slot, arg=name)
            for name, actor in self.moves
            if self.spec.available(w.state, name)
            and (info.moves < u.moves or w.state in self._held)
        ]
        # The requester sends an admission again (its reply lost), at this instant.
        admit = (Action("admit", "requester", slot=slot),)
        forged: list[Action] = []
        if u.stale_workers:
            # A caller that never held the fence it presents: another worker's id,
            # or the holder's with another token; refused, writing nothing.
            for call in _FORGED_CALLS:
                if self._forgeable(info, call):
                    for form in FORGED_VARIANTS:
                        forged.append(Action(f"forged_{call}", "impostor", slot=slot, arg=form))
        return (tuple(operator), tuple(again), tuple(moves), admit, tuple(forged))

    def claim_request(self, state: CheckState, worker: int) -> str:
        """The request id of a new claim by `worker` in `state` ("" without `request_ids`).

        Made of the fencing tokens issued so far, so that every new claim names
        a request id of its own, and a state says which (not of the worker's
        name: the abstraction may swap workers).
        """
        if not self.universe.request_ids:
            return ""
        issued = 0
        for document in state.docs:
            w = self.workload(document)
            if w is not None:
                issued += w.fencing_token
        return f"claim-{issued + 1}"

    @staticmethod
    def _ended_as(workload: Workload, token: int, status: str | None) -> bool:
        """Did the attempt of fence `token` end with `status` (an operation's attempt status)?"""
        return status is not None and any(
            a.fencing_token == token and a.status == status for a in workload.attempts
        )

    def _takes(self, state: str, operation: str) -> bool:
        """Does the table let `operation` leave `state`?"""
        key = (state, operation)
        takes = self._takes_memo.get(key)
        if takes is None:
            takes = self._takes_memo[key] = bool(self.spec.edges_for(state, operation))
        return takes

    def interesting_instants(self, state: CheckState) -> list[int]:
        """Instants after `now` where something can change, and the millisecond before each."""
        return self._next_instants(state.now, self.facts(state))

    def _next_instants(self, now: int, docs: list[DocumentFacts | None]) -> list[int]:
        ahead = [at for info in docs if info is not None for at in info.marks if at > now]
        if not ahead:
            return []
        # Only the next instant and the millisecond before it: later instants
        # are reached through it, so every boundary stays in the universe.
        nearest = min(ahead)
        return [at for at in (nearest - 1, nearest) if at > now]

    # -- one step ----------------------------------------------------------

    def step(self, state: CheckState, action: Action) -> Step:
        """Take `action` in `state`."""
        label = action.label
        if label == "jump":
            if action.to > self.universe.horizon_ms:
                return Step(state, None, (), cut=True)
            moved = CheckState(
                action.to, state.docs, state.workers, state.pending, state.crashes, state.prepares
            )
            return Step(moved, None, ())
        if label == "crash":
            held, _ = state.workers[action.worker]
            crashed = CheckState(
                state.now,
                state.docs,
                _with(state.workers, action.worker, (None, held)),
                state.pending,
                state.crashes + 1,
                state.prepares,
            )
            return Step(crashed, None, ())
        if label in ("claim_next", "recover_expired", "enforce_deadlines"):
            return self._store_step(state, action)
        if label.startswith("prepare_"):
            return self._prepare(state, action)
        if label == "move":
            document = state.docs[action.slot]
            if document is not None and self.abstraction.doc(document).moves >= self.universe.moves:
                # Only an operator moves held work on, and the budget has none
                # left: the bound cuts this future off, as the horizon does.
                return Step(state, None, (), cut=True)
        if label == "commit":
            return self._commit(state)
        slot = action.slot
        before = state.docs[slot]
        document, refusal, fact = self._decided(before, self._command_key(state, action), state.now)
        docs = state.docs
        pending = state.pending
        wrote: tuple[int, ...] = ()
        if document is not None and document != before:
            docs = (*docs[:slot], document, *docs[slot + 1 :])
            wrote = (slot,)
            if pending is not None and pending.slot == slot:
                pending = Pending(pending.slot, pending.document, pending.refusal, True)
        workers = self._after_worker_call(state.workers, docs, action, refusal, document)
        changes = ((slot, before, document),)
        if not wrote and workers is state.workers:
            # Nothing changed: the same state (which spares the checker its key).
            return Step(state, refusal, (), changes, reply=fact)
        next_state = CheckState(state.now, docs, workers, pending, state.crashes, state.prepares)
        return Step(next_state, refusal, wrote, changes, reply=fact)

    def _decided(
        self, before: str | None, command: _CommandKey, now: int
    ) -> tuple[str | None, str | None, tuple[str, str] | None]:
        """The document a command writes (None: nothing), the code it refuses with, and
        what its reply says beyond the document (`reply_fact`).

        Memoised by (document, command, instant): the core is pure, so the same
        three decide the same way in every state they recur in.
        """
        key = (before, command, now)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        try:
            decision = self.decide_fn(
                self.spec, self.workload(before), self._command_for(command), now
            )
        except errors.WorkloadError as exc:
            outcome: tuple[str | None, str | None, tuple[str, str] | None] = (None, exc.code, None)
        except Exception as exc:  # noqa: BLE001 - a core that crashes is a finding, not the end
            outcome = (None, raised(exc), None)
        else:
            written = decision.workload
            document = self.abstraction.serialise(written) if written is not None else None
            refusal = decision.refusal.code if decision.refusal is not None else None
            outcome = (document, refusal, reply_fact(decision.reply))
        return keep(self._memo, key, outcome, self.cache_limit)

    def _command_key(self, state: CheckState, action: Action) -> _CommandKey:
        """What the command of a worker's or an operator's action is made from."""
        label, slot = action.label, action.slot
        if label == "claim":
            return (label, slot, action.worker, None, self.claim_request(state, action.worker))
        if label == "claim_again" and action.arg == BORROWED_REQUEST:
            w = self.workload(state.docs[slot])
            assert w is not None
            assert w.current_claim is not None
            made = claim_request_of(w, w.current_claim.fencing_token) or ""
            return ("claim", slot, action.worker, None, made)
        if label == "claim_again":
            held = state.workers[action.worker][0]
            assert held is not None
            w = self.workload(state.docs[slot])
            assert w is not None
            made = claim_request_of(w, held[3]) or ""
            arg = {"same": made, "before": made[:-1], "after": made + "+"}[action.arg]
            # Its own command (the fence held marks it), built anew.
            return ("claim", slot, action.worker, held, arg)
        if label in _OPERATOR_CALLS:
            if not self.universe.request_ids:
                return (label, slot, -1, None, "")
            document = state.docs[slot]
            assert document is not None
            info = self.abstraction.doc(document)
            if action.arg == REQUEST_AGAIN:
                recorded = _operator_request(info.workload)
                assert recorded is not None
                return (label, slot, -2, None, recorded)
            # A new request id for each call: numbered by the operator's events so far (a
            # fact of the document's class, so every state of the class names the same).
            return (label, slot, -1, None, f"op-{label}-{slot}-{info.operator_events}")
        if label == "admit":
            return (label, slot, -1, None, "")
        if label == "move":
            return (label, slot, -1, None, action.arg)
        if label.startswith("forged_"):
            return self._forged_key(state, action)
        stale = label.startswith("stale_")
        held, lost = state.workers[action.worker]
        hold = lost if stale else held
        assert hold is not None
        arg = action.arg
        if label == "checkpoint" and arg:
            assert arg in CHECKPOINT_VARIANTS, arg
            # The sequence the worker names: what it knows of the checkpoints
            # recorded (its claim's reply lists them, and it recorded the rest).
            w = self.workload(state.docs[slot])
            assert w is not None
            arg = str(len(w.checkpoints) + (1 if arg == "next" else 0))
        elif label == "stale_complete" and arg:
            assert arg in (REUSED_RESULT, OTHER_OUTPUT), arg
            w = self.workload(state.docs[slot])
            assert w is not None
            assert w.result is not None
            marker = f"{OTHER_OUTPUT}:" if arg == OTHER_OUTPUT else ""
            arg = marker + w.result.result_id
        # A call sent again is a command of its own (-2), built anew: the core
        # must recognise it by its values, not as the very object it answered.
        return (called(label), slot, -2 if stale else -1, hold, arg)

    def _forgeable(self, info: DocumentFacts, call: str) -> bool:
        """Does an impostor make `call` on this document (see `_FORGED_CALLS`)?"""
        w = info.workload
        if info.claim_id is not None:
            return call == "heartbeat"
        if not w.attempts or w.current_claim is not None:
            return False
        if call == "complete":
            return w.result is not None
        status = self._forged_status.get(call)
        return status is not None and w.attempts[-1].status == status

    def _forged_key(self, state: CheckState, action: Action) -> _CommandKey:
        """An impostor's call: a fence forged from the one its document shows (see
        `FORGED_VARIANTS`)."""
        slot, form = action.slot, action.arg
        w = self.workload(state.docs[slot])
        assert w is not None
        claim = w.current_claim
        if claim is not None:
            claim_id, worker, token = claim.claim_id, claim.worker_id, claim.fencing_token
        else:
            last = w.attempts[-1]
            claim_id, worker, token = last.claim_id, last.worker_id, last.fencing_token
        if form in _IMPOSTORS:
            worker = _IMPOSTORS[form]
        else:
            assert form in ("token<", "token>"), form
            token += 1 if form == "token>" else -1
        base = called(action.label)
        # A completion names the recorded result id where there is one; a failure
        # report is the first form a worker reports.
        arg = ""
        if base == "complete" and w.result is not None:
            arg = w.result.result_id
        elif base == "fail":
            arg = FAIL_VARIANTS[0]
        return (base, slot, -3, (slot, claim_id, worker, token), arg)

    def _command(self, state: CheckState, action: Action) -> Command:
        """The command a worker's or an operator's action sends in `state`."""
        return self._command_for(self._command_key(state, action))

    def _command_for(self, key: _CommandKey) -> Command:
        command = self._commands.get(key)
        if command is None:
            command = self._commands[key] = self._make_command(key)
        return command

    def _make_command(self, key: _CommandKey) -> Command:
        base, slot, worker, hold, arg = key
        wid = self.ids[slot]
        # A request id is text of its own, as a caller sending it again builds it.
        request = _own_text(arg) if arg else None
        if base == "claim":
            return ClaimCommand(
                workload_id=wid,
                worker_id=_own_text(worker_name(worker)),
                capabilities=(CAPABILITY,),
                lease_ms=self.universe.lease_ms,
                request_id=request,
            )
        if base == "cancel":
            return CancelCommand(workload_id=wid, actor="operator", request_id=request)
        if base == "timeout":
            return TimeoutCommand(workload_id=wid, actor="operator", request_id=request)
        if base == "retry":
            return RetryCommand(workload_id=wid, actor="operator", request_id=request)
        if base == "admit":
            return AdmitCommand(request=self.requests[slot])
        if base == "move":
            actor = dict(self.moves)[arg]
            return OperatorCommand(operation=arg, workload_id=wid, actor=actor)
        if base == "recover":
            return RecoverCommand(workload_id=wid)
        if base == "enforce":
            return EnforceDeadlineCommand(workload_id=wid)
        assert hold is not None
        fence = Fence(claim_id=hold[1], worker_id=_own_text(hold[2]), token=hold[3])
        if base == "start":
            return StartCommand(workload_id=wid, fence=fence)
        if base == "heartbeat":
            return HeartbeatCommand(workload_id=wid, fence=fence, extend_ms=self.universe.lease_ms)
        if base == "execution_context":
            prefix = self.spec.secrets.reference_prefix
            named = {"reference": f"{prefix}db", "bare": prefix, "other": "vault:db"}
            refs = (named[arg],) if arg else ()
            return ExecutionContextCommand(workload_id=wid, fence=fence, secret_references=refs)
        if base == "checkpoint":
            return CheckpointCommand(
                workload_id=wid,
                fence=fence,
                state=_CHECKPOINT_STATE,
                sequence=int(arg) if arg else None,
            )
        if base == "complete":
            # Under a recorded result id (`arg`), or with another output after its marker.
            recorded = arg.removeprefix(f"{OTHER_OUTPUT}:")
            return CompleteCommand(
                workload_id=wid,
                fence=fence,
                result_id=recorded or f"result-{slot}-{fence.worker_id}-{fence.token}",
                output={"ok": recorded == arg},
            )
        if base == "fail":
            variant, _, other = arg.partition("+")
            kind, effect = _FAIL_VARIANTS[variant]
            return FailCommand(
                workload_id=wid,
                fence=fence,
                kind=kind,
                # Another error text, one that sorts before the first ("failed").
                error="failed" if not other else "another failure",
                effect="unknown" if effect == "unknown" else "none",
            )
        if base == "confirm_cancel":
            return ConfirmCancelCommand(workload_id=wid, fence=fence)
        raise AssertionError(f"no command for {base}")

    def _after_worker_call(
        self,
        workers: tuple[WorkerHold, ...],
        docs: tuple[str | None, ...],
        action: Action,
        refusal: str | None,
        document: str | None,
    ) -> tuple[WorkerHold, ...]:
        """A worker keeps its fence while its call succeeds, and lets it go when refused or done."""
        if action.worker < 0 or action.label.startswith("stale_"):
            return workers
        held, lost = workers[action.worker]
        if action.label == "claim":
            if refusal is None and document is not None:
                claim = self.workload(document)
                assert claim is not None
                assert claim.current_claim is not None
                c = claim.current_claim
                hold = (action.slot, c.claim_id, c.worker_id, c.fencing_token)
                return _with(workers, action.worker, (hold, lost))
            return workers
        if held is None:
            return workers
        current = docs[held[0]]
        still = current is not None and self.abstraction.doc(current).claim_id == held[1]
        if refusal in _CLAIM_GONE or not still:
            return _with(workers, action.worker, (None, held))
        return workers

    def _store(self, docs: tuple[str | None, ...]) -> MemoryStore:
        store = MemoryStore()
        for slot, document in enumerate(docs):
            if document is None:
                continue
            index = self.abstraction.doc(document).index
            store.write(self.ids[slot], document, index, None, self._seed_audits[slot])
        return store

    def _store_step(self, state: CheckState, action: Action) -> Step:
        key = (state.docs, action.label, action.worker, state.now)
        cached = self._store_memo.get(key)
        if cached is None:
            cached = keep(
                self._store_memo, key, self._run_store_step(state, action), self.cache_limit
            )
        docs, refusal, hold, changed = cached
        # What a sweep's reply says it changed (the slots, in order); a claim says nothing here.
        reply = None if action.label == "claim_next" else ("changed", changed)
        if hold is None and docs == state.docs:
            return Step(state, refusal, (), (), reply=reply)
        wrote = tuple(s for s in range(len(docs)) if docs[s] != state.docs[s])
        pending = state.pending
        if pending is not None and pending.slot in wrote:
            pending = Pending(pending.slot, pending.document, pending.refusal, True)
        workers = state.workers
        if hold is not None:
            _, lost = workers[action.worker]
            workers = _with(workers, action.worker, (hold, lost))
        next_state = CheckState(state.now, docs, workers, pending, state.crashes, state.prepares)
        changes = tuple((s, state.docs[s], docs[s]) for s in wrote)
        return Step(next_state, refusal, wrote, changes, reply=reply)

    def _run_store_step(
        self, state: CheckState, action: Action
    ) -> tuple[tuple[str | None, ...], str | None, tuple[int, str, str, int] | None, str]:
        spare = self._spare_store
        store = (
            spare[1] if spare is not None and spare[0] == state.docs else self._store(state.docs)
        )
        self._spare_store = None
        authority = self.authority_cls(store, grants=_VERIFIER, spec=self.spec)
        refusal: str | None = None
        claimed: Claim | None = None
        changed: list[str] = []
        try:
            if action.label == "claim_next":
                claimed = authority.claim_next(
                    TENANT,
                    APPLICATION,
                    worker_name(action.worker),
                    (CAPABILITY,),
                    state.now,
                    self.universe.lease_ms,
                    request_id=self.claim_request(state, action.worker) or None,
                )
            elif action.label == "recover_expired":
                changed = authority.recover_expired(state.now)
            else:
                changed = authority.enforce_deadlines(state.now)
        except errors.WorkloadError as exc:
            refusal = exc.code
        except Exception as exc:  # noqa: BLE001 - a core that crashes is a finding, not the end
            refusal = raised(exc)
        docs: list[str | None] = []
        untouched = True
        for slot, before in enumerate(state.docs):
            current = store.read(self.ids[slot])
            docs.append(current.document if current is not None else before)
            if (current is None) != (before is None) or (
                current is not None and current.version != 1
            ):
                untouched = False
        if untouched:
            # Nothing was written: the store still holds exactly the state's
            # documents, and the state's other store steps can run on it.
            self._spare_store = (state.docs, store)
        hold = None
        if claimed is not None:
            hold = (
                self.ids.index(claimed.workload_id),
                claimed.claim_id,
                claimed.worker_id,
                claimed.fencing_token,
            )
        slots = ",".join(str(self.ids.index(key)) for key in changed if key in self.ids)
        return tuple(docs), refusal, hold, slots

    def _prepare(self, state: CheckState, action: Action) -> Step:
        label = action.label.removeprefix("prepare_")
        slot = action.slot
        key: _CommandKey
        if label in ("recover", "enforce"):
            key = (label, slot, -1, None, "")
        else:
            key = self._command_key(state, replace(action, label="complete"))
        document, refusal, _ = self._decided(state.docs[slot], key, state.now)
        if document is None:
            # A prepared call that would write nothing has no race to lose.
            return Step(state, refusal, (), noop=True)
        pending = Pending(slot=slot, document=document, refusal=refusal)
        prepared = CheckState(
            state.now, state.docs, state.workers, pending, state.crashes, state.prepares + 1
        )
        return Step(prepared, None, ())

    def _commit(self, state: CheckState) -> Step:
        pending = state.pending
        assert pending is not None
        cleared = CheckState(
            state.now, state.docs, state.workers, None, state.crashes, state.prepares
        )
        if pending.document is None:
            return Step(cleared, pending.refusal, ())
        if pending.stale and self.commit_checks_version:
            return Step(cleared, errors.CONFLICT, ())
        docs = list(state.docs)
        before = docs[pending.slot]
        docs[pending.slot] = pending.document
        return Step(
            CheckState(state.now, tuple(docs), state.workers, None, state.crashes, state.prepares),
            pending.refusal,
            (pending.slot,),
            ((pending.slot, before, pending.document),),
        )


def claim_request_of(w: Workload, token: int) -> str | None:
    """The request id the claim of fence `token` was made with, as its event records it."""
    for event in reversed(w.execution_history):
        if event.evidence.get("fencing_token") == str(token):
            return event.evidence.get("request_id")
    return None


def _own_text(text: str) -> str:
    """`text` as a string object of its own, never one a parsed document holds.

    pydantic keeps one object per parsed string, so an id taken from a document
    and the same id in the document the core reads would be the very same
    object: the core must compare ids by value, and an `is` would pass unseen.
    """
    return text.encode().decode()


def _operator_request(w: Workload) -> str | None:
    """The request id of the operator's last call recorded on `w`, or None."""
    for event in reversed(w.execution_history):
        if "request_operation" in event.evidence:
            return event.evidence.get("request_id")
    return None


def _with(workers: tuple[WorkerHold, ...], index: int, hold: WorkerHold) -> tuple[WorkerHold, ...]:
    """`workers` with worker `index` holding `hold`."""
    return (*workers[:index], hold, *workers[index + 1 :])
