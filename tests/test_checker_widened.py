"""The checker's calls that repeat a lost reply, and admission inside its grant's window.

A worker's checkpoint may name its sequence (the next one, or its last one
again after a lost reply), a worker whose cancellation confirmation went
unanswered confirms again through the fence it lost, and the requester sends
an admission again at a later instant than its grant was issued. The oracle
restates what the spec says of each; a core that gets one wrong is reported
by both engines, with a trace the real `Authority` replays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from workwarden.cli import main
from workwarden.statemachine import default_spec, errors
from workwarden.statemachine.admission import with_required_states
from workwarden.statemachine.check.checker import CheckReport, check
from workwarden.statemachine.check.compiled import CompiledModel
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.mutants import Mutant
from workwarden.statemachine.check.oracle import PROPERTY, expect
from workwarden.statemachine.check.refinement import refine
from workwarden.statemachine.check.replay import replay_trace
from workwarden.statemachine.check.universe import (
    BORROWED_REQUEST,
    CHECKER_KEY,
    CHECKER_KEY_ID,
    FORGED_VARIANTS,
    OTHER_OUTPUT,
    RAISED,
    REQUEST_AGAIN,
    STALE_FAIL_VARIANTS,
    Action,
    CheckState,
    Model,
    Universe,
    claim_request_of,
)
from workwarden.statemachine.commands import (
    AdmitCommand,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    RecoverCommand,
    RetryCommand,
    StateReply,
    SweepReply,
    TimeoutCommand,
)
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.grants import GrantSigner
from workwarden.statemachine.models import ClaimReply, CreateWorkload, Fence, Result, Workload
from workwarden.statemachine.spec import Spec, load_spec
from workwarden.storage import MemoryStore

#: One workload, one worker, a short horizon: the checker judge's universe.
SMALL = Universe(workers=1, dependent=False, horizon_ms=14)

WORKER = "worker-A"


def _walk(model: Model, *actions: Action) -> CheckState:
    """The state `actions` reach from the initial one, each granted."""
    state = model.initial()
    for action in actions:
        step = model.step(state, action)
        assert step.refusal is None, (action, step.refusal)
        state = step.state
    return state


def _claim() -> Action:
    return Action("claim", WORKER, slot=0, worker=0)


def _call(label: str, arg: str = "") -> Action:
    return Action(label, WORKER, slot=0, worker=0, arg=arg)


def _workload(model: Model, state: CheckState) -> Workload:
    w = model.workload(state.docs[0])
    assert w is not None
    return w


def _fence(w: Workload) -> Fence:
    attempt = w.attempts[-1]
    return Fence(
        claim_id=attempt.claim_id, worker_id=attempt.worker_id, token=attempt.fencing_token
    )


def _core(spec: Spec, w: Workload | None, command: Command, now: int) -> tuple[str | None, bool]:
    """The core's answer: its refusal code (None: granted), and whether it writes."""
    try:
        decision = decide(spec, w, command, now)
    except errors.WorkloadError as exc:
        return exc.code, False
    code = decision.refusal.code if decision.refusal is not None else None
    return code, decision.workload is not None


