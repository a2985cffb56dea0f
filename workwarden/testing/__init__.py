"""The stateful suite, shipped in the package: hold an authority over your store to every rule.

`AuthorityMachine` is a Hypothesis `RuleBasedStateMachine` that drives
several writers (`Authority` objects over one store) and several workers
through random programs: admissions (new, replayed, conflicting), claims,
the worker calls, failures of every kind and effect, cancellation, operator
timeouts and re-arms, both sweeps, a clock that steps, leaps and jumps exactly
to the next lease expiry or deadline, workers that crash and come back with
old fences, a writer's `prepare` held while others commit, then
committed (every read-decide-write race, without threads or sleeps), and
batches (`admit_many`, `claim_many`, `report_many`) among all of these, each
slot held to what its one-call method would answer.

After every step it checks the committed store against the named invariants
of `workwarden.statemachine.properties.invariants`, and before every call it asks an
independent shadow model (`workwarden.testing.shadow`) what must happen: the call
fails the run when the authority disagrees. The shadow model states the shipped
spec's rules: under a spec whose rules differ it is off, and the suite says so
with a `ShadowModelOffWarning` (the invariants and the refusals each operation
may give are still checked). A refused call must change
nothing. A failing run prints the shortest program Hypothesis found, step by
step, with each call and its outcome noted.

Run it against your own store (needs the `test` extra, for Hypothesis):

    import contextlib, pathlib, tempfile
    from workwarden.storage import SQLiteStore  # or your own store
    from workwarden.testing import authority_machine

    @contextlib.contextmanager
    def fresh_store():  # a fresh, empty store per example, its folder removed after
        with tempfile.TemporaryDirectory() as folder:
            yield SQLiteStore(pathlib.Path(folder) / "store.db")

    TestMyStore = authority_machine(fresh_store).TestCase

The factory returns a fresh, empty store, or a context manager yielding one;
the machine opens one per example and closes it when the example ends.
`run_authority_machine(store_factory, ...)` runs it once, in any test. The
rules, invariants and profiles are described in `docs/testing.md`.

The suite's parts: `machine` (the base: setup, the checks after every step,
the plumbing of each call), the rule groups mixed into `AuthorityMachine`
(`admission_rules`, `batch_rules`, `claim_rules`, `worker_rules`, `crash_rules`,
`operator_rules`, `sweep_rules`, `clock_rules`, `held_rules`, `race_rules`, and
`move_rules` for a spec with operations of effect `move`, `reply_lost_rules` for calls
repeated after a lost reply),
`suite` (the machine and its factories), `support` (plans, workers, the
recording store) and `shadow` (the independent model).
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401  (the stateful suite is built on it)
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError(
        "workwarden.testing needs Hypothesis: pip install 'workwarden[test]'"
    ) from None

from workwarden.testing.move_rules import MoveRules
from workwarden.testing.profiles import PROFILE_ENV, PROFILES, profile
from workwarden.testing.reply_lost_rules import ReplyLostRules
from workwarden.testing.suite import (
    AuthorityMachine,
    ShadowModelOffWarning,
    authority_machine,
    run_authority_machine,
)
from workwarden.testing.support import (
    CheckFailed,
    Coverage,
    RecordingBatchStore,
    RecordingStore,
    StoreFactory,
    WorkloadPlan,
    recording_store,
    workload_plans,
)

__all__ = [
    "PROFILES",
    "PROFILE_ENV",
    "AuthorityMachine",
    "CheckFailed",
    "Coverage",
    "MoveRules",
    "RecordingBatchStore",
    "RecordingStore",
    "ReplyLostRules",
    "ShadowModelOffWarning",
    "StoreFactory",
    "WorkloadPlan",
    "authority_machine",
    "profile",
    "recording_store",
    "run_authority_machine",
    "workload_plans",
]
