"""What of a checker state decides its future: documents read once, and states as keys.

The model checker explores states that differ only in what no decision reads
(event times, past attempts, which worker is which) as one. This module
works that out: what the model reads of each document (parsed once; a
document the core has just decided is not parsed at all, the decided
workload is kept), each document's projection at an instant (instants
relative to now and clamped), what a held fence tells a later call, and the
state's key, a short tuple of numbers given to each part of the abstraction
the first time it is seen, the smallest of the keys of the state with its
workers renamed in every order (the workers are interchangeable).

Every cache is keyed by everything its value is computed from and bounded
(`CACHE_LIMIT`); what a cache drops is only worked out again, so the limit
changes how long a check takes, never what it finds. The numbers are never
dropped: a number always stands for the same abstraction.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from workwarden.statemachine import errors
from workwarden.statemachine.authority import serialise
from workwarden.statemachine.check.state import CheckState, Universe
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.models import Workload
from workwarden.statemachine.predicates import operator_retries
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import IndexFields

__all__ = [
    "CACHE_LIMIT",
    "MAX_SYMMETRIC_WORKERS",
    "Abstraction",
    "DocumentFacts",
    "StateKey",
    "checkpoints_this_attempt",
    "keep",
    "move_edges",
]

#: Entries each of the model's caches keeps by default; when one is full it
#: drops its older half. Every cached value can be computed again from its
#: key, so what is dropped costs time, never a different answer.
CACHE_LIMIT = 200_000

#: The most workers whose symmetry is reduced: a state's key is the least over the
#: workers renamed in every order, N! of them, held in a table (8: 40,320 orders; at 10
#: the table alone outgrows a machine's memory before the first state is explored).
MAX_SYMMETRIC_WORKERS = 8

_K = TypeVar("_K")
_V = TypeVar("_V")


def keep(cache: dict[_K, _V], key: _K, value: _V, limit: int) -> _V:
    """Put `value` in `cache`, first dropping the older half if the cache is full."""
    if len(cache) >= limit:
        for old in list(itertools.islice(cache, max(1, len(cache) // 2))):
            del cache[old]
    cache[key] = value
    return value


#: The number of an absent part (no document, no fence held, no pending write).
NOTHING = -1

StateKey = tuple[int, ...]
"""A state's abstraction as numbers: equal keys, the same future (see `Model.canonical`)."""


@dataclass(frozen=True, slots=True)
class DocumentFacts:
    """What the model reads of one document, worked out once per document text."""

    workload: Workload
    index: IndexFields
    #: Instants where something can change for it: a lease expiry, a
    #: deadline, the eligibility of READY work.
    marks: tuple[int, ...]
    claim_id: str | None
    checkpoints: int
    operator_events: int
    operator_retries: int
    ready_since: int
    #: The moves it took: events along an edge an operation of effect `move` takes.
    moves: int = 0


