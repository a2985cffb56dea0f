"""Applying a decision policy of the spec to a draft, and the backoff it may schedule.

A policy is ordered rules over named predicates (see `predicates.py`); the
first rule that matches decides. Applying it moves the draft through the
policy's `via` state (carrying the operation's evidence) to the rule's target
(carrying the decision), or straight to the target for a `direct` rule, and
sets the next eligibility instant as the rule's `delay` says.

A policy decides only on failure kinds the spec declares (`[failures.kinds]`,
unless `[failures] open = true`): a reported kind outside that vocabulary is
refused with `WORKLOAD_INVALID`, naming the valid kinds, before anything is
decided. The retry policy of a request without one retries the kinds the
spec marks `retry_by_default` (`Spec.default_retry_on`).
"""

from __future__ import annotations

from collections.abc import Mapping

from workwarden.statemachine.draft import Draft
from workwarden.statemachine.models import Workload
from workwarden.statemachine.predicates import Facts
from workwarden.statemachine.spec import CompiledRule, Spec

__all__ = ["apply_policy", "backoff_delay"]


def backoff_delay(spec: Spec, workload: Workload) -> int:
    """The delay before the `retry_count`-th retry: initial * multiplier^(n-1), capped at max."""
    policy = workload.retry_policy
    multiplier = spec.backoff_multiplier[policy.backoff]
    exponent = max(workload.retry_count - 1, 0)
    # Stop growing once it cannot change any more (past the cap, a zero initial
    # delay, a fixed shape): a huge retry count must neither build a huge
    # integer nor loop once per retry. At most ~53 doublings reach any cap.
    delay = policy.initial_delay_ms
    for _ in range(exponent):
        if delay == 0 or delay >= policy.max_delay_ms or multiplier == 1:
            break
        delay *= multiplier
    return min(delay, policy.max_delay_ms)


def apply_policy(
    draft: Draft,
    name: str,
    facts: Facts,
    *,
    actor: str,
    via_actor: str | None = None,
    via_actor_class: str | None = None,
    via_evidence: Mapping[str, str] | None = None,
) -> CompiledRule:
    """Decide by policy `name` on `facts` and apply the decision to `draft`.

    When the policy has a `via` state and the deciding rule is not `direct`,
    the draft first enters `via` (by `via_actor`, with `via_evidence`), then
    the rule's target (by `actor`, with the decision as evidence).

    A reported failure kind (`facts.failure_kind`) the spec does not declare
    is refused with `WORKLOAD_INVALID` (`Spec.check_failure_kind`) before the
    policy decides; the draft is then discarded, so nothing is written.
    """
    if facts.failure_kind is not None:
        draft.spec.check_failure_kind(facts.failure_kind)
    policy = draft.spec.policies[name]
    rule = policy.decide(facts)
    target = rule.spec.to
    if target is None:
        return rule
    decision = {"decision": rule.spec.decision}
    if policy.spec.via is not None and not rule.spec.direct:
        if draft.workload.state != policy.spec.via:
            draft.move(
                policy.spec.via,
                actor=via_actor or actor,
                actor_class=via_actor_class or "system",
                evidence=via_evidence,
            )
        draft.move(target, actor=actor, actor_class="system", evidence=decision)
    else:
        evidence = {**(via_evidence or {}), **decision}
        draft.move(target, actor=actor, actor_class="system", evidence=evidence)
    w = draft.workload
    if rule.spec.delay == "backoff":
        w.retry_count += 1
        w.next_attempt_at = draft.now + backoff_delay(draft.spec, w)
    elif rule.spec.delay == "initial":
        w.retry_count += 1
        w.next_attempt_at = draft.now + w.retry_policy.initial_delay_ms
    return rule
