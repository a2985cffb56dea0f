"""Deadlines from the spec's table: which has fallen, and when the next one falls.

A deadline `kind` applies while the workload is in one of its `while` states
and its `<kind>_ms` timeout is set; it falls at anchor + duration, exactly
(never early: at that instant the whole duration has elapsed). Kinds are
evaluated in the declared order and the first that has fallen decides. Only
workloads admitted at the deadline contract version or later are subject to
deadlines; older documents keep the behaviour they were admitted under.
"""

from __future__ import annotations

from workwarden.statemachine.models import Workload
from workwarden.statemachine.predicates import ANCHORS
from workwarden.statemachine.spec import Spec

__all__ = ["deadline_breach", "next_deadline_at"]


#: A deadline kind's timeout field (`<kind>_ms`), named once per kind.
_FIELDS: dict[str, str] = {}


def _instants(spec: Spec, workload: Workload) -> list[tuple[str, int]]:
    if workload.contract_version < spec.deadline_contract_version:
        return []
    # The timeouts' values by field name; most workloads set none, and then no deadline falls.
    durations = workload.timeouts.__dict__
    if all(value is None for value in durations.values()):
        return []
    out: list[tuple[str, int]] = []
    for kind in spec.deadline_order:
        field = _FIELDS.get(kind)
        if field is None:
            field = _FIELDS.setdefault(kind, f"{kind}_ms")
        duration = durations[field]  # checked at load: every kind has its field
        if duration is None:
            continue
        table = spec.deadline_kinds[kind]
        if workload.state not in table.while_states:
            continue
        anchor = ANCHORS[table.anchor][0](workload, spec.roles)
        if anchor is None:
            continue
        out.append((kind, anchor + duration))
    return out


def deadline_breach(spec: Spec, workload: Workload, now: int) -> tuple[str, int] | None:
    """The first deadline (in declared order) that has fallen at `now`, and its instant."""
    for kind, at in _instants(spec, workload):
        if now >= at:
            return kind, at
    return None


def next_deadline_at(spec: Spec, workload: Workload) -> int | None:
    """The earliest instant at which one of the workload's deadlines falls (for the index)."""
    instants = [at for _, at in _instants(spec, workload)]
    return min(instants) if instants else None
