"""`workwarden conform`: the reference adapter passes, a wrong one fails at the right step.

Each test runs a real program through the protocol, as an implementer's CI
would: the repository's adapter (`python -m workwarden.adapter`) and the
deliberately wrong ones in `tests/wrong_adapter.py`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from workwarden.cli import main
from workwarden.cli.reference import MAX_VECTOR_FILE_BYTES
from workwarden.statemachine.conformance.conform import (
    MAX_RESPONSE_BYTES,
    ConformanceProgram,
    ProgramError,
)

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parent / "specs" / "vectors" / "workload.jsonl"
CLAIM_STARTS = HERE.parent / "specs" / "examples" / "claim_starts.toml"
CLAIM_STARTS_VECTORS = HERE.parent / "specs" / "vectors" / "workload-claim_starts.jsonl"
ADAPTER = f"{shlex.quote(sys.executable)} -m workwarden.adapter"


def wrong(mistake: str) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'wrong_adapter.py'))} {mistake}"


def scenarios() -> int:
    return len(SHIPPED.read_text("ascii").splitlines())


def _failed_scenario(
    capsys: pytest.CaptureFixture[str], program: str, selected: str, *options: str
) -> str:
    """`conform --cmd PROGRAM -k SELECTED OPTIONS`: it exits 1, failing SELECTED; its output."""
    assert main(["conform", "--cmd", program, "-k", selected, *options]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {selected}" in out
    return out


def test_the_repository_adapter_passes_every_vector_and_says_so_in_junit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "conformance.xml"
    assert main(["conform", "--cmd", ADAPTER, "--junit", str(junit)]) == 0
    out = capsys.readouterr().out
    assert f"{scenarios()} of {scenarios()} scenarios passed" in out
    assert "PASS admission/the_same_request_replays_the_original_without_creating_another" in out
    assert not [line for line in out.splitlines() if line.startswith("FAIL ")]
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("tests") == str(scenarios())
    assert suite.get("failures") == "0"
    assert suite.get("errors") == "0"


def test_an_adapter_that_retries_past_the_budget_fails_exactly_where_the_budget_is_spent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "conformance.xml"
    assert main(["conform", "--cmd", wrong("budget"), "--quiet", "--junit", str(junit)]) == 1
    out = capsys.readouterr().out
    failed = [line.removeprefix("FAIL ") for line in out.splitlines() if line.startswith("FAIL ")]
    assert failed == [
        "failures/the_attempt_budget_bounds_failure_retries",
        "failures/a_single_attempt_policy_dead_letters_a_retryable_failure",
        # The model checker's witness of the failure policy's budget rule.
        "checker/rule:failure.attempt_budget_exhausted",
    ]
    report = out.split("FAIL failures/the_attempt_budget_bounds_failure_retries\n")[1]
    lines = [line.strip() for line in report.splitlines()]
    assert lines[0] == "step 6 of 7: fail at now=13000"
    assert lines[2] == "differs in reply"
    assert lines[3].startswith("expected")
    assert '"state":"DEAD_LETTER"' in lines[3]
    assert lines[4].startswith("actual")
    assert '"state":"READY"' in lines[4]
    assert f"{scenarios() - 3} of {scenarios()} scenarios passed" in out
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    failures = {
        str(case.get("name")): case.find("failure")
        for case in cases
        if case.find("failure") is not None
    }
    assert sorted(failures) == [
        "a_single_attempt_policy_dead_letters_a_retryable_failure",
        "rule:failure.attempt_budget_exhausted",
        "the_attempt_budget_bounds_failure_retries",
    ]
    first = failures["the_attempt_budget_bounds_failure_retries"]
    assert first is not None
    assert first.get("message") == "step 6: reply differs"


def test_an_adapter_that_ignores_stale_fences_fails_where_a_stale_worker_calls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["conform", "--cmd", wrong("stale-fence"), "-k", "fencing/", "--quiet"])
    assert status == 1
    out = capsys.readouterr().out
    stale = out.split(
        "FAIL fencing/after_recovery_a_new_claim_has_a_larger_token_and_the_old_fence_is_stale\n"
    )[1].splitlines()
    stale = [line.strip() for line in stale]
    assert stale[0] == "step 6 of 7: heartbeat at now=13500"
    assert stale[2] == "differs in response"
    assert "WORKLOAD_STALE_FENCE" in stale[3]
    assert '"ok"' in stale[4]


@pytest.mark.parametrize(
    ("mistake", "failing"),
    [
        (
            "unfenced-checkpoint",
            ["fencing/a_stale_worker_cannot_checkpoint_or_confirm_a_cancellation"],
        ),
        (
            "unfenced-confirm_cancel",
            ["fencing/a_stale_worker_cannot_checkpoint_or_confirm_a_cancellation"],
        ),
        ("lease-unchecked-start", ["fencing/an_expired_lease_refuses_a_start"]),
        (
            "lease-unchecked-checkpoint",
            ["fencing/an_expired_lease_refuses_every_call_of_its_running_worker"],
        ),
        (
            "lease-unchecked-execution_context",
            ["fencing/an_expired_lease_refuses_every_call_of_its_running_worker"],
        ),
        (
            "lease-unchecked-fail",
            ["fencing/an_expired_lease_refuses_every_call_of_its_running_worker"],
        ),
        (
            "lease-unchecked-confirm_cancel",
            ["fencing/an_expired_lease_refuses_a_cancel_confirmation"],
        ),
        (
            "ignores-request-ids",
            [
                "replays/a_repeated_claim_request_answers_its_claim_until_the_attempt_starts",
                "replays/a_repeated_claim_next_request_answers_its_claim_until_the_attempt_starts",
                "replays/a_repeated_cancel_request_answers_what_it_did",
                "replays/repeated_timeout_and_retry_requests_answer_what_they_did",
                "replays/a_request_id_used_for_another_workload_is_a_conflict",
            ],
        ),
        (
            "tie-largest-id",
            ["scheduler/equal_priority_and_age_are_claimed_smallest_workload_id_first"],
        ),
    ],
)
def test_an_adapter_that_skips_one_fence_lease_request_or_ordering_rule_fails_the_vectors(
    mistake: str, failing: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["conform", "--cmd", wrong(mistake), "--quiet"]) == 1
    out = capsys.readouterr().out
    failed = [line.removeprefix("FAIL ") for line in out.splitlines() if line.startswith("FAIL ")]
    assert set(failing) <= set(failed), failed
    assert not [line for line in out.splitlines() if "the program" in line]


@pytest.mark.parametrize("mistake", ["codeless-refusal", "null-refusal"])
def test_an_error_without_a_code_is_outside_the_protocol_and_never_passes_for_a_reply(
    mistake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Where the reference answers `{"ok": null}`, an error without a catalogue code must not
    # compare equal to it: every scenario with a null reply fails, naming the step.
    selected = "scheduler/the_scheduler_skips_work_that_is_not_yet_eligible"
    out = _failed_scenario(capsys, wrong(mistake), selected)
    assert "an error must be an object with a string code" in out
    assert "0 of 1 scenarios passed" in out
    assert main(["conform", "--cmd", wrong(mistake), "-k", "scheduler/", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAIL scheduler/a_dependency_on_a_missing_workload_is_never_met" in out


def test_a_program_that_writes_lines_nobody_asked_for_is_told_so_not_misread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each response written twice: the second copy must not be read as the answer to the
    # next request (a reset's `null` taken for the store read-back).
    assert main(["conform", "--cmd", wrong("answers-twice"), "-k", "lifecycle/"]) == 1
    out = capsys.readouterr().out
    reports = out.split("FAIL ")[1:]
    assert len(reports) >= 9
    for report in reports:
        assert "at reset: the program wrote a line no request asked for: '{\"ok\":null}\\n'" in (
            report
        )
    assert "read-back was refused" not in out


def test_a_response_that_is_not_utf8_is_reported_as_such_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    selected = "lifecycle/a_workload_that_does_not_exist_is_not_found"
    started = time.monotonic()
    assert main(["conform", "--cmd", wrong("not-utf8"), "-k", selected]) == 1
    assert time.monotonic() - started < 4
    out = capsys.readouterr().out
    assert "at reset: the response is not one line of JSON: '\ufffd\ufffd{}\\n'" in out
    assert "closed its standard output" not in out


def test_a_line_that_never_ends_is_cut_off_at_the_longest_response_not_read_into_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    selected = "lifecycle/a_workload_that_does_not_exist_is_not_found"
    out = _failed_scenario(capsys, wrong("endless-line"), selected, "--timeout", "60")
    assert (
        f"at reset: the response is longer than {MAX_RESPONSE_BYTES} bytes without a line "
        "break; the program was stopped"
    ) in out


def test_the_stderr_tail_keeps_the_end_of_a_line_that_never_breaks() -> None:
    program = ConformanceProgram(shlex.split(wrong("endless-stderr")), timeout=30)
    try:
        with pytest.raises(ProgramError) as caught:
            program.request({"type": "store"})
    finally:
        program.close()
    message = str(caught.value)
    assert "the program exited (status 3)" in message
    assert message.endswith("x" * 100)
    assert len(message) < 10_000


def test_a_vector_file_larger_than_the_limit_is_refused_before_it_is_read_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as file:
        file.truncate(MAX_VECTOR_FILE_BYTES + 1)  # sparse: nothing is written to disk
    for path in (str(huge), "/dev/zero"):
        assert main(["conform", "--cmd", ADAPTER, "--vectors", path]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.splitlines()[0] == (
            f"WORKWARDEN_INPUT_UNREADABLE: the vector file {path} is larger than "
            f"{MAX_VECTOR_FILE_BYTES} bytes"
        )


def test_a_program_that_exits_fails_that_scenario_and_is_started_again_for_the_next(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["conform", "--cmd", wrong("crash"), "-k", "lifecycle/a_w", "--timeout", "5"])
    assert status == 1
    out = capsys.readouterr().out
    first = out.split("FAIL lifecycle/a_workload_goes_from_admission_through_checkpoints_to_")[1]
    assert "at step 4 of 9: the program exited (status 3)" in first
    assert "wrong adapter: giving up" in first
    # Started afresh, it answers three commands of the next scenario, then exits again.
    assert "PASS lifecycle/a_workload_that_does_not_exist_is_not_found" in out


def test_a_program_that_does_not_answer_is_stopped_after_the_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    selected = "failures/a_worker_that_could_not_start_reports_a_failure_with_no_effect"
    out = _failed_scenario(capsys, wrong("hang"), selected, "--timeout", "0.5")
    assert "at step 3 of 3: no response within 0.5 s to a command request" in out


def test_a_stopped_programs_end_of_output_never_reaches_the_program_started_after_it() -> None:
    # The first program leaves a child holding its stdout for 1 s after it stops; the next
    # one answers 1.5 s after each request. The first one's end of output, arriving at 1 s,
    # must not be read as the second one's exit.
    program = ConformanceProgram(shlex.split(wrong("lingers")), timeout=10)
    try:
        assert program.request({"type": "store"}) == {"ok": None}
        program.close()
        assert program.request({"type": "store"}) == {"ok": None}
        assert program.answered == 2
    finally:
        program.close()


def test_a_program_that_stops_reading_its_input_is_stopped_after_the_timeout(
    tmp_path: Path,
) -> None:
    """A request larger than the pipe, sent to a program that no longer reads: the write
    never ends, and the timeout bounds it as it bounds the answer (a run, never a hang)."""
    selected = "lifecycle/a_workload_that_does_not_exist_is_not_found"
    line = json.loads(
        next(x for x in SHIPPED.read_text("ascii").splitlines() if f'"{selected}"' in x)
    )
    line["steps"][0]["command"]["padding"] = "x" * (4 << 20)
    vectors = tmp_path / "large.jsonl"
    vectors.write_text(json.dumps(line) + "\n", "ascii")
    command = [sys.executable, "-m", "workwarden", "conform", "--cmd", wrong("stops-reading")]
    done = subprocess.run(
        [*command, "--vectors", str(vectors), "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=120,  # a bound for the test run, not a measurement: the run never hangs
    )
    assert done.returncode == 1, done.stderr
    assert "at step 1 of 3: no response within 1 s to a command request" in done.stdout


def test_a_program_stopped_at_the_timeout_leaves_no_thread_writing_its_input() -> None:
    program = ConformanceProgram(
        [sys.executable, "-c", "import time; time.sleep(3600)"], timeout=0.2, startup=0.2
    )
    for _ in range(3):
        with pytest.raises(ProgramError, match=r"no response within 0\.2 s"):
            program.request({"type": "store"})
    for thread in threading.enumerate():
        if thread.name == "conformance-feed":
            thread.join(timeout=10)  # a bound for the test run: each ends at once
    assert not [t for t in threading.enumerate() if t.name == "conformance-feed"]


def test_a_program_that_closes_its_output_but_lives_on_is_stopped_and_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    selected = "lifecycle/a_workload_that_does_not_exist_is_not_found"
    out = _failed_scenario(capsys, wrong("closes-stdout"), selected)
    assert (
        "at step 1 of 3: the program closed its standard output instead of answering a "
        "command request, and did not exit within 5 s; the program was stopped"
    ) in out
    assert "0 of 1 scenarios passed" in out


def test_a_program_that_cannot_be_started_stops_the_run_with_one_coded_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["conform", "--cmd", "no-such-program-here --x"])
    assert status == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[0] == (
        "CONFORMANCE_PROGRAM_UNUSABLE: cannot start no-such-program-here --x: No such file or"
        " directory; no scenario can run, so none was"
    )


def test_a_program_that_dies_on_its_first_request_stops_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    program = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)'"
    assert main(["conform", "--cmd", program]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    first = err.splitlines()[0]
    assert first.startswith("CONFORMANCE_PROGRAM_UNUSABLE: ")
    assert "failed its first request: the program exited (status 3)" in first
    assert len(err) < 1_000


def adapter_lines(requests: list[str]) -> list[str]:
    """What the reference adapter answers to `requests`, one line each; it must exit 0 and
    write nothing on standard error."""
    done = subprocess.run(
        [sys.executable, "-m", "workwarden.adapter"],
        input="\n".join(requests) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == len(requests), lines
    return lines


def test_the_adapter_answers_one_line_per_request_and_refuses_what_is_not_the_protocol() -> None:
    requests = "\n".join(
        [
            '{"type": "reset", "store": [], "grant_keys": {}}',
            "not json",
            '{"type": "dance"}',
            '{"type": "command", "command": {"op": "start"}, "now": 1}',
            '{"type": "store"}',
        ]
    )
    done = subprocess.run(
        [sys.executable, "-m", "workwarden.adapter"],
        input=requests + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == '{"ok":null}'
    assert '"code":"WORKLOAD_INVALID"' in lines[1]
    assert "unknown request type 'dance'" in lines[2]
    assert '"code":"WORKLOAD_INVALID"' in lines[3]
    assert lines[4] == '{"ok":[]}'


def test_the_adapter_refuses_json_nested_too_deeply_and_answers_on() -> None:
    lines = adapter_lines(["[" * 100_000 + "]" * 100_000, '{"type": "store"}'])
    assert '"code":"WORKLOAD_INVALID"' in lines[0]
    assert "nested too deeply" in lines[0]
    assert lines[1] == '{"ok":[]}'


def test_the_adapter_refuses_a_number_too_long_to_read_or_an_op_that_is_not_a_name() -> None:
    # Python reads no integer of more than 4300 digits; a list is no key of a dict.
    lines = adapter_lines(
        [
            '{"type": "command", "command": {"op": "start"}, "now": ' + "9" * 5000 + "}",
            '{"type": "command", "command": {"op": ["pause"]}, "now": 1}',
            '{"type": "command", "command": {"op": {"claim_next": 1}}, "now": 1}',
            '{"type": "store"}',
        ]
    )
    assert '"code":"WORKLOAD_INVALID"' in lines[0]
    assert "a number too long to read" in lines[0]
    for line in lines[1:3]:
        assert '"code":"WORKLOAD_INVALID"' in line
        assert "must name one of the operations" in line
    assert lines[3] == '{"ok":[]}'


@pytest.mark.parametrize("timeout", ["-1", "0", "inf", "nan", "1e300", "3601", "soon"])
def test_a_timeout_that_is_not_positive_finite_and_at_most_an_hour_is_a_usage_error(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["conform", "--cmd", ADAPTER, f"--timeout={timeout}", "-k", "admission/a_zero"])
    assert status == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("WORKWARDEN_USAGE: workwarden conform: argument --timeout: ")


def test_an_hour_is_the_longest_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "--cmd", ADAPTER, "--timeout", "3600", "-k", "admission/a_zero"]) == 0
    assert "1 of 1 scenarios passed" in capsys.readouterr().out


def test_a_junit_report_that_cannot_be_written_is_refused_before_any_scenario_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "missing" / "conformance.xml"
    assert main(["conform", "--cmd", ADAPTER, "--junit", str(junit)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"WORKWARDEN_OUTPUT_UNWRITABLE: cannot write the JUnit report {junit}")
    assert not junit.parent.exists()


def test_a_program_that_refuses_its_first_reset_stops_the_run_with_one_coded_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["conform", "--cmd", wrong("refuses-reset")]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    first = err.splitlines()[0]
    assert first.startswith("CONFORMANCE_PROGRAM_UNUSABLE: ")
    assert "refused its first request (reset)" in first
    assert "WORKLOAD_STORAGE_FAILURE" in first
    assert '"scenarios_run": 0' in err


_READ_BACK = "at step 1 of 1: the store read-back does not hold workload documents: entry "
_WORKLOAD = "(workload_a905c442ee731da96617b295)"


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        (
            "no-input-hash",
            [_READ_BACK + "1 (workload_", "not a workload document: input_hash: Field required"],
        ),
        (
            "version-zero",
            [f"{_READ_BACK}1 {_WORKLOAD}: version 0 is not a whole number of at least 1"],
        ),
        ("lists-twice", [f"{_READ_BACK}2 {_WORKLOAD}: the key of entry 1 again"]),
        ("store-object", ['at reset: the store read-back is not a list of entries: {"ok":{}}']),
    ],
)
def test_a_store_read_back_that_is_not_a_list_of_documents_fails_the_scenario_saying_why(
    capsys: pytest.CaptureFixture[str], mode: str, says: list[str]
) -> None:
    """A field missing, a version below 1, a key listed twice, an object for a list: each
    fails its scenario, named as such (never the run, never called a refusal)."""
    selected = "admission/a_one_millisecond_timeout_is_accepted"
    out = _failed_scenario(capsys, wrong(mode), selected)
    for text in says:
        assert text in out
    assert "refused" not in out


def test_a_reply_nested_too_deeply_fails_the_scenario_not_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    selected = "admission/a_one_millisecond_timeout_is_accepted"
    for depth, says in ((100_000, "to read"), (300, "to compare")):
        program = f"{wrong('nested-reply')} {depth}"
        out = _failed_scenario(capsys, program, selected)
        assert f"at step 1 of 1: the response is JSON nested too deeply {says}" in out


def test_a_number_too_long_to_read_fails_the_scenario_not_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    selected = "admission/a_one_millisecond_timeout_is_accepted"
    out = _failed_scenario(capsys, wrong("long-number"), selected)
    assert 'at step 1 of 1: the response holds a number too long to read: \'{"ok":999' in out


def test_what_a_program_writes_is_shown_escaped_and_the_junit_report_stays_well_formed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lone surrogate in a reply, control characters on stderr or in a scenario's name:
    each is written as its escape, on the terminal and in a JUnit file that parses."""
    selected = "lifecycle/a_workload_that_does_not_exist_is_not_found"
    line = next(x for x in SHIPPED.read_text("ascii").splitlines() if f'"{selected}"' in x)
    vectors = tmp_path / "named.jsonl"
    vectors.write_text(line.replace(selected, selected + "\\u0001\\u001b[2J"), "ascii")
    for mistake, says in (
        ("lone-surrogate", 'actual    {"ok":"\\ud800"}'),
        ("stderr-controls", "bad\\x00byte \\x1b[31mred\\x1b[0m\\x0cend"),
    ):
        junit = tmp_path / f"{mistake}.xml"
        options = ["--vectors", str(vectors), "--junit", str(junit)]
        assert main(["conform", "--cmd", wrong(mistake), *options]) == 1
        out = capsys.readouterr().out
        assert f"FAIL {selected}\\x01\\x1b[2J\n" in out
        assert says in out
        assert "failed: lifecycle/a_workload_that_does_not_exist_is_not_found\\x01\\x1b[2J" in out
        assert not [c for c in out if (c < " " and c != "\n") or "\ud800" <= c <= "\udfff"]
        case = ElementTree.parse(junit).getroot().find("testsuite/testcase")
        assert case is not None
        assert case.get("name") == "a_workload_that_does_not_exist_is_not_found\\x01\\x1b[2J"
        assert says in ElementTree.tostring(case, encoding="unicode")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        (
            "store",
            [{"key": "k", "document": {"state": "READY"}}],
            "store.0.document: Value error, not a workload document: ",
        ),
        ("grant_keys", {"conformance": "not hex"}, "grant_keys.conformance: String should match"),
    ],
)
def test_a_vector_whose_reset_the_protocol_forbids_is_refused_not_blamed_on_the_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, says: str
) -> None:
    """An initial store that is not workload documents, or a grant key that is not hex, is
    the vector file's fault: refused naming its line, never sent to the program to refuse."""
    lines = SHIPPED.read_text("ascii").splitlines()[:2]
    lines[1] = json.dumps({**json.loads(lines[1]), field: value})
    vectors = tmp_path / "edited.jsonl"
    vectors.write_text("\n".join(lines) + "\n", "ascii")
    assert main(["conform", "--cmd", ADAPTER, "--vectors", str(vectors)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"WORKLOAD_INVALID: not a vector file: line 2: {says}")


def test_the_spec_option_shows_an_extended_specs_documents_field_by_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    program = f"{wrong('doc-field')} {shlex.quote(str(CLAIM_STARTS))}"
    selected = "lifecycle/a_workload_without_checkpoints_completes_from_running"
    common = ["conform", "--cmd", program, "--vectors", str(CLAIM_STARTS_VECTORS), "-k", selected]
    assert main([*common, "--spec", str(CLAIM_STARTS)]) == 1
    out = capsys.readouterr().out
    assert "differs in store (version and digest by key)" in out
    assert "document workload_" in out
    assert "$.updated_at  11000  |  11001" in out
    # Replayed under the shipped spec, the reference's documents are not the vectors', so
    # there is nothing to show field by field.
    assert main(common) == 1
    out = capsys.readouterr().out
    assert "differs in store (version and digest by key)" in out
    assert "document workload_" not in out


def test_a_spec_that_is_not_the_vectors_own_is_refused_before_any_scenario_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The shipped vectors are of spec `workload`; claim_starts.toml is another.
    assert main(["conform", "--cmd", ADAPTER, "--spec", str(CLAIM_STARTS)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(
        "WORKLOAD_INVALID: the vector file's scenario 1 (admission/the_same_request_replays_"
        f"the_original_without_creating_another) is of spec 'workload', but --spec {CLAIM_STARTS}"
        " is spec 'workload-claim_starts': give the spec the vectors were generated from"
    )


def test_the_adapter_refuses_a_spec_it_cannot_read_with_one_coded_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workwarden.adapter", "--spec", str(tmp_path / "none.toml")],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("WORKLOAD_SPEC_INVALID: cannot read spec ")
    assert len(done.stderr.splitlines()) == 1
