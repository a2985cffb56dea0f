"""Liveness under weak fairness over the compiled engine's graph, with lasso counterexamples.

Two properties (registered in `properties/registry.py`, kind `eventually`):

- `claimable_work_is_claimed`: a workload that is claimable (in a state the
  claim operation leaves, eligible now, its dependencies met, within the
  workers' capabilities) is eventually claimed while a worker keeps asking
  (`claim_next`);
- `expired_leases_are_recovered`: a workload whose lease has expired (in a
  state the recovery sweep leaves) eventually stops being so while the
  sweeper runs (`recover_expired`).

**Fairness.** The fair actions are each worker's `claim_next` (enabled while
the worker holds no fence) and the sweeper's `recover_expired` (always
enabled). They are weakly fair: a run that keeps one of them enabled from
some point on takes it again and again. Nothing else is fair: a worker
holding a fence need not call again, the operator need not act, the clock
need not move. A counterexample is an infinite run that is weakly fair,
keeps the property's condition ("claimable and unclaimed", "expired and
unrecovered") on one workload in every state from some point on, and, for
the claim property, in which a worker keeps asking (some `claim_next` is
taken again and again).

**Time.** The universe's time is bounded (`Universe.horizon_ms`), so every
run takes finitely many clock moves and ends in a suffix where the clock
stands still. The abstraction keys states by instants relative to `now`, so
the graph has cycles through clock moves, but each stands for time running
on without bound, past the horizon the concrete universe cuts; and a cycle
of clock moves alone shows only that nobody acted. So clock moves are left
out of the search: a fair cycle is a cycle of the graph without them.

**The search.** For each property and workload, the states where the
condition holds; in the graph they span (clock moves left out), the
strongly connected components (Tarjan's algorithm, iterative). A component
with an edge inside it is a counterexample when it is weakly fair (every
fair action is disabled in one of its states or taken on one of its edges)
and, for the claim property, some `claim_next` is taken inside it. Weak
fairness needs no finer search: a component that is not fair has a fair
action enabled everywhere and taken nowhere, and so has every cycle inside
it.

**The lasso** (`Lasso`). A counterexample is printed as a stem, the
checker's shortest trace to the component's first state found, and a loop
inside the component that takes every fair action enabled where it starts
(and a `claim_next`); it is walked on the compiled model's states, not the
keys, until it comes back to exactly the state it started from, so running
the loop again repeats it step for step. Its trace is the stem and then the
loop twice (each step marked `"lasso": "stem"` or `"loop"`), and
`replay_lasso` holds it to the real `Authority`: every step must agree
(`refinement.refine_trace`), and the loop must close on the same state each
time round, with the condition holding all along.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.check.checker import Finding, _action_dict
from workwarden.statemachine.check.compiled import CompiledModel, Outcome
from workwarden.statemachine.check.refinement import REFINEMENT, _given, _matching, refine_trace
from workwarden.statemachine.check.replay import _action
from workwarden.statemachine.check.state import CheckState
from workwarden.statemachine.check.universe import CAPABILITY, Action
from workwarden.storage.base import Store

__all__ = [
    "CLAIMED",
    "LIVENESS_PROPERTIES",
    "RECOVERED",
    "Lasso",
    "LivenessGraph",
    "find_lassos",
    "replay_lasso",
]

#: A claimable workload is eventually claimed while a worker keeps asking.
CLAIMED = "claimable_work_is_claimed"
#: An expired lease is eventually recovered while the sweeper runs.
RECOVERED = "expired_leases_are_recovered"
#: The liveness properties the compiled engine checks, in the order they are reported.
LIVENESS_PROPERTIES = (CLAIMED, RECOVERED)

#: The label of an edge that is a clock move (left out of the search).
TICK = -2
#: The label of an edge of no fair action.
OTHER = -1

#: How many compiled states the walk of one loop visits at most.
_WALK_LIMIT = 100_000
#: How many times round a loop is walked to come back to exactly where it started.
_PASSES = 4

Steps = tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Lasso:
    """A counterexample to a liveness property: a stem from the initial state, then a loop.

    `slot` is the workload the condition holds of; each step is an action
    as a trace names it (`{"action": ..., "now": ...}`).
    """

    property: str
    slot: int
    stem: Steps
    loop: Steps

    def trace(self) -> Steps:
        """The stem, then the loop twice: each step marked with the part it belongs to."""
        stem = tuple({**step, "lasso": "stem"} for step in self.stem)
        loop = tuple({**step, "lasso": "loop"} for step in self.loop)
        return stem + loop + loop

    def finding(self) -> Finding:
        """The lasso as a violation of its property, reported like a safety counterexample."""
        what = (
            "stays claimable and unclaimed while a worker keeps asking"
            if self.property == CLAIMED
            else "keeps an expired lease while the sweeper runs"
        )
        n, m = len(self.stem), len(self.loop)
        return Finding(
            self.property,
            f"workload {self.slot} {what}, in a weakly fair run: a stem of {n} steps, then a "
            f"loop of {m} steps repeated forever (shown twice: steps {n + 1}-{n + m} and "
            f"{n + m + 1}-{n + 2 * m})",
            self.trace(),
        )


class LivenessGraph:
    """What an exploration records for the liveness search, beside its graph of states.

    Per state (in the order states are numbered) a mask of facts: for workload
    `s`, bit `2s` when it is claimable, bit `2s + 1` when its lease has expired;
    for worker `k`, bit `2 * slots + k` when it holds no fence (its
    `claim_next` is enabled). Per edge (in the order of the exploration's
    edges) a label: the worker's number for a `claim_next`, the number of
    workers for `recover_expired`, `TICK` for a clock move, `OTHER` otherwise.
    """

    def __init__(self, compiled: CompiledModel) -> None:
        self.compiled = compiled
        self.workers = compiled.workers
        self.recover = compiled.workers
        self.facts: list[int] = []
        self.labels = array("h")
        self._class_facts: dict[int, tuple[bool, bool, tuple[tuple[int, str | None], ...]]] = {}

    def _of_class(self, d: int) -> tuple[bool, bool, tuple[tuple[int, str | None], ...]]:
        """Claimable but for its dependencies, expired, and its dependencies (slot, state)."""
        known = self._class_facts.get(d)
        if known is None:
            compiled = self.compiled
            facts = compiled.classes[d]
            info = compiled.abstraction.doc(facts.document)
            w, at, spec = info.workload, facts.at, compiled.spec
            # By the kinds of state, not the table's edges: a table that
            # never lets queued work be claimed starves it.
            eligible = (
                w.state in spec.roles.queued
                and w.is_eligible_at(at)
                and set(w.capability_snapshot) <= {CAPABILITY}
            )
            claim = w.current_claim
            expired = (
                w.state in spec.claimed_states and claim is not None and claim.expires_at <= at
            )
            ids = compiled.model.ids
            deps = tuple(
                (ids.index(dep.workload_id) if dep.workload_id in ids else -1, dep.required_state)
                for dep in w.dependencies
            )
            known = self._class_facts[d] = (eligible, expired, deps)
        return known

    def mask(self, c: tuple[int, ...]) -> int:
        """The facts of compiled state `c` (see the class docstring)."""
        compiled = self.compiled
        n = compiled.slots
        classes = compiled.classes
        out = 0
        for slot in range(n):
            d = c[slot]
            if d < 0:
                continue
            eligible, expired, deps = self._of_class(d)
            if eligible and all(
                s >= 0 and c[s] >= 0 and classes[c[s]].state == state for s, state in deps
            ):
                out |= 1 << (2 * slot)
            if expired:
                out |= 1 << (2 * slot + 1)
        for k, at in enumerate(compiled.held_at):
            if c[at] < 0:
                out |= 1 << (2 * n + k)
        return out

    def add_state(self, c: tuple[int, ...]) -> None:
        """Record the facts of the state just numbered, compiled state `c`."""
        self.facts.append(self.mask(c))

    def label(self, action: Action, tick: bool) -> int:
        """The label of an edge taking `action` (`tick`: a move of the clock)."""
        if tick:
            return TICK
        if action.label == "claim_next":
            return action.worker
        if action.label == "recover_expired":
            return self.recover
        return OTHER

    def add_edge(self, action: Action, tick: bool) -> None:
        """Record the label of the edge just appended to the exploration's edges."""
        self.labels.append(self.label(action, tick))


