"""`workwarden validate-history`: a recorded history checked against the spec.

A history is valid, or the first bad event is named.

The histories here are the reference's own, committed through an `Authority`,
then read back as a workload document, as a bare list of events, from an
export, or straight from a store; the invalid ones are those histories with
one thing changed, as a faulty implementation would have recorded them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import CAPS, request
from support import authority as authority_over
from workwarden.cli import main
from workwarden.statemachine import Authority, RetryPolicy
from workwarden.statemachine.models import DEFAULT_RETRY_ON, Event, Workload
from workwarden.statemachine.properties.decisions import check_history, recorded_decisions
from workwarden.statemachine.spec import default_spec
from workwarden.storage import MemoryStore, SQLiteStore


def _budget_spent(authority: Authority) -> Workload:
    """A workload with max_attempts 2 whose second failure is dead-lettered."""
    workload_id = authority.admit(
        request(retry_policy=RetryPolicy(max_attempts=2, retry_on=DEFAULT_RETRY_ON)), now=10_000
    ).workload.workload_id
    claim = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=10_000)
    authority.fail(workload_id, claim.fence, "timeout", "slow", 12_000)
    claim = authority.claim(workload_id, "a", CAPS, now=13_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, 13_100)
    authority.fail(workload_id, claim.fence, "timeout", "slow", 13_200)
    return authority.get(workload_id)


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite3"


@pytest.fixture
def spent(sqlite_path: Path) -> Workload:
    store = SQLiteStore(sqlite_path)
    try:
        return _budget_spent(authority_over(store))
    finally:
        store.close()


def _write(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value), encoding="utf-8")
    return str(path)


def _document(workload: Workload) -> dict[str, Any]:
    return json.loads(workload.model_dump_json(by_alias=True))  # type: ignore[no-any-return]


def test_a_committed_history_is_valid_and_every_decision_is_rechecked(
    spent: Workload, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate-history", _write(tmp_path / "w.json", _document(spent))]) == 0
    out = capsys.readouterr().out
    assert out == f"VALID {spent.workload_id}: 8 events, 4 decisions checked\n"
    found = recorded_decisions(default_spec(), spent.execution_history, spent)
    decided = [(d.policy, d.decision) for d in found]
    assert decided == [
        ("claim", "claimable"),
        ("failure", "retry"),
        ("claim", "claimable"),
        ("failure", "attempt_budget_exhausted"),
    ]


def test_a_retry_past_the_attempt_budget_is_named_at_its_event(
    spent: Workload, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _document(spent)
    last = document["execution_history"][-1]
    last.update(to="READY", type="workload.ready", evidence={"decision": "retry"})
    document["state"] = "READY"
    assert main(["validate-history", _write(tmp_path / "w.json", document)]) == 1
    assert capsys.readouterr().out == (
        f"INVALID {spent.workload_id}: event 8: records failure decision 'retry', "
        "but the failure policy gives attempt_budget_exhausted\n"
    )


def test_a_bare_list_of_events_is_checked_on_what_its_evidence_says(
    spent: Workload, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _document(spent)["execution_history"]
    assert main(["validate-history", _write(tmp_path / "events.json", events)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("VALID ")
    assert "not knowing budget_exhausted, retries_failure_kind, retries_worker_failure" in out


def test_a_claim_beyond_the_budget_is_invalid_even_without_a_policy_decision() -> None:
    spec = default_spec()
    workload = _budget_spent(authority_over(MemoryStore()))
    history = list(workload.execution_history)
    # An implementation that re-queued the dead letter and let a third claim through.
    extra = [
        Event.model_validate(
            {"sequence": 9, "type": "workload.ready", "from": "DEAD_LETTER", "to": "READY",
             "actor": "someone", "actor_class": "operator", "at": 14_000}
        ),
        Event.model_validate(
            {"sequence": 10, "type": "workload.claimed", "from": "READY", "to": "CLAIMED",
             "actor": "a", "actor_class": "worker", "at": 14_100,
             "evidence": {"fencing_token": "3"}}
        ),
    ]  # fmt: skip
    problem = check_history(spec, history + extra, workload)
    assert problem is not None
    assert problem.sequence == 10
    assert "claim decision 'claimable'" in problem.message
    assert "attempt_budget_exhausted" in problem.message


@pytest.mark.parametrize(
    ("change", "sequence", "message"),
    [
        (lambda h: h[3].update(sequence=7), 7, "expected sequence 4"),
        (lambda h: h[1].update(to="SUCCEEDED"), 2, "READY -> SUCCEEDED is not an edge"),
        (lambda h: h[4]["evidence"].update(fencing_token="1"), 5, "fencing token 1 does not"),
        (lambda h: h[3].update(actor_class="worker"), 4, "actor class 'worker'"),
        (lambda h: h.pop(), 7, "rests in FAILED"),
    ],
    ids=["gap", "illegal-edge", "token-not-increasing", "wrong-actor", "rests-in-transient"],
)
def test_the_first_bad_event_is_named(
    spent: Workload, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    change: Any, sequence: int, message: str,
) -> None:  # fmt: skip
    events = _document(spent)["execution_history"]
    change(events)
    assert main(["validate-history", _write(tmp_path / "events.json", events)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"INVALID {tmp_path / 'events.json'}: event {sequence}: ")
    assert message in out


def test_a_store_workload_is_read_and_checked(
    spent: Workload, sqlite_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{sqlite_path}"
    assert main(["validate-history", "--store", url, "--workload", spent.workload_id]) == 0
    assert capsys.readouterr().out.startswith(f"VALID {spent.workload_id}: 8 events")
    assert main(["validate-history", "--store", url]) == 0
    assert main(["validate-history", "--store", url, "--workload", "nope"]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_NOT_FOUND: the store has no workload nope")


def test_every_workload_of_an_export_is_checked(
    spent: Workload, sqlite_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SQLiteStore(sqlite_path)
    try:
        authority_over(store).admit(request(idempotency_key="second"), now=20_000)
    finally:
        store.close()
    export = tmp_path / "export.jsonl"
    assert main(["export", "--store", f"sqlite:///{sqlite_path}", "--out", str(export)]) == 0
    capsys.readouterr()
    assert main(["validate-history", str(export)]) == 0
    out = capsys.readouterr().out
    assert out.count("VALID ") == 2
    assert out.endswith("2 of 2 histories valid\n")


def test_json_lines_with_line_separators_inside_their_strings_are_read_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a newline ends a line of JSON Lines: U+2028 and U+0085 may stand unescaped in a
    JSON string (as `jq -c` writes them), so a history holding one is still one line."""
    store = MemoryStore()
    authority = authority_over(store)
    for key in ("first", "second"):
        authority.admit(request(idempotency_key=key, input={"note": "a\u2028b\x85c"}), 10_000)
    lines = [
        json.dumps(_document(workload), ensure_ascii=False)
        for workload in authority.list("t", "app")
    ]
    assert "\u2028" in lines[0]
    export = tmp_path / "export.jsonl"
    export.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["validate-history", str(export)]) == 0
    assert capsys.readouterr().out.endswith("2 of 2 histories valid\n")


def test_a_file_that_is_not_a_history_is_refused_with_a_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate-history", _write(tmp_path / "x.json", {"hello": 1})]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: ")
    # An event that is not an object names no field (no empty one before a colon).
    events = _write(tmp_path / "events.json", [1])
    assert main(["validate-history", events]) == 1
    assert capsys.readouterr().err.startswith(
        f"WORKLOAD_INVALID: {events}: value 1: Input should be a valid dictionary"
    )
    assert main(["validate-history", str(tmp_path / "missing.json")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_a_file_or_a_store_without_histories_says_so(
    tmp_path: Path, sqlite_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("\n\n", encoding="utf-8")
    assert main(["validate-history", str(empty)]) == 0
    assert capsys.readouterr().out == f"no histories: {empty} holds none\n"
    SQLiteStore(sqlite_path).close()
    assert main(["validate-history", "--store", str(sqlite_path)]) == 0
    assert capsys.readouterr().out == "no histories: the store holds no workload\n"


def test_a_history_file_that_cannot_be_read_is_input_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.json"
    assert main(["validate-history", str(missing)]) == 1
    assert capsys.readouterr().err.startswith(
        f"WORKWARDEN_INPUT_UNREADABLE: cannot read the history file {missing}: "
    )
