"""Holding the compiled model to the real core: every step of chosen traces must agree.

The compiled model (`compiled.py`) is trusted only because it is checked
against the real thing. `refine` takes traces of it — every edge and rule
witness of a report, every counterexample, and a sample of random walks —
and replays each through a real `Authority` on a real store
(`replay._Replayer`, as `workwarden replay` does). At every step the compiled
model's prediction (its next state, and the code it is refused with) must
agree with what the authority did (the state the store then holds, compiled
the same way, and the code the call was refused with). A disagreement is a
failure of the check itself: a `Finding` named `refinement`, with the trace
up to the step that disagrees.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.check.checker import CheckReport, Finding, _action_dict
from workwarden.statemachine.check.compiled import CompiledModel, Outcome
from workwarden.statemachine.check.replay import _action, _Replayer
from workwarden.statemachine.check.state import CheckState
from workwarden.statemachine.check.universe import Action
from workwarden.storage.base import Store
from workwarden.storage.memory import MemoryStore

__all__ = ["REFINEMENT", "random_traces", "refine", "refine_trace"]

#: The name refinement failures are reported under.
REFINEMENT = "refinement"

Trace = tuple[dict[str, Any], ...]


def _matching(
    compiled: CompiledModel,
    c: tuple[int, ...],
    now: int,
    action: Action,
    concrete: Callable[[], CheckState],
) -> Outcome | None:
    """The compiled model's outcome of `action` in `c` at `now` (None: it does not offer it)."""
    for outcome in compiled.outcomes(c, concrete):
        if action.label == "jump":
            if outcome.rel and now + outcome.rel == action.to:
                return outcome
        elif outcome.action == action:
            return outcome
    return None


def _given(state: CheckState) -> Callable[[], CheckState]:
    """A rebuild that needs no work: the concrete state is at hand."""
    return lambda: state


def _describe(compiled: CompiledModel, c: tuple[int, ...]) -> str:
    """A compiled state in words: each workload's state, the fences held, the counters."""
    parts = []
    for slot, d in enumerate(c[: compiled.slots]):
        parts.append(f"w{slot}={'-' if d < 0 else compiled.classes[d].state}#{d}")
    for k in range(compiled.workers):
        held, lost = c[compiled.held_at[k]], c[compiled.lost_at[k]]
        shown = [
            "-" if h < 0 else f"slot {compiled.holds[h][0]} token {compiled.holds[h][3]}"
            for h in (held, lost)
        ]
        parts.append(f"worker {k} holds {shown[0]}, lost {shown[1]}")
    parts.append(f"pending {'-' if c[compiled.pending_at] < 0 else 'yes'}")
    parts.append(f"crashes {c[compiled.crashes_at]}, prepares {c[compiled.prepares_at]}")
    return "; ".join(parts)


def _comparable(compiled: CompiledModel, c: tuple[int, ...]) -> tuple[int, ...]:
    """`c` without what a replay cannot see of a pending write (only whether there is one)."""
    p = compiled.pending_at
    return (*c[:p], 0 if c[p] < 0 else 1, *c[p + 1 :])


def refine_trace(
    compiled: CompiledModel,
    steps: Trace,
    store: Store,
    authority_cls: type[Authority] | None = None,
) -> Finding | None:
    """Replay `steps` through the compiled model and a real authority on `store`, side by side.

    Returns the first disagreement as a `refinement` finding (None: every step agreed).
    """
    model = compiled.model
    replayer = _Replayer(model, store, authority_cls or model.authority_cls)
    replayer.admit()
    c = compiled.initial
    concrete = compiled.initial_concrete
    now = 0
    real = compiled.compact(replayer.state())
    if _comparable(compiled, real) != _comparable(compiled, c):
        return Finding(
            REFINEMENT,
            "the admitted workloads differ: compiled "
            f"{_describe(compiled, c)}; real {_describe(compiled, real)}",
            (),
        )
    for number, raw in enumerate(steps, start=1):
        action = _action(raw)
        outcome = _matching(compiled, c, now, action, _given(concrete))
        shown = steps[:number]
        if outcome is None:
            return Finding(
                REFINEMENT,
                f"step {number} ({action.label}) is not offered by the compiled model",
                shown,
            )
        if outcome.cut or (action.label == "jump" and action.to > model.universe.horizon_ms):
            return None
        expected = compiled.apply(c, outcome)
        try:
            refusal = replayer.take(action)
        except errors.WorkloadError as exc:
            refusal = exc.code
        found = compiled.compact(replayer.state())
        if refusal != outcome.refusal or _comparable(compiled, found) != _comparable(
            compiled, expected
        ):
            return Finding(
                REFINEMENT,
                f"step {number} ({action.label}) disagrees: the compiled model predicts "
                f"refusal {outcome.refusal} and {_describe(compiled, expected)}; the real "
                f"authority answered refusal {refusal} and {_describe(compiled, found)}",
                shown,
            )
        concrete = compiled.take(concrete, action).state
        c = expected
        if action.label == "jump":
            now = action.to
    return None


def random_traces(compiled: CompiledModel, count: int, length: int, seed: int = 0) -> list[Trace]:
    """`count` random walks of the compiled model from the initial state, up to `length` steps."""
    rng = random.Random(seed)
    horizon = compiled.universe.horizon_ms
    out: list[Trace] = []
    for _ in range(count):
        c = compiled.initial
        concrete = compiled.initial_concrete
        now = 0
        steps: list[dict[str, Any]] = []
        for _ in range(length):
            choices = [
                o
                for o in compiled.outcomes(c, _given(concrete))
                if not o.cut and not o.noop and now + o.rel <= horizon
            ]
            if not choices:
                break
            outcome = rng.choice(choices)
            action = outcome.action
            if outcome.rel:
                action = Action("jump", "clock", to=now + outcome.rel)
            steps.append(_action_dict(action, now))
            c = compiled.apply(c, outcome)
            concrete = compiled.take(concrete, action).state
            if outcome.rel:
                now += outcome.rel
        out.append(tuple(steps))
    return out


def refine(
    compiled: CompiledModel,
    report: CheckReport,
    *,
    samples: int = 16,
    length: int = 30,
    seed: int = 0,
    store: Callable[[], Store] = MemoryStore,
    authority_cls: type[Authority] | None = None,
    wrap_store: Callable[[Store], Store] | None = None,
) -> list[Finding]:
    """Hold the compiled model to the real core on the report's traces and random walks.

    The traces are every witness, every counterexample and `samples` random
    walks of up to `length` steps; each is replayed on a fresh `store()`
    (wrapped by `wrap_store`, as a mutant wraps its store) through
    `authority_cls` (the model's). Returns the disagreements, one per trace
    that has one, the shortest first.
    """
    traces: list[Trace] = []
    seen: set[str] = set()
    candidates = [*report.witnesses.values(), *(v.trace for v in report.violations)]
    candidates += random_traces(compiled, samples, length, seed)
    for trace in candidates:
        text = json.dumps(trace, sort_keys=True)
        if trace and text not in seen:
            seen.add(text)
            traces.append(trace)
    found: list[Finding] = []
    for trace in traces:
        target = store()
        if wrap_store is not None:
            target = wrap_store(target)
        try:
            failure = refine_trace(compiled, trace, target, authority_cls)
        finally:
            target.close()
        if failure is not None:
            found.append(failure)
    return sorted(found, key=lambda f: len(f.trace))