def _offsets(edges: Sequence[int], count: int) -> tuple[list[int], list[int], list[int]]:
    """The out-edges of each state: (start offsets, targets, edge numbers), by source."""
    starts = [0] * (count + 1)
    for i in range(0, len(edges), 2):
        starts[edges[i] + 1] += 1
    for i in range(count):
        starts[i + 1] += starts[i]
    fill = starts[:-1]
    targets = [0] * (len(edges) // 2)
    numbers = [0] * (len(edges) // 2)
    for e in range(len(edges) // 2):
        source = edges[2 * e]
        at = fill[source]
        fill[source] = at + 1
        targets[at] = edges[2 * e + 1]
        numbers[at] = e
    return starts, targets, numbers


def _components(
    member: bytearray, starts: list[int], targets: list[int], usable: Callable[[int], bool]
) -> list[list[int]]:
    """The strongly connected components of the states in `member` (Tarjan, iterative).

    Only the edges `usable(position)` accepts count, between members.
    """
    count = len(member)
    order = [-1] * count
    low = [0] * count
    on = bytearray(count)
    stack: list[int] = []
    found: list[list[int]] = []
    counter = 0
    for root in range(count):
        if not member[root] or order[root] >= 0:
            continue
        order[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on[root] = 1
        work = [(root, starts[root])]
        while work:
            v, e = work[-1]
            end = starts[v + 1]
            descended = False
            while e < end:
                w = targets[e]
                e += 1
                if not member[w] or not usable(e - 1):
                    continue
                if order[w] < 0:
                    work[-1] = (v, e)
                    order[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on[w] = 1
                    work.append((w, starts[w]))
                    descended = True
                    break
                if on[w] and order[w] < low[v]:
                    low[v] = order[w]
            if descended:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                if low[v] < low[u]:
                    low[u] = low[v]
            if low[v] == order[v]:
                component: list[int] = []
                while True:
                    w = stack.pop()
                    on[w] = 0
                    component.append(w)
                    if w == v:
                        break
                found.append(component)
    return found


def _fair(
    graph: LivenessGraph,
    prop: str,
    component: list[int],
    inside: set[int],
    starts: list[int],
    targets: list[int],
    numbers: list[int],
) -> bool:
    """Is the component a cycle that is weakly fair and, for the claim property, keeps asking?"""
    taken: set[int] = set()
    for v in component:
        for at in range(starts[v], starts[v + 1]):
            label = graph.labels[numbers[at]]
            if label != TICK and targets[at] in inside:
                taken.add(label)
    if not taken:
        return False  # one state and no step back to it: no cycle
    if graph.recover not in taken:
        return False  # the sweeper is always enabled: a fair cycle takes it
    base = 2 * graph.compiled.slots
    for k in range(graph.workers):
        always_free = all(graph.facts[v] >> (base + k) & 1 for v in component)
        if always_free and k not in taken:
            return False
    return prop != CLAIMED or any(0 <= label < graph.workers for label in taken)


def find_lassos(
    graph: LivenessGraph,
    edges: Sequence[int],
    seen: dict[tuple[int, ...], int],
    stem_of: Callable[[int], Steps],
) -> list[Lasso]:
    """One lasso per liveness property that has a counterexample, the shortest stem first.

    `edges` are the exploration's (source, target) pairs, labelled in
    `graph`; `seen` numbers states by key; `stem_of(i)` is the shortest trace
    to state `i`.
    """
    count = len(graph.facts)
    starts, targets, numbers = _offsets(edges, count)
    labels = graph.labels

    def usable(position: int) -> bool:
        return labels[numbers[position]] != TICK

    out: list[Lasso] = []
    for prop in LIVENESS_PROPERTIES:
        best: Lasso | None = None
        best_at = -1
        for slot in range(graph.compiled.slots):
            bit = _bit(prop, slot)
            member = bytearray(1 if f & bit else 0 for f in graph.facts)
            if not any(member):
                continue
            for component in sorted(_components(member, starts, targets, usable), key=min):
                first = min(component)
                if best is not None and first >= best_at:
                    break
                inside = set(component)
                if not _fair(graph, prop, component, inside, starts, targets, numbers):
                    continue
                lasso = _lasso(graph, prop, slot, inside, seen, stem_of(first))
                if lasso is not None:
                    best, best_at = lasso, first
                    break
        if best is not None:
            out.append(best)
    return out


def _bit(prop: str, slot: int) -> int:
    """The bit of `LivenessGraph.facts` that holds the condition of `prop` on workload `slot`."""
    return 1 << (2 * slot + (0 if prop == CLAIMED else 1))


def _along(
    compiled: CompiledModel, steps: Steps
) -> Iterator[tuple[tuple[int, ...], int, CheckState, Outcome]]:
    """Walk `steps` through the compiled model: before each, (state, instant, concrete, outcome)."""
    c = compiled.initial
    concrete = compiled.initial_concrete
    now = 0
    for raw in steps:
        action = _action(raw)
        outcome = _matching(compiled, c, now, action, _given(concrete))
        if outcome is None:
            raise ValueError(f"{action.label} is not offered by the compiled model")
        yield c, now, concrete, outcome
        c = compiled.apply(c, outcome)
        concrete = compiled.take(concrete, action).state
        if action.label == "jump":
            now = action.to
    yield c, now, concrete, Outcome(Action("end", ""), (), None, (), None)


_Node = tuple[int, ...]
_Goal = Callable[[int, _Node], bool]


def _taking(label: int) -> _Goal:
    """A goal met by an edge labelled `label`."""
    return lambda found, _target: found == label


def _any_claim(workers: int) -> _Goal:
    """A goal met by any worker's `claim_next`."""
    return lambda found, _target: 0 <= found < workers


def _reaching(compiled: CompiledModel, key: tuple[int, ...]) -> _Goal:
    """A goal met by an edge into a state of `key`."""
    return lambda _found, target: compiled.key(target) == key


def _walk_to(
    graph: LivenessGraph,
    inside: set[int],
    seen: dict[tuple[int, ...], int],
    start: _Node,
    concrete: CheckState,
    goal: _Goal,
) -> tuple[list[Action], _Node, CheckState] | None:
    """The shortest path inside the component from `start` whose last edge meets `goal`.

    `goal(label, target)` is asked of each edge (clock moves left out); the
    path has at least one step. None when no such path is within reach.
    """
    compiled = graph.compiled
    parents: dict[_Node, tuple[_Node, Action] | None] = {start: None}
    states: dict[_Node, CheckState] = {start: concrete}
    queue: deque[_Node] = deque([start])
    while queue and len(parents) < _WALK_LIMIT:
        node = queue.popleft()
        here = states[node]
        for outcome in compiled.outcomes(node, _given(here)):
            if outcome.rel or outcome.cut or outcome.noop:
                continue
            nxt = compiled.apply(node, outcome)
            if seen.get(compiled.key(nxt), -1) not in inside:
                continue
            action = outcome.action
            if goal(graph.label(action, False), nxt):
                path = [action]
                back = node
                link = parents[back]
                while link is not None:
                    back, step = link
                    path.append(step)
                    link = parents[back]
                path.reverse()
                return path, nxt, compiled.take(here, action).state
            if nxt not in parents:
                parents[nxt] = (node, action)
                states[nxt] = compiled.take(here, action).state
                queue.append(nxt)
    return None


def _one_pass(
    graph: LivenessGraph,
    prop: str,
    inside: set[int],
    seen: dict[tuple[int, ...], int],
    start: _Node,
    concrete: CheckState,
) -> tuple[list[Action], _Node, CheckState] | None:
    """A walk from `start` back to its key, taking every fair action enabled at `start`.

    Every fair action enabled at `start` is taken on the way (one disabled
    there is disabled in a state of the loop, which is fair to it), and for
    the claim property some `claim_next` is.
    """
    compiled = graph.compiled
    free = [k for k, at in enumerate(compiled.held_at) if start[at] < 0]
    goals = [_taking(k) for k in free]
    goals.append(_taking(graph.recover))
    if prop == CLAIMED and not free:
        goals.append(_any_claim(graph.workers))
    home = compiled.key(start)
    path: list[Action] = []
    node, state = start, concrete
    for goal in goals:
        found = _walk_to(graph, inside, seen, node, state, goal)
        if found is None:
            return None
        steps, node, state = found
        path += steps
    if compiled.key(node) != home:
        found = _walk_to(graph, inside, seen, node, state, _reaching(compiled, home))
        if found is None:
            return None
        steps, node, state = found
        path += steps
    return path, node, state


def _lasso(
    graph: LivenessGraph,
    prop: str,
    slot: int,
    inside: set[int],
    seen: dict[tuple[int, ...], int],
    stem: Steps,
) -> Lasso | None:
    """The lasso through the component: the stem, then a loop back to exactly its start.

    Each time round comes back to the key it started at; the walk goes round
    again (at most `_PASSES` times) until it is back at exactly a compiled
    state it started a round at, and the loop is the rounds from there.
    """
    compiled = graph.compiled
    *_, (node, now, state, _) = _along(compiled, stem)
    starts: list[_Node] = [node]
    passes: list[list[Action]] = []
    for _ in range(_PASSES):
        walked = _one_pass(graph, prop, inside, seen, node, state)
        if walked is None:
            return None
        path, node, state = walked
        passes.append(path)
        if node in starts:
            first = starts.index(node)
            before = [a for p in passes[:first] for a in p]
            loop = [a for p in passes[first:] for a in p]
            return Lasso(
                prop,
                slot,
                stem + tuple(_action_dict(a, now) for a in before),
                tuple(_action_dict(a, now) for a in loop),
            )
        starts.append(node)
    return None


def replay_lasso(
    compiled: CompiledModel,
    lasso: Lasso,
    store: Store,
    authority_cls: type[Authority] | None = None,
) -> Finding | None:
    """Hold a lasso to the real `Authority` on `store`; None when it holds.

    Every step of its trace (the stem, then the loop twice) must agree with
    the compiled model (`refinement.refine_trace`); the compiled state must
    be the same where each time round the loop starts and after the last,
    and the property's condition must hold of the workload in every state of
    the loop. A failure is a `refinement` finding.
    """
    trace = lasso.trace()
    failure = refine_trace(compiled, trace, store, authority_cls)
    if failure is not None:
        return failure
    graph = LivenessGraph(compiled)
    bit = _bit(lasso.property, lasso.slot)
    n, m = len(lasso.stem), len(lasso.loop)
    walked = list(_along(compiled, trace))
    for number in range(n, n + 2 * m + 1):
        if not graph.mask(walked[number][0]) & bit:
            return Finding(
                REFINEMENT,
                f"after step {number} the condition of {lasso.property} no longer holds",
                trace[:number],
            )
    if not walked[n][0] == walked[n + m][0] == walked[n + 2 * m][0]:
        return Finding(
            REFINEMENT,
            f"the loop of the {lasso.property} lasso does not come back to its start",
            trace,
        )
    return None
