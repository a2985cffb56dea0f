"""The spec file: the shipped one is valid and complete, and every kind of mistake is reported.

A copy of the shipped spec is edited in one place for each kind of problem;
the loader must name the field and say what is wrong, report every problem
of a file in one run, and never build a `Spec` from a file with any problem.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import time
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from transitions import Machine, MachineError

from workwarden.statemachine import errors
from workwarden.statemachine.check.state import Universe
from workwarden.statemachine.effects import EFFECTS, REPLAYS
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.machine import StateCursor, fire
from workwarden.statemachine.predicates import ANCHORS, PREDICATES
from workwarden.statemachine.spec import (
    CHECK_DEFAULT_DELAYS_MS,
    MAX_SPEC_BYTES,
    Problem,
    SpecFile,
    TransitionSpec,
    check_spec_file,
    default_spec,
    load_spec,
    load_spec_text,
    raised_codes,
    shipped_spec_text,
    spec_json_schema,
)
from workwarden.statemachine.spec_model import CheckSpec

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = shipped_spec_text()
README = (ROOT / "specs" / "README.md").read_text(encoding="utf-8")

_LAST_EDGE_END = ' operations = ["claim", "claim_next"] },\n]\n'


def edited(old: str, new: str, text: str = SHIPPED) -> str:
    """`text` with its one occurrence of `old` replaced by `new`."""
    assert text.count(old) == 1, f"expected exactly one {old!r} in the spec"
    return text.replace(old, new)


def with_edges(*edges: str, text: str = SHIPPED) -> str:
    """`text` with `edges` appended to the transition table (from index 33 on)."""
    added = "".join(f"  {edge},\n" for edge in edges)
    return edited(_LAST_EDGE_END, _LAST_EDGE_END[:-2] + added + "]\n", text)


def without_table(header: str, text: str = SHIPPED) -> str:
    """`text` without the TOML table that starts at `header` (up to the next blank line)."""
    start = text.index(header + "\n")
    end = text.index("\n\n", start)
    return text[:start] + text[end + 2 :]


def problems_in(text: str, tmp_path: Path) -> list[Problem]:
    """Every problem `check_spec_file` finds in `text`, written to a file."""
    path = tmp_path / "copy.toml"
    path.write_text(text, encoding="utf-8")
    return check_spec_file(path)


def fields_of(problems: list[Problem]) -> list[str]:
    return [problem.field for problem in problems]


# -- the shipped spec ----------------------------------------------------------


def test_the_shipped_spec_validates_with_no_problem() -> None:
    assert check_spec_file(ROOT / "specs" / "workload.toml") == []
    assert load_spec(ROOT / "specs" / "workload.toml").data == default_spec().data


def test_the_packaged_spec_is_the_repositorys_spec_file() -> None:
    assert (ROOT / "specs" / "workload.toml").read_text(encoding="utf-8") == SHIPPED


def test_the_shipped_spec_has_twelve_states_each_with_a_kind_and_a_meaning() -> None:
    states = default_spec().states
    assert len(states) == 12
    for name, state in states.items():
        assert state.kind in ("queued", "active", "terminal", "transient"), name
        assert state.meaning.strip(), name


def test_the_shipped_table_has_exactly_33_transitions_including_claimed_to_failed() -> None:
    spec = default_spec()
    assert len(spec.data.transitions) == 33
    assert len(spec.edges) == 33
    claimed_to_failed = spec.edge("CLAIMED", "FAILED")
    assert claimed_to_failed is not None
    assert claimed_to_failed.operations == ["fail"]
    assert claimed_to_failed.actors == ["worker"]


def test_every_error_code_the_core_raises_is_in_the_catalogue_with_meaning_and_action() -> None:
    constants = [getattr(errors, name) for name in errors.__all__ if name.isupper()]
    assert sorted(constants) == sorted(raised_codes())
    catalogue = default_spec().errors
    for code in constants:
        assert code in catalogue, code
        assert catalogue[code].meaning.strip(), code
        assert catalogue[code].action in ("retry_later", "give_up", "fix_request"), code


def test_the_refusals_that_record_their_decision_are_the_ones_the_catalogue_marks() -> None:
    recorded = {code for code, entry in default_spec().errors.items() if entry.records}
    assert recorded == {errors.TIMED_OUT, errors.ATTEMPTS_EXHAUSTED}


def test_the_states_a_worker_holds_are_the_active_ones() -> None:
    spec = default_spec()
    assert spec.claimed_states == {"CLAIMED", "RUNNING", "CHECKPOINTED", "CANCELLATION_REQUESTED"}
    assert spec.terminal_states == {"SUCCEEDED", "CANCELLED", "DEAD_LETTER"}


# -- every problem in one run ------------------------------------------------

THREE_PROBLEMS = with_edges(
    '{ from = "LIMBO", to = "READY", event = "workload.ready", actors = ["system"], '
    'operations = ["admit"] }',
    '{ from = "CREATED", to = "READY", event = "workload.ready", actors = ["system"], '
    'operations = ["admit"] }',
    '{ from = "READY", to = "SUCCEEDED", event = "workload.completed", actors = ["worker"], '
    'operations = ["teleport"] }',
)
THREE_FIELDS = ["transitions[33].from", "transitions[34]", "transitions[35].operations[0]"]


def test_a_spec_with_an_unknown_state_a_duplicate_edge_and_an_unknown_operation_reports_all_three(
    tmp_path: Path,
) -> None:
    problems = problems_in(THREE_PROBLEMS, tmp_path)
    assert fields_of(problems) == THREE_FIELDS
    unknown_state, duplicate, unknown_operation = problems
    assert "unknown state 'LIMBO'" in unknown_state.message
    assert "duplicate edge CREATED -> READY (first at transitions[0])" in duplicate.message
    assert "unknown operation 'teleport'" in unknown_operation.message
    assert all(problem.file == str(tmp_path / "copy.toml") for problem in problems)


def test_loading_a_spec_with_three_problems_refuses_it_naming_all_three(tmp_path: Path) -> None:
    path = tmp_path / "copy.toml"
    path.write_text(THREE_PROBLEMS, encoding="utf-8")
    with pytest.raises(WorkloadError) as raised:
        load_spec(path)
    assert raised.value.code == errors.SPEC_INVALID
    assert raised.value.details is not None
    reported = raised.value.details["problems"]
    assert [problem["field"] for problem in reported] == THREE_FIELDS
    assert all(problem["file"] == str(path) for problem in reported)
    assert raised.value.message.startswith(f"3 problem(s) in {path}: ")
    with pytest.raises(WorkloadError) as from_text:
        load_spec_text(THREE_PROBLEMS, "copy.toml")
    assert from_text.value.code == errors.SPEC_INVALID


def test_a_problem_reads_file_then_field_then_message() -> None:
    problem = Problem("copy.toml", "transitions[3].to", "unknown state 'X'")
    assert str(problem) == "copy.toml: transitions[3].to: unknown state 'X'"


# -- each kind of problem, with its field path --------------------------------

_DL_CANCEL = 'operations = ["cancel"], exit = "close" }'
_REARM = 'operations = ["retry"], exit = "rearm" }'
_FIRST_EDGE = (
    '{ from = "CREATED", to = "READY", event = "workload.ready", actors = ["system"], '
    'operations = ["admit"] }'
)
_CLAIMABLE = '{ when = [], decision = "claimable" }'
_RETRY_ON_FAILURE = '{ when = [], decision = "retry", to = "READY", delay = "backoff" }'


def with_pause(operation: str) -> str:
    """The shipped spec with a PAUSED state, entered by `operation` and left by `resume`."""
    return with_edges(
        '{ from = "READY", to = "PAUSED", event = "workload.paused", actors = ["operator"], '
        f'operations = ["{operation}"] }}',
        '{ from = "PAUSED", to = "READY", event = "workload.resumed", actors = ["operator"], '
        'operations = ["resume"] }',
        text=SHIPPED
        + '\n[states.PAUSED]\nkind = "held"\nmeaning = "Held."\n'
        + f'\n[operations."{operation}"]\nactor = "operator"\neffect = "move"\nmeaning = "m"\n'
        + '\n[operations.resume]\nactor = "operator"\neffect = "move"\nmeaning = "m"\n',
    )


PROBLEM_CASES: list[tuple[str, str, str, str]] = [
    (
        "unknown state in an edge",
        with_edges(
            '{ from = "LIMBO", to = "READY", event = "workload.ready", actors = ["system"], '
            'operations = ["admit"] }'
        ),
        "transitions[33].from",
        "unknown state 'LIMBO' (valid: CREATED, READY,",
    ),
    (
        "unknown target state in an edge",
        edited(_FIRST_EDGE, _FIRST_EDGE.replace('to = "READY"', 'to = "QUEUED"')),
        "transitions[0].to",
        "unknown state 'QUEUED'",
    ),
    (
        "duplicate edge",
        with_edges(_FIRST_EDGE),
        "transitions[33]",
        "duplicate edge CREATED -> READY (first at transitions[0])",
    ),
    (
        "one event out of one state to two targets",
        with_edges(
            '{ from = "CREATED", to = "DEAD_LETTER", event = "workload.ready", '
            'actors = ["system"], operations = ["admit"] }'
        ),
        "transitions[33].event",
        "event 'workload.ready' already leaves CREATED for READY (transitions[0])",
    ),
    (
        "event name not dotted",
        edited(_FIRST_EDGE, _FIRST_EDGE.replace('"workload.ready"', '"Ready"')),
        "transitions[0].event",
        "event name 'Ready' is not like 'workload.claimed'",
    ),
    (
        "edge out of a terminal state not declared as an exit",
        edited(_DL_CANCEL, 'operations = ["cancel"] }'),
        "transitions[14]",
        "leaves terminal state DEAD_LETTER but is not declared as a re-arm or a close",
    ),
    (
        "edge out of a terminal state with no exit at all",
        with_edges(
            '{ from = "SUCCEEDED", to = "READY", event = "workload.ready", '
            'actors = ["operator"], operations = ["retry"] }'
        ),
        "transitions[33]",
        "leaves terminal state SUCCEEDED",
    ),
    (
        "close exit leading to a queued state",
        edited(_REARM, 'operations = ["retry"], exit = "close" }'),
        "transitions[24].exit",
        "a close must lead to a terminal state",
    ),
    (
        "re-arm exit leading to a terminal state",
        edited(_DL_CANCEL, 'operations = ["cancel"], exit = "rearm" }'),
        "transitions[14].exit",
        "a re-arm must lead to a queued state",
    ),
    (
        "exit on an edge out of a state that is not terminal",
        edited(_FIRST_EDGE, _FIRST_EDGE.replace('["admit"] }', '["admit"], exit = "rearm" }')),
        "transitions[0].exit",
        "exit is only for edges out of a terminal state, not CREATED",
    ),
    (
        "unknown operation",
        edited(_FIRST_EDGE, _FIRST_EDGE.replace('["admit"]', '["admit", "teleport"]')),
        "transitions[0].operations[1]",
        "unknown operation 'teleport' (valid: admit, claim,",
    ),
    (
        "unknown predicate in a policy rule",
        edited(
            '"not retries_worker_failure"], decision = "effect_unknown_not_retryable"',
            '"not retries_worker_failures"], decision = "effect_unknown_not_retryable"',
        ),
        "policies.failure.rules[0].when[1]",
        "unknown predicate 'retries_worker_failures' (valid: effect_unknown,",
    ),
    (
        "policy without a final rule that always matches",
        edited(_CLAIMABLE, '{ when = ["not budget_exhausted"], decision = "claimable" }'),
        "policies.claim.rules",
        "policy 'claim' lacks a final rule that always matches (when = [])",
    ),
    # The checker's oracle, and any other reader, takes a test as NAME or `not NAME`
    # exactly: a name padded with spaces passed the loader and stopped the checker.
    (
        "a predicate name padded with spaces",
        edited(
            '{ when = ["budget_exhausted"], decision = "attempt_budget_exhausted", '
            'to = "DEAD_LETTER", refuse',
            '{ when = [" budget_exhausted "], decision = "attempt_budget_exhausted", '
            'to = "DEAD_LETTER", refuse',
        ),
        "policies.claim.rules[0].when[0]",
        "unknown predicate ' budget_exhausted ': write NAME or `not NAME`, with no other space",
    ),
    (
        "a negated predicate name after two spaces",
        edited(
            _CLAIMABLE, '{ when = ["not  budget_exhausted"], decision = "x" },\n  ' + _CLAIMABLE
        ),
        "policies.claim.rules[1].when[0]",
        "unknown predicate ' budget_exhausted': write NAME or `not NAME`",
    ),
    (
        "rule after an always-matching rule",
        edited(_CLAIMABLE, _CLAIMABLE + ",\n  " + _CLAIMABLE),
        "policies.claim.rules[2]",
        "never reached: rules[1] before it always matches",
    ),
    (
        "unknown target state in a policy rule",
        edited(_RETRY_ON_FAILURE, _RETRY_ON_FAILURE.replace('"READY"', '"WAITING"')),
        "policies.failure.rules[3].to",
        "unknown state 'WAITING'",
    ),
    (
        "policy decision the table has no edge for",
        edited(_RETRY_ON_FAILURE, _RETRY_ON_FAILURE.replace('"READY"', '"SUCCEEDED"')),
        "policies.failure.rules[3].to",
        "no edge FAILED -> SUCCEEDED in the table lets the system take it by 'fail'",
    ),
    (
        "rule of a policy with via that does not move on",
        edited(_RETRY_ON_FAILURE, '{ when = [], decision = "retry", delay = "backoff" }'),
        "policies.failure.rules[3].to",
        "a rule of a policy with `via` must move on from FAILED",
    ),
    (
        "delay without a target",
        edited(_CLAIMABLE, '{ when = [], decision = "claimable", delay = "backoff" }'),
        "policies.claim.rules[1]",
        "`direct` and `delay` need a target (`to`)",
    ),
    (
        "policy passing through a state that is not transient",
        edited('via = "FAILED"', 'via = "READY"'),
        "policies.failure.via",
        "READY is passed through within one commit, so it must be of kind transient",
    ),
    (
        "policy through an unknown state",
        edited('via = "FAILED"', 'via = "BROKEN"'),
        "policies.failure.via",
        "unknown state 'BROKEN'",
    ),
    (
        "unknown error code refused",
        edited('refuse = "WORKLOAD_ATTEMPTS_EXHAUSTED"', 'refuse = "WORKLOAD_GONE"'),
        "policies.claim.rules[0].refuse",
        "unknown error code 'WORKLOAD_GONE'",
    ),
    (
        "refused error code that does not record its decision",
        edited('refuse = "WORKLOAD_ATTEMPTS_EXHAUSTED"', 'refuse = "WORKLOAD_NOT_READY"'),
        "policies.claim.rules[0].refuse",
        "its catalogue entry must say records = true",
    ),
    (
        "missing policy",
        without_table("[policies.operator_timeout]"),
        "operations.timeout.policy",
        "unknown policy 'operator_timeout' (valid: failure, recovery,",
    ),
    (
        "policy no operation consults",
        edited("[policies.claim]", "[policies.claims]"),
        "policies.claims",
        "no operation consults the policy 'claims'",
    ),
    (
        "missing operation the commands call",
        without_table("[operations.start]"),
        "operations",
        "missing operation 'start', which the commands call",
    ),
    (
        "unknown replay",
        edited('replay = "started_attempt"', 'replay = "again"'),
        "operations.start.replay",
        "unknown replay 'again' (valid: same_result,",
    ),
    (
        "a replay of another effect",
        edited('replay = "started_attempt"', 'replay = "own_claim"'),
        "operations.start.replay",
        "the replay 'own_claim' answers calls of the effect 'lease'",
    ),
    (
        "unknown effect",
        edited('effect = "start_attempt"', 'effect = "begin"'),
        "operations.start.effect",
        "unknown effect 'begin' (valid: admit, lease,",
    ),
    (
        "an operation leaving one state for two targets without a policy",
        edited(
            '{ from = "READY", to = "CANCELLED", event = "workload.cancelled", '
            'actors = ["operator"], operations = ["cancel"] },',
            '{ from = "READY", to = "CANCELLED", event = "workload.cancelled", '
            'actors = ["operator"], operations = ["cancel"] },\n'
            '  { from = "READY", to = "SUCCEEDED", event = "workload.completed", '
            'actors = ["operator"], operations = ["cancel"] },',
        ),
        "operations.cancel",
        "'cancel' leaves READY for CANCELLED, SUCCEEDED as 'operator': one edge",
    ),
    (
        "an operation on no edge that does not say it stays",
        edited('effect = "extend_lease"\nstays = true', 'effect = "extend_lease"'),
        "operations.heartbeat",
        "no edge lists 'heartbeat' (set stays = true if it takes none)",
    ),
    # An operation is called by its name (`Authority.operate`, the HTTP API) and recorded
    # by it in the audit log: a name no call can give is an edge no one could take.
    (
        "an operation name with a line break",
        with_pause("pa\\nuse"),
        "operations.pa\\nuse",
        "an operation name is what `operate` is called with: 1 to 256 characters",
    ),
    (
        "an empty operation name",
        with_pause(""),
        "operations.",
        "an operation name is what `operate` is called with",
    ),
    (
        "an operation name longer than a name",
        with_pause("p" * 257),
        "operations." + "p" * 37 + "...",
        "1 to 256 characters, no control character",
    ),
    (
        "a denial with a code that says it records a decision",
        edited(
            'denied = "WORKLOAD_NOT_READY"\nreplay = "own_claim"\nmeaning = "claim a READY',
            'denied = "WORKLOAD_TIMED_OUT"\nreplay = "own_claim"\nmeaning = "claim a READY',
        ),
        "operations.claim.denied",
        "WORKLOAD_TIMED_OUT says records = true (raised after a committed decision), but a denial",
    ),
    # claim_next sends claim's command, and the core decides a command by the row its `op`
    # names: claim_next's own `then` (or any other key, or edge) was never applied.
    (
        "claim_next with a key claim does not have",
        edited(
            'replay = "own_claim"\nmeaning = "claim the next',
            'replay = "own_claim"\nthen = "start"\nmeaning = "claim the next',
        ),
        "operations.claim_next.then",
        "'claim_next' is decided by the row of 'claim' (they send one command): its then must"
        " equal that of 'claim', None, not 'start'",
    ),
    (
        "claim_next missing from an edge claim takes",
        edited(
            'actors = ["worker"], operations = ["claim", "claim_next"] },',
            'actors = ["worker"], operations = ["claim"] },',
        ),
        "operations.claim_next",
        "an edge lists both or neither, and READY -> CLAIMED lists 'claim' but not 'claim_next'",
    ),
    (
        "state name not in capitals",
        SHIPPED + '\n[states.Parked]\nkind = "queued"\nmeaning = "Waiting."\n',
        "states.Parked",
        "a state name is SCREAMING_SNAKE_CASE",
    ),
    (
        "a state no edge enters (a typo in the edge meant to reach it)",
        with_edges(
            '{ from = "READY", to = "PAUSD", event = "workload.paused", actors = ["operator"], '
            'operations = ["cancel"] }',
            '{ from = "PAUSED", to = "READY", event = "workload.resumed", actors = ["operator"], '
            'operations = ["retry"] }',
            text=SHIPPED + '\n[states.PAUSED]\nkind = "held"\nmeaning = "Held."\n',
        ),
        "states.PAUSED",
        "no edge enters PAUSED, so no workload can ever be in it",
    ),
    (
        "states edges enter only from each other (no path from where work is admitted)",
        with_edges(
            '{ from = "LIMBO", to = "PAUSED", event = "workload.paused", actors = ["operator"], '
            'operations = ["shuffle"] }',
            '{ from = "PAUSED", to = "LIMBO", event = "workload.resumed", actors = ["operator"], '
            'operations = ["shuffle"] }',
            text=SHIPPED
            + '\n[states.PAUSED]\nkind = "held"\nmeaning = "Held."\n'
            + '\n[states.LIMBO]\nkind = "held"\nmeaning = "Held."\n'
            + '\n[operations.shuffle]\nactor = "operator"\neffect = "move"\nmeaning = "m"\n',
        ),
        "states.PAUSED",
        "no path of edges from CREATED, where work is admitted, reaches PAUSED",
    ),
    (
        "a claim leading into a state no worker holds",
        edited('[states.CLAIMED]\nkind = "active"', '[states.CLAIMED]\nkind = "queued"'),
        "operations.claim",
        "'claim' leases the work into CLAIMED, of kind 'queued': a claim leads to an active",
    ),
    (
        "a seed version over two lines (the diagrams print it on one)",
        edited('seed_version = "0.15"', 'seed_version = "0.15\\ndraft"'),
        "spec.seed_version",
        "String should match pattern",
    ),
    (
        "unknown anchor",
        edited('anchor = "ready_or_eligible"', 'anchor = "enqueued"'),
        "deadlines.kinds.queue.anchor",
        "unknown anchor 'enqueued' (valid: admitted, ready_or_eligible,",
    ),
    (
        "deadline in a state with no edge to enforce it",
        edited(
            'while = ["CLAIMED", "RUNNING", "CHECKPOINTED"]\nbounds = "attempt"\n'
            'meaning = "From the last heartbeat',
            'while = ["CLAIMED", "RUNNING", "CHECKPOINTED", "CANCELLATION_REQUESTED"]\n'
            'bounds = "attempt"\nmeaning = "From the last heartbeat',
        ),
        "deadlines.kinds.heartbeat.while[3]",
        "no edge CANCELLATION_REQUESTED -> TIMED_OUT lets the system take it",
    ),
    (
        "deadline in an unknown state",
        edited('while = ["READY"]', 'while = ["QUEUED"]'),
        "deadlines.kinds.queue.while[0]",
        "unknown state 'QUEUED'",
    ),
    (
        "deadline kind left out of the order",
        edited(
            'order = ["overall", "queue", "claim", "execution", "heartbeat"]',
            'order = ["overall", "queue", "claim", "execution"]',
        ),
        "deadlines.order",
        "deadline 'heartbeat' is not in the order",
    ),
    (
        "deadline kind listed twice in the order",
        edited(
            'order = ["overall", "queue", "claim", "execution", "heartbeat"]',
            'order = ["overall", "queue", "claim", "execution", "heartbeat", "queue"]',
        ),
        "deadlines.order[5]",
        "deadline 'queue' is listed twice",
    ),
    (
        "unknown deadline kind",
        SHIPPED
        + '\n[deadlines.kinds.lunch]\nanchor = "admitted"\nwhile = ["READY"]\n'
        + 'bounds = "work"\nmeaning = "x"\n',
        "deadlines.kinds.lunch",
        "unknown deadline 'lunch' (valid: overall, queue,",
    ),
    (
        "fixed backoff that grows",
        edited("[backoff.fixed]\nmultiplier = 1", "[backoff.fixed]\nmultiplier = 2"),
        "backoff.fixed.multiplier",
        "a fixed backoff does not grow: multiplier = 1",
    ),
    (
        "missing backoff shape",
        without_table("[backoff.exponential]"),
        "backoff",
        "missing backoff shape 'exponential'",
    ),
    (
        "forbidden text pattern with both forms",
        edited('{ prefix = "sk-" }', '{ prefix = "sk-", contains = "sk-" }'),
        "secrets.forbidden_text[1]",
        "set exactly one of `contains` or `prefix`",
    ),
    (
        "missing error code the core raises",
        without_table("[errors.WORKLOAD_CONFLICT]"),
        "errors",
        "missing error code 'WORKLOAD_CONFLICT', which the core raises",
    ),
    (
        "wrong type of a limit",
        edited("max_json_depth = 64", 'max_json_depth = "deep"'),
        "limits.max_json_depth",
        "Input should be a valid integer",
    ),
    (
        "number written as a string",
        edited("max_json_depth = 64", 'max_json_depth = "64"'),
        "limits.max_json_depth",
        "Input should be a valid integer (got '64')",
    ),
    (
        "limit out of range",
        edited("max_json_depth = 64", "max_json_depth = 0"),
        "limits.max_json_depth",
        "Input should be greater than or equal to 1",
    ),
    (
        "unknown actor class",
        edited(_FIRST_EDGE, _FIRST_EDGE.replace('actors = ["system"]', 'actors = ["robot"]')),
        "transitions[0].actors[0]",
        "Input should be 'worker', 'system' or 'operator'",
    ),
    (
        "unknown state kind",
        edited('[states.READY]\nkind = "queued"', '[states.READY]\nkind = "waiting"'),
        "states.READY.kind",
        "Input should be 'queued', 'held', 'active', 'terminal' or 'transient'",
    ),
    (
        "missing field of an edge",
        edited(_FIRST_EDGE, _FIRST_EDGE.replace('from = "CREATED", ', "")),
        "transitions[0].from",
        "Field required",
    ),
    (
        "unknown key",
        edited(
            '[states.READY]\nkind = "queued"', '[states.READY]\ncolour = "red"\nkind = "queued"'
        ),
        "states.READY.colour",
        "Extra inputs are not permitted",
    ),
    (
        "wrong type of a policy rule list",
        edited(
            'rules = [\n  { when = ["budget_exhausted"], decision = "attempt_budget_exhausted", '
            'to = "DEAD_LETTER", refuse',
            'rules = [\n  { when = "budget_exhausted", decision = "attempt_budget_exhausted", '
            'to = "DEAD_LETTER", refuse',
        ),
        "policies.claim.rules[0].when",
        "Input should be a valid list",
    ),
    (
        "an empty forbidden text pattern (every text would be a secret)",
        edited("forbidden_text = [", 'forbidden_text = [{ contains = "" }, '),
        "secrets.forbidden_text[0]",
        "must not be empty",
    ),
    (
        "an empty forbidden key",
        edited("forbidden_keys = [", 'forbidden_keys = ["", '),
        "secrets.forbidden_keys[0]",
        "must not be empty",
    ),
    (
        "a state kept from purges twice",
        edited('keep = ["DEAD_LETTER"]', 'keep = ["DEAD_LETTER", "DEAD_LETTER"]'),
        "retention",
        "keep names DEAD_LETTER more than once",
    ),
    (
        "a concurrency key no workload can carry (a control character)",
        edited("[concurrency]\nlimits = {}", '[concurrency]\nlimits = { "a\\tb" = 1 }'),
        "concurrency.limits.a\tb.[key]",
        "String should match pattern",
    ),
    # A number the spec gives reaches documents (an import refuses one above 2**53 - 1),
    # the store's index (SQLite's integers end at 2**63 - 1) and the authority's
    # arguments (a purge's age): each is bounded where the spec is read.
    (
        "a contract version no document can carry",
        edited(
            "at this contract version.\ncontract_version = 2",
            "at this contract version.\ncontract_version = 9007199254740992",
        ),
        "spec.contract_version",
        "less than or equal to 9007199254740991",
    ),
    (
        "a retention age no purge can take",
        edited("after_ms = 2592000000", "after_ms = 99999999999999999999"),
        "retention.after_ms",
        "less than or equal to 9007199254740991",
    ),
    (
        "a concurrency limit no store index can hold",
        edited(
            "[concurrency]\nlimits = {}", "[concurrency]\nlimits = { k = 99999999999999999999 }"
        ),
        "concurrency.limits.k",
        "less than or equal to 9007199254740991",
    ),
    # An operation's attempt status is written on the attempt it acts on, and a stored
    # document's reader holds it to a name: a spec that gave another would write work
    # no call could read back.
    (
        "an attempt status with a control character",
        edited('attempt_status = "RUNNING"', 'attempt_status = "RUN\\nNING"'),
        "operations.start.attempt_status",
        "String should match pattern",
    ),
    (
        "an attempt status longer than a name",
        edited('attempt_status = "RUNNING"', 'attempt_status = "' + "R" * 257 + '"'),
        "operations.start.attempt_status",
        "at most 256 characters",
    ),
    # The [check] table is read by `workwarden check`, not by the authority: a table the
    # checker cannot admit its workloads under is refused with the spec, not at the
    # checker's first run.
    (
        "a checker timeout that is no deadline kind",
        edited("first_timeouts = { claim_ms = 8 }", "first_timeouts = { claim = 8 }"),
        "check.first_timeouts.claim.[key]",
        "Input should be 'overall_ms', 'queue_ms', 'claim_ms', 'execution_ms' or 'heartbeat_ms'",
    ),
    (
        "checker retry delays out of order",
        edited("initial_delay_ms = 3\n", "initial_delay_ms = 7\n"),
        "check",
        "initial_delay_ms (7) exceeds max_delay_ms (6)",
    ),
    # A dependency admitted without a required state waits for where a result leads.
    (
        "no edge a result takes",
        edited(
            'effect = "record_result"\n',
            'effect = "record_result"\nstays = true\n',
            without_table(
                "[states.SUCCEEDED]",
                "".join(
                    line
                    for line in SHIPPED.splitlines(keepends=True)
                    if 'operations = ["complete"]' not in line
                ),
            ),
        ),
        "operations.complete",
        "no edge lists 'complete', so no result leads to a state",
    ),
    (
        "TOML nested deeper than the parser goes",
        "a = " + "[" * 100_000 + "]" * 100_000,
        "(toml)",
        "nested too deeply",
    ),
]


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [pytest.param(text, field, fragment, id=name) for name, text, field, fragment in PROBLEM_CASES],
)
def test_each_kind_of_problem_is_reported_at_its_field(
    text: str, field: str, fragment: str, tmp_path: Path
) -> None:
    problems = problems_in(text, tmp_path)
    matching = [p for p in problems if p.field == field and fragment in p.message]
    assert matching, f"no problem at {field} saying {fragment!r}; got:\n" + "\n".join(
        map(str, problems)
    )
    with pytest.raises(WorkloadError) as raised:
        load_spec_text(text, "copy.toml")
    assert raised.value.code == errors.SPEC_INVALID


def test_a_toml_syntax_error_is_reported_with_its_line(tmp_path: Path) -> None:
    text = edited("max_json_bytes = 1048576", "max_json_bytes = = 1048576")
    line = text[: text.index("max_json_bytes = =")].count("\n") + 1
    problems = problems_in(text, tmp_path)
    assert len(problems) == 1
    assert problems[0].field.startswith(f"(toml) line {line}, column ")
    assert problems[0].message.startswith("not valid TOML: ")


def test_a_byte_order_mark_is_named_as_what_breaks_the_toml(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + SHIPPED.encode("utf-8"))
    (problem,) = check_spec_file(path)
    assert problem.field == "(toml) line 1, column 1"
    assert "starts with a byte order mark (U+FEFF)" in problem.message


def test_a_toml_syntax_error_at_the_end_of_the_file_is_reported_at_the_last_line(
    tmp_path: Path,
) -> None:
    problems = problems_in("[spec]\nname = [", tmp_path)
    assert fields_of(problems) == ["(toml) line 2, column 9 (end of file)"]


def test_semantic_problems_are_reported_beside_structural_ones(tmp_path: Path) -> None:
    text = edited('[states.SUCCEEDED]\nkind = "terminal"', "[states.SUCCEEDED]\nkind = 7")
    text = edited('anchor = "ready_or_eligible"', 'anchor = "enqueued"', text)
    text = edited(_FIRST_EDGE, _FIRST_EDGE.replace('["admit"]', '["teleport"]'), text)
    text = edited('"effect_unknown", "not retries', '"effect_unkown", "not retries', text)
    text = edited(
        '{ from = "READY", to = "CLAIMED", event = "workload.claimed", actors = ["worker"]',
        '{ from = "READY", to = "CLAIMED", event = "workload.claimed", actors = "worker"',
        text,
    )
    problems = problems_in(text, tmp_path)
    assert fields_of(problems) == [
        "states.SUCCEEDED.kind",
        "transitions[1].actors",
        "transitions[0].operations[0]",
        "policies.failure.rules[0].when[0]",
        "deadlines.kinds.queue.anchor",
    ]
    # A state whose own fields are broken is still a known state name.
    assert not any("unknown state 'SUCCEEDED'" in p.message for p in problems)


def test_a_missing_section_is_reported_once_without_knock_on_problems(tmp_path: Path) -> None:
    problems = problems_in(without_table("[secrets]"), tmp_path)
    assert [(p.field, p.message) for p in problems] == [("secrets", "Field required")]


def test_a_missing_policy_section_is_reported_once(tmp_path: Path) -> None:
    text = SHIPPED
    for name in default_spec().policies:
        text = without_table(f"[policies.{name}]", text)
    problems = problems_in(text, tmp_path)
    # Deadlines need the deadline policy's `via`; without it nothing more is claimed.
    assert [(p.field, p.message) for p in problems] == [("policies", "Field required")]


def test_an_unreadable_spec_is_reported_as_a_problem_not_raised(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    assert [(p.field, p.message) for p in check_spec_file(missing)] == [
        ("(file)", "cannot read the file: No such file or directory")
    ]
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert [p.field for p in check_spec_file(binary)] == ["(file)"]
    assert check_spec_file(binary)[0].message.startswith("not UTF-8 text: ")
    with pytest.raises(WorkloadError) as raised:
        load_spec(missing)
    assert raised.value.code == errors.SPEC_INVALID
    assert str(missing) in raised.value.message


def test_the_check_tables_default_delays_are_the_checkers() -> None:
    # The loader compares a [check] table's delays with the ones it leaves to the checker.
    universe = Universe()
    assert (universe.initial_delay_ms, universe.max_delay_ms) == CHECK_DEFAULT_DELAYS_MS
    text = edited("initial_delay_ms = 3\nmax_delay_ms = 6\n", "max_delay_ms = 2\n")
    with pytest.raises(WorkloadError) as raised:
        load_spec_text(text)
    assert "initial_delay_ms (3) exceeds max_delay_ms (2)" in raised.value.message


def test_spec_text_holding_a_lone_surrogate_is_refused_as_not_utf8() -> None:
    # Text read with errors="surrogateescape" is a str no file can hold: the spec's name
    # in it made write_diagrams fail with a UnicodeEncodeError, not a coded refusal.
    text = edited('name = "workload"', 'name = "work\udc80load"')
    with pytest.raises(WorkloadError) as raised:
        load_spec_text(text, "copy.toml")
    assert raised.value.code == errors.SPEC_INVALID
    assert raised.value.details["problems"] == [
        {
            "file": "copy.toml",
            "field": "(file)",
            "message": "not UTF-8 text: surrogates not allowed at character "
            + str(text.index("\udc80")),
        }
    ]


def test_a_spec_file_larger_than_the_bound_is_refused_unparsed(tmp_path: Path) -> None:
    # A wrong path (a disk image, a log) is refused for its size, before it is parsed.
    text = "# padding\n" * (MAX_SPEC_BYTES // 10 + 1)
    path = tmp_path / "huge.toml"
    path.write_text(text, encoding="utf-8")
    expected = [("(file)", f"larger than {MAX_SPEC_BYTES:,} bytes: not a spec")]
    assert [(p.field, p.message) for p in check_spec_file(path)] == expected
    for load in (lambda: load_spec(path), lambda: load_spec_text(text)):
        with pytest.raises(WorkloadError) as raised:
            load()
        assert raised.value.code == errors.SPEC_INVALID
        assert "larger than" in raised.value.message


def _large_spec(states: int, rules: int, kept: int) -> str:
    """The shipped spec with `states` held states the claim policy may divert to, `rules`
    more rules in that policy, and DEAD_LETTER kept from purges `kept` times."""
    held = "".join(f'\n[states.H{i}]\nkind = "held"\nmeaning = ""\n' for i in range(states))
    edges = "".join(
        f'  {{ from = "READY", to = "H{i}", event = "workload.h{i}", actors = ["system"], '
        'operations = ["claim", "claim_next"] },\n'
        for i in range(states)
    )
    more = '  { when = ["budget_exhausted"], decision = "d", to = "DEAD_LETTER" },\n' * rules
    text = edited("transitions = [\n", "transitions = [\n" + edges)
    text = edited(_CLAIMABLE, more + "  " + _CLAIMABLE, text)
    keep = ", ".join(['"DEAD_LETTER"'] * kept)
    return edited('keep = ["DEAD_LETTER"]', f"keep = [{keep}]", text) + held


def test_a_large_spec_is_checked_in_time_and_space_that_grow_with_its_size(
    tmp_path: Path,
) -> None:
    # A problem naming an unknown state lists some valid ones, not all eight thousand:
    # a report naming every state in every such problem would grow as the square.
    typo = edited('while = ["READY"]', 'while = ["REDY"]', _large_spec(8_000, 0, 1))
    (problem,) = problems_in(typo, tmp_path)
    assert problem.field == "deadlines.kinds.queue.while[0]"
    assert problem.message.startswith("unknown state 'REDY' (valid: CREATED, READY, CLAIMED,")
    assert problem.message.endswith(", H6, H7, ... (7992 more))")
    # Thousands of edges and rules, and a long list: each rule's edge is looked up, not
    # searched for, and a repeated name is counted once, so the check takes seconds.
    text = _large_spec(states=8_000, rules=15_000, kept=100_000)
    assert len(text.encode("utf-8")) <= MAX_SPEC_BYTES
    started = time.monotonic()
    problems = problems_in(text, tmp_path)
    assert time.monotonic() - started < 30
    assert [(p.field, p.message) for p in problems] == [
        ("retention", "Value error, keep names DEAD_LETTER more than once")
    ]


def test_a_spec_with_problems_is_never_compiled(tmp_path: Path) -> None:
    for _, text, _, _ in PROBLEM_CASES:
        with pytest.raises(WorkloadError):
            load_spec_text(text)


# -- the JSON Schema -----------------------------------------------------------


def test_the_json_schema_is_draft_2020_12_and_describes_every_section() -> None:
    schema = spec_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    sections = set(SpecFile.model_fields)
    # Every section is required but those whose keys all have defaults.
    assert set(schema["required"]) == sections - {"check", "retention", "concurrency", "fairness"}
    assert set(schema["properties"]) == sections
    definitions = schema["$defs"]
    # Keys are spelled as in the file, not as the Python attributes.
    assert "from" in definitions["TransitionSpec"]["properties"]
    assert "while" in definitions["DeadlineKindSpec"]["properties"]
    for name, definition in definitions.items():
        if definition.get("type") == "object" and "properties" in definition:
            assert definition["additionalProperties"] is False, name


def test_the_json_schema_accepts_the_shipped_file() -> None:
    schema = spec_json_schema()
    parsed = tomllib.loads(SHIPPED)
    assert set(schema["required"]) <= set(parsed) <= set(schema["properties"])
    for section, value in parsed.items():
        expected = schema["properties"][section]
        if "$ref" in expected:
            definition = schema["$defs"][expected["$ref"].rsplit("/", 1)[1]]
            assert set(definition.get("required", ())) <= set(value), section
            assert set(value) <= set(definition["properties"]), section
    if importlib.util.find_spec("jsonschema") is not None:
        jsonschema: Any = importlib.import_module("jsonschema")
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator(schema).validate(parsed)
        broken = tomllib.loads(edited("max_json_depth = 64", 'max_json_depth = "deep"'))
        assert not jsonschema.Draft202012Validator(schema).is_valid(broken)


# -- the machine -----------------------------------------------------------------


def test_the_machine_is_one_transitions_machine_shared_by_every_user_of_the_spec() -> None:
    spec = default_spec()
    assert isinstance(spec.machine, Machine)
    assert default_spec() is spec
    assert default_spec().machine is spec.machine


def test_the_machine_has_a_trigger_for_every_edge_of_the_table() -> None:
    spec = default_spec()
    for edge in spec.data.transitions:
        event = spec.machine.events[edge.event]
        assert [t.dest for t in event.transitions[edge.from_state]] == [edge.to]
        assert fire(spec.machine, edge) == (edge.to, edge.event)


def test_the_machine_has_no_trigger_the_table_does_not_declare() -> None:
    spec = default_spec()
    declared = {(e.event, e.from_state, e.to) for e in spec.data.transitions}
    built = {
        (name, source, t.dest)
        for name, event in spec.machine.events.items()
        for source, moves in event.transitions.items()
        for t in moves
    }
    assert built == declared


def test_an_illegal_change_through_the_machine_is_denied() -> None:
    spec = default_spec()
    with pytest.raises(WorkloadError) as raised:
        fire(
            spec.machine,
            TransitionSpec.model_validate(
                {
                    "from": "SUCCEEDED",
                    "to": "RUNNING",
                    "event": "workload.started",
                    "actors": ["worker"],
                    "operations": ["start"],
                }
            ),
        )
    assert raised.value.code == errors.TRANSITION_DENIED
    assert raised.value.details == {"from": "SUCCEEDED", "to": "RUNNING"}


def test_the_machine_itself_refuses_an_event_from_a_state_it_does_not_leave() -> None:
    cursor = StateCursor("SUCCEEDED")
    with pytest.raises(MachineError):
        default_spec().machine.events["workload.started"].trigger(cursor)
    assert cursor.state == "SUCCEEDED"


# -- specs/README.md documents every name ---------------------------------------


def _models(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> None:
    if model.__name__ in seen:
        return
    seen[model.__name__] = model
    for field in model.model_fields.values():
        stack: list[Any] = [field.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                _models(annotation, seen)
            stack.extend(typing.get_args(annotation))


def _spec_file_keys() -> set[str]:
    models: dict[str, type[BaseModel]] = {}
    _models(SpecFile, models)
    return {
        field.alias or name
        for model in models.values()
        for name, field in model.model_fields.items()
    }


def _literals() -> set[str]:
    """Every value a Literal field of the spec file allows (kinds, actors, actions, ...)."""
    models: dict[str, type[BaseModel]] = {}
    _models(SpecFile, models)
    values: set[str] = set()
    for model in models.values():
        for field in model.model_fields.values():
            stack: list[Any] = [field.annotation]
            while stack:
                annotation = stack.pop()
                if typing.get_origin(annotation) is typing.Literal:
                    values.update(str(v) for v in typing.get_args(annotation))
                else:
                    stack.extend(typing.get_args(annotation))
    return values


def _documented(name: str) -> bool:
    return re.search(rf"`{re.escape(name)}`", README) is not None


@pytest.mark.parametrize(
    ("what", "names"),
    [
        ("spec file key", sorted(_spec_file_keys())),
        ("allowed value", sorted(_literals())),
        ("predicate", sorted(PREDICATES)),
        ("anchor", sorted(ANCHORS)),
        ("operation", sorted(default_spec().operations)),
        ("effect", sorted(EFFECTS)),
        ("replay", sorted(REPLAYS)),
        ("policy", sorted(default_spec().policies)),
        ("deadline kind", sorted(default_spec().deadline_kinds)),
        ("state", sorted(default_spec().states)),
    ],
)
def test_specs_readme_documents_every_name(what: str, names: list[str]) -> None:
    missing = [name for name in names if not _documented(name)]
    assert not missing, f"specs/README.md does not document these {what}s: {missing}"


def test_the_readme_keys_check_sees_the_nested_models() -> None:
    keys = _spec_file_keys()
    assert {"from", "while", "when", "contains", "max_reason_chars", "records"} <= keys
    assert {"queued", "rearm", "backoff", "fix_request", "attempt"} <= _literals()


def test_specs_readme_gives_each_check_count_the_range_the_loader_takes() -> None:
    # A copy's `lease_ms = 5000` is refused ("less than or equal to 1000"): the page a user
    # writes the table from says so first.
    properties = CheckSpec.model_json_schema()["properties"]
    ranges = {
        name: (bound["minimum"], bound["maximum"])
        for name, field in properties.items()
        for bound in field.get("anyOf", [])
        if bound.get("type") == "integer"
    }
    assert {"workers", "lease_ms", "horizon_ms", "max_delay_ms"} <= set(ranges)
    wrong = {
        name: (low, high)
        for name, (low, high) in ranges.items()
        if f"| `{name}` | integer {low:,}..{high:,} |" not in README
    }
    assert not wrong, f"specs/README.md's [check] table lacks these ranges: {wrong}"