def _spec_says(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> tuple[str | None, bool]:
    expected = expect(spec, w, command, now)
    assert expected is not None, f"the oracle does not restate {command.op}"
    return expected.code, expected.writes


# -- checkpoints that name their sequence ----------------------------------------------------


def _checkpointed() -> tuple[Spec, Model, Workload]:
    spec = default_spec()
    model = Model(spec, SMALL)
    state = _walk(model, _claim(), _call("start"), _call("checkpoint", "next"))
    return spec, model, _workload(model, state)


def test_a_checkpoint_naming_the_next_sequence_is_recorded() -> None:
    spec, _, w = _checkpointed()
    assert len(w.checkpoints) == 1
    command = CheckpointCommand(
        workload_id=w.workload_id, fence=_fence(w), state={"step": 1}, sequence=2
    )
    assert _spec_says(spec, w, command, 0) == (None, True) == _core(spec, w, command, 0)
    expected = expect(spec, w, command, 0)
    assert expected is not None
    assert expected.shape is not None
    assert expected.shape.checkpoints == 2


def test_a_repeated_checkpoint_with_the_same_state_is_answered_without_a_write() -> None:
    spec, _, w = _checkpointed()
    command = CheckpointCommand(
        workload_id=w.workload_id, fence=_fence(w), state={"step": 1}, sequence=1
    )
    assert _spec_says(spec, w, command, 0) == (None, False) == _core(spec, w, command, 0)


@pytest.mark.parametrize(
    ("sequence", "state", "code"),
    [
        (1, {"step": 2}, errors.CONFLICT),  # the recorded sequence, another state
        (3, {"step": 1}, errors.INVALID),  # beyond the next
    ],
)
def test_any_other_sequence_is_the_documented_refusal(
    sequence: int, state: dict[str, int], code: str
) -> None:
    spec, _, w = _checkpointed()
    command = CheckpointCommand(
        workload_id=w.workload_id, fence=_fence(w), state=state, sequence=sequence
    )
    assert _spec_says(spec, w, command, 0) == (code, False) == _core(spec, w, command, 0)


def test_the_worker_repeats_its_last_checkpoint_only_once_its_attempt_recorded_one() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    running = _walk(model, _claim(), _call("start"))
    repeat = _call("checkpoint", "repeat")
    assert repeat not in list(model.actions(running))
    checkpointed = model.step(running, _call("checkpoint")).state
    assert repeat in list(model.actions(checkpointed))
    # The repeat names the checkpoint recorded, with the same state, and writes nothing.
    command = model._command(checkpointed, repeat)
    assert isinstance(command, CheckpointCommand)
    assert command.sequence == 1
    step = model.step(checkpointed, repeat)
    assert (step.refusal, step.wrote) == (None, ())


# -- a confirmation sent again after its reply was lost ---------------------------------------


def test_a_worker_whose_confirmation_went_unanswered_confirms_again_and_is_answered() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    cancel = Action("cancel", "operator", slot=0)
    state = _walk(model, _claim(), cancel, _call("confirm_cancel"))
    held, lost = state.workers[0]
    assert held is None
    assert lost is not None
    again = _call("stale_confirm_cancel")
    assert again in list(model.actions(state))
    w = _workload(model, state)
    command = ConfirmCancelCommand(workload_id=w.workload_id, fence=_fence(w))
    assert _spec_says(spec, w, command, 0) == (None, False) == _core(spec, w, command, 0)
    step = model.step(state, again)
    assert (step.refusal, step.wrote) == (None, ())


# -- admission inside the grant's window ------------------------------------------------------


def _request(model: Model, **grant: object) -> CreateWorkload:
    """The universe's first request, its grant changed by `grant` and signed again."""
    request = model.requests[0]
    changed = request.authorization_snapshot.grant.model_copy(update=grant)
    signed = GrantSigner(CHECKER_KEY_ID, CHECKER_KEY).sign(changed)
    return request.model_copy(update={"authorization_snapshot": signed})


def test_an_admission_after_the_grant_was_issued_is_answered_with_the_original() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    w = _workload(model, model.initial())
    assert w.authorization_snapshot.grant.issued_at == 0
    command = AdmitCommand(request=model.requests[0])
    assert _spec_says(spec, w, command, 7) == (None, False) == _core(spec, w, command, 7)
    assert _spec_says(spec, None, command, 7) == (None, True) == _core(spec, None, command, 7)


@pytest.mark.parametrize(
    "grant",
    [
        {"issued_at": 8},  # not yet issued at 7
        {"expires_at": 7},  # expired at 7
        {"status": "revoked"},
        {"tenant_id": "another"},  # does not bind the request's tenant
    ],
)
def test_an_admission_outside_the_grant_is_unauthorized(grant: dict[str, object]) -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    w = _workload(model, model.initial())
    command = AdmitCommand(request=_request(model, **grant))
    refused = (errors.UNAUTHORIZED, False)
    assert _spec_says(spec, w, command, 7) == refused == _core(spec, w, command, 7)
    assert _spec_says(spec, None, command, 7) == refused == _core(spec, None, command, 7)


def test_another_request_under_the_same_key_is_refused_as_a_reused_key() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    w = _workload(model, model.initial())
    other = model.requests[0].model_copy(update={"input": {"n": 99}})
    command = AdmitCommand(request=other)
    reused = (errors.IDEMPOTENCY_KEY_REUSED, False)
    assert _spec_says(spec, w, command, 7) == reused == _core(spec, w, command, 7)


def test_the_requester_sends_its_admission_again_at_later_instants() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    state = _walk(model, _claim())  # its lease and claim deadline give the clock instants
    later = [a for a in model.actions(state) if a.label == "jump"][-1]
    moved = model.step(state, later).state
    assert moved.now > 0
    again = Action("admit", "requester", slot=0)
    assert again in list(model.actions(moved))
    step = model.step(moved, again)
    assert (step.refusal, step.wrote) == (None, ())


# -- a core that gets one of them wrong is reported ------------------------------------------


def _records_the_repeat(spec: Spec, w: Workload | None, command: Command, now: int) -> Decision:
    """A core that ignores the sequence a checkpoint names: a repeat is recorded again."""
    if isinstance(command, CheckpointCommand) and command.sequence is not None:
        command = command.model_copy(update={"sequence": None})
    return decide(spec, w, command, now)


def _refuses_the_repeat(spec: Spec, w: Workload | None, command: Command, now: int) -> Decision:
    """A core that takes every recorded sequence named again for another state."""
    if (
        isinstance(command, CheckpointCommand)
        and w is not None
        and command.sequence is not None
        and command.sequence <= len(w.checkpoints)
    ):
        raise errors.WorkloadError(errors.CONFLICT, "recorded with another state")
    return decide(spec, w, command, now)


def _confirmation_not_replayed(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that answers a repeated confirmation only on a workload's second attempt."""
    if (
        isinstance(command, ConfirmCancelCommand)
        and w is not None
        and w.current_claim is None
        and len(w.attempts) < 2
    ):
        raise errors.WorkloadError(errors.CLAIM_INVALID, "no claim")
    return decide(spec, w, command, now)


def _grant_window_from_issue_only(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that admits only at the very instant the grant was issued."""
    if (
        isinstance(command, AdmitCommand)
        and command.request.authorization_snapshot.grant.issued_at != now
    ):
        raise errors.WorkloadError(errors.UNAUTHORIZED, "not active at the instant")
    return decide(spec, w, command, now)


def _crashes_on_a_repeat(spec: Spec, w: Workload | None, command: Command, now: int) -> Decision:
    """A core that reads past the end of the checkpoints on a repeated one."""
    if (
        isinstance(command, CheckpointCommand)
        and w is not None
        and command.sequence is not None
        and command.sequence <= len(w.checkpoints)
    ):
        return decide(spec, w, command, w.checkpoints[len(w.checkpoints)].created_at)
    return decide(spec, w, command, now)


def _failure_report_not_replayed(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that refuses a failure report sent again once its attempt has ended."""
    if (
        isinstance(command, FailCommand)
        and w is not None
        and w.current_claim is None
        and any(a.fencing_token == command.fence.token and a.ended_at for a in w.attempts)
    ):
        raise errors.WorkloadError(errors.CLAIM_INVALID, "no claim")
    return decide(spec, w, command, now)


def _checkpoint_sequence_misstated(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose checkpoint event states the sequence after the one it records."""
    decision = decide(spec, w, command, now)
    if isinstance(command, CheckpointCommand) and decision.workload is not None:
        evidence = decision.workload.execution_history[-1].evidence
        if "checkpoint_sequence" in evidence:
            evidence["checkpoint_sequence"] = str(int(evidence["checkpoint_sequence"]) + 1)
    return decision


def _rearm_budget_overstated(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose re-arm event states one attempt more than the budget it makes."""
    decision = decide(spec, w, command, now)
    if isinstance(command, RetryCommand) and decision.workload is not None:
        evidence = decision.workload.execution_history[-1].evidence
        evidence["attempt_budget"] = str(int(evidence["attempt_budget"]) + 1)
    return decision


def _repeated_result(w: Workload | None, command: Command) -> Result | None:
    """The result `w` records when `command` is a completion naming it, or None."""
    if (
        isinstance(command, CompleteCommand)
        and w is not None
        and w.result is not None
        and w.result.result_id == command.result_id
    ):
        return w.result
    return None


def _refenced(command: Command, **changes: object) -> Command:
    """`command` presenting its fence with `changes`."""
    fence = command.fence  # type: ignore[union-attr]
    return command.model_copy(update={"fence": fence.model_copy(update=changes)})


def _result_replay_by_identity(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that knows a repeated completion only by the very worker id object it recorded."""
    result = _repeated_result(w, command)
    if result is not None and result.produced_by is not command.fence.worker_id:  # type: ignore[union-attr]
        raise errors.WorkloadError(errors.RESULT_CONFLICT, "recorded by a different report")
    return decide(spec, w, command, now)


def _fence_by_claim_and_token(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose fence check compares the claim id and the token, not the worker id."""
    fence = getattr(command, "fence", None)
    claim = None if w is None else w.current_claim
    if (
        fence is not None
        and claim is not None
        and fence.worker_id != claim.worker_id
        and (fence.claim_id, fence.token) == (claim.claim_id, claim.fencing_token)
    ):
        command = _refenced(command, worker_id=claim.worker_id)
    return decide(spec, w, command, now)


def _fence_token_not_above(spec: Spec, w: Workload | None, command: Command, now: int) -> Decision:
    """A core that lets a fence whose token is above the claim's pass as the claim's."""
    fence = getattr(command, "fence", None)
    claim = None if w is None else w.current_claim
    if fence is not None and claim is not None and fence.token > claim.fencing_token:
        command = _refenced(command, token=claim.fencing_token)
    return decide(spec, w, command, now)


def _failure_replay_by_claim(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that knows a repeated failure report by its claim id and token alone."""
    if isinstance(command, FailCommand) and w is not None and w.current_claim is None:
        for attempt in w.attempts:
            if (attempt.claim_id, attempt.fencing_token) == (
                command.fence.claim_id,
                command.fence.token,
            ) and attempt.worker_id != command.fence.worker_id:
                command = _refenced(command, worker_id=attempt.worker_id)
    return decide(spec, w, command, now)


def _result_replay_ignores_output(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that answers a completion sent again as a replay whatever output it reports."""
    result = _repeated_result(w, command)
    if result is not None:
        command = command.model_copy(update={"output": result.output})
    return decide(spec, w, command, now)


_Decide = Callable[[Spec, Workload | None, Command, int], Decision]

#: Each wrong rule, the action the trace ends with, and its arg (None: any).
WRONG: dict[str, tuple[_Decide, str, str | None]] = {
    "checkpoint_sequence_misstated": (_checkpoint_sequence_misstated, "checkpoint", None),
    "failure_report_not_replayed": (_failure_report_not_replayed, "stale_fail", None),
    "rearm_budget_overstated": (_rearm_budget_overstated, "retry", ""),
    "result_replay_by_identity": (_result_replay_by_identity, "stale_complete", ""),
    "records_the_repeat": (_records_the_repeat, "checkpoint", "repeat"),
    "refuses_the_repeat": (_refuses_the_repeat, "checkpoint", "repeat"),
    "confirmation_not_replayed": (_confirmation_not_replayed, "stale_confirm_cancel", ""),
    "grant_window_from_issue_only": (_grant_window_from_issue_only, "admit", ""),
    "fence_by_claim_and_token": (_fence_by_claim_and_token, "forged_heartbeat", None),
    "fence_token_not_above": (_fence_token_not_above, "forged_heartbeat", "token>"),
    "failure_replay_by_claim": (_failure_replay_by_claim, "forged_fail", None),
    "result_replay_ignores_output": (_result_replay_ignores_output, "stale_complete", OTHER_OUTPUT),
}


def _reported(report: CheckReport) -> list[dict[str, object]]:
    found = [v for v in report.violations if v.property == PROPERTY]
    assert found, "the wrong rule went unreported"
    return list(found[0].trace)


def _both_report(spec: Spec, universe: Universe, decide_fn: _Decide) -> list[dict[str, object]]:
    """The trace both engines report a wrong core with (they must report the same)."""
    mutant = Mutant(decide_fn.__name__, decide_fn.__doc__ or "", decide_fn=decide_fn)
    traces = []
    for run in (check, check_compiled):
        model = Model(spec, universe, decide_fn=decide_fn, authority_cls=mutant.authority_cls())
        traces.append(_reported(run(spec, universe, model=model)))
    assert traces[0] == traces[1]
    return traces[0]


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_replay_grant_or_budget_rule_is_reported_by_both_engines(name: str) -> None:
    decide_fn, label, arg = WRONG[name]
    last = _both_report(default_spec(), SMALL, decide_fn)[-1]
    assert last["action"] == label
    if arg is not None:
        assert last.get("arg", "") == arg
    if label == "admit":
        # Sent again after the instant the grant was issued at (0).
        assert isinstance(last["now"], int)
        assert last["now"] > 0


def test_a_core_that_raises_is_reported_and_replayed_with_what_it_raised(tmp_path: Path) -> None:
    spec = default_spec()
    mutant = Mutant("crashes_on_a_repeat", "reads past the end", decide_fn=_crashes_on_a_repeat)
    authority_cls = mutant.authority_cls()
    compiled = CompiledModel(
        Model(spec, SMALL, decide_fn=_crashes_on_a_repeat, authority_cls=authority_cls)
    )
    report = check_compiled(spec, compiled=compiled)
    (finding,) = [v for v in report.violations if v.property == PROPERTY]
    assert f"the core {RAISED}IndexError" in finding.message
    assert finding.trace[-1]["arg"] == "repeat"
    # The real authority with the same core raises the same: the compiled model holds.
    assert refine(compiled, report, samples=0, authority_cls=authority_cls) == []
    trace = {"universe": SMALL.to_dict(), "steps": list(finding.trace)}
    result = replay_trace(spec, trace, MemoryStore(), authority_cls=authority_cls)
    assert result.violation is not None
    assert result.violation[1] == PROPERTY
    assert replay_trace(spec, trace, MemoryStore()).violation is None


def test_a_trace_of_the_new_calls_replays_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = {"actor": WORKER, "now": 0, "slot": 0, "worker": 0}
    steps = [
        {"action": "claim", **worker},
        {"action": "start", **worker},
        {"action": "checkpoint", "arg": "next", **worker},
        {"action": "checkpoint", "arg": "repeat", **worker},
        {"action": "cancel", "actor": "operator", "now": 0, "slot": 0},
        {"action": "confirm_cancel", **worker},
        {"action": "stale_confirm_cancel", **worker},
        {"action": "jump", "actor": "clock", "now": 0, "to": 9},
        {"action": "admit", "actor": "requester", "now": 9, "slot": 0},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"universe": SMALL.to_dict(), "steps": steps}), encoding="utf-8")
    assert main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "replayed every step; no property was violated" in out
    assert "->" not in out  # every call answered, none refused


@pytest.mark.parametrize(
    ("edited", "number"),
    [
        # The clock going back: each call is answered, and no property can break.
        ([{"action": "jump", "to": 9}, {"action": "jump", "to": 3}], 2),
        # A crash the universe's bound (no crashes) never allows.
        ([{"action": "claim", "slot": 0, "worker": 0}, {"action": "crash", "worker": 0}], 2),
        # A claim with its worker left out: -1, which Python reads as the last worker.
        ([{"action": "claim_next"}], 1),
    ],
    ids=["clock-going-back", "crash-past-the-bound", "claim-by-no-worker"],
)
def test_a_trace_edited_into_steps_the_universe_never_offers_is_refused(
    edited: list[dict[str, object]],
    number: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert SMALL.crashes == 0
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"universe": SMALL.to_dict(), "steps": edited}), encoding="utf-8")
    assert main(["replay", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{errors.INVALID}: trace {path}: step {number}: ")
    assert "cannot be taken where the steps before it leave the universe" in err


@pytest.mark.parametrize(
    ("action", "arg"),
    [("checkpoint", "again"), ("fail", "fatal/none"), ("stale_fail", ""), ("stale_complete", "x")],
)
def test_a_trace_naming_a_call_the_universe_lacks_is_refused(
    action: str, arg: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = {"action": action, "actor": WORKER, "arg": arg, "now": 0, "slot": 0}
    path = tmp_path / "trace.json"
    trace = {"universe": SMALL.to_dict(), "steps": [{**step, "worker": 0}]}
    path.write_text(json.dumps(trace), encoding="utf-8")
    assert main(["replay", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{errors.INVALID}: trace {path}: step 1: {action} {arg!r}")


# -- request ids: a claim and an operator's call sent again ----------------------------------

REQUESTS = replace(SMALL, request_ids=True)


def test_a_claim_sent_again_with_its_request_id_is_answered_and_with_another_refused() -> None:
    spec = default_spec()
    model = Model(spec, REQUESTS)
    claimed = _walk(model, Action("claim_next", WORKER, worker=0))
    w = _workload(model, claimed)
    for variant, answer in (("same", (None, False)), ("before", ("WORKLOAD_NOT_READY", False))):
        command = model._command(claimed, Action("claim_again", WORKER, 0, 0, arg=variant))
        assert command.request_id is not None
        assert _spec_says(spec, w, command, 0) == answer == _core(spec, w, command, 0)
    started = _walk(model, Action("claim_next", WORKER, worker=0), _call("start"))
    w = _workload(model, started)
    again = model._command(started, Action("claim_again", WORKER, 0, 0, arg="same"))
    # The request was answered and its attempt started: refused, nothing written.
    assert (
        _spec_says(spec, w, again, 0) == ("WORKLOAD_NOT_READY", False) == _core(spec, w, again, 0)
    )


def test_an_operator_request_sent_again_is_answered_and_under_another_call_refused() -> None:
    spec = default_spec()
    model = Model(spec, REQUESTS)
    cancelled = _walk(model, Action("cancel", "operator", slot=0))
    w = _workload(model, cancelled)
    assert w.execution_history[-1].evidence.get("request_operation") == "cancel"
    same = model._command(cancelled, Action("cancel", "operator", slot=0, arg=REQUEST_AGAIN))
    other = model._command(cancelled, Action("timeout", "operator", slot=0, arg=REQUEST_AGAIN))
    assert _spec_says(spec, w, same, 0) == (None, False) == _core(spec, w, same, 0)
    assert _spec_says(spec, w, other, 0) == ("WORKLOAD_CONFLICT", False) == _core(spec, w, other, 0)


def _claim_request_ignored(spec: Spec, w: Workload | None, command: Command, now: int) -> Decision:
    """A core that answers its holder's claim as a repeat, whatever request id it names."""
    if isinstance(command, ClaimCommand) and command.request_id is not None:
        command = command.model_copy(update={"request_id": None})
    return decide(spec, w, command, now)


def _operator_request_forgotten(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that decides an operator's request sent again as a new call."""
    operator = isinstance(command, (CancelCommand, TimeoutCommand, RetryCommand))
    if operator and w is not None and command.request_id is not None:
        known = {e.evidence.get("request_id") for e in w.execution_history}
        if command.request_id in known:
            command = command.model_copy(update={"request_id": f"{command.request_id}-anew"})
    return decide(spec, w, command, now)


@pytest.mark.parametrize(
    ("decide_fn", "label", "arg"),
    [
        (_claim_request_ignored, None, None),
        (_operator_request_forgotten, None, REQUEST_AGAIN),
    ],
)
def test_a_wrong_request_id_rule_is_reported_by_both_engines(
    decide_fn: _Decide, label: str | None, arg: str | None
) -> None:
    last = _both_report(default_spec(), REQUESTS, decide_fn)[-1]
    if label is not None:
        assert last["action"] == label
    if arg is not None:
        assert last.get("arg", "") == arg


def test_without_request_ids_no_call_names_one() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    state = _walk(model, Action("claim_next", WORKER, worker=0))
    labels = {a.label for a in model.actions(state)}
    assert "claim_again" not in labels
    assert all(a.arg != REQUEST_AGAIN for a in model.actions(state))
    w = _workload(model, state)
    assert all("request_id" not in e.evidence for e in w.execution_history)


# -- failure reports sent again, the workload id's recipe, what replies say ------------------


def test_a_failure_report_sent_again_with_another_error_is_not_a_replay() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    failed = _walk(
        model,
        Action("claim_next", WORKER, worker=0),
        _call("start"),
        _call("fail", "validation/none"),
    )
    w = _workload(model, failed)
    for variant in STALE_FAIL_VARIANTS:
        command = model._command(failed, _call("stale_fail", variant))
        said = _spec_says(spec, w, command, 0)
        assert said == _core(spec, w, command, 0)
        assert (said == (None, False)) is (variant == "validation/none")


def test_an_admission_under_a_key_holding_another_workload_id_is_a_conflict() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    w = _workload(model, model.initial())
    request = model.requests[0]
    assert _spec_says(spec, w, AdmitCommand(request=request), 1) == (None, False)
    moved = w.model_copy(update={"workload_id": w.workload_id[:-1]})
    command = AdmitCommand(request=request)
    assert _spec_says(spec, moved, command, 1) == ("WORKLOAD_CONFLICT", False)
    assert _core(spec, moved, command, 1) == ("WORKLOAD_CONFLICT", False)


def _replay_says_created(spec: Spec, w: Workload | None, command: Command, now: int) -> Decision:
    """A core whose admission replay says it created the workload."""
    decision = decide(spec, w, command, now)
    if isinstance(command, AdmitCommand) and w is not None and decision.reply is not None:
        return replace(decision, reply=decision.reply.model_copy(update={"created": True}))
    return decision


def _context_of_the_first_attempt(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose execution context names the workload's first attempt."""
    decision = decide(spec, w, command, now)
    context = isinstance(command, ExecutionContextCommand) and decision.reply is not None
    if context and w is not None and len(w.attempts) > 1:
        first = w.attempts[0].attempt_id
        reply = decision.reply.model_copy(update={"attempt_id": first})
        return replace(decision, reply=reply)
    return decision


@pytest.mark.parametrize(
    ("decide_fn", "label"),
    [(_replay_says_created, "admit"), (_context_of_the_first_attempt, "execution_context")],
)
def test_a_wrong_reply_is_reported_by_both_engines(decide_fn: _Decide, label: str) -> None:
    assert _both_report(default_spec(), SMALL, decide_fn)[-1]["action"] == label


# -- what replies name: the state a replay answers, the attempt a claim made ------------------


def _operator_replay_names_the_first_state(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose answer to an operator's request sent again names the state its first
    event led to, not its last (a timeout that re-armed answers TIMED_OUT, not READY)."""
    decision = decide(spec, w, command, now)
    operator = isinstance(command, (CancelCommand, TimeoutCommand, RetryCommand))
    if operator and w is not None and decision.workload is None and decision.refusal is None:
        taken = [
            e for e in w.execution_history if e.evidence.get("request_id") == command.request_id
        ]
        if taken:
            reply = StateReply(workload_id=w.workload_id, state=taken[0].to)
            return replace(decision, reply=reply)
    return decision


def _state_reply_before_the_call(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose state reply names the state the workload was in before the call."""
    decision = decide(spec, w, command, now)
    if isinstance(decision.reply, StateReply) and w is not None and decision.workload is not None:
        return replace(decision, reply=StateReply(workload_id=w.workload_id, state=w.state))
    return decision


def _claim_reply_names_the_first_attempt(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose claim reply names the workload's first attempt, not the one it made."""
    decision = decide(spec, w, command, now)
    if isinstance(decision.reply, ClaimReply) and decision.workload is not None:
        first = decision.workload.attempts[0].attempt_id
        return replace(decision, reply=decision.reply.model_copy(update={"attempt_id": first}))
    return decision


def _dependency_state_left_out(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that records a dependency naming no state without the state it requires,
    and compares a repeat the same way (so the repeat is still answered as a replay)."""
    if isinstance(command, AdmitCommand) and w is not None:
        filled = with_required_states(spec, command.request.dependencies)
        decision = decide(spec, w.model_copy(update={"dependencies": filled}), command, now)
        if decision.refusal is None and decision.workload is None:
            return replace(decision, reply=decision.reply.model_copy(update={"workload": w}))
        return decision
    decision = decide(spec, w, command, now)
    if isinstance(command, AdmitCommand) and decision.workload is not None:
        undone = tuple(
            d.model_copy(update={"required_state": None}) for d in decision.workload.dependencies
        )
        written = decision.workload.model_copy(update={"dependencies": undone})
        return replace(decision, workload=written)
    return decision


@pytest.mark.parametrize(
    ("decide_fn", "universe", "label"),
    [
        (_operator_replay_names_the_first_state, REQUESTS, "timeout"),
        (_state_reply_before_the_call, SMALL, None),
        (_claim_reply_names_the_first_attempt, SMALL, "claim"),
        (_dependency_state_left_out, replace(SMALL, dependent=True, horizon_ms=4), "admit"),
    ],
)
def test_a_wrong_reply_or_admitted_dependency_is_reported_by_both_engines(
    decide_fn: _Decide, universe: Universe, label: str | None
) -> None:
    trace = _both_report(default_spec(), universe, decide_fn)
    if label is not None:
        assert trace[-1]["action"] == label


# -- forged fences ---------------------------------------------------------------------------


def test_every_forged_fence_is_refused_and_writes_nothing() -> None:
    spec = default_spec()
    model = Model(spec, SMALL)
    state = _walk(model, _claim(), _call("start"))
    forged = [a for a in model.actions(state) if a.label.startswith("forged_")]
    # A live claim: the fence check, with each part forged.
    assert [(a.label, a.arg) for a in forged] == [
        ("forged_heartbeat", form) for form in FORGED_VARIANTS
    ]
    holder = _workload(model, state).current_claim
    assert holder is not None
    for action in forged:
        fence = model._command(state, action).fence  # type: ignore[attr-defined]
        assert fence.claim_id == holder.claim_id
        assert (fence.worker_id, fence.token) != (holder.worker_id, holder.fencing_token)
        step = model.step(state, action)
        assert (step.refusal, step.wrote) == (errors.STALE_FENCE, ()), action
    # Once an attempt ended, the replays that compare a fence with what it recorded.
    for ending, label, code in (
        (_call("complete"), "forged_complete", errors.RESULT_CONFLICT),
        (_call("fail", "validation/none"), "forged_fail", errors.CLAIM_INVALID),
    ):
        ended = _walk(model, _claim(), _call("start"), ending)
        forged = [a for a in model.actions(ended) if a.label.startswith("forged_")]
        assert [(a.label, a.arg) for a in forged] == [(label, form) for form in FORGED_VARIANTS]
        for action in forged:
            step = model.step(ended, action)
            assert (step.refusal, step.wrote) == (code, ()), action


def test_first_timeouts_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    argv = ["check", "--single", "--workers", "1", "--horizon-ms", "6", "--json", str(out)]
    assert main([*argv, "--first-timeouts", "claim_ms=3,execution_ms=5"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["universe"]["first_timeouts"] == {"claim_ms": 3, "execution_ms": 5}
    capsys.readouterr()
    for bad in ("claim=3", "claim_ms=0", "claim_ms=x", "claim_ms=1001"):
        assert main([*argv, "--first-timeouts", bad]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{errors.INVALID}: --first-timeouts")
    assert not (tmp_path / "trace").exists()


# -- an operation with `then`: the claim that starts its attempt ------------------------------


def test_a_core_whose_claim_does_not_start_under_then_is_reported_by_both_engines() -> None:
    spec = load_spec(Path(__file__).resolve().parent.parent / "specs/examples/claim_starts.toml")
    plain = default_spec()  # the same table, without `then`

    def decide_fn(s: Spec, w: Workload | None, command: Command, now: int) -> Decision:
        return decide(plain if isinstance(command, ClaimCommand) else s, w, command, now)

    universe = Universe.from_spec(spec, dependent=False, workers=1, horizon_ms=14)
    trace = _both_report(spec, universe, decide_fn)
    assert trace[-1]["action"] in ("claim", "claim_next")
    # What the spec says the claim writes: the start's edge too.
    authority_cls = Mutant("then_ignored", "", decide_fn=decide_fn).authority_cls()
    model = Model(spec, universe, decide_fn=decide_fn, authority_cls=authority_cls)
    report = check(spec, universe, model=model)
    (finding,) = [v for v in report.violations if v.property == PROPERTY][:1]
    assert "RUNNING" in finding.message


def _claim_answered_to_another_worker(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core that answers a claim naming another worker's request id with that worker's claim."""
    claim = None if w is None else w.current_claim
    if (
        isinstance(command, ClaimCommand)
        and w is not None
        and claim is not None
        and command.request_id is not None
        and claim.worker_id != command.worker_id
        and claim_request_of(w, claim.fencing_token) == command.request_id
    ):
        command = command.model_copy(update={"worker_id": claim.worker_id})
    return decide(spec, w, command, now)


def test_a_claim_under_another_workers_request_id_is_not_answered_with_its_claim() -> None:
    spec = default_spec()
    universe = replace(REQUESTS, workers=2)
    model = Model(spec, universe)
    state = _walk(model, Action("claim_next", WORKER, worker=0))
    borrowed = Action("claim_again", "worker-B", slot=0, worker=1, arg=BORROWED_REQUEST)
    assert borrowed in list(model.actions(state))
    command = model._command(state, borrowed)
    assert command.worker_id == "worker-B"  # type: ignore[attr-defined]
    w = _workload(model, state)
    assert _spec_says(spec, w, command, 0) == _core(spec, w, command, 0)
    assert _core(spec, w, command, 0)[0] is not None  # refused: the workload is claimed
    last = _both_report(spec, universe, _claim_answered_to_another_worker)[-1]
    assert (last["action"], last["arg"]) == ("claim_again", BORROWED_REQUEST)


# -- what a sweep answers: the workloads it changed ---------------------------------------


def _recovery_reported_unchanged(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose recovery of an expired lease answers that it changed nothing."""
    decision = decide(spec, w, command, now)
    if isinstance(command, RecoverCommand) and isinstance(decision.reply, SweepReply):
        return replace(decision, reply=decision.reply.model_copy(update={"changed": False}))
    return decision


def _deadline_reported_unchanged(
    spec: Spec, w: Workload | None, command: Command, now: int
) -> Decision:
    """A core whose deadline sweep answers that it changed nothing when it timed work out.

    (The opposite slip, an answer that names a workload left alone, needs a sweep
    asked about work that is not due: the stores hand a sweep only due work.)
    """
    decision = decide(spec, w, command, now)
    sweep = isinstance(command, EnforceDeadlineCommand) and isinstance(decision.reply, SweepReply)
    if sweep and decision.workload is not None:
        return replace(decision, reply=decision.reply.model_copy(update={"changed": False}))
    return decision


def test_a_sweep_answers_with_exactly_the_workloads_it_wrote() -> None:
    model = Model(default_spec(), SMALL)
    state = _walk(model, _claim())
    w = _workload(model, state)
    assert w.current_claim is not None
    expired = CheckState(w.current_claim.expires_at, state.docs, state.workers, state.pending, 0, 0)
    recovered = model.step(expired, Action("recover_expired", "sweeper"))
    assert recovered.wrote == (0,)
    assert recovered.reply == ("changed", "0")
    untouched = model.step(state, Action("enforce_deadlines", "sweeper"))
    assert untouched.wrote == ()
    assert untouched.reply == ("changed", "")


@pytest.mark.parametrize(
    ("decide_fn", "label"),
    [
        (_recovery_reported_unchanged, "recover_expired"),
        (_deadline_reported_unchanged, "enforce_deadlines"),
    ],
)
def test_a_sweep_that_misreports_what_it_changed_is_reported_by_both_engines(
    decide_fn: _Decide, label: str
) -> None:
    found = _both_report(default_spec(), SMALL, decide_fn)
    assert found[-1]["action"] == label
