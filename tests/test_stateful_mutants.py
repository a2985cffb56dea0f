"""The stateful suite has teeth: it catches each deliberately broken variant, by name.

Every run here is derandomised (the same programs on every run, so CI is
stable) and stops at the first failure without shrinking it (the test needs
which check failed, not the shortest program); each mutant is caught within
the first few hundred programs, well inside the run's ceiling. (Which
programs come first is fixed for a given version of the code and of
Hypothesis, but any change can reorder them: the ceiling leaves room.) Each mutant of `mutants.py`
is run twice: with the whole suite, where the shadow model usually notices
first, and with the shadow model switched off, to show that the invariants
alone catch it too. The control runs the unbroken authority through runs of
the same kind, with several numbers of writers and workers, until it has taken
every edge of the table that any sequence of calls can take and met every
refusal and boundary race listed below (usually within the first two runs);
every run must pass, so the mutants are caught for what they break, not
because the runs fail anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from mutants import (
    BlindRecoveryAuthority,
    BudgetlessFailureAuthority,
    UnfencedCompleteAuthority,
    VersionBlindStore,
    batch_commits_refusals,
    budgetless_spec,
    late_deadlines,
)

from workwarden.statemachine import default_spec, errors
from workwarden.storage import MemoryStore
from workwarden.testing import CheckFailed, Coverage, run_authority_machine

RUNS = settings(
    max_examples=2_000,
    stateful_step_count=50,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
"""How the mutants are run: at most 2,000 examples, each caught long before."""

CONTROL = settings(RUNS, max_examples=200)
"""How the unbroken authority is run: the same, 200 examples a run."""


def caught(
    *,
    shadow: bool,
    during: Callable[[], AbstractContextManager[Any]] = nullcontext,
    **options: Any,
) -> str:
    """The name of the check that fails the run (the run must fail)."""
    options.setdefault("store_factory", MemoryStore)
    with pytest.raises(CheckFailed) as failure, during():
        run_authority_machine(settings=RUNS, shadow=shadow, **options)
    return failure.value.check


# Where two checks can see the same mutant, the one that fails first depends
# on which of the mutant's effects the run meets first: both are named.
REWRITTEN = {"writes_extend_the_committed_history"}
# The shadow model's predictions are held to a one-call method's answer, or to a
# batch slot's (which must be the one-call answer): whichever call meets the
# mutant first names it.
PREDICTED = {"shadow_model", "batch_slots_answer_as_single_calls"}
STALE_ADMISSION = {"replies_are_consistent"} | REWRITTEN


@pytest.mark.parametrize(
    ("shadow", "remember", "checks"),
    [
        pytest.param(True, (0, 16), PREDICTED, id="whole-suite"),
        pytest.param(False, (0,), REWRITTEN, id="invariants-alone"),
        pytest.param(False, (0, 16), STALE_ADMISSION, id="invariants-alone-remembering-writer"),
    ],
)
def test_a_store_that_ignores_the_expected_version_is_caught(
    shadow: bool, remember: tuple[int, ...], checks: set[str]
) -> None:
    # A held call commits over a write it never saw: the shadow model expects
    # WORKLOAD_CONFLICT, and the write loses the events it did not decide on.
    # A writer that decides admissions on assumed absence may instead re-create
    # an admitted workload, answering created=True to a reused key.
    options = {"store_factory": VersionBlindStore, "remember": remember}
    assert caught(shadow=shadow, **options) in checks


@pytest.mark.parametrize(
    ("shadow", "checks"),
    [
        pytest.param(True, PREDICTED, id="whole-suite"),
        pytest.param(False, {"no_write_from_a_stale_fence"}, id="invariants-alone"),
    ],
)
def test_an_authority_that_skips_the_fence_check_on_complete_is_caught(
    shadow: bool, checks: set[str]
) -> None:
    # A stale worker's completion is answered (or accepted) as if it were the
    # holder's; the audit record of the accepted write carries the stale token.
    # Two workers, so that the work changes hands between them often.
    options = {"authority_class": UnfencedCompleteAuthority, "workers": 2}
    assert caught(shadow=shadow, **options) in checks


@pytest.mark.parametrize(
    ("shadow", "remember", "checks"),
    [
        pytest.param(True, (0,), PREDICTED, id="whole-suite"),
        pytest.param(False, (0,), REWRITTEN, id="invariants-alone"),
        pytest.param(True, (16,), REWRITTEN | PREDICTED, id="remembering-writers"),
    ],
)
def test_a_recovery_that_does_not_recheck_the_committed_version_is_caught(
    shadow: bool, remember: tuple[int, ...], checks: set[str]
) -> None:
    # A sweep step held while another writer commits overwrites that commit with
    # the decision it made on the version it read (the shadow model expects
    # WORKLOAD_CONFLICT). A writer that remembers its own writes runs into the
    # same stale read inside a one-call sweep, where only the rewritten history
    # or the shadow model's comparison after the step can tell.
    options = {"authority_class": BlindRecoveryAuthority, "remember": remember}
    assert caught(shadow=shadow, **options) in checks


@pytest.mark.parametrize(
    ("shadow", "checks"),
    [
        pytest.param(True, PREDICTED, id="whole-suite"),
        pytest.param(
            False,
            {"no_write_after_a_deadline", "deadlines_enforced_only_when_due"},
            id="invariants-alone",
        ),
    ],
)
def test_a_deadline_check_one_millisecond_late_is_caught(shadow: bool, checks: set[str]) -> None:
    # At the instant a deadline falls the core still accepts the call (and the
    # sweep still finds nothing), which the clock's jumps to that instant reach;
    # a timeout it does record may name a deadline that fell one ms before
    # another one earlier in the order.
    assert caught(shadow=shadow, during=late_deadlines) in checks


@pytest.mark.parametrize(
    ("shadow", "checks"),
    [
        pytest.param(True, PREDICTED, id="whole-suite"),
        pytest.param(False, {"decisions_follow_the_policy"}, id="invariants-alone"),
    ],
)
def test_a_failure_policy_that_retries_past_the_budget_is_caught(
    shadow: bool, checks: set[str]
) -> None:
    # Deployed with a failure policy lacking the budget rule, checked against
    # the shipped spec: the recorded decision is not the one the spec gives.
    assert caught(shadow=shadow, authority_class=BudgetlessFailureAuthority) in checks


@pytest.mark.parametrize(
    ("shadow", "checks"),
    [
        pytest.param(True, PREDICTED, id="whole-suite"),
        pytest.param(False, {"attempts_within_budget"}, id="invariants-alone"),
    ],
)
def test_a_policy_file_without_budget_rules_is_caught_as_the_users_own_spec(
    shadow: bool, checks: set[str]
) -> None:
    # The suite run on a user's spec that lost every budget rule: its own
    # decisions agree with it, but the attempt budget is overrun.
    assert caught(shadow=shadow, spec=budgetless_spec()) in checks


@pytest.mark.parametrize(
    ("shadow", "checks"),
    [
        pytest.param(True, {"batch_slots_answer_as_single_calls"}, id="whole-suite"),
        pytest.param(False, {"no_write_from_a_stale_fence"}, id="invariants-alone"),
    ],
)
def test_a_report_many_that_commits_what_its_one_call_method_refuses_is_caught(
    shadow: bool, checks: set[str]
) -> None:
    # Only the batch path is broken: a stale worker's report in a batch is
    # written under the current claim, where `complete` alone refuses it. The
    # slot answers what the one-call method would not; the write's audit record
    # carries the stale token.
    assert caught(shadow=shadow, during=batch_commits_refusals) in checks


# Edges of the shipped table that no sequence of calls takes: CREATED and FAILED
# are transient (never at rest, so no operator can cancel from them), and READY
# work always has an attempt left (every way back to READY checks the budget
# first), so the claim policy's budget rule never fires.
UNREACHABLE = [("CREATED", "CANCELLED"), ("FAILED", "CANCELLED"), ("READY", "DEAD_LETTER")]

# What the control runs must meet, by operation: each call's success and the
# refusals that exercise fencing, leases, deadlines, budgets, replays and races.
EXPECTED_OUTCOMES = [
    ("admit", "ok"),
    ("admit", errors.IDEMPOTENCY_KEY_REUSED),
    ("admit", errors.CONFLICT),
    ("claim", "ok"),
    ("claim", errors.NOT_READY),
    ("claim", errors.NOT_YET_ELIGIBLE),
    ("claim", errors.CAPABILITY_DENIED),
    ("claim", errors.TIMED_OUT),
    ("claim", errors.CONFLICT),
    ("claim_next", "ok"),
    ("start", "ok"),
    ("start", errors.TRANSITION_DENIED),
    ("heartbeat", "ok"),
    ("heartbeat", errors.LEASE_EXPIRED),
    ("heartbeat", errors.CONFLICT),
    ("execution_context", "ok"),
    ("checkpoint", "ok"),
    ("complete", "ok"),
    ("complete", errors.STALE_FENCE),
    ("complete", errors.CLAIM_INVALID),
    ("complete", errors.TIMED_OUT),
    ("complete", errors.RESULT_CONFLICT),
    ("fail", "ok"),
    ("cancel", "ok"),
    ("cancel", errors.TRANSITION_DENIED),
    ("timeout", "ok"),
    ("retry", "ok"),
    ("recover_expired", "ok"),
    ("recover_expired", errors.CONFLICT),
    ("enforce_deadlines", "ok"),
    ("enforce_deadlines", errors.CONFLICT),
    # Batches: slots answered as their one-call methods, and writes of a batch
    # that found another writer's version (decided again on a fresh read).
    ("batch admit", "ok"),
    ("batch admit", errors.IDEMPOTENCY_KEY_REUSED),
    ("batch admit", errors.INVALID),
    ("admit_many", "batch conflict"),
    ("claim_many", "ok"),
    ("batch start", "ok"),
    ("batch heartbeat", "ok"),
    ("batch heartbeat", errors.LEASE_EXPIRED),
    ("batch checkpoint", "ok"),
    ("batch complete", "ok"),
    ("batch complete", errors.CLAIM_INVALID),
    ("batch fail", "ok"),
    ("report_many", "batch conflict"),
]

# Boundary races the control runs must meet: refusals at the very instant the
# lease expired (a heartbeat racing the recovery sweep) or a deadline fell (a
# completion at the execution deadline, a claim at the queue deadline).
AT_THE_INSTANT = [
    ("heartbeat", errors.LEASE_EXPIRED),
    ("complete", errors.TIMED_OUT),
    ("claim", errors.TIMED_OUT),
]


# The control's runs, in turn, until everything above has been met: the mutants'
# configuration first, then other numbers of writers and workers, with and without
# the shadow model (other programs, the same checks). Every run must pass.
CONFIGURATIONS: list[dict[str, Any]] = [
    {},
    {"writers": 3, "workers": 2, "shadow": False},
    {"workers": 1},
    {"writers": 1, "workers": 2, "remember": (16,)},
    {"workers": 4, "shadow": False},
    {"writers": 3, "remember": (0, 4, 16)},
    # With pauses and purges among the rules, the races at a deadline's instant come up
    # less often in a run: one more run of one worker and one writer each.
    {"writers": 1, "workers": 1},
    {"writers": 1, "workers": 1, "shadow": False},
]


def _unmet(coverage: Coverage) -> list[Any]:
    edges = [e for e in coverage.edges_never_taken(default_spec()) if e not in UNREACHABLE]
    outcomes = [o for o in EXPECTED_OUTCOMES if coverage.outcomes[o] == 0]
    instants = [r for r in AT_THE_INSTANT if coverage.at_the_instant[r] == 0]
    return [*edges, *outcomes, *instants]


def test_the_unbroken_authority_passes_runs_of_the_same_kind_and_reaches_everything() -> None:
    coverage = Coverage()
    for options in CONFIGURATIONS:
        run_authority_machine(MemoryStore, settings=CONTROL, coverage=coverage, **options)
        if not _unmet(coverage):
            break
    assert coverage.edges_never_taken(default_spec()) == UNREACHABLE
    missing = [outcome for outcome in EXPECTED_OUTCOMES if coverage.outcomes[outcome] == 0]
    assert missing == [], f"never met: {missing}"
    late = [race for race in AT_THE_INSTANT if coverage.at_the_instant[race] == 0]
    assert late == [], f"never met at the boundary instant: {late}"
