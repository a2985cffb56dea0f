"""`workwarden conform`: the reference adapter passes, a wrong one fails at the right step.

Each test runs a real program through the protocol, as an implementer's CI
would: the repository's adapter (`python -m workwarden.adapter`) and the
deliberately wrong ones in `tests/wrong_adapter.py`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from workwarden.cli import main

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parent / "specs" / "vectors" / "workload.jsonl"
ADAPTER = f"{shlex.quote(sys.executable)} -m workwarden.adapter"


def wrong(mistake: str) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'wrong_adapter.py'))} {mistake}"


def scenarios() -> int:
    return len(SHIPPED.read_text("ascii").splitlines())


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
    status = main(["conform", "--cmd", wrong("hang"), "-k", selected, "--timeout", "0.5"])
    assert status == 1
    out = capsys.readouterr().out
    assert f"FAIL {selected}" in out
    assert "at step 3 of 3: no response within 0.5 s to a command request" in out


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
