"""Bad input is refused with a `WorkloadError` and a catalogue code, never another exception.

The README promises that every refusal is a `WorkloadError`. These tests hold
every public model's constructor, the grant signer and verifier and the spec
loader to it with a battery of hostile values (sets, bytes, arbitrary objects,
over-long names, NUL characters, numbers out of range, wrong shapes), and hold
the failure-kind vocabulary of the spec to its promise: an undeclared kind is
`WORKLOAD_INVALID` naming the valid ones, and nothing is written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from support import CAPS, VERIFIER, request, store_snapshot
from workwarden import statemachine
from workwarden.statemachine import (
    Authority,
    CreateWorkload,
    Fence,
    GrantSigner,
    GrantVerifier,
    RetryPolicy,
    WorkloadError,
    default_spec,
    errors,
    load_spec,
)
from workwarden.statemachine.errors import ValidatedModel
from workwarden.statemachine.models import DEFAULT_RETRY_ON, MAX_INSTANT, MAX_LIST
from workwarden.statemachine.spec import check_spec_file, load_spec_text, shipped_spec_text
from workwarden.storage import MemoryStore, Store

CATALOGUE = set(default_spec().errors)
EXAMPLES = Path(__file__).resolve().parents[1] / "specs" / "examples"

#: Values no field of any model accepts as they are, of every shape.
HOSTILE: tuple[Any, ...] = (
    {"a", "b"},
    frozenset({1}),
    b"bytes",
    bytearray(b"x"),
    object(),
    lambda: None,
    "k" * 257,
    "with\x00nul",
    "",
    -1,
    2**64,
    math.nan,
    math.inf,
    1.5,
    True,
    [object()],
    {"k": object()},
    [[[[[]]]]],
)

#: Every public model of `workwarden.statemachine`.
MODELS = sorted(
    (
        obj
        for name in statemachine.__all__
        if isinstance(obj := getattr(statemachine, name), type) and issubclass(obj, ValidatedModel)
    ),
    key=lambda model: model.__name__,
)


def refused(call: Callable[[], Any]) -> WorkloadError | None:
    """The `WorkloadError` `call` raised (None when it succeeded); any other exception fails."""
    try:
        call()
    except WorkloadError as exc:
        return exc
    return None


def assert_invalid(call: Callable[[], Any], field: str | None = None) -> WorkloadError:
    exc = refused(call)
    assert exc is not None, "accepted"
    assert exc.code in CATALOGUE
    assert exc.code == errors.INVALID
    assert exc.details is not None
    problems = exc.details["errors"]
    assert problems, exc
    assert all(set(problem) == {"field", "message"} for problem in problems)
    if field is not None:
        assert field in {problem["field"] for problem in problems}, problems
    return exc


def test_the_battery_covers_the_models_of_the_api() -> None:
    names = {model.__name__ for model in MODELS}
    assert {"CreateWorkload", "Fence", "RetryPolicy", "Grant", "FailCommand", "Workload"} <= names


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_a_models_constructor_refuses_hostile_values_of_every_field_with_workload_invalid(
    model: type[ValidatedModel],
) -> None:
    assert_invalid(lambda: model(unknown_field=1))
    for field in model.model_fields:
        for value in HOSTILE:
            exc = refused(lambda field=field, value=value: model(**{field: value}))
            if exc is not None:
                assert exc.code == errors.INVALID


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("input", {"a", "b"}, "input"),
        ("input", b"raw bytes", "input"),
        ("input", object(), "input"),
        ("input", {"k": {1, 2}}, "input.dict.k"),
        ("idempotency_key", "k" * 257, "idempotency_key"),
        ("idempotency_key", "one\x00two", "idempotency_key"),
        ("tenant_id", 7, "tenant_id"),
        ("capability_snapshot", ["ok", 3], "capability_snapshot.1"),
        ("capability_snapshot", "email", "capability_snapshot"),
        ("priority", 2**40, "priority"),
        ("retry_policy", {"max_attempts": 0}, "retry_policy.max_attempts"),
        ("retry_policy", RetryPolicy, "retry_policy"),
        ("timeouts", {"claim_ms": -1}, "timeouts.claim_ms"),
        ("not_before", 2**53, "not_before"),
        ("dependencies", [{"workload_id": ""}], "dependencies.0.workload_id"),
    ],
)
def test_a_request_built_with_a_bad_field_is_workload_invalid_naming_it(
    field: str, value: Any, where: str
) -> None:
    fields = dict(request())
    fields[field] = value
    exc = assert_invalid(lambda: CreateWorkload(**fields), where)
    assert exc.message.startswith(exc.details["errors"][0]["field"])  # type: ignore[index]


@pytest.mark.parametrize(
    "call",
    [
        lambda: Fence(claim_id="c", worker_id="w", token="1"),
        lambda: Fence(claim_id="c\x00", worker_id="w", token=1),
        lambda: Fence(claim_id="c", worker_id="w", token=-1),
        lambda: RetryPolicy(retry_on={"timeout", 3}),
        lambda: RetryPolicy(backoff="linear"),
        lambda: RetryPolicy(max_attempts=1.0),
        lambda: statemachine.FailCommand(workload_id="w", fence={}, kind="timeout", error="x"),
        lambda: statemachine.ClaimCommand(workload_id="w", worker_id="w", lease_ms=0),
        lambda: statemachine.Subject(kind="robot", id="r"),
    ],
)
def test_a_model_built_with_bad_values_is_workload_invalid(call: Callable[[], Any]) -> None:
    assert_invalid(call)


def test_model_validate_is_pydantics_and_keeps_the_full_paths_of_nested_errors() -> None:
    data = dict(request().model_dump(), retry_policy={"max_attempts": 0})
    with pytest.raises(ValidationError) as caught:
        CreateWorkload.model_validate(data)
    assert caught.value.errors()[0]["loc"] == ("retry_policy", "max_attempts")
    # A valid document still round-trips through both doors.
    assert CreateWorkload.model_validate(request().model_dump()) == request()
    assert CreateWorkload(**dict(request())) == request()


def test_a_workload_error_is_not_a_value_error() -> None:
    # A refusal raised inside a validator must not be folded into a ValidationError.
    assert not issubclass(WorkloadError, ValueError)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: GrantSigner("k", b"short"), "secret"),
        (lambda: GrantSigner("k", "a secret of at least 16 chars"), "secret"),
        (lambda: GrantSigner("k", None), "secret"),
        (lambda: GrantSigner("", b"a secret of at least 16 bytes"), "key_id"),
        (lambda: GrantSigner(7, b"a secret of at least 16 bytes"), "key_id"),
        (lambda: GrantSigner("k\x00", b"a secret of at least 16 bytes"), "key_id"),
        (lambda: GrantVerifier({}), "keys"),
        (lambda: GrantVerifier(None), "keys"),
        (lambda: GrantVerifier(["k"]), "keys"),
        (lambda: GrantVerifier({"k": "not bytes, a str of 16+"}), "keys['k']"),
        (lambda: GrantVerifier({"k": b"short"}), "keys['k']"),
        (lambda: GrantVerifier({3: b"a secret of at least 16 bytes"}), "keys"),
    ],
)
def test_the_grant_signer_and_verifier_refuse_bad_arguments_naming_them(
    call: Callable[[], Any], field: str
) -> None:
    assert_invalid(call, field)


@pytest.mark.parametrize("path", [123, b"specs/workload.toml", object()])
def test_load_spec_refuses_a_path_that_is_not_one(path: Any) -> None:
    exc = refused(lambda: load_spec(path))
    assert exc is not None
    assert exc.code == errors.SPEC_INVALID


@pytest.mark.parametrize("text", [None, b"[spec]", 7])
def test_load_spec_text_refuses_text_that_is_not_text(text: Any) -> None:
    assert_invalid(lambda: load_spec_text(text))


# -- the failure kinds are a declared vocabulary ------------------------------


def _running(authority: Authority) -> tuple[str, Fence]:
    workload_id = authority.admit(request(), 10_000).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, 11_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, 11_100)
    return workload_id, claim.fence


def test_the_default_retry_policy_retries_the_kinds_the_spec_marks() -> None:
    spec = default_spec()
    assert set(spec.failure_kinds) == {
        "timeout",
        "transient_connection",
        "worker_failure",
        "validation",
    }
    assert spec.default_retry_on == DEFAULT_RETRY_ON
    assert (
        tuple(sorted(name for name, kind in spec.failure_kinds.items() if kind.retry_by_default))
        == DEFAULT_RETRY_ON
    )


@pytest.mark.parametrize("kind", ["transient_conection", "Timeout", "oom"])
def test_a_failure_of_an_undeclared_kind_is_refused_naming_the_valid_ones_and_writes_nothing(
    store: Store, kind: str
) -> None:
    authority = Authority(store, grants=VERIFIER)
    workload_id, fence = _running(authority)
    before = store_snapshot(store)
    exc = assert_invalid(lambda: authority.fail(workload_id, fence, kind, "no route", 12_000))
    assert exc.details is not None
    assert exc.details["valid"] == [
        "timeout",
        "transient_connection",
        "validation",
        "worker_failure",
    ]
    assert "transient_connection" in exc.message
    assert store_snapshot(store) == before
    # The attempt goes on: the same worker reports a declared kind.
    assert authority.fail(workload_id, fence, "transient_connection", "no route", 12_000) == "READY"


def test_a_spec_that_opens_the_vocabulary_lets_any_kind_through_to_the_failure_policy(
    store: Store,
) -> None:
    text = shipped_spec_text().replace("[failures]\nopen = false", "[failures]\nopen = true")
    assert text != shipped_spec_text()
    authority = Authority(store, grants=VERIFIER, spec=load_spec_text(text))
    workload_id, fence = _running(authority)
    assert authority.fail(workload_id, fence, "oom", "killed", 12_000) == "DEAD_LETTER"
    decided = authority.get(workload_id).execution_history[-1].evidence["decision"]
    assert decided == "failure_kind_not_retryable"


def _problems(tmp_path: Any, old: str, new: str) -> list[tuple[str, str]]:
    text = shipped_spec_text()
    assert old in text
    path = tmp_path / "spec.toml"
    path.write_text(text.replace(old, new), "utf-8")
    return [(problem.field, problem.message) for problem in check_spec_file(path)]


def test_a_check_universe_naming_an_undeclared_kind_is_a_spec_problem(tmp_path: Any) -> None:
    problems = _problems(
        tmp_path, 'second_retry_on = ["transient_connection"]', 'second_retry_on = ["transient"]'
    )
    assert problems == [
        (
            "check.second_retry_on[0]",
            "unknown failure kind 'transient' (valid: timeout, transient_connection, "
            "validation, worker_failure)",
        )
    ]


def test_a_policy_asking_about_an_undeclared_kind_is_a_spec_problem(tmp_path: Any) -> None:
    problems = _problems(tmp_path, "[failures.kinds.validation]", "[failures.kinds.invalid_input]")
    assert problems == []  # renaming a kind no policy names is fine
    problems = _problems(
        tmp_path,
        '[failures.kinds.timeout]\nmeaning = "The attempt ran out of time',
        '[failures.kinds.slow]\nmeaning = "The attempt ran out of time',
    )
    fields = [field for field, _ in problems]
    assert "policies.deadline.rules[1].when[0]" in fields
    assert "policies.operator_timeout.rules[0].when[0]" in fields
    assert "failures.kinds" in fields  # the default retry policy's kinds changed too
    message = dict(problems)["policies.deadline.rules[1].when[0]"]
    assert "'timeout'" in message
    assert "valid: slow, transient_connection, validation, worker_failure" in message


def test_a_spec_must_keep_the_default_retry_policys_kinds(tmp_path: Any) -> None:
    problems = _problems(
        tmp_path,
        'failed a check): another attempt would fail the same way."\nretry_by_default = false',
        'failed a check): another attempt would fail the same way."\nretry_by_default = true',
    )
    assert len(problems) == 1
    field, message = problems[0]
    assert field == "failures.kinds"
    assert "timeout, transient_connection, worker_failure" in message


def test_a_kind_name_is_snake_case(tmp_path: Any) -> None:
    problems = _problems(tmp_path, "[failures.kinds.validation]", '[failures.kinds."Bad-Kind"]')
    assert ("failures.kinds.Bad-Kind", "a failure kind is snake_case") in problems


def test_a_kind_name_longer_than_fail_takes_is_a_spec_problem(tmp_path: Any) -> None:
    # Declared, it loaded; but fail() takes a kind of at most 256 characters, so no
    # worker could ever report it.
    longest = "k" * 256
    assert _problems(tmp_path, "[failures.kinds.validation]", f"[failures.kinds.{longest}]") == []
    problems = _problems(tmp_path, "[failures.kinds.validation]", f"[failures.kinds.{longest}k]")
    assert [field for field, _ in problems] == [f"failures.kinds.{'k' * 40}..."]
    assert "at most 256 characters" in problems[0][1]


@pytest.mark.parametrize("text", ["with\x00nul", "\x00", "a lone \ud800 surrogate"])
def test_free_text_no_store_can_hold_is_refused_by_every_call_taking_it_and_writes_nothing(
    text: str,
) -> None:
    # An error, a reason and a secret reference are free text, but a NUL fails on
    # PostgreSQL's text columns: every backend refuses it alike, before anything is written.
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER, spec=load_spec(EXAMPLES / "pause.toml"))
    failed = warden.admit(request(idempotency_key="failed"), 1_000).workload.workload_id
    claim = warden.claim(failed, "w1", CAPS, 1_001, 30_000)
    warden.start(failed, claim.fence, 1_002)
    warden.fail(failed, claim.fence, "validation", "no lines", 1_003, effect="none")
    waiting = warden.admit(request(idempotency_key="waiting"), 1_000).workload.workload_id
    running = warden.admit(request(idempotency_key="running"), 1_000).workload.workload_id
    held = warden.claim(running, "w2", CAPS, 1_001, 30_000)
    warden.start(running, held.fence, 1_002)
    before = store_snapshot(store)
    calls: dict[str, Callable[[], Any]] = {
        "error": lambda: warden.fail(running, held.fence, "validation", text, 1_004),
        "reason": lambda: warden.retry(failed, "ops", 1_004, reason=text),
        "operate": lambda: warden.operate(waiting, "pause", "ops", 1_004, reason=text),
        "pause": lambda: warden.pause("ops", 1_004, tenant="t", reason=text),
        "secret_references": lambda: warden.execution_context(
            running, held.fence, 1_004, [f"secret://{text}"]
        ),
    }
    for field, call in calls.items():
        exc = refused(call)
        assert exc is not None, f"{field}: accepted"
        assert exc.code == errors.INVALID, (field, exc)
    assert store_snapshot(store) == before
    assert warden.pauses() == []


def test_an_integer_too_long_to_write_is_invalid_in_its_own_slot_and_writes_nothing() -> None:
    # Python writes integers of at most 4,300 digits as text; a longer one in an
    # input, a checkpoint or an output was a bare ValueError, out of a batch
    # whose other slots had been answered and written.
    huge = 10**5000
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    before = store_snapshot(store)
    exc = refused(lambda: warden.admit(request(idempotency_key="big", input={"n": huge}), 1_000))
    assert exc is not None
    assert exc.code == errors.INVALID
    assert store_snapshot(store) == before
    good, bad = warden.admit_many(
        [request(idempotency_key="fine"), request(idempotency_key="big", input=[huge])], 1_000
    )
    assert not isinstance(good, WorkloadError)
    assert good.created
    assert isinstance(bad, WorkloadError)
    assert bad.code == errors.INVALID
    workload_id = good.workload.workload_id
    claim = warden.claim(workload_id, "w1", CAPS, 1_001, 30_000)
    fence = claim.fence.model_dump()
    started, checkpointed = warden.report_many(
        [
            {"op": "start", "workload_id": workload_id, "fence": fence},
            {"op": "checkpoint", "workload_id": workload_id, "fence": fence, "state": huge},
        ],
        1_002,
    )
    assert not isinstance(started, WorkloadError)
    assert isinstance(checkpointed, WorkloadError)
    assert checkpointed.code == errors.INVALID
    assert warden.get(workload_id).checkpoints == []
    exc = refused(lambda: warden.complete(workload_id, claim.fence, "r1", {"n": -huge}, 1_003))
    assert exc is not None
    assert exc.code == errors.INVALID
    assert warden.get(workload_id).state == "RUNNING"


@pytest.mark.parametrize("value", [[1], 5, None, "start", b"{}"], ids=repr)
def test_a_command_that_is_not_a_mapping_is_invalid_naming_the_command_and_writes_nothing(
    value: Any,
) -> None:
    # A whole command of the wrong type was refused with an empty field path
    # (": Input should be a valid dictionary ..."), naming nothing the caller wrote.
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    warden.admit(request(), 1_000)
    before = store_snapshot(store)
    exc = refused(lambda: warden.execute(value, 1_001))
    assert exc is not None
    assert exc.code == errors.INVALID
    assert exc.message.startswith("command: ")
    assert exc.details["errors"][0]["field"] == "command"
    [slot] = warden.report_many([value], 1_001)
    assert isinstance(slot, WorkloadError)
    assert slot.code == errors.INVALID
    assert slot.details["errors"][0]["field"] == "command"
    assert store_snapshot(store) == before


def test_a_lease_ending_after_the_largest_instant_is_invalid_and_writes_nothing() -> None:
    # `lease_ms` and `extend_ms` may each be up to 2**53 - 1, but a lease must end
    # at an instant a JSON number holds and a recovery sweep can reach.
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    workload_id = warden.admit(request(), 1_000).workload.workload_id
    before = store_snapshot(store)
    last = MAX_INSTANT - 1_001
    for call in (
        lambda: warden.claim(workload_id, "w1", CAPS, 1_001, last + 1),
        lambda: warden.claim_many("t", "app", "w1", CAPS, 1_001, last + 1, 5),
    ):
        exc = refused(call)
        assert exc is not None
        assert exc.code == errors.INVALID
        assert exc.details is not None
        assert exc.details["field"] == "lease_ms"
    assert store_snapshot(store) == before
    claim = warden.claim(workload_id, "w1", CAPS, 1_001, last)
    assert claim.expires_at == MAX_INSTANT
    exc = refused(lambda: warden.heartbeat(workload_id, claim.fence, 1_002, last))
    assert exc is not None
    assert exc.code == errors.INVALID
    assert warden.get(workload_id).current_claim == claim


def test_a_request_cannot_be_changed_after_it_was_built_so_nothing_unchecked_is_stored() -> None:
    # A field set after validation (`policy.max_attempts = 0`) once reached the
    # stored document unchecked, and a document that does not parse stopped every
    # claim of its tenant and application.
    made = request()
    for target, field, value in (
        (made, "idempotency_key", "a\x00b"),
        (made, "priority", 2**40),
        (made.retry_policy, "max_attempts", 0),
        (made.timeouts, "queue_ms", -1),
        (made.authorization_snapshot.grant, "tenant_id", "other"),
    ):
        exc = refused(lambda target=target, field=field, value=value: setattr(target, field, value))
        assert exc is not None, (type(target).__name__, field)
        assert exc.code == errors.INVALID
        exc = refused(lambda target=target, field=field: delattr(target, field))
        assert exc is not None
    assert made == request()
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    admitted = warden.admit(made, 1_000).workload
    assert warden.claim_next("t", "app", "w1", CAPS, 1_001, 30_000) is not None
    assert warden.get(admitted.workload_id).retry_policy == made.retry_policy


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("store", lambda: Authority(None, grants=VERIFIER)),  # type: ignore[arg-type]
        ("store", lambda: Authority(5, grants=VERIFIER)),  # type: ignore[arg-type]
        ("spec", lambda: Authority(MemoryStore(), grants=VERIFIER, spec="x")),  # type: ignore[arg-type]
        ("grant", lambda: GrantSigner("k1", b"0123456789abcdef").sign({})),  # type: ignore[arg-type]
        ("grant", lambda: GrantSigner("k1", b"0123456789abcdef").sign(None)),  # type: ignore[arg-type]
    ],
)
def test_an_authority_and_a_signer_refuse_what_they_cannot_use_when_called(
    field: str, build: Callable[[], Any]
) -> None:
    assert_invalid(build, field)


def test_a_prepared_call_commits_once_and_a_second_commit_is_invalid() -> None:
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    prepared = warden.prepare({"op": "admit", "request": request().model_dump()}, 1_000)
    prepared.commit()
    before = store_snapshot(store)
    assert_invalid(prepared.commit, "commit")
    assert store_snapshot(store) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("capability_snapshot", [f"c{i}" for i in range(MAX_LIST + 1)]),
        ("connection_scopes", [f"s{i}" for i in range(MAX_LIST + 1)]),
        ("dependencies", [{"workload_id": f"w{i}"} for i in range(MAX_LIST + 1)]),
    ],
)
def test_a_request_list_longer_than_the_limit_is_invalid_and_admits_nothing(
    field: str, value: list[Any]
) -> None:
    # Each entry is copied into the document and read on every claim.
    fields = request().model_dump()
    fields[field] = value
    assert_invalid(lambda: CreateWorkload(**fields), field)
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    assert_invalid(lambda: warden.admit(fields, 1_000), f"request.{field}")
    assert store_snapshot(store) == store_snapshot(MemoryStore())
    fields[field] = value[:MAX_LIST]
    assert CreateWorkload(**fields)


def test_a_worker_offering_more_capabilities_than_the_limit_is_invalid() -> None:
    warden = Authority(MemoryStore(), grants=VERIFIER)
    offered = [f"c{i}" for i in range(MAX_LIST + 1)]
    assert_invalid(lambda: warden.claim_next("t", "app", "w1", offered, 1_000, 30_000))
