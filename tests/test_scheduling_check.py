"""`workwarden check --scheduling`: the fair-share bound and the concurrency limit, explored."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workwarden.cli import main
from workwarden.statemachine import WorkloadError
from workwarden.statemachine.check.scheduling import (
    SCHEDULING_MUTANTS,
    SchedulingUniverse,
    check_scheduling,
    replay,
)
from workwarden.statemachine.spec import Spec, default_spec, load_spec_text, shipped_spec_text

THOROUGH = os.environ.get("WORKWARDEN_HYPOTHESIS_PROFILE") == "thorough"


def weighted(table: str) -> Spec:
    return load_spec_text(shipped_spec_text().replace('policy = "round_robin"\n', table + "\n", 1))


def test_the_default_universe_completes_with_the_bound_reached_and_never_passed() -> None:
    report = check_scheduling(default_spec())
    assert report.complete
    assert report.violations == []
    assert report.universe.tenants == ("a", "b")
    # The flood (three of a's, one of b's) does make the trickle wait: the
    # bound is reached, so a scheduler one claim less fair would break it.
    assert report.largest_wait == report.bounds == {"a": 1, "b": 1}
    assert report.claims > 0


def test_a_weighted_policy_is_held_to_its_own_bound() -> None:
    spec = weighted('policy = "weighted"\nweights = { a = 3 }')
    universe = SchedulingUniverse(admissions=(4, 1), workers=1, limit=None)
    report = check_scheduling(spec, universe)
    assert report.complete
    assert report.violations == []
    assert report.bounds == {"a": 1, "b": 3}
    assert report.largest_wait["b"] == 3


def test_a_claimer_ignoring_its_ledger_is_caught_with_a_replayable_trace() -> None:
    mutant = SCHEDULING_MUTANTS["ledger_in_list_order"]
    report = check_scheduling(default_spec(), mutant=mutant)
    [(violation, trace)] = report.violations
    assert violation.property == "fair_share_bound"
    assert "'b'" in violation.message
    # Breadth first: the shortest path, two claims of a while b waits.
    assert trace == ["admit a", "admit a", "admit b", "claim w0", "finish w0", "claim w0"]
    again = replay(default_spec(), report.universe, trace, mutant)
    assert [v.property for v in again] == ["fair_share_bound"]
    assert replay(default_spec(), report.universe, trace) == []


def test_a_store_that_ignores_the_limit_is_caught() -> None:
    mutant = SCHEDULING_MUTANTS["store_ignores_concurrency_limits"]
    report = check_scheduling(default_spec(), mutant=mutant)
    [(violation, trace)] = report.violations
    assert violation.property == "claims_within_concurrency_limits"
    assert trace == ["admit a", "admit a", "claim w0", "claim w1"]
    assert replay(default_spec(), report.universe, trace) == []


def test_a_trace_step_the_state_does_not_offer_is_refused() -> None:
    with pytest.raises(WorkloadError) as caught:
        replay(default_spec(), SchedulingUniverse(), ["finish w0"])
    assert caught.value.code == "WORKLOAD_INVALID"


@pytest.mark.parametrize(
    "fields",
    [
        {"tenants": ("a",), "admissions": (1, 1)},
        {"tenants": ("a", "a"), "admissions": (1, 1)},
        {"workers": 0},
        {"limit": 0},
        {"ticks": 9},
        {"admissions": (7, 1)},
        # Types a hand-edited trace may carry: none is a universe the checker explores.
        {"limit": 1.5},
        {"limit": True},
        {"tenants": "ab", "admissions": (1, 1)},
        {"tenants": (1, 2), "admissions": (1, 1)},
        {"admissions": (3.0, 1)},
        {"workers": True},
        {"ticks": 0.5},
        {"lease_ms": float("inf")},
    ],
)
def test_a_universe_out_of_bounds_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(WorkloadError) as caught:
        SchedulingUniverse(**fields)  # type: ignore[arg-type]
    assert caught.value.code == "WORKLOAD_INVALID"


def test_the_command_exits_0_then_1_with_a_trace_that_replay_reproduces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    assert main(["check", "--scheduling", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["violations"] == []
    assert "no violation" in capsys.readouterr().out
    status = main(
        [
            "check",
            "--scheduling",
            "--mutant",
            "ledger_in_list_order",
            "--trace-dir",
            str(tmp_path),
        ]
    )
    assert status == 1
    trace = tmp_path / "trace-fair_share_bound.json"
    assert json.loads(trace.read_text())["scheduling"] is True
    capsys.readouterr()
    assert main(["replay", str(trace)]) == 1
    assert "reproduced: fair_share_bound" in capsys.readouterr().out


def test_a_trace_that_cannot_be_written_leaves_no_report_and_no_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A folder of the trace's name: refused before the report or the trace is written.
    (tmp_path / "trace-fair_share_bound.json").mkdir()
    report = tmp_path / "report.json"
    args = ["check", "--scheduling", "--mutant", "ledger_in_list_order"]
    assert main([*args, "--trace-dir", str(tmp_path), "--json", str(report)]) == 1
    assert capsys.readouterr().err.startswith("WORKWARDEN_OUTPUT_UNWRITABLE: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace-fair_share_bound.json"]


@pytest.mark.parametrize(
    "changes",
    [{"tenants": "ab"}, {"admissions": "31"}, {"limit": 1.5}, {"lease_ms": True}],
)
def test_a_trace_whose_universe_is_not_one_is_refused_by_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object]
) -> None:
    universe = {**SchedulingUniverse().to_dict(), **changes}
    trace = tmp_path / "trace.json"
    steps = [{"action": "admit a"}, {"action": "claim w0"}]
    trace.write_text(json.dumps({"scheduling": True, "universe": universe, "steps": steps}))
    assert main(["replay", str(trace)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("WORKLOAD_INVALID: "), err
    assert "Traceback" not in err


def test_a_scheduling_trace_naming_an_empty_mutant_is_refused_not_run_on_the_real_core(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "" named no mutant and replayed the trace against the real claimer and store.
    args = ["check", "--scheduling", "--mutant", "ledger_in_list_order", "--trace-dir"]
    assert main([*args, str(tmp_path)]) == 1
    path = tmp_path / "trace-fair_share_bound.json"
    trace = json.loads(path.read_text())
    trace["mutant"] = ""
    path.write_text(json.dumps(trace))
    capsys.readouterr()
    assert main(["replay", str(path)]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: no scheduling mutant ''")


def test_scheduling_options_without_the_flag_are_one_coded_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--tenants", "a,b"]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: --tenants")
    assert main(["check", "--scheduling", "--admissions", "x,1"]) == 1
    assert "WORKLOAD_INVALID" in capsys.readouterr().err
    assert main(["check", "--scheduling", "--mutant", "nope"]) == 1
    assert "ledger_in_list_order" in capsys.readouterr().err
    assert main(["check", "--scheduling", "--limit", "1,2"]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: --limit is one integer")


@pytest.mark.parametrize(
    "option",
    [
        ["--workloads", "3"],
        ["--horizon-ms", "5"],
        ["--single"],
        ["--no-racer"],
        ["--request-ids"],
        ["--first-timeouts", "claim_ms=3"],
        ["--engine", "compiled"],
        ["--samples", "0"],
        ["--processes", "4"],
    ],
)
def test_an_option_of_the_cores_universe_is_refused_with_scheduling_not_ignored(
    option: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    args = ["check", "--scheduling", "--max-states", "50", "--json", str(report), *option]
    assert main(args) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("WORKLOAD_INVALID: --")
    assert option[0] in first
    assert "an option of the core's universe, not of --scheduling" in first
    assert not report.exists()


def test_a_larger_universe_with_a_clock_and_a_sweeper_holds_both_properties() -> None:
    # Leases expire and are recovered: a recovered claim frees its slot of the
    # key, and its stale worker is fenced out.
    universe = (
        SchedulingUniverse(admissions=(3, 1), workers=2, limit=1, ticks=1)
        if THOROUGH
        else SchedulingUniverse(admissions=(3, 2), workers=1, limit=1, ticks=1)
    )
    report = check_scheduling(default_spec(), universe, max_states=2_000_000)
    assert report.complete
    assert report.violations == []
    assert report.largest_wait == report.bounds
