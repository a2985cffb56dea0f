"""The conformance scenarios of the operators' scope-wide calls: pauses and retention.

A pause changes no workload, but it changes what a claim answers; a purge
deletes workloads, and what is admitted again under a purged key must start
afresh without reusing a version. These scenarios put the scope-wide commands
of `scope_steps` (`pause`, `resume`, `purge`) between the commands of the
core, so the vectors record what each does to the work around it: a claim of
a paused scope answered with nothing (`claim_next`) or refused
`WORKLOAD_NOT_READY` with `details.paused` (a claim by id), the same claim
granted after the resume, in-flight work running on, a deadline falling
while paused, and a purged workload read as absent, admitted again as new, at
a version above every one it had, its fencing tokens continuing past the
purge's tombstone so that a fence of its first life is stale.
"""

from __future__ import annotations

from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.conformance.runner import Scenario
from workwarden.statemachine.conformance.scenarios import Work, claim_next, request
from workwarden.statemachine.conformance.scope_steps import (
    PauseCommand,
    PurgeCommand,
    ResumeCommand,
)
from workwarden.statemachine.models import RetryPolicy, Timeouts
from workwarden.statemachine.spec import default_spec

__all__ = ["scope_scenarios"]

Step = tuple[Any, int]

OPERATOR = "operator-1"


def pause(
    now: int,
    *,
    tenant: str = "t",
    application: str | None = None,
    definition: str | None = None,
    concurrency_key: str | None = None,
    reason: str | None = "maintenance",
) -> Step:
    """An operator's pause of a scope at `now`."""
    command = PauseCommand(
        tenant=tenant,
        application=application,
        definition=definition,
        concurrency_key=concurrency_key,
        actor=OPERATOR,
        reason=reason,
    )
    return command, now


def resume(
    now: int,
    *,
    tenant: str = "t",
    application: str | None = None,
    definition: str | None = None,
    concurrency_key: str | None = None,
) -> Step:
    """An operator's resume of a scope at `now`."""
    command = ResumeCommand(
        tenant=tenant,
        application=application,
        definition=definition,
        concurrency_key=concurrency_key,
        actor=OPERATOR,
    )
    return command, now


def purge(now: int, **fields: Any) -> Step:
    """A purge at `now` (`fields` are `PurgeCommand`'s: `older_than_ms`, `dry_run`, ...)."""
    return PurgeCommand(**fields), now


def _finish(work: Work, now: int, worker: str = "w1", token: int = 1) -> list[Step]:
    """Claim, start and complete `work` from `now` (it must be READY)."""
    return [
        work.claim(worker, now),
        work.start(worker, token, now + 100),
        work.complete(worker, token, now + 200, result=f"result-{work.request.idempotency_key}"),
    ]


def _s(name: str, *steps: Step, ends: str | None = None) -> Scenario:
    group = name.split("/")[0]
    return Scenario(
        name=name,
        steps=steps,
        ends=ends,
        about=f"scope-wide operator call; the suite pins it down in tests/test_{group}.py",
    )


