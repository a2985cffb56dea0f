"""The decision policies, pinned down rule by rule, and the backoff they schedule.

The expected decisions below are written out by hand, one row per combination
of a policy's predicates. They are deliberately not derived from the spec: a
change to `specs/workload.toml` that alters any decision fails here, loudly,
and the table must be changed with it.
"""

from __future__ import annotations

import itertools

import pytest

from support import CAPS, authority, request
from workwarden.statemachine import AdmitCommand, RetryPolicy, Workload, decide, default_spec
from workwarden.statemachine.policies import backoff_delay
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text
from workwarden.storage import Store

T, F = True, False

#: Per policy: its predicates, in the order the truth tuples below list them.
PREDICATE_ORDER: dict[str, tuple[str, ...]] = {
    "failure": (
        "effect_unknown",
        "retries_worker_failure",
        "retries_failure_kind",
        "budget_exhausted",
    ),
    "recovery": ("cancellation_requested", "retries_worker_failure", "budget_exhausted"),
    "deadline": ("deadline_bounds_work", "retries_timeout", "budget_exhausted"),
    "operator_timeout": ("retries_timeout", "budget_exhausted"),
    "claim": ("budget_exhausted",),
}

#: Per policy: predicate truth (in PREDICATE_ORDER) -> (decision, target state or None).
EXPECTED: dict[str, dict[tuple[bool, ...], tuple[str, str | None]]] = {
    "failure": {
        # effect_unknown, retries_worker_failure, retries_failure_kind, budget_exhausted
        (F, F, F, F): ("failure_kind_not_retryable", "DEAD_LETTER"),
        (F, F, F, T): ("failure_kind_not_retryable", "DEAD_LETTER"),
        (F, F, T, F): ("retry", "READY"),
        (F, F, T, T): ("attempt_budget_exhausted", "DEAD_LETTER"),
        (F, T, F, F): ("failure_kind_not_retryable", "DEAD_LETTER"),
        (F, T, F, T): ("failure_kind_not_retryable", "DEAD_LETTER"),
        (F, T, T, F): ("retry", "READY"),
        (F, T, T, T): ("attempt_budget_exhausted", "DEAD_LETTER"),
        (T, F, F, F): ("effect_unknown_not_retryable", "DEAD_LETTER"),
        (T, F, F, T): ("effect_unknown_not_retryable", "DEAD_LETTER"),
        (T, F, T, F): ("effect_unknown_not_retryable", "DEAD_LETTER"),
        (T, F, T, T): ("effect_unknown_not_retryable", "DEAD_LETTER"),
        (T, T, F, F): ("retry", "READY"),
        (T, T, F, T): ("attempt_budget_exhausted", "DEAD_LETTER"),
        (T, T, T, F): ("retry", "READY"),
        (T, T, T, T): ("attempt_budget_exhausted", "DEAD_LETTER"),
    },
    "recovery": {
        # cancellation_requested, retries_worker_failure, budget_exhausted
        (F, F, F): ("worker_failure_not_retryable", "DEAD_LETTER"),
        (F, F, T): ("worker_failure_not_retryable", "DEAD_LETTER"),
        (F, T, F): ("retry", "READY"),
        (F, T, T): ("attempt_budget_exhausted", "DEAD_LETTER"),
        (T, F, F): ("cancellation_requested", "CANCELLED"),
        (T, F, T): ("cancellation_requested", "CANCELLED"),
        (T, T, F): ("cancellation_requested", "CANCELLED"),
        (T, T, T): ("cancellation_requested", "CANCELLED"),
    },
    "deadline": {
        # deadline_bounds_work, retries_timeout, budget_exhausted
        (F, F, F): ("timeout_not_retryable", "DEAD_LETTER"),
        (F, F, T): ("timeout_not_retryable", "DEAD_LETTER"),
        (F, T, F): ("retry", "READY"),
        (F, T, T): ("attempt_budget_exhausted", "DEAD_LETTER"),
        (T, F, F): ("deadline_not_retryable", "DEAD_LETTER"),
        (T, F, T): ("deadline_not_retryable", "DEAD_LETTER"),
        (T, T, F): ("deadline_not_retryable", "DEAD_LETTER"),
        (T, T, T): ("deadline_not_retryable", "DEAD_LETTER"),
    },
    "operator_timeout": {
        # retries_timeout, budget_exhausted
        (F, F): ("timeout_not_retryable", "DEAD_LETTER"),
        (F, T): ("timeout_not_retryable", "DEAD_LETTER"),
        (T, F): ("retry", "READY"),
        (T, T): ("attempt_budget_exhausted", "DEAD_LETTER"),
    },
    "claim": {
        # budget_exhausted
        (F,): ("claimable", None),
        (T,): ("attempt_budget_exhausted", "DEAD_LETTER"),
    },
}

