"""The compiled checker with helper processes reports what it reports alone.

`check_compiled(processes=N)` (`workwarden check --processes N`) forks N
helper processes that ask the real core for the table entries each level of
the exploration lacks, and rebuild the concrete states they are asked at;
the exploring process numbers their answers. Each case runs
`tests/processes_driver.py` in a process of its own (so the helpers are
forked from a process holding nothing but the check), which checks one
universe once alone and once with two helpers and prints both reports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from workwarden.cli import main
from workwarden.statemachine import default_spec, errors
from workwarden.statemachine.check import compiled as compiled_module
from workwarden.statemachine.check.compiled import CompiledModel
from workwarden.statemachine.check.compiled_check import check_compiled
from workwarden.statemachine.check.mutants import MUTANTS
from workwarden.statemachine.check.universe import Model, Universe

DRIVER = Path(__file__).resolve().parent / "processes_driver.py"


def _both(scenario: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reports of `scenario` checked alone and with two helper processes."""
    done = subprocess.run(
        [sys.executable, str(DRIVER), scenario],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout)
    alone, helped = reports["1"], reports["2"]
    assert alone.pop("processes") == 1
    assert helped.pop("processes") == 2
    return alone, helped


def test_helper_processes_find_the_same_states_coverage_and_witnesses() -> None:
    alone, helped = _both("shipped")
    assert alone["complete"]
    assert alone["states"] > 500
    # Every entry asked alone is asked with helpers, and shared where it was shared.
    assert alone == helped


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_helper_processes_find_each_mutant_with_the_same_traces(name: str) -> None:
    alone, helped = _both(name)
    assert alone["violations"] or alone["refined"], f"{name} went unnoticed"
    # A check that stops at its first violation may have looked further ahead with
    # helpers: its tables differ, what it reports does not.
    del alone["tables"], helped["tables"]
    assert alone == helped


def test_a_wrong_compiled_rule_is_reported_with_the_same_traces_with_helpers() -> None:
    alone, helped = _both("start_refused")
    assert alone["refined"], "the wrong compiled rule went unnoticed"
    assert {failure["trace"][-1]["action"] for failure in alone["refined"]} == {"start"}
    assert alone == helped


def test_a_state_a_helper_rebuilds_is_held_to_the_compiled_one() -> None:
    # A compiled rule that forgets what a claim writes: the helper rebuilds the state
    # after the claim, and the exploring process finds it differs from the tables'.
    alone, helped = _both("claim_writes_nothing")
    assert not helped["complete"]
    assert helped["refinement"] == alone["refinement"]
    (failure,) = helped["refinement"]
    assert failure["property"] == "refinement"
    assert [step["action"] for step in failure["trace"]] == ["claim_next"]


def test_a_helper_killed_mid_check_stops_the_check_with_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, str(DRIVER), "helper_dies"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    stopped = json.loads(done.stdout)["stopped"]
    assert stopped is not None, "the check went on without the helper's answers"
    assert "helper process of the check stopped" in stopped


def test_the_command_line_runs_helper_processes_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    args = ["check", "--single", "--horizon-ms", "8", "--processes", "2", "--json", str(path)]
    done = subprocess.run(
        [sys.executable, "-m", "workwarden", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "2 helper processes" in done.stdout
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["tables"]["processes"] == 2
    assert report["complete"]
    assert report["violations"] == []


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text(encoding="utf-8")
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.add(pid)
    return alive


def _stop_helpers_by_their_parents_signal(
    tmp_path: Path, signum: int, group: bool = False
) -> tuple[int, set[int]]:
    """Run a check with two helpers, send the checking process (with `group`, its whole
    process group, as a terminal's Ctrl-C does) `signum` once the helpers are forked; its
    exit status, and the helpers still running a few seconds after."""
    out = (tmp_path / "out").open("w")
    checking = subprocess.Popen(
        [sys.executable, "-m", "workwarden", "check", "--processes", "2", "--json", "r.json"],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        start_new_session=True,
    )
    helpers: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(helpers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            helpers = _children(checking.pid)
        assert len(helpers) == 2, "the check forked no helpers"
        time.sleep(1)
        if group:
            os.killpg(checking.pid, signum)
        else:
            checking.send_signal(signum)
        status = checking.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _alive(helpers) and time.monotonic() < deadline:
            time.sleep(0.2)
        return status, _alive(helpers)
    finally:
        for pid in _alive(helpers):
            os.kill(pid, signal.SIGKILL)
        if checking.poll() is None:
            checking.kill()
        out.close()


@pytest.mark.parametrize(
    ("signum", "status", "group"),
    [(signal.SIGTERM, 143, False), (signal.SIGTERM, 143, True), (signal.SIGINT, 130, True)],
)
def test_a_signal_stops_the_check_and_its_helper_processes(
    tmp_path: Path, signum: int, status: int, group: bool
) -> None:
    ended, left = _stop_helpers_by_their_parents_signal(tmp_path, signum, group)
    assert ended == status, (tmp_path / "out").read_text(encoding="utf-8")
    assert not left, "helper processes outlived the check"
    assert not (tmp_path / "r.json").exists()
    assert "Traceback" not in (tmp_path / "out").read_text(encoding="utf-8")


def test_helper_processes_stop_when_the_check_is_killed_outright(tmp_path: Path) -> None:
    status, left = _stop_helpers_by_their_parents_signal(tmp_path, signal.SIGKILL)
    assert status == -signal.SIGKILL
    assert not left, "helper processes outlived the check"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0"], "--processes must be 1 to 64"),
        (["--processes", "100000"], "--processes must be 1 to 64"),
        (["--processes", "2", "--engine", "reference"], "needs the compiled engine"),
    ],
)
def test_a_bad_process_count_is_refused_before_any_work(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{errors.INVALID}: ")
    assert message in err


@pytest.mark.parametrize("processes", [0, -1, 1.5, True, "2"])
def test_the_library_refuses_a_bad_process_count_with_a_coded_error(processes: Any) -> None:
    spec = default_spec()
    compiled = CompiledModel(Model(spec, Universe.from_spec(spec, dependent=False)))
    with pytest.raises(errors.WorkloadError) as refused:
        check_compiled(spec, compiled=compiled, processes=processes)
    assert refused.value.code == errors.INVALID
    assert refused.value.details["field"] == "processes"


def test_without_fork_helpers_are_refused_by_the_library_and_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compiled_module, "can_fork", lambda: False)
    spec = default_spec()
    compiled = CompiledModel(Model(spec, Universe.from_spec(spec, dependent=False)))
    with pytest.raises(errors.WorkloadError) as refused:
        check_compiled(spec, compiled=compiled, processes=2)
    assert refused.value.code == errors.INVALID
    assert refused.value.details["field"] == "processes"
    assert "cannot" in refused.value.message
    assert main(["check", "--processes", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{errors.INVALID}: ")
    assert "forks helper processes, which this system cannot" in err