class Abstraction:
    """The documents and the state keys of one universe under one spec (see the module)."""

    def __init__(
        self,
        spec: Spec,
        universe: Universe,
        worker_names: tuple[str, ...],
        cache_limit: int = CACHE_LIMIT,
        *,
        symmetry: bool = True,
    ) -> None:
        self.spec = spec
        self.cache_limit = cache_limit
        self.docs: dict[str, DocumentFacts] = {}
        """What the model read of each document text (bounded)."""
        self._views: dict[tuple[str, int], tuple[int, ...]] = {}
        self._holds: dict[tuple[str, int, int], tuple[int, ...]] = {}
        # Every abstraction seen, numbered in order of discovery; never dropped,
        # so a number always stands for the same abstraction.
        self._numbers: dict[Hashable, int] = {}
        self._pairs: dict[Hashable, tuple[int, ...]] = {}
        # The workers renamed in every order (without `symmetry`, only as they
        # are), the names as they are first: permutation p renames worker k
        # worker `self.orders[p][k]` (its id by `self._renames[p]`), and
        # `self.placed[p][j]` is the worker it renames the j-th.
        if symmetry and len(worker_names) > MAX_SYMMETRIC_WORKERS:
            raise errors.bad_argument(
                "workers",
                f"a checked universe has at most {MAX_SYMMETRIC_WORKERS} workers (its states "
                f"are reduced over the workers renamed in every order), not {len(worker_names)}",
            )
        every = itertools.permutations(range(len(worker_names)))
        self.orders = tuple(every) if symmetry else (next(every),)
        self.placed = tuple(
            tuple(order.index(j) for j in range(len(order))) for order in self.orders
        )
        self._renames = tuple(
            {worker_names[k]: worker_names[order[k]] for k in range(len(order))}
            for order in self.orders
        )
        self._nothing = (NOTHING,) * len(self.orders)
        u = universe
        durations = [u.lease_ms, u.initial_delay_ms, u.max_delay_ms]
        durations += list(u.first_timeouts.values()) + list(u.second_timeouts.values())
        self._clamp = max(durations) + 1
        saturation = 1
        delay = u.initial_delay_ms
        while delay < u.max_delay_ms and saturation < 64:
            delay *= 2
            saturation += 1
        self._retry_saturation = saturation
        self._queued = spec.roles.queued
        #: The states in which the instant work last became queued decides a deadline:
        #: those of the deadlines anchored there, by the timeout that sets each.
        self._queue_anchored = tuple(
            (f"{kind}_ms", frozenset(row.while_states))
            for kind, row in sorted(spec.deadline_kinds.items())
            if row.anchor == "ready_or_eligible"
        )
        #: The edges the spec's `move` operations take (none in the shipped spec).
        self.move_edges = move_edges(spec)
        self._move_budget = universe.moves

    # -- documents -------------------------------------------------------

    def doc(self, document: str) -> DocumentFacts:
        known = self.docs.get(document)
        if known is None:
            known = self.read(document, Workload.model_validate_json(document))
        return known

    def read(self, document: str, w: Workload) -> DocumentFacts:
        """Work out, once, what the model reads of `document`, which holds `w`."""
        index = index_fields(self.spec, w)
        marks = [at for at in (index.lease_expires_at, index.next_deadline_at) if at is not None]
        if w.next_attempt_at is not None and w.state in self._queued:
            marks.append(w.next_attempt_at)
        ready_since = w.created_at
        operator_events = 0
        moves = 0
        move_edges = self.move_edges
        for event in w.execution_history:
            if event.to in self._queued:
                ready_since = event.at
            if move_edges and (event.from_state, event.to) in move_edges:
                # Counted against the `moves` budget, not the operator's.
                moves += 1
            elif event.actor == "operator":
                operator_events += 1
        claim = w.current_claim
        info = DocumentFacts(
            workload=w,
            index=index,
            marks=tuple(marks),
            claim_id=None if claim is None else claim.claim_id,
            checkpoints=checkpoints_this_attempt(w),
            operator_events=operator_events,
            operator_retries=operator_retries(w),
            ready_since=ready_since,
            moves=moves,
        )
        return keep(self.docs, document, info, self.cache_limit)

    def workload(self, document: str | None) -> Workload | None:
        """The workload a state's document holds (parsed once, cached)."""
        return None if document is None else self.doc(document).workload

    def serialise(self, workload: Workload) -> str:
        """The document text of a decided workload, which then needs no parsing.

        The core returns a workload that is its document's parse: the same
        values in the same types (a checker test holds every workload the
        model keeps to that).
        """
        document = serialise(workload)
        if document not in self.docs:
            self.read(document, workload)
        return document

    def _project_uncached(self, document: str, now: int) -> tuple[Any, ...]:
        """What of a document decides its future, with instants relative to `now`.

        Kept: the state, the counters the budget and the backoff read (the
        retry count only up to where the backoff reaches its cap), the current
        claim and attempt, and the anchor of every deadline the workload has.
        Instants are relative to `now` and clamped beyond the largest duration
        of the universe (an instant that long ago compares the same way with
        every `now + duration`). Left out: event times and past attempts, which
        no decision reads unless a worker still holds their fence (those are
        added by `canonical`), and without a live claim its attempt's
        checkpoints and start (only the claim holder's calls read them; an
        operator's re-arm out of a terminal state carries them along unread).
        """
        info = self.doc(document)
        w = info.workload
        bound = self._clamp

        def rel(instant: int | None) -> int | None:
            if instant is None:
                return None
            return max(instant - now, -bound)

        operator = info.operator_retries
        # The moves taken matter up to the budget (a constant without move operations).
        moved = min(info.moves, self._move_budget)
        if w.state in self.spec.terminal_states:
            # At rest: only an exit edge (an operator's re-arm or close) leaves it,
            # and those read no instant, only the budget's counters.
            if self.move_edges:
                return (w.state, w.attempt_count, operator, moved)
            return (w.state, w.attempt_count, operator)
        t = w.timeouts
        claim = w.current_claim
        attempt = w.attempts[-1] if w.attempts else None
        queued_since = any(
            getattr(t, timeout) is not None and w.state in states
            for timeout, states in self._queue_anchored
        )
        projection = (
            w.state,
            w.attempt_count,
            min(w.retry_count, self._retry_saturation),
            operator,
            # Only a live claim's calls read its attempt's checkpoints and start.
            info.checkpoints if claim is not None else 0,
            rel(w.next_attempt_at),
            rel(w.created_at) if t.overall_ms is not None else None,
            rel(info.ready_since) if queued_since else None,
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
                rel(attempt.started_at)
                if t.execution_ms is not None and claim is not None
                else None,
            ),
        )
        return (*projection, moved) if self.move_edges else projection

    def projection(self, document: str, now: int) -> tuple[Any, ...]:
        """What of `document` decides its future at `now` (see `_project_uncached`)."""
        return self._project_uncached(document, now)

    def fence_facts(self, document: str | None, token: int) -> tuple[Any, ...]:
        """What a fence of `token` on `document` tells a later call (see `_fence_facts`)."""
        return self._fence_facts(document, token)

    def numbered(self, value: Hashable) -> tuple[int, ...]:
        """The numbers of an abstraction renamed by each permutation (see `_numbered`)."""
        return self._numbered(value)

    def pending_numbers(
        self, slot: int, refusal: str | None, stale: bool, view: tuple[int, ...]
    ) -> tuple[int, ...]:
        """The numbers of a pending write, renamed by each permutation: `view` is the
        numbers of the document it would write (`NOTHING` each, for none)."""
        return tuple(self.number(("pending", slot, refusal, stale, own)) for own in view)

    def number(self, value: Hashable) -> int:
        """The number standing for `value` (given the first time it is asked for)."""
        return self._numbers.setdefault(value, len(self._numbers))

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

    @staticmethod
    def _renamed(value: Any, names: dict[str, str]) -> Any:
        """`value` with each worker's id replaced by `names`' wherever one appears."""
        if isinstance(value, str):
            return names.get(value, value)
        if isinstance(value, tuple):
            return tuple(Abstraction._renamed(part, names) for part in value)
        return value

    def _numbered(self, value: Hashable) -> tuple[int, ...]:
        """The numbers of an abstraction with its workers renamed by each permutation.

        The first is the abstraction's own number (the identity comes first);
        with two workers the second is its mirror's, the workers exchanged.
        """
        numbers = self._pairs.get(value)
        if numbers is None:
            known = self._numbers
            own = known.setdefault(value, len(known))
            renamed = [
                known.setdefault(self._renamed(value, names), len(known))
                for names in self._renames[1:]
            ]
            numbers = (own, *renamed)
            self._pairs[value] = numbers
        return numbers

    def _view(self, document: str, now: int) -> tuple[int, ...]:
        """The numbers of a document's projection at `now`, renamed by each permutation."""
        key = (document, now)
        view = self._views.get(key)
        if view is None:
            view = keep(
                self._views,
                key,
                self._numbered(self._project_uncached(document, now)),
                self.cache_limit,
            )
        return view

    def _hold(
        self, docs: tuple[str | None, ...], hold: tuple[int, str, str, int]
    ) -> tuple[int, ...]:
        """The numbers of what a held fence tells (its slot and `_fence_facts`), renamed."""
        document = docs[hold[0]]
        key = (document or "", hold[0], hold[3])
        numbers = self._holds.get(key)
        if numbers is None:
            facts = (hold[0], self._fence_facts(document, hold[3]))
            numbers = keep(self._holds, key, self._numbered(facts), self.cache_limit)
        return numbers

    def canonical(self, state: CheckState) -> tuple[CheckState, StateKey]:
        """The state, and its abstraction as a key with worker symmetry reduced.

        States with equal keys have the same future; the first one found
        (breadth first: the one with the shortest trace) stands for all. The
        key numbers the abstraction of each part (each document's projection,
        what each held fence tells, the pending write), so two keys are equal
        exactly when the abstractions are; it is the smallest of the keys of
        the state with its workers renamed in every order (with two workers,
        the state's and its mirror's).
        """
        now = state.now
        docs = state.docs
        views = self._views
        nothing = self._nothing
        doc_numbers: list[tuple[int, ...]] = []
        for document in docs:
            if document is None:
                doc_numbers.append(nothing)
                continue
            doc_numbers.append(views.get((document, now)) or self._view(document, now))
        known = self._holds
        holds: list[tuple[int, ...]] = []
        for worker in state.workers:
            for hold in worker:
                if hold is None:
                    holds.append(nothing)
                    continue
                slot = hold[0]
                document = docs[slot] or ""
                holds.append(known.get((document, slot, hold[3])) or self._hold(docs, hold))
        pending = state.pending
        if pending is None:
            pendings = nothing
        else:
            view = nothing if pending.document is None else self._view(pending.document, now)
            pendings = self.pending_numbers(pending.slot, pending.refusal, pending.stale, view)
        return state, min(
            state_key(p, placed, doc_numbers, holds, pendings, state.crashes, state.prepares)
            for p, placed in enumerate(self.placed)
        )


