"""The stateful suite put together: `AuthorityMachine` and the factories that configure it.

`AuthorityMachine` mixes every rule group of `workwarden.testing` into one
Hypothesis `RuleBasedStateMachine` (Hypothesis collects the rules,
initializers, invariants and preconditions of every class it inherits);
`authority_machine(...)` builds a concrete machine over a store factory and a
spec, and `run_authority_machine(...)` runs one once. A spec with operations
of effect `move` also gets `MoveRules`, which takes them.

The shadow model states the shipped spec's rules. Under a spec whose rules
differ it is off, and building the machine says so with a
`ShadowModelOffWarning`; asking for it (`shadow=True`) under a spec whose
table differs (other states, transitions or operations), which it cannot
follow at all, is refused.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.testing.admission_rules import AdmissionRules
from workwarden.testing.batch_rules import BatchRules
from workwarden.testing.claim_rules import ClaimRules
from workwarden.testing.clock_rules import ClockRules
from workwarden.testing.crash_rules import CrashRules
from workwarden.testing.held_rules import HeldCallRules
from workwarden.testing.move_rules import MoveRules, move_operations
from workwarden.testing.operator_rules import OperatorRules
from workwarden.testing.pause_rules import PauseRules
from workwarden.testing.profiles import chosen_profile
from workwarden.testing.race_rules import RaceRules
from workwarden.testing.reply_lost_rules import ReplyLostRules
from workwarden.testing.retention_rules import RetentionRules
from workwarden.testing.support import Coverage, StoreFactory, same_rules
from workwarden.testing.sweep_rules import SweepRules
from workwarden.testing.worker_rules import WorkerRules

__all__ = [
    "AuthorityMachine",
    "ShadowModelOffWarning",
    "authority_machine",
    "run_authority_machine",
    "same_table",
]


class ShadowModelOffWarning(UserWarning):
    """The stateful suite runs without its shadow model: the spec's rules are not the shipped ones.

    The shadow model predicts each call by the shipped spec's rules; under a
    spec whose states, table, policies, backoff or deadlines differ it cannot,
    so the suite checks every registered invariant after each step and that
    each refusal is one its operation can give, but predicts no outcome.
    Emitted once, when `authority_machine(...)` builds the machine. Pass
    `shadow=False` to say that this is what you want (no warning), or filter
    it like any warning.
    """


def same_table(spec: Spec, other: Spec) -> bool:
    """Do two specs have the same states, transitions and operations?"""
    fields = {"states", "transitions", "operations"}
    return spec.data.model_dump(include=fields) == other.data.model_dump(include=fields)


class AuthorityMachine(
    RaceRules,
    HeldCallRules,
    CrashRules,
    ReplyLostRules,
    BatchRules,
    PauseRules,
    WorkerRules,
    ClaimRules,
    AdmissionRules,
    OperatorRules,
    RetentionRules,
    SweepRules,
    ClockRules,
):
    """Writers and workers over one store, checked after every step.

    Build a concrete machine with `authority_machine(...)`; the class
    attributes of its base, `MachineBase`, are what it sets.
    """


_MAX_PARTIES = 64
"""The most writers, and the most workers, a machine takes (each example opens them all)."""


def authority_machine(
    store_factory: StoreFactory,
    spec: Spec | None = None,
    *,
    writers: int = 2,
    workers: int = 3,
    remember: Sequence[int] = (0, 16),
    shadow: bool | None = None,
    authority_class: type[Authority] = Authority,
    coverage: Coverage | None = None,
) -> type[AuthorityMachine]:
    """A concrete `AuthorityMachine` over stores from `store_factory`, under `spec`.

    `spec` defaults to the shipped spec. `shadow` runs the shadow model, which
    states the shipped spec's rules; by default it runs exactly when `spec`
    has the shipped rules (states, table, policies, backoff, deadlines), and
    otherwise the suite checks the invariants and that each refusal is one
    the operation can give, and warns (`ShadowModelOffWarning`) that the
    shadow model is off. `shadow=True` under a spec whose states, transitions
    or operations differ from the shipped ones is refused (`ValueError`): the
    shadow model cannot follow another table. (Under the shipped table with
    other policies it may run, and then holds the spec to the shipped rules.)
    A spec with operations of effect `move` gets `MoveRules` too.

    `writers` authorities share the store; each is built by `authority_class`
    (a subclass of `Authority`) with the next `remember` value, cycled (by
    default the first writer reads before every decision, the second decides
    one-call methods on its own 16 latest writes too). `workers` workers hold
    claims. `coverage` collects the edges and outcomes the runs reach. The
    class's `TestCase` is a unittest case for pytest, run under the profile
    `WORKWARDEN_HYPOTHESIS_PROFILE` names (`workwarden.testing.profiles`), or
    else the Hypothesis profile in force when it is first read.
    """
    if not callable(store_factory):
        raise errors.bad_argument(
            "store_factory", "store_factory must be a callable returning a fresh store"
        )
    for name, count in (("writers", writers), ("workers", workers)):
        # A count is checked here, not when the first example opens that many writers.
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_PARTIES:
            raise errors.bad_argument(
                name,
                f"{name} must be a whole number from 1 to {_MAX_PARTIES} (got {count!r}):"
                " need at least one writer and one worker",
            )
    if spec is not None and not isinstance(spec, Spec):
        raise errors.bad_argument(
            "spec", f"spec must be a Spec (load_spec(path)), not {type(spec).__name__}"
        )
    if shadow is not None and not isinstance(shadow, bool):
        raise errors.bad_argument("shadow", "shadow must be True, False or None (the default)")
    if coverage is not None and not isinstance(coverage, Coverage):
        raise errors.bad_argument("coverage", "coverage must be a Coverage (or None)")
    if not remember or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in remember
    ):
        raise errors.bad_argument(
            "remember", f"remember must list whole numbers of writes, 0 or more (got {remember})"
        )
    if not (isinstance(authority_class, type) and issubclass(authority_class, Authority)):
        raise errors.bad_argument(
            "authority_class", "authority_class must be Authority or a subclass of it"
        )
    chosen = spec if spec is not None else default_spec()
    shipped = default_spec()
    if shadow and not same_table(chosen, shipped):
        raise errors.bad_argument(
            "shadow",
            f"shadow=True under {chosen.source}: the shadow model states the shipped spec's "
            "rules and cannot follow a spec whose states, transitions or operations differ; "
            "leave shadow unset (the suite then checks the invariants and the refusals each "
            "operation can give)",
        )
    use_shadow = same_rules(chosen, shipped) if shadow is None else shadow
    if shadow is None and not use_shadow:
        warnings.warn(
            ShadowModelOffWarning(
                f"the stateful suite runs without its shadow model under {chosen.source}: its "
                "rules differ from the shipped spec's, so no call's outcome is predicted; every "
                "invariant and the refusals each operation can give are still checked (pass "
                "shadow=False to silence this)"
            ),
            stacklevel=2,
        )
    # Mixed in only when there is something to take, so the shipped spec's
    # programs are drawn from exactly the same rules as before.
    bases: tuple[type, ...] = (
        (MoveRules, AuthorityMachine) if move_operations(chosen) else (AuthorityMachine,)
    )
    machine: type[AuthorityMachine] = type(
        "AuthorityMachine",
        bases,
        {
            "store_factory": staticmethod(store_factory),
            "spec": chosen,
            "writer_count": writers,
            "remember": tuple(remember),
            "worker_count": workers,
            "authority_class": authority_class,
            "shadow_enabled": use_shadow,
            "coverage": coverage,
            "__doc__": AuthorityMachine.__doc__,
            # Named as the public module that exports the suite.
            "__module__": __package__,
        },
    )
    picked = chosen_profile()
    if picked is not None:
        # Hypothesis makes the class's unittest case once and keeps it.
        machine.TestCase.settings = picked
    return machine


def run_authority_machine(
    store_factory: StoreFactory,
    spec: Spec | None = None,
    *,
    settings: settings | None = None,
    writers: int = 2,
    workers: int = 3,
    remember: Sequence[int] = (0, 16),
    shadow: bool | None = None,
    authority_class: type[Authority] = Authority,
    coverage: Coverage | None = None,
) -> None:
    """Run the stateful suite once against stores from `store_factory`; raise on a failure.

    `settings` defaults to the profile `WORKWARDEN_HYPOTHESIS_PROFILE` names
    (`workwarden.testing.profiles`), or else the Hypothesis profile in force.
    """
    machine = authority_machine(
        store_factory,
        spec,
        writers=writers,
        workers=workers,
        remember=remember,
        shadow=shadow,
        authority_class=authority_class,
        coverage=coverage,
    )
    picked = chosen_profile()
    chosen = settings if settings is not None else picked if picked is not None else _current()
    # Older Hypothesis releases leave this one function unannotated.
    run_state_machine_as_test(machine, settings=chosen)  # type: ignore[no-untyped-call, unused-ignore]


def _current() -> settings:
    return settings()