#: (policy, decision) -> (delay, direct, refuse): how each decision is carried out.
HOW: dict[tuple[str, str], tuple[str, bool, str | None]] = {
    ("failure", "effect_unknown_not_retryable"): ("none", False, None),
    ("failure", "failure_kind_not_retryable"): ("none", False, None),
    ("failure", "attempt_budget_exhausted"): ("none", False, None),
    ("failure", "retry"): ("backoff", False, None),
    ("recovery", "cancellation_requested"): ("none", True, None),
    ("recovery", "worker_failure_not_retryable"): ("none", False, None),
    ("recovery", "attempt_budget_exhausted"): ("none", False, None),
    ("recovery", "retry"): ("none", False, None),
    ("deadline", "deadline_not_retryable"): ("none", False, None),
    ("deadline", "timeout_not_retryable"): ("none", False, None),
    ("deadline", "attempt_budget_exhausted"): ("none", False, None),
    ("deadline", "retry"): ("initial", False, None),
    ("operator_timeout", "timeout_not_retryable"): ("none", False, None),
    ("operator_timeout", "attempt_budget_exhausted"): ("none", False, None),
    ("operator_timeout", "retry"): ("initial", False, None),
    ("claim", "attempt_budget_exhausted"): ("none", False, "WORKLOAD_ATTEMPTS_EXHAUSTED"),
    ("claim", "claimable"): ("none", False, None),
}


def test_the_shipped_spec_has_exactly_the_policies_tabled_here() -> None:
    assert set(default_spec().policies) == set(EXPECTED) == set(PREDICATE_ORDER)


@pytest.mark.parametrize("name", sorted(PREDICATE_ORDER))
def test_each_policy_decides_on_exactly_the_predicates_tabled_here(name: str) -> None:
    assert set(default_spec().policies[name].predicates) == set(PREDICATE_ORDER[name])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_expected_table_covers_every_combination_of_the_policys_predicates(name: str) -> None:
    combinations = set(itertools.product((F, T), repeat=len(PREDICATE_ORDER[name])))
    assert set(EXPECTED[name]) == combinations


@pytest.mark.parametrize(
    ("name", "truth"),
    [(name, truth) for name, table in sorted(EXPECTED.items()) for truth in table],
)
def test_the_first_matching_rule_decides_as_tabled(name: str, truth: tuple[bool, ...]) -> None:
    policy = default_spec().policies[name]
    values = dict(zip(PREDICATE_ORDER[name], truth, strict=True))
    rule = policy.first_match(values)
    assert (rule.spec.decision, rule.spec.to) == EXPECTED[name][truth]
    assert (rule.spec.delay, rule.spec.direct, rule.spec.refuse) == HOW[(name, rule.spec.decision)]


def test_first_match_accepts_a_function_of_the_predicate_name_as_well_as_a_mapping() -> None:
    policy = default_spec().policies["recovery"]
    by_function = policy.first_match(lambda name: name == "retries_worker_failure")
    by_mapping = policy.first_match(
        {"cancellation_requested": F, "retries_worker_failure": T, "budget_exhausted": F}
    )
    assert by_function is by_mapping
    assert by_function.spec.decision == "retry"


# -- backoff ------------------------------------------------------------------


