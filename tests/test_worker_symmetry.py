"""The checker's worker symmetry: states that differ only in which worker is which are one.

With two workers a state and its mirror share a key; with three, the six renamings of
its workers do (four workers: twenty-four). Held here two ways: every state reached in a
three-worker universe, its workers renamed in every order (in its documents and in what
each worker holds), has the key of the state itself; and a universe explored with the
reduction finds what the same universe explored without it finds (coverage, terminal
states, states never at rest, no violation), in between a sixth and all of its states.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from typing import Any

from workwarden.statemachine import default_spec
from workwarden.statemachine.authority import serialise
from workwarden.statemachine.check.compiled import CompiledModel
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.state import CheckState, Pending, WorkerHold
from workwarden.statemachine.check.universe import Model, Universe
from workwarden.statemachine.models import Workload

SPEC = default_spec()


def _universe(**bounds: Any) -> Universe:
    return Universe.from_spec(
        SPEC,
        workers=3,
        workloads=2,
        checkpoints_per_attempt=0,
        operator_actions=0,
        rearms=0,
        **bounds,
    )


def _renamed_value(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [_renamed_value(part, names) for part in value]
    if isinstance(value, dict):
        return {key: _renamed_value(part, names) for key, part in value.items()}
    return value


def _renamed_document(document: str | None, names: dict[str, str]) -> str | None:
    if document is None:
        return None
    data = _renamed_value(json.loads(document), names)
    return serialise(Workload.model_validate(data))


def _renamed(
    state: CheckState, order: tuple[int, ...], worker_names: tuple[str, ...]
) -> CheckState:
    """`state` with worker k renamed worker order[k], in its documents and its workers."""
    names = {worker_names[k]: worker_names[order[k]] for k in range(len(order))}

    def hold(h: tuple[int, str, str, int] | None) -> tuple[int, str, str, int] | None:
        return None if h is None else (h[0], h[1], names.get(h[2], h[2]), h[3])

    workers: list[WorkerHold] = [(None, None)] * len(state.workers)
    for k, (held, lost) in enumerate(state.workers):
        workers[order[k]] = (hold(held), hold(lost))
    pending = state.pending
    if pending is not None:
        pending = Pending(
            pending.slot,
            _renamed_document(pending.document, names),
            pending.refusal,
            pending.stale,
        )
    return CheckState(
        state.now,
        tuple(_renamed_document(d, names) for d in state.docs),
        tuple(workers),
        pending,
        state.crashes,
        state.prepares,
    )


def _reachable(model: Model, limit: int) -> list[CheckState]:
    """The first `limit` states reached breadth first (one per key)."""
    first = model.initial()
    seen = {model.canonical(first)[1]}
    queue = deque([first])
    found: list[CheckState] = []
    while queue and len(found) < limit:
        state = queue.popleft()
        found.append(state)
        for action in model.actions(state):
            step = model.step(state, action)
            if step.cut or step.noop:
                continue
            key = model.canonical(step.state)[1]
            if key not in seen:
                seen.add(key)
                queue.append(step.state)
    return found


def test_a_state_and_its_workers_renamed_in_every_order_share_one_key() -> None:
    model = Model(SPEC, _universe(horizon_ms=30))
    states = _reachable(model, 400)
    assert len(states) == 400
    names = model.worker_names
    renamings = 0
    for state in states:
        key = model.canonical(state)[1]
        for order in itertools.permutations(range(len(names))):
            other = _renamed(state, order, names)
            if other != state:
                renamings += 1
            assert model.canonical(other)[1] == key, (state, order)
    # Most states tell their workers apart (a claim, a fence lost), so the renamings are
    # other states, not the same one again.
    assert renamings > 400


def test_the_reduction_keeps_what_the_check_finds_and_divides_the_states() -> None:
    universe = _universe(horizon_ms=24)
    reduced = check_compiled(SPEC, compiled=CompiledModel(Model(SPEC, universe)))
    whole = check_compiled(SPEC, compiled=CompiledModel(Model(SPEC, universe, symmetry=False)))
    for report in (reduced, whole):
        assert report.complete
        assert report.violations == []
        assert report.refinement == []
    assert set(reduced.edges_taken) == set(whole.edges_taken)
    assert reduced.edges_never_taken == whole.edges_never_taken
    assert reduced.rules_taken == whole.rules_taken
    assert reduced.rules_never_taken == whole.rules_never_taken
    assert reduced.sometimes == whole.sometimes
    assert reduced.terminal_unreached == whole.terminal_unreached
    assert reduced.never_at_rest == whole.never_at_rest
    assert whole.states / 6 <= reduced.states < whole.states / 2