def _pauses() -> list[Scenario]:
    first = Work(request("paused"))
    running = Work(request("running"))
    billing = Work(request("billing", application_id="billing"))
    ours = Work(request("ours"))
    queued = Work(request("queued", timeouts=Timeouts(queue_ms=500)))
    keyed = Work(request("keyed", concurrency_key="reports"))
    return [
        _s(
            "pauses/a_concurrency_key_pause_holds_that_keys_work_and_no_other",
            keyed.admit(10_000),
            ours.admit(10_100),
            pause(10_500, concurrency_key="reports"),
            keyed.claim("w1", 11_000),
            claim_next("w1", 11_000),
            claim_next("w2", 11_100),
            resume(11_500, concurrency_key="reports"),
            claim_next("w2", 12_000),
            ends="CLAIMED",
        ),
        _s(
            "pauses/a_paused_tenant_is_not_claimed_until_resumed",
            first.admit(10_000),
            pause(10_500),
            claim_next("w1", 11_000),
            first.claim("w1", 11_000),
            resume(12_000),
            claim_next("w1", 12_500),
            ends="CLAIMED",
        ),
        _s(
            "pauses/a_claim_by_id_of_a_paused_scope_is_refused_not_ready",
            first.admit(10_000),
            pause(10_500, application="app"),
            first.claim("w1", 11_000),
            ends=errors.NOT_READY,
        ),
        _s(
            "pauses/the_claim_refused_while_paused_is_granted_after_the_resume",
            first.admit(10_000),
            pause(10_500, application="app", definition="send"),
            first.claim("w1", 11_000),
            resume(11_500, application="app", definition="send"),
            first.claim("w1", 12_000),
            ends="CLAIMED",
        ),
        _s(
            "pauses/in_flight_work_runs_on_while_its_scope_is_paused",
            running.admit(10_000),
            running.claim("w1", 11_000),
            pause(11_200),
            running.start("w1", 1, 11_500),
            running.heartbeat("w1", 1, 12_000),
            running.checkpoint("w1", 1, 12_500),
            running.complete("w1", 1, 13_000),
            ends="SUCCEEDED",
        ),
        _s(
            "pauses/an_application_pause_leaves_the_tenants_other_applications_claimable",
            ours.admit(10_000),
            billing.admit(10_000),
            pause(10_500, application="app"),
            claim_next("w1", 11_000),
            claim_next("w1", 11_000, application="billing"),
            ends="CLAIMED",
        ),
        _s(
            "pauses/pausing_twice_or_resuming_what_is_not_paused_writes_nothing",
            first.admit(10_000),
            pause(10_500),
            pause(11_000, reason="again"),
            resume(11_500),
            resume(12_000),
            claim_next("w1", 12_500),
            ends="CLAIMED",
        ),
        _s(
            "pauses/a_definition_pause_without_its_application_is_refused",
            first.admit(10_000),
            pause(10_500, definition="send"),
            ends=errors.INVALID,
        ),
        _s(
            "pauses/a_queue_deadline_falls_while_the_scope_is_paused",
            queued.admit(10_000),
            pause(10_100),
            queued.enforce(10_500),
            resume(11_000),
            claim_next("w1", 11_000),
        ),
    ]


def _retention() -> list[Scenario]:
    after = default_spec().data.retention.after_ms
    old = Work(request("old"))
    dead = Work(request("dead", retry_policy=RetryPolicy(max_attempts=1)))
    young = Work(request("young"))
    waiting = Work(request("waiting"))
    again = Work(request("again"))
    late = 10_000 + after + 60_000
    return [
        _s(
            "retention/a_purge_deletes_old_finished_work_and_keeps_dead_letters_and_young_work",
            old.admit(10_000),
            *_finish(old, 11_000),
            dead.admit(10_000),
            dead.claim("w2", 11_000),
            dead.start("w2", 1, 11_100),
            dead.fail("w2", 1, 11_200, "validation"),
            waiting.admit(10_000),
            young.admit(late - 1_000),
            *_finish(young, late - 900),
            purge(late),
            old.claim("w1", late + 1),
            ends=errors.NOT_FOUND,
        ),
        _s(
            "retention/a_dry_run_reports_what_a_purge_would_delete_and_writes_nothing",
            old.admit(10_000),
            *_finish(old, 11_000),
            purge(late, dry_run=True),
            purge(late, older_than_ms=after + 120_000),
            purge(late, limit=1),
            old.claim("w1", late + 1),
            ends=errors.NOT_FOUND,
        ),
        _s(
            "retention/a_purge_whose_dry_run_is_not_true_or_false_is_refused_and_writes_nothing",
            old.admit(10_000),
            *_finish(old, 11_000),
            ({"op": "purge", "dry_run": "false"}, late),
            ({"op": "purge", "dry_run": 0}, late),
            ends=errors.INVALID,
        ),
        _s(
            "retention/a_purged_key_admitted_again_starts_afresh_and_never_reuses_a_version",
            again.admit(10_000),
            *_finish(again, 11_000),
            purge(late),
            again.admit(late + 1_000),
            again.admit(late + 1_500),
            # Its tokens continue past the purge's tombstone, so the claim of the new
            # life is not the first life's (token 1), whose fence is stale.
            again.claim("w1", late + 2_000),
            again.start("w1", 1, late + 2_100),
            ends=errors.STALE_FENCE,
        ),
    ]


def scope_scenarios() -> list[Scenario]:
    """Every pause and retention scenario, in a fixed order (`pauses/...`, `retention/...`)."""
    return [*_pauses(), *_retention()]