def _workload(retry_count: int, **policy: object) -> Workload:
    admitted = decide(default_spec(), None, AdmitCommand(request=request()), 10_000).workload
    assert admitted is not None
    return admitted.model_copy(
        update={
            "retry_count": retry_count,
            "retry_policy": RetryPolicy.model_validate(
                {"initial_delay_ms": 1_000, "max_delay_ms": 300_000, **policy}
            ),
        }
    )


@pytest.mark.parametrize("retry_count", [1, 2, 3, 10])
def test_a_fixed_backoff_waits_the_initial_delay_before_every_retry(retry_count: int) -> None:
    workload = _workload(retry_count, backoff="fixed")
    assert backoff_delay(default_spec(), workload) == 1_000


@pytest.mark.parametrize(
    ("retry_count", "delay"),
    [(0, 1_000), (1, 1_000), (2, 2_000), (3, 4_000), (4, 8_000), (9, 256_000)],
)
def test_an_exponential_backoff_doubles_from_the_initial_delay(
    retry_count: int, delay: int
) -> None:
    workload = _workload(retry_count, backoff="exponential")
    assert backoff_delay(default_spec(), workload) == delay


@pytest.mark.parametrize("retry_count", [10, 11, 50])
def test_an_exponential_backoff_is_capped_at_the_max_delay(retry_count: int) -> None:
    workload = _workload(retry_count, backoff="exponential")
    assert backoff_delay(default_spec(), workload) == 300_000


def test_a_cap_below_the_initial_delay_caps_the_first_retry_too() -> None:
    workload = _workload(1, backoff="exponential", initial_delay_ms=5_000, max_delay_ms=2_000)
    assert backoff_delay(default_spec(), workload) == 2_000


@pytest.mark.parametrize(("initial", "expected"), [(1_000, 300_000), (1, 300_000), (0, 0)])
def test_a_huge_retry_count_neither_builds_a_huge_integer_nor_loops_per_retry(
    initial: int, expected: int
) -> None:
    # 10**18 doublings would not fit in memory, and as many loop turns would not
    # end; the delay stops growing as soon as it cannot change any more.
    workload = _workload(10**18, backoff="exponential", initial_delay_ms=initial)
    delay = backoff_delay(default_spec(), workload)
    assert delay == expected
    assert delay.bit_length() <= 64


# -- the policy is data: a changed copy of the spec changes the authority -------

_FAILURE_KIND_RULE = (
    '  { when = ["not effect_unknown", "not retries_failure_kind"], '
    'decision = "failure_kind_not_retryable", to = "DEAD_LETTER" },\n'
)


def _fail_once(store: Store, key: str, spec_text: str | None) -> str:
    spec = load_spec_text(spec_text, "copy.toml") if spec_text is not None else None
    warden = authority(store, spec)
    admitted = warden.admit(request(idempotency_key=key), now=10_000)
    workload_id = admitted.workload.workload_id
    claim = warden.claim(workload_id, "w", CAPS, now=11_000, lease_ms=10_000)
    warden.start(workload_id, claim.fence, now=12_000)
    return warden.fail(workload_id, claim.fence, "validation", "bad row", now=13_000)


def test_a_policy_changed_in_a_copy_of_the_spec_changes_what_the_authority_decides(
    store: Store,
) -> None:
    shipped = shipped_spec_text()
    assert shipped.count(_FAILURE_KIND_RULE) == 1
    changed = shipped.replace(_FAILURE_KIND_RULE, "")

    # The shipped spec does not retry a kind the retry policy does not name.
    assert _fail_once(store, "shipped", None) == "DEAD_LETTER"
    # Without that rule the same failure, on the same code, is retried.
    assert _fail_once(store, "changed", changed) == "READY"

    retried = authority(store).list("t", "app")
    decisions = {
        w.idempotency_key: [e.evidence.get("decision") for e in w.execution_history]
        for w in retried
    }
    assert decisions["shipped"][-1] == "failure_kind_not_retryable"
    assert decisions["changed"][-1] == "retry"
