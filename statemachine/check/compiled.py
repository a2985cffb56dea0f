"""The compiled model: the universe as lookups over tuples of small integers.

A compiled state is a tuple of numbers: for each workload the number of its
document's *class* (its projection at the state's instant, as
`abstraction.py` computes it, with what the actions read beside it: the
operator's events, the fencing token, the facts of every fence its attempts
handed out, the instants ahead where something changes), for each worker the
numbers of the fence it holds and of the last one it lost, the racing
writer's pending write, and the crash and prepare counters. The instant
itself travels beside the tuple (only the time horizon reads it), as it does
beside the reference model's key.

The transitions are tables, one per group of actions, keyed by exactly the
numbers a group reads: a worker's calls by its fences and the classes of the
documents they name; the calls on one document (the operator's, the moves, a
repeated admission, an impostor's) by that document's class alone, and
whether the operator has calls left; the sweeps by every document's class;
the racing writer by its pending write, the fences and the
classes; a move of the clock by the classes and the pending write. Each
entry lists the group's enabled actions in the reference order with, for
each, the numbers it writes, the code it is refused with and what it shows
(edges taken, rules deciding, step properties broken).

**Where the tables come from.** None of them is written by hand. The
enabled actions come from the universe's offer (`Model.actions`, which reads
the spec's transition table and operations table); each outcome is asked of
the real core (`decide`, and a real `Authority` over a `MemoryStore` for the
scheduler and the sweeps, through `Model.step`) once per distinct key, at a
concrete state with those numbers, and kept: an *oracle* table generated
from the spec and the core, so an extended spec (pause, approval, claim
starts) is compiled the same way. An outcome that writes nothing is asked
once per *reference key* of what its group reads, not per class, and shared
(see `CompiledModel._compile`). A concrete state is rebuilt on demand by
replaying the path that reached it through `Model.step` (the last few are
kept). Every rebuilt state is held to the compiled one (its tuple and its
key must be equal); a difference is a `RefinementError` with the trace.
`refinement.py` holds the tables to the real `Authority` on a real store.

**Helper processes** (`Helpers`, `check_compiled(processes=N)`) ask the core for a
level's missing entries in parallel: the exploration finds them as it finds the level's
states (`look_ahead`) and keeps their answers in that order before exploring it
(`settle`), so the tables are those one process fills.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from workwarden.statemachine.check.abstraction import keep, state_key
from workwarden.statemachine.check.checker import (
    StepFindings,
    state_violations,
    step_findings,
    with_spec_refinement,
)
from workwarden.statemachine.check.state import CheckState
from workwarden.statemachine.check.universe import (
    DOC_PHASES,
    DOC_PHASES_BEFORE_SWEEPS,
    SWEEPS,
    Action,
    Model,
    Step,
)
from workwarden.statemachine.properties.coverage import proceeding_rules
from workwarden.statemachine.properties.operations import operation_roles

__all__ = [
    "COMPILED_CACHE_LIMIT",
    "ClassFacts",
    "CompiledModel",
    "HelperStopped",
    "Helpers",
    "Outcome",
    "Raw",
    "RefinementError",
    "Table",
    "can_fork",
]

#: The number of an absent part (no document, no fence, no pending write).
NONE = -1

#: How many rebuilt concrete states the model keeps (they share their documents).
CONCRETE_LIMIT = 4096

#: The cache limit of the reference model in a helper process (`Helpers`).
HELPER_CACHE_LIMIT = 20_000

#: The cache limit of the reference model a compiled model asks (`Model(cache_limit=...)`):
#: it is asked only where a table lacks an entry, so small caches serve it (on the
#: default universe 1,000 explores as fast as 20,000, in two thirds of the memory).
COMPILED_CACHE_LIMIT = 1_000


class RefinementError(Exception):
    """The compiled model and the real core disagree on a step (see `refinement.py`)."""

    def __init__(self, message: str, trace: tuple[dict[str, Any], ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.trace = trace


@dataclass(frozen=True, slots=True)
class ClassFacts:
    """What the compiled model reads of one document class.

    `numbers` are the numbers the reference key gives the class's projection
    with its workers renamed by each permutation (the first its own; see
    `Abstraction.numbered`); `marks` are the
    instants ahead, relative to now, where something can change for it;
    `operator_events` how many of the operator's calls its document records;
    `document` and `at` are the first document seen in the class and the
    instant it was seen at (the class's representative); the document is
    kept compressed (`packed`), for a universe has thousands of classes and
    it is read only when an entry is compiled.
    """

    slot: int
    state: str
    terminal: bool
    marks: tuple[int, ...]
    operator_events: int
    numbers: tuple[int, ...]
    packed: bytes
    at: int

    @property
    def document(self) -> str:
        """The class's representative document."""
        return zlib.decompress(self.packed).decode("utf-8")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One enabled action of a group and what it does.

    `patch` is the (position, number) pairs it writes into the compiled
    state; `wrote` the workloads whose documents it wrote (a write to the
    slot of a pending write makes that write stale); `cut` that the bounds
    cut it off; `noop` that it is not a transition at all (a prepared call
    that writes nothing); `rel` for a move of the clock, how far ahead it
    goes.
    """

    action: Action
    patch: tuple[tuple[int, int], ...]
    refusal: str | None
    wrote: tuple[int, ...]
    findings: StepFindings | None
    cut: bool = False
    noop: bool = False
    rel: int = 0


@dataclass(frozen=True, slots=True)
class Raw:
    """What the reference model says of one action at a concrete state, before numbering:
    the state it leads to (None: the same), its refusal, what it wrote, what it showed,
    and whether the bounds cut it off or it is no transition at all. A process helping
    an exploration (`Helpers`) answers these; the exploring process numbers them."""

    action: Action
    after: CheckState | None
    refusal: str | None
    wrote: tuple[int, ...]
    findings: StepFindings | None
    cut: bool = False
    noop: bool = False
    moved: Delta | None = None
    """From a helper process, in place of `after`: how it differs from the state asked at."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its fields: a helper process sends one for every call it is asked.
        fields = (self.action, self.after, self.refusal, self.wrote, self.findings)
        return (Raw, (*fields, self.cut, self.noop, self.moved))


Delta = tuple[
    tuple[tuple[int, str | None], ...],
    tuple[Any, ...],
    Any,
    int,
    int,
    int,
    tuple[tuple[int, Any], ...],
]
"""A concrete state as a helper process sends it, as what differs from one the exploring
process holds: the documents changed (slot, text), the workers, pending write, crashes,
prepares and instant, and `CompiledModel.describe` of each document changed, by slot (-1:
the pending write's), so that the exploring process numbers them without reading them.
(A few hundred bytes, where a whole state is kilobytes.)"""

Description = tuple[tuple[Any, ...], tuple[Any, ...]]
"""What makes a document's class, and the facts read of it (`CompiledModel.describe`)."""

Table = dict[tuple[Any, ...], tuple[Outcome, ...]]
"""A group's table: its key, the numbers it reads, to its outcomes in order."""

Phases = tuple[tuple[Outcome, ...], ...]
"""The outcomes of the calls on one document, phase by phase (see `Model.doc_offers`)."""

#: The groups an action falls in: a worker's calls through the fence it holds
#: (or its claims), its calls through the fence it lost, the sweeps (which read
#: every document), the racing writer's, the clock's, and the calls on one
#: document alone (the operator's, the spec's moves, a repeated admission, an
#: impostor's).
WORKER, STALE, DOCS, RACER, CLOCK, ONE_DOC = 0, 1, 2, 3, 4, 5

#: The sweeps: the only calls on the documents that read all of them.
_SWEEPS = frozenset(action.label for action in SWEEPS)


#: A move of the clock as a table keeps it (its instant is the state's plus `rel`).
_CLOCK = Action("jump", "clock")


def group_of(action: Action) -> int:
    """The group an action of the universe falls in."""
    label = action.label
    if label == "jump":
        return CLOCK
    if label == "commit" or label.startswith("prepare_"):
        return RACER
    if action.worker >= 0:
        return STALE if label.startswith("stale_") else WORKER
    return DOCS if label in _SWEEPS else ONE_DOC


class CompiledModel:
    """A universe's model compiled into tables over small integers (see the module).

    `model` is the reference model it is compiled from (its `decide_fn` and
    `authority_cls` are the core asked). `mistake`, for the refinement
    check's own tests only, rewrites each outcome as it is compiled: a
    deliberately wrong compiled rule.
    """

    def __init__(
        self,
        model: Model,
        *,
        mistake: Callable[[Outcome], Outcome] | None = None,
        share_inert: bool = True,
        verify_shared: bool = False,
    ) -> None:
        self.model = model
        self.share_inert = share_inert
        self.verify_shared = verify_shared
        self.spec = model.spec
        self.universe = model.universe
        self.mistake = mistake
        self.abstraction = model.abstraction
        self.slots = len(model.ids)
        self.workers = len(model.worker_names)
        n, w = self.slots, self.workers
        #: Positions in a compiled state.
        self.held_at = tuple(n + 2 * k for k in range(w))
        self.lost_at = tuple(n + 2 * k + 1 for k in range(w))
        self.pending_at = n + 2 * w
        self.crashes_at = self.pending_at + 1
        self.prepares_at = self.pending_at + 2
        # The workers renamed in every order, as the reference key renames them.
        self._placed = model.abstraction.placed
        self._nothing = (NONE,) * len(self._placed)
        # Interned parts.
        self.classes: list[ClassFacts] = []
        self._class_numbers: dict[tuple[Any, ...], int] = {}
        self._class_of: dict[tuple[str, int, int], int] = {}
        #: Descriptions of documents a helper process sent (see `describe`), while its
        #: answers are numbered.
        self._told: dict[tuple[str, int, int], Description] = {}
        self.holds: list[tuple[int, str, str, int]] = []
        self._hold_numbers: dict[tuple[int, str, str, int], int] = {}
        self.pendings: list[tuple[int, int, str | None, bool]] = []
        self._pending_numbers: dict[tuple[int, int, str | None, bool], int] = {}
        self._stale: dict[int, int] = {}
        self._hold_key: dict[tuple[int, int], tuple[int, ...]] = {}
        self._pending_key: dict[int, tuple[int, ...]] = {}
        self._violations: dict[int, list[tuple[str, str]]] = {}
        self._shifts: dict[tuple[int, int], int] = {}
        # The tables.
        self.tables: tuple[Table, ...] = ({}, {}, {}, {}, {})
        #: The calls on one document, by its class and whether the operator has calls left.
        self.one_doc: dict[tuple[int, bool], Phases] = {}
        self.misses = [0, 0, 0, 0, 0, 0]
        #: Inert entries, by what the reference key makes of what a group reads (see `_compile`).
        self._inert: dict[tuple[Any, ...], tuple[Outcome, ...]] = {}
        self._inert_docs: dict[tuple[Any, ...], Phases] = {}
        #: Table entries taken from `_inert`, by group, instead of asked of the core.
        self.shared = [0, 0, 0, 0, 0, 0]
        #: Inert outcomes of single actions, by an entry's shared key and the action.
        self._inert_steps: dict[tuple[Any, ...], dict[Action, Outcome]] = {}
        #: Outcomes taken from `_inert_steps` instead of asked of the core.
        self.shared_steps = 0
        self._outcomes: dict[Outcome, Outcome] = {}
        # With helper processes (`look_ahead`, `settle`): whether the entries a state lacks
        # are being looked for, and the exploration's number of that state; the entries the
        # level being looked ahead at lacks, by group and key; the shared keys one of them
        # is asked for, and those that wait for its answer; the entries not sent yet, and
        # those sent, chunk by chunk, with the handles of their answers.
        self._collecting = False
        self._at = 0
        self._level: dict[tuple[Any, ...], _Request] = {}
        self._claimed: set[tuple[Any, ...]] = set()
        self._later: list[_Request] = []
        self._queue: list[_Request] = []
        self._sent: list[tuple[list[_Request], Any]] = []
        self._concrete: dict[int, CheckState] = {}
        self._proceeds = proceeding_rules(self.spec)
        self._policy_of_actor = operation_roles(self.spec).policy_of_actor
        self._terminal = self.spec.terminal_states
        self._queued = self.spec.roles.queued
        self.initial_concrete = model.initial()
        self.initial = self.compact(self.initial_concrete)

    # -- numbering the parts of a concrete state ---------------------------

    def class_of(self, document: str, now: int, slot: int) -> int:
        """The number of the class of `document` (in workload `slot`) at `now`."""
        key = (document, now, slot)
        known = self._class_of.get(key)
        if known is not None:
            return known
        described = self._told.get(key)
        value, facts = described if described is not None else self.describe(*key)
        number = self._class_numbers.get(value)
        if number is None:
            number = self._class_numbers[value] = len(self.classes)
            self.classes.append(
                ClassFacts(
                    slot=slot,
                    state=facts[0],
                    terminal=facts[1],
                    marks=facts[2],
                    operator_events=facts[3],
                    # Numbered here: the reference key's numbers are this process's.
                    numbers=self.abstraction.numbered(value[1]),
                    packed=zlib.compress(document.encode("utf-8"), 1),
                    at=now,
                )
            )
        return keep(self._class_of, key, number, COMPILED_CACHE_LIMIT)

    def describe(self, document: str, now: int, slot: int) -> Description:
        """What makes the class of `document` (in workload `slot`) at `now` (its projection
        at `now`, with what the actions read beside it), and the facts the model reads of
        it: its state, whether that is terminal, its marks ahead, the operator's calls it
        records. Nothing in it is numbered, so another process may describe a document
        for this one."""
        a = self.abstraction
        info = a.doc(document)
        w = info.workload
        projection = a.projection(document, now)
        fences = tuple(a.fence_facts(document, t.fencing_token) for t in w.attempts)
        marks = tuple(sorted({at - now for at in info.marks if at > now}))
        claim = w.current_claim
        value = (
            slot,
            projection,
            info.operator_events,
            info.moves,
            w.fencing_token,
            None if claim is None else claim.claim_id,
            fences,
            marks,
        )
        facts = (w.state, w.state in self._terminal, marks, info.operator_events)
        return value, facts

    def hold_of(self, hold: tuple[int, str, str, int] | None) -> int:
        """The number of a fence a worker holds (NONE for none)."""
        if hold is None:
            return NONE
        number = self._hold_numbers.get(hold)
        if number is None:
            number = self._hold_numbers[hold] = len(self.holds)
            self.holds.append(hold)
        return number

    def pending_of(self, state: CheckState) -> int:
        """The number of the racing writer's pending write in `state` (NONE for none)."""
        pending = state.pending
        if pending is None:
            return NONE
        document = NONE
        if pending.document is not None:
            document = self.class_of(pending.document, state.now, pending.slot)
        return self._pending((pending.slot, document, pending.refusal, pending.stale))

    def _pending(self, value: tuple[int, int, str | None, bool]) -> int:
        number = self._pending_numbers.get(value)
        if number is None:
            number = self._pending_numbers[value] = len(self.pendings)
            self.pendings.append(value)
        return number

    def stale(self, pending: int) -> int:
        """The number of `pending` once a write to its workload made it stale."""
        known = self._stale.get(pending)
        if known is None:
            slot, document, refusal, _ = self.pendings[pending]
            known = self._stale[pending] = self._pending((slot, document, refusal, True))
        return known

    def compact(self, state: CheckState) -> tuple[int, ...]:
        """The compiled state of a concrete one."""
        out = [
            NONE if d is None else self.class_of(d, state.now, slot)
            for slot, d in enumerate(state.docs)
        ]
        for held, lost in state.workers:
            out.append(self.hold_of(held))
            out.append(self.hold_of(lost))
        out += (self.pending_of(state), state.crashes, state.prepares)
        return tuple(out)

    # -- the key -----------------------------------------------------------

    def _hold_numbers_for(self, hold: int, document: int) -> tuple[int, ...]:
        """The reference key's numbers of what fence `hold` tells, on document class `document`."""
        key = (hold, document)
        known = self._hold_key.get(key)
        if known is None:
            slot, _, _, token = self.holds[hold]
            text = None if document == NONE else self.classes[document].document
            facts = (slot, self.abstraction.fence_facts(text, token))
            known = self._hold_key[key] = self.abstraction.numbered(facts)
        return known

    def _pending_numbers_for(self, pending: int) -> tuple[int, ...]:
        known = self._pending_key.get(pending)
        if known is None:
            slot, document, refusal, stale = self.pendings[pending]
            view = self._nothing if document == NONE else self.classes[document].numbers
            known = self._pending_key[pending] = self.abstraction.pending_numbers(
                slot, refusal, stale, view
            )
        return known

    def key(self, c: tuple[int, ...]) -> tuple[int, ...]:
        """The compiled state's key: the reference model's key of any state it stands for."""
        n = self.slots
        classes = self.classes
        nothing = self._nothing
        docs = [nothing if d < 0 else classes[d].numbers for d in c[:n]]
        holds: list[tuple[int, ...]] = []
        hold_key = self._hold_key
        all_holds = self.holds
        for h in c[n : self.pending_at]:
            if h < 0:
                holds.append(nothing)
            else:
                document = c[all_holds[h][0]]
                holds.append(hold_key.get((h, document)) or self._hold_numbers_for(h, document))
        p = c[self.pending_at]
        pending = nothing if p < 0 else self._pending_numbers_for(p)
        crashes, prepares = c[self.crashes_at], c[self.prepares_at]
        return min(
            state_key(i, placed, docs, holds, pending, crashes, prepares)
            for i, placed in enumerate(self._placed)
        )

    # -- facts of a compiled state ----------------------------------------

    def all_terminal(self, c: tuple[int, ...]) -> bool:
        """Is every workload of the compiled state in a terminal state?"""
        classes = self.classes
        return all(d < 0 or classes[d].terminal for d in c[: self.slots])

    def class_violations(self, d: int) -> list[tuple[str, str]]:
        """The properties the representative document of class `d` breaks (worked out once)."""
        known = self._violations.get(d)
        if known is None:
            w = self.abstraction.workload(self.classes[d].document)
            assert w is not None
            known = self._violations[d] = state_violations(self.spec, w)
        return known

    # -- the tables --------------------------------------------------------

    def outcomes(self, c: tuple[int, ...], concrete: Callable[[], CheckState]) -> Iterator[Outcome]:
        """Every enabled action of compiled state `c`, in the reference order, with its outcome.

        `concrete` rebuilds a concrete state `c` stands for; it is called only
        when a table lacks an entry.
        """
        n = self.slots
        docs = c[:n]
        crashes = c[self.crashes_at]
        tables = self.tables
        holds = self.holds
        worker_table = tables[WORKER]
        stale_table = tables[STALE]
        for k in range(self.workers):
            held = c[self.held_at[k]]
            lost = c[self.lost_at[k]]
            # A worker's own calls read its fence, the document it names and the
            # crash budget (its claims, every document); they write its fences.
            if held < 0:
                key: tuple[Any, ...] = (k, held, crashes, docs)
            else:
                key = (k, held, crashes, c[holds[held][0]])
            found = worker_table.get(key)
            if found is None:
                found = self._compile(WORKER, key, c, concrete, k)
            yield from found
            if lost >= 0:
                key = (k, lost, c[holds[lost][0]])
                found = stale_table.get(key)
                if found is None:
                    found = self._compile(STALE, key, c, concrete, k)
                yield from found
        # The calls on one document read its class and, for the operator's, whether
        # the universe's budget of them (counted over every document) has some left.
        classes = self.classes
        used = sum(classes[d].operator_events for d in docs if d >= 0)
        left = used < self.universe.operator_actions
        one_doc = self.one_doc
        phases: list[Phases] = []
        for slot, d in enumerate(docs):
            if d >= 0:
                known = one_doc.get((d, left))
                if known is None:
                    known = self._compile_one_doc((d, left), slot, c, concrete)
                phases.append(known)
        for phase in range(DOC_PHASES_BEFORE_SWEEPS):
            for calls in phases:
                yield from calls[phase]
        found = tables[DOCS].get(docs)
        if found is None:
            found = self._compile(DOCS, docs, c, concrete)
        yield from found
        for phase in range(DOC_PHASES_BEFORE_SWEEPS, DOC_PHASES):
            for calls in phases:
                yield from calls[phase]
        if self.universe.racer:
            # Its commit reads the pending write and the document it lands on;
            # its prepares read the documents and the fences held.
            pending = c[self.pending_at]
            if pending >= 0:
                key = (pending, c[self.pendings[pending][0]])
            else:
                key = (c[self.prepares_at], docs, *(c[at] for at in self.held_at))
            found = tables[RACER].get(key)
            if found is None:
                found = self._compile(RACER, key, c, concrete)
            yield from found
        key = (docs, c[self.pending_at])
        found = tables[CLOCK].get(key)
        if found is None:
            found = self._compile_clock(key)
        yield from found

    def shifted(self, d: int, delta: int) -> int:
        """The class a document of class `d` is in `delta` milliseconds later.

        Asked of the class's representative document: a projection is
        relative to its instant, so every document of the class moves to the
        same class.
        """
        key = (d, delta)
        known = self._shifts.get(key)
        if known is None:
            facts = self.classes[d]
            known = self._shifts[key] = self.class_of(facts.document, facts.at + delta, facts.slot)
        return known

    def _compile_clock(self, key: tuple[Any, ...]) -> tuple[Outcome, ...]:
        """The moves of the clock: to the nearest instant ahead and the millisecond before it.

        The instants are the classes' marks (from the index fields and the
        deadline table: lease expiries, deadlines, eligibility), as
        `Model.actions` offers them.
        """
        self.misses[CLOCK] += 1
        docs, pending = key
        ahead = [mark for d in docs if d >= 0 for mark in self.classes[d].marks]
        out: list[Outcome] = []
        if ahead:
            nearest = min(ahead)
            for rel in (nearest - 1, nearest):
                if rel <= 0:
                    continue
                patch = [
                    (slot, moved)
                    for slot, d in enumerate(docs)
                    if d >= 0 and (moved := self.shifted(d, rel)) != d
                ]
                if pending >= 0:
                    slot, document, refusal, stale = self.pendings[pending]
                    if document >= 0:
                        moved_pending = self._pending(
                            (slot, self.shifted(document, rel), refusal, stale)
                        )
                        if moved_pending != pending:
                            patch.append((self.pending_at, moved_pending))
                out.append(Outcome(_CLOCK, tuple(patch), None, (), None, rel=rel))
        found = tuple(out)
        self.tables[CLOCK][key] = found
        return found

    def apply(self, c: tuple[int, ...], outcome: Outcome) -> tuple[int, ...]:
        """The compiled state after `outcome` in `c` (`c` itself when nothing changes)."""
        patch = outcome.patch
        pending = c[self.pending_at]
        stale = (
            pending >= 0
            and not self.pendings[pending][3]
            and self.pendings[pending][0] in outcome.wrote
            and group_of(outcome.action) != RACER
        )
        if not patch and not stale:
            return c
        out = list(c)
        for position, number in patch:
            out[position] = number
        if stale:
            out[self.pending_at] = self.stale(pending)
        return tuple(out)

    def _asked(
        self,
        group: int,
        c: tuple[int, ...],
        concrete: Callable[[], CheckState],
        offered: Callable[[CheckState], Iterable[Action]],
        coarse: tuple[Any, ...] | None = None,
    ) -> Iterator[Outcome]:
        """The outcomes of the actions `offered` at a concrete state of `c` (the group's,
        in the reference order), asked of the reference model (a table lacks them: a miss).

        Where the group's entry has a key to share inert outcomes by (`coarse`,
        see `_compile`), an action whose outcome there is known to write
        nothing is not asked again: its outcome is shared, action by action.
        """
        self.misses[group] += 1
        state = concrete()
        inert = self._inert_steps.get(coarse) if coarse is not None else None
        for action in offered(state):
            if inert is not None:
                shared = inert.get(action)
                if shared is not None:
                    self.shared_steps += 1
                    if self.verify_shared:
                        self._verified(shared, self._asked_one(group, c, state, action), c)
                    yield shared
                    continue
            outcome = self._asked_one(group, c, state, action)
            noted = self._noted(coarse, outcome)
            if noted is not None:
                inert = noted
            yield outcome

    def _asked_one(
        self, group: int, c: tuple[int, ...], state: CheckState, action: Action
    ) -> Outcome:
        return self._as_compiled(self._outcome(group, c, state, action))

    def _as_compiled(self, outcome: Outcome) -> Outcome:
        """`outcome` as the tables keep it (rewritten by `mistake`, in its tests)."""
        return outcome if self.mistake is None else self.mistake(outcome)

    def _noted(
        self, coarse: tuple[Any, ...] | None, outcome: Outcome
    ) -> dict[Action, Outcome] | None:
        """Note `outcome`, asked in an entry shared by `coarse`, among that key's outcomes
        that write nothing, if it writes nothing; those outcomes (None: not noted)."""
        if coarse is None or outcome.patch or outcome.wrote:
            return None
        inert = self._inert_steps.setdefault(coarse, {})
        inert[outcome.action] = outcome
        return inert

    def _table(self, group: int) -> dict[Any, Any]:
        """Where `group`'s entries are kept (the calls on one document: phase by phase)."""
        return self.one_doc if group == ONE_DOC else self.tables[group]

    def _kept(
        self, group: int, key: tuple[Any, ...], found: Any, coarse: tuple[Any, ...] | None
    ) -> None:
        """Keep `found`, asked, as `group`'s entry `key`; an entry that writes nothing is also
        kept under `coarse`, to share (see `_compile`)."""
        self._table(group)[key] = found
        if coarse is None:
            return
        if group == ONE_DOC:
            if all(_inert(phase) for phase in found):
                self._inert_docs.setdefault(coarse, found)
        elif _inert(found):
            self._inert.setdefault(coarse, found)

    @staticmethod
    def _verified(shared: Any, asked: Any, c: tuple[int, ...]) -> None:
        """Refuse a shared inert outcome (or entry) the core answers otherwise at `c`."""
        if shared != asked:
            raise RefinementError(
                f"an outcome shared between states the reference key reads alike differs "
                f"from the core's at {c}: shared {shared}, asked {asked}"
            )

    def _compile(
        self,
        group: int,
        key: tuple[Any, ...],
        c: tuple[int, ...],
        concrete: Callable[[], CheckState],
        worker: int = -1,
    ) -> tuple[Outcome, ...]:
        """A group's outcomes at `c`: shared from an inert entry, or asked of the reference
        model at a concrete state of `c`.

        An entry is *inert* when none of its actions writes (refusals, calls
        that find nothing to do): it names no class, so it holds for every
        state whose reference key reads alike where the group reads (the
        numbers `_coarse` gives). The reference checker takes states with
        one key for one state; this takes the parts of states a group reads
        with one key for one part. An entry that writes names the classes it
        writes, which differ across states a key merges, so it is never
        shared. With `verify_shared`, a shared entry is asked of the core as
        well, and a difference is a `RefinementError`.
        """
        coarse = self._coarse(group, key) if self.share_inert else None
        if coarse is not None:
            shared = self._inert.get(coarse)
            if shared is not None:
                self.shared[group] += 1
                if self.verify_shared:
                    self._verified(shared, self._ask(group, c, concrete, worker), c)
                self.tables[group][key] = shared
                return shared
        if self._collecting:
            self._wanted(_Request(group, key, c, self._at, worker, coarse=coarse))
            return ()
        found = self._ask(group, c, concrete, worker, coarse)
        self._kept(group, key, found, coarse)
        return found

    def _ask(
        self,
        group: int,
        c: tuple[int, ...],
        concrete: Callable[[], CheckState],
        worker: int,
        coarse: tuple[Any, ...] | None = None,
    ) -> tuple[Outcome, ...]:
        """The outcomes of `group`'s calls at `c` (`worker`'s, for a worker's groups), asked
        of the reference model in the reference order (see `_offered`)."""
        return tuple(self._asked(group, c, concrete, self._offered(group, worker), coarse))

    def _offered(self, group: int, worker: int) -> Callable[[CheckState], Iterable[Action]]:
        """What `group` offers at a concrete state, in the reference order: a worker's calls
        as `Model.worker_actions` offers them, the sweeps as `SWEEPS`, the racer's among
        every call of the state. (The calls on one document: `_doc_offered`.)"""
        model = self.model
        offered: Callable[[CheckState], Iterable[Action]]
        if group in (WORKER, STALE):

            def offered(state: CheckState) -> Iterator[Action]:
                for action in model.worker_actions(state, model.facts(state), worker):
                    if group_of(action) == group:
                        yield action

        elif group == DOCS:

            def offered(state: CheckState) -> Iterable[Action]:
                return SWEEPS

        else:

            def offered(state: CheckState) -> Iterator[Action]:
                return (action for action in model.actions(state) if group_of(action) == group)

        return offered

    def _doc_offered(
        self, state: CheckState, slot: int, left: bool
    ) -> Iterator[tuple[int, Action]]:
        """The calls on the document of `slot` at a concrete state, each with its phase."""
        document = state.docs[slot]
        assert document is not None
        offers = self.model.doc_offers(slot, self.abstraction.doc(document), left)
        for phase, actions in enumerate(offers):
            for action in actions:
                yield phase, action

    def _coarse(self, group: int, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The reference key's numbers of what `group`'s entry `key` reads, by which inert
        outcomes are shared (None where none are): a worker's calls through the fence
        it holds (the fence's facts on its document, the document, the crash budget),
        an idle worker's claims (every document and the crash budget), a worker's
        calls through the fence it lost (the fence's facts and the document) and the
        sweeps (every document). The racer's entries are not shared, and the clock's
        are not asked of the core."""
        if group == WORKER and key[1] >= 0:
            worker, held, crashes, document = key
            fence = self._hold_numbers_for(held, document)[0]
            return (WORKER, worker, crashes, fence, self._own_number(document))
        if group == WORKER:
            worker, _, crashes, docs = key
            return (WORKER, worker, crashes, *map(self._own_number, docs))
        if group == STALE:
            worker, lost, document = key
            fence = self._hold_numbers_for(lost, document)[0]
            return (STALE, worker, fence, self._own_number(document))
        if group == DOCS:
            return (DOCS, *map(self._own_number, key))
        return None

    def _own_number(self, d: int) -> int:
        """The reference key's number of class `d`'s projection, its workers as named."""
        return NONE if d < 0 else self.classes[d].numbers[0]

    def _compile_one_doc(
        self,
        key: tuple[int, bool],
        slot: int,
        c: tuple[int, ...],
        concrete: Callable[[], CheckState],
    ) -> Phases:
        """The calls on the document of `slot`, phase by phase: shared from an inert entry
        (see `_compile`), or asked of the reference model.

        What these calls read is the document and whether the operator has
        calls left; which calls are offered reads facts of the document the
        reference key may merge (its budgets, its claim), so the shared
        entry's key names the offer as well (`Model.doc_offers`, of the
        class's representative document).
        """
        coarse = None
        if self.share_inert:
            d, left = key
            offers = self.model.doc_offers(
                slot, self.abstraction.doc(self.classes[d].document), left
            )
            coarse = (ONE_DOC, slot, self._own_number(d), left, offers)
            shared = self._inert_docs.get(coarse)
            if shared is not None:
                self.shared[ONE_DOC] += 1
                if self.verify_shared:
                    self._verified(shared, self._ask_one_doc(slot, left, c, concrete), c)
                self.one_doc[key] = shared
                return shared
        if self._collecting:
            self._wanted(_Request(ONE_DOC, key, c, self._at, slot=slot, left=key[1], coarse=coarse))
            return _NO_PHASES
        found = self._ask_one_doc(slot, key[1], c, concrete, coarse)
        self._kept(ONE_DOC, key, found, coarse)
        return found

    def _ask_one_doc(
        self,
        slot: int,
        left: bool,
        c: tuple[int, ...],
        concrete: Callable[[], CheckState],
        coarse: tuple[Any, ...] | None = None,
    ) -> Phases:
        phase_of: dict[Action, int] = {}

        def offered(state: CheckState) -> Iterator[Action]:
            for phase, action in self._doc_offered(state, slot, left):
                phase_of[action] = phase
                yield action

        asked = self._asked(ONE_DOC, c, concrete, offered, coarse)
        return _phased((phase_of[outcome.action], outcome) for outcome in asked)

    # -- asking for a level's entries in other processes ----------------------

    def look_ahead(
        self,
        helpers: Helpers,
        items: Iterable[tuple[tuple[int, ...], int]],
        path_of: PathOf,
    ) -> None:
        """Find the entries the compiled states of `items` (each with its number in the
        exploration, all of the level explored next) lack, and send them to the `helpers`'
        processes as chunks fill; `settle` keeps the answers.

        The entries are found as `outcomes` would find them (an entry shared from an
        inert one is shared here too). The concrete state each is asked at is rebuilt by
        the helper, along the path `path_of` gives. Of the entries one inert entry could
        stand for (the same shared key), the first is sent, the others wait for its
        answer.
        """
        self._collecting = True
        try:
            for c, index in items:
                self._at = index
                for _ in self.outcomes(c, _not_asked):
                    pass
        finally:
            self._collecting = False
        if len(self._queue) >= helpers.chunk:
            self._send(helpers, path_of)

    def settle(self, helpers: Helpers, path_of: PathOf, reached: Reached) -> None:
        """Keep every answer for the level looked ahead at, in the order its entries were
        found (so the tables are the same whatever order the helpers finish in), then share
        or ask the entries that waited; after this, no state of the level lacks an entry."""
        self._send(helpers, path_of)
        self._receive(reached)
        later, self._later = self._later, []
        for request in later:
            if not self._shared_now(request):
                self._queue.append(request)
        self._send(helpers, path_of)
        self._receive(reached)
        self._level.clear()
        self._claimed.clear()

    def _wanted(self, request: _Request) -> None:
        """Note an entry the level looked ahead at lacks (once)."""
        found = (request.group, request.key)
        if found in self._level:
            return
        self._level[found] = request
        coarse = request.coarse
        if coarse is not None:
            if coarse in self._claimed:
                self._later.append(request)
                return
            self._claimed.add(coarse)
        self._queue.append(request)

    def _shared_now(self, request: _Request) -> bool:
        """Share an inert entry that is known now for `request`, if there is one."""
        assert request.coarse is not None
        group = request.group
        inert: dict[tuple[Any, ...], Any] = self._inert_docs if group == ONE_DOC else self._inert
        found = inert.get(request.coarse)
        if found is None:
            return False
        self._table(group)[request.key] = found
        self.shared[group] += 1
        return True

    def _send(self, helpers: Helpers, path_of: PathOf) -> None:
        """Send the entries not sent yet, in chunks, each with the path to the concrete
        state it is asked at (from the nearest state the exploration holds) and the calls
        known to write nothing where it reads alike."""
        queue, self._queue = self._queue, []
        for begin in range(0, len(queue), helpers.chunk):
            chunk = queue[begin : begin + helpers.chunk]
            tasks: list[Task] = []
            for request in chunk:
                start, path = path_of(request.index)
                request.state = start
                coarse = request.coarse
                inert = self._inert_steps.get(coarse) if coarse is not None else None
                known = frozenset(inert) if inert else frozenset()
                tasks.append(
                    (request.group, request.worker, request.slot, request.left, start, path, known)
                )
            self._sent.append((chunk, helpers.ask(tasks)))

    def _receive(self, reached: Reached) -> None:
        """Keep the answers of every chunk sent, in the order sent. Each concrete state a
        helper reached is handed to `reached` first (which holds it to the compiled state
        it stands for, and keeps it)."""
        sent, self._sent = self._sent, []
        for chunk, answers in sent:
            for request, (delta, raws) in zip(chunk, Helpers.answered(answers), strict=True):
                start = request.state
                assert start is not None
                if delta is not None:
                    state, self._told = self._undone(start, delta)
                    try:
                        reached(request.index, request.c, state)
                    finally:
                        self._told = {}
                    request.state = state
                self._install(request, raws)

    def answers(
        self,
        group: int,
        worker: int,
        slot: int,
        left: bool,
        start: CheckState,
        path: tuple[Action, ...],
        known: frozenset[Action] = frozenset(),
    ) -> tuple[Delta | None, list[tuple[int, Raw | Action]]]:
        """What a helper process answers for an entry: the concrete state it is asked at,
        reached from `start` along `path` (as what differs from `start`; None when the path
        is empty), and the group's calls there, each with its phase and what the reference
        model says of it. A call in `known` (its outcome is known to write nothing there)
        is answered by itself, unasked."""
        state = start
        for action in path:
            state = self.take(state, action).state
        if group == ONE_DOC:
            asked: Iterable[tuple[int, Action]] = self._doc_offered(state, slot, left)
        else:
            asked = ((0, action) for action in self._offered(group, worker)(state))
        raws: list[tuple[int, Raw | Action]] = []
        for phase, action in asked:
            if action in known:
                raws.append((phase, action))
                continue
            raw = self._raw(state, action)
            if raw.after is not None:
                raw = replace(raw, after=None, moved=self._delta(state, raw.after))
            raws.append((phase, raw))
        return (self._delta(start, state) if path else None), raws

    def _delta(self, before: CheckState, after: CheckState) -> Delta:
        """`after` as what differs from `before` (see `Delta`)."""
        now = after.now
        changed = tuple(
            (slot, d)
            for slot, d in enumerate(after.docs)
            if d != before.docs[slot] or now != before.now
        )
        told = [(slot, self.describe(d, now, slot)) for slot, d in changed if d is not None]
        pending = after.pending
        if pending is not None and pending.document is not None and pending != before.pending:
            told.append((-1, self.describe(pending.document, now, pending.slot)))
        return (changed, after.workers, pending, after.crashes, after.prepares, now, tuple(told))

    @staticmethod
    def _undone(
        before: CheckState, delta: Delta
    ) -> tuple[CheckState, dict[tuple[str, int, int], Description]]:
        """The state `delta` describes from `before`, and the descriptions it carries by
        document (what `class_of` reads instead of describing them again)."""
        changed, workers, pending, crashes, prepares, now, described = delta
        docs = list(before.docs)
        for slot, d in changed:
            docs[slot] = d
        told: dict[tuple[str, int, int], Description] = {}
        for slot, description in described:
            if slot < 0:
                told[(pending.document, now, pending.slot)] = description
            else:
                told[(docs[slot], now, slot)] = description  # type: ignore[index]
        return CheckState(now, tuple(docs), workers, pending, crashes, prepares), told

    def _install(self, request: _Request, raws: list[tuple[int, Raw | Action]]) -> None:
        """Number a helper's answers for `request` and keep them as its entry."""
        group, coarse = request.group, request.coarse
        self.misses[group] += 1
        outcomes: list[tuple[int, Outcome]] = []
        first = True
        for phase, raw in raws:
            if type(raw) is Action:
                assert coarse is not None
                outcomes.append((phase, self._inert_steps[coarse][raw]))
                self.shared_steps += 1
                continue
            assert type(raw) is Raw
            state = request.state
            assert state is not None
            if first:
                # The state it was asked at compiles to `request.c` (the exploration held it
                # to it when it was kept or reached), so the documents a call leaves alone
                # keep their classes.
                first = False
                for slot, d in enumerate(state.docs):
                    if d is not None:
                        keep(
                            self._class_of,
                            (d, state.now, slot),
                            request.c[slot],
                            COMPILED_CACHE_LIMIT,
                        )
            if raw.moved is not None:
                after, self._told = self._undone(state, raw.moved)
                raw = replace(raw, after=after, moved=None)

            try:
                outcome = self._as_compiled(self._numbered(group, request.c, raw))
            finally:
                self._told = {}
            self._noted(coarse, outcome)
            outcomes.append((phase, outcome))
        found: Any = (
            _phased(outcomes) if group == ONE_DOC else tuple(outcome for _, outcome in outcomes)
        )
        self._kept(group, request.key, found, coarse)

    def _outcome(
        self, group: int, c: tuple[int, ...], state: CheckState, action: Action
    ) -> Outcome:
        if group == CLOCK:
            # Moved without the horizon: whether it cuts depends on the instant only.
            moved = CheckState(
                action.to, state.docs, state.workers, state.pending, state.crashes, state.prepares
            )
            after = self.compact(moved)
            return Outcome(action, _diff(c, after), None, (), None, rel=action.to - state.now)
        return self._numbered(group, c, self._raw(state, action))

    def _raw(self, state: CheckState, action: Action) -> Raw:
        """What the reference model says of `action` at concrete `state`, before numbering."""
        model = self.model
        step = model.step(state, action)
        if step.cut or step.noop:
            return Raw(action, None, step.refusal, (), None, step.cut, step.noop)
        findings = None
        if step.wrote:
            findings = step_findings(
                model, state, action, step, self._proceeds, self._policy_of_actor
            )
        findings = with_spec_refinement(model, state, action, step, findings)
        after = None if step.state is state else step.state
        return Raw(action, after, step.refusal, step.wrote, findings)

    def _numbered(self, group: int, c: tuple[int, ...], raw: Raw) -> Outcome:
        """The outcome `raw` (of an action at a state of `c`) is, in this model's numbers."""
        if raw.cut or raw.noop:
            return Outcome(raw.action, (), raw.refusal, (), None, cut=raw.cut, noop=raw.noop)
        patch: tuple[tuple[int, int], ...] = ()
        if raw.after is not None:
            patch = _diff(c, self.compact(raw.after))
            if group != RACER:
                # The pending write goes stale by the rule `apply` keeps.
                patch = tuple(p for p in patch if p[0] != self.pending_at)
        return self._interned(Outcome(raw.action, patch, raw.refusal, raw.wrote, raw.findings))

    def _interned(self, outcome: Outcome) -> Outcome:
        """One object for equal outcomes: many entries repeat one (a refusal, a replay)."""
        return self._outcomes.setdefault(outcome, outcome)

    def take(self, state: CheckState, action: Action) -> Step:
        """The reference model's step (for rebuilding concrete states)."""
        return self.model.step(state, action)


def _phased(outcomes: Iterable[tuple[int, Outcome]]) -> Phases:
    """The calls on one document, each with its phase, as the table keeps them."""
    phases: list[list[Outcome]] = [[] for _ in range(DOC_PHASES)]
    for phase, outcome in outcomes:
        phases[phase].append(outcome)
    return tuple(tuple(phase) for phase in phases)


def _inert(outcomes: tuple[Outcome, ...]) -> bool:
    """Does none of `outcomes` write (no number changes, no document is written)?"""
    return all(not o.patch and not o.wrote for o in outcomes)


def _diff(before: tuple[int, ...], after: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((i, v) for i, (u, v) in enumerate(zip(before, after, strict=True)) if u != v)


_NO_PHASES: Phases = ((),) * DOC_PHASES


def _not_asked() -> CheckState:
    raise AssertionError("an entry is only looked for here, never asked")


@dataclass(slots=True)
class _Request:
    """An entry a level lacks: its group and key, the compiled state it was missed at (and
    that state's number in the exploration), and what its group's offer needs."""

    group: int
    key: tuple[Any, ...]
    c: tuple[int, ...]
    index: int
    worker: int = -1
    slot: int = -1
    left: bool = False
    coarse: tuple[Any, ...] | None = None
    state: CheckState | None = None
    """The concrete state it is asked at, once rebuilt."""


#: The compiled model a helper process answers for (set before its processes are forked).
_HELPED: CompiledModel | None = None
#: The process that forked the helpers (theirs to watch: `_exit_when_orphaned`).
_HELPED_BY = 0


Task = tuple[int, int, int, bool, CheckState, tuple[Action, ...], frozenset[Action]]
"""An entry a helper is asked for: its group, worker, slot, whether the operator has calls
left, a concrete state and the path from it to the state the entry is asked at, and the
calls known to write nothing there."""

PathOf = Callable[[int], tuple[CheckState, tuple[Action, ...]]]
"""The exploration's nearest concrete state before its state number N, and the path on."""

Reached = Callable[[int, tuple[int, ...], CheckState], None]
"""Told that a concrete state was reached for the exploration's state number N, compiled C."""


#: How often, in seconds, a helper process looks whether the exploring process is gone.
HELPER_ORPHAN_POLL_S = 0.5


def _exit_when_orphaned(parent: int) -> None:
    """In a helper process: end it once the exploring process is gone (killed outright,
    by SIGKILL or the OOM killer, it shuts no helper down), so no helper is left blocked
    forever on a pipe nobody reads."""
    while os.getppid() == parent:
        time.sleep(HELPER_ORPHAN_POLL_S)
    os._exit(1)


def _helping() -> None:
    """In a helper process, once: its reference model may keep more (it keeps no tables),
    and it ends when the exploring process does. Ctrl-C and SIGTERM, which a terminal or a
    service manager sends the whole process group, are the exploring process's to act on:
    it stops its helpers (`Helpers.close`) as it ends."""
    assert _HELPED is not None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _HELPED.model.cache_limit = _HELPED.model.abstraction.cache_limit = HELPER_CACHE_LIMIT
    threading.Thread(
        target=_exit_when_orphaned, args=(_HELPED_BY,), name="orphan-watch", daemon=True
    ).start()


def _answer(tasks: list[Task]) -> list[tuple[Delta | None, list[tuple[int, Raw | Action]]]]:
    """In a helper process: the answers to a chunk of entries (see `CompiledModel.answers`)."""
    assert _HELPED is not None
    return [_HELPED.answers(*task) for task in tasks]


def can_fork() -> bool:
    """Whether this system can fork the checker's helper processes (`Helpers`)."""
    return "fork" in multiprocessing.get_all_start_methods()


@contextmanager
def _stopped_helpers() -> Iterator[None]:
    """A helper process that stopped (its pool broke) as `HelperStopped`."""
    try:
        yield
    except BrokenProcessPool:
        raise HelperStopped(
            "a helper process of the check stopped before it answered (killed, or out of "
            "memory): check again, with fewer processes or a smaller universe"
        ) from None


class Helpers:
    """Processes that ask the reference model for the entries a level of the exploration
    lacks, in parallel (`check_compiled(processes=N)`).

    They are forked from the exploring process once its compiled model is built, so each
    holds a copy of the same reference model (the same spec, universe and core, a
    mutant's too) and answers with what it says of each call (`Raw`); the exploring
    process numbers the answers and keeps the tables. Forking needs a POSIX system;
    `close` stops the processes.
    """

    def __init__(self, compiled: CompiledModel, processes: int, chunk: int = 64) -> None:
        global _HELPED, _HELPED_BY
        if processes < 2:
            raise ValueError("helpers are two processes or more")
        self.chunk = chunk
        """How many entries are sent to a helper at once."""
        self.processes = processes
        """How many helper processes there are."""
        _HELPED, _HELPED_BY = compiled, os.getpid()
        # Forked all at once on the first chunk, before the pool starts a thread of its own.
        self._pool = ProcessPoolExecutor(
            processes, mp_context=multiprocessing.get_context("fork"), initializer=_helping
        )

    def ask(self, tasks: list[Task]) -> Future[Any]:
        """Send a chunk of entries; its answers come with `answered`. `HelperStopped` if a
        helper has stopped already (the pool takes no more chunks then)."""
        with _stopped_helpers():
            return self._pool.submit(_answer, tasks)

    @staticmethod
    def answered(sent: Future[Any]) -> Any:
        """The answers to a chunk sent; `HelperStopped` if a helper stopped meanwhile."""
        with _stopped_helpers():
            return sent.result()

    def close(self) -> None:
        """Stop the processes (once the chunks they are answering are answered)."""
        global _HELPED
        self._pool.shutdown(wait=True, cancel_futures=True)
        _HELPED = None


class HelperStopped(RuntimeError):
    """A helper process stopped before it answered (it was killed, or ran out of memory)."""
