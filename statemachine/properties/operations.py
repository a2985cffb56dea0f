"""What the properties read of the spec's operations table, derived once per spec.

The checks of this package, the checker, the stateful suite and the chaos
audit all need to know which operations present a fence, which are refused
once a deadline has fallen, which claim, which end a claim, which policy an
actor's decisions are recorded under. None of them lists operation names:
they ask `operation_roles(spec)`, which reads the `[operations]` table, the
policies' `actor` fields, the transition table and `Spec.roles`.
"""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

from workwarden.statemachine.spec import Spec

__all__ = ["OperationRoles", "operation_roles"]


@dataclass(frozen=True, slots=True)
class OperationRoles:
    """The operations of one spec by what they do (each a set of operation names).

    - `fenced`: the caller presents the current claim's fence (`fenced = true`).
    - `deadline_guarded`: a fallen deadline is enforced instead (`deadlines = true`).
    - `claiming`: the operations whose effect leases the work to a worker.
    - `completing`: the operations whose effect records the result.
    - `recovering`: the operations whose effect recovers an expired lease.
    - `claim_ending`: the operations that take an edge from a state a worker
      holds to one it does not.
    - `sweeps`: the system's operations a policy decides for (run over
      whatever is due).
    - `policy_of_actor`: the policy each decision is recorded under, by the
      policy's `actor`.
    - `deadline_actor`: the actor a fallen deadline is enforced as (the
      `acting_as` of the spec's deadline operation), at a sweep or a
      worker's call.
    - `success_statuses`: the attempt status of the completing operations.
    """

    fenced: frozenset[str]
    deadline_guarded: frozenset[str]
    claiming: frozenset[str]
    completing: frozenset[str]
    recovering: frozenset[str]
    claim_ending: frozenset[str]
    sweeps: tuple[str, ...]
    policy_of_actor: dict[str, str]
    deadline_actor: str | None
    success_statuses: frozenset[str]


_CACHE: WeakKeyDictionary[Spec, OperationRoles] = WeakKeyDictionary()


def operation_roles(spec: Spec) -> OperationRoles:
    """The operations of `spec` by what they do (worked out once per spec)."""
    known = _CACHE.get(spec)
    if known is None:
        known = _CACHE[spec] = _derive(spec)
    return known


def _derive(spec: Spec) -> OperationRoles:
    rows = spec.operations

    def by_effect(effect: str) -> frozenset[str]:
        return frozenset(name for name, op in rows.items() if op.spec.effect == effect)

    held = spec.claimed_states
    deadline = rows.get(spec.deadline_operation)
    deadline_actor = (deadline.spec.acting_as or deadline.actor) if deadline is not None else None
    completing = by_effect("record_result")
    return OperationRoles(
        fenced=frozenset(name for name, op in rows.items() if op.spec.fenced),
        deadline_guarded=frozenset(name for name, op in rows.items() if op.spec.deadlines),
        claiming=by_effect("lease"),
        completing=completing,
        recovering=by_effect("recover_lease"),
        claim_ending=frozenset(
            operation
            for edge in spec.data.transitions
            if edge.from_state in held and edge.to not in held
            for operation in edge.operations
        ),
        sweeps=tuple(
            name
            for name, op in rows.items()
            if op.spec.actor == "system" and op.via_policy is not None
        ),
        policy_of_actor={policy.spec.actor: name for name, policy in spec.policies.items()},
        deadline_actor=deadline_actor,
        success_statuses=frozenset(
            status for name in completing if (status := rows[name].spec.attempt_status) is not None
        ),
    )