def state_key(
    p: int,
    placed: tuple[int, ...],
    docs: list[tuple[int, ...]],
    holds: list[tuple[int, ...]],
    pending: tuple[int, ...],
    crashes: int,
    prepares: int,
) -> StateKey:
    """The key of a state with its workers renamed by permutation `p`.

    `docs`, `holds` (two a worker, in worker order) and `pending` are the
    numbers of each part under every permutation; `placed[j]` is the worker
    the permutation puts at position j, whose fences come j-th.
    """
    key = [numbers[p] for numbers in docs]
    for k in placed:
        key += (holds[2 * k][p], holds[2 * k + 1][p])
    key += (pending[p], crashes, prepares)
    return tuple(key)


def move_edges(spec: Spec) -> frozenset[tuple[str, str]]:
    """The (from, to) edges the operations of effect `move` take themselves, out of any state."""
    moving = [name for name, op in spec.operations.items() if op.spec.effect == "move"]
    return frozenset(
        (state, edge.to)
        for name in moving
        for state in spec.states
        if (edge := spec.own_edge(state, name)) is not None
    )


def checkpoints_this_attempt(w: Workload) -> int:
    """How many checkpoints the current attempt of `w` recorded."""
    if not w.attempts:
        return 0
    attempt = w.attempts[-1].attempt_id
    return sum(1 for c in w.checkpoints if c.attempt_id == attempt)
