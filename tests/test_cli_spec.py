"""`workwarden spec schema | validate | show`: what each prints and the exit status it returns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workwarden.cli import main
from workwarden.statemachine.spec import default_spec, shipped_spec_text, spec_json_schema

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_FILE = ROOT / "specs" / "workload.toml"
#: The shipped catalogue lists the core's codes and the command line's; the codes
#: themselves are pinned by tests/test_spec.py and tests/test_cli_battery.py.
OK_SUMMARY = f"OK: 12 states, 33 transitions, 5 policies, {len(default_spec().errors)} error codes"

_LAST_EDGE_END = ' operations = ["claim", "claim_next"] },\n]\n'
THREE_PROBLEMS = shipped_spec_text().replace(
    _LAST_EDGE_END,
    _LAST_EDGE_END[:-2]
    + '  { from = "LIMBO", to = "READY", event = "workload.ready", actors = ["system"],'
    ' operations = ["admit"] },\n'
    '  { from = "CREATED", to = "READY", event = "workload.ready", actors = ["system"],'
    ' operations = ["admit"] },\n'
    '  { from = "READY", to = "SUCCEEDED", event = "workload.completed", actors = ["worker"],'
    ' operations = ["teleport"] },\n'
    "]\n",
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command line in-process: (exit status, standard output, standard error)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_spec_schema_prints_the_json_schema_as_stable_sorted_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "spec", "schema")
    assert status == 0
    assert out == json.dumps(spec_json_schema(), indent=2, sort_keys=True) + "\n"
    schema = json.loads(out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.dumps(schema, indent=2, sort_keys=True) + "\n" == out


def test_spec_schema_prints_the_same_bytes_every_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "spec", "schema") == run(capsys, "spec", "schema")


def test_spec_validate_of_the_shipped_spec_prints_one_ok_line_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, "spec", "validate", str(SHIPPED_FILE))
    assert status == 0
    assert out == f"{SHIPPED_FILE}: {OK_SUMMARY}\n"
    assert err == ""


def test_spec_validate_prints_every_problem_one_a_line_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "copy.toml", THREE_PROBLEMS)
    status, out, _ = run(capsys, "spec", "validate", str(path))
    assert status == 1
    lines = out.splitlines()
    assert [line.split(": ")[:2] for line in lines] == [
        [str(path), "transitions[33].from"],
        [str(path), "transitions[34]"],
        [str(path), "transitions[35].operations[0]"],
    ]
    assert "unknown state 'LIMBO'" in lines[0]
    assert "duplicate edge CREATED -> READY" in lines[1]
    assert "unknown operation 'teleport'" in lines[2]
    assert "OK" not in out


def test_spec_validate_checks_every_file_and_fails_if_any_has_a_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = write(tmp_path, "bad.toml", THREE_PROBLEMS)
    good = write(tmp_path, "good.toml", shipped_spec_text())
    status, out, _ = run(capsys, "spec", "validate", str(good), str(bad), str(good))
    assert status == 1
    lines = out.splitlines()
    assert lines[0] == f"{good}: {OK_SUMMARY}"
    assert all(line.startswith(f"{bad}: ") for line in lines[1:4])
    assert lines[4] == f"{good}: {OK_SUMMARY}"
    assert len(lines) == 5


def test_spec_validate_names_the_line_of_a_toml_syntax_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "broken.toml", '[spec]\nname = "x"\nseed_version = \n')
    status, out, _ = run(capsys, "spec", "validate", str(path))
    assert status == 1
    assert out.startswith(f"{path}: (toml) line 3, column 16: not valid TOML: ")
    assert len(out.splitlines()) == 1


def test_spec_validate_reports_a_wrong_type_with_its_field_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = shipped_spec_text().replace("max_json_depth = 64", 'max_json_depth = "64"')
    path = write(tmp_path, "typed.toml", text)
    status, out, _ = run(capsys, "spec", "validate", str(path))
    assert status == 1
    assert out == (f"{path}: limits.max_json_depth: Input should be a valid integer (got '64')\n")


@pytest.mark.parametrize(
    # A line break or a tab would end the comment and title lines of the DOT and Mermaid.
    "name",
    ["../../evil", "a/b", "a\\\\b", "", ".hidden", "..", "line\\nbreak", "tab\\there", "end\\n"],
)
def test_a_spec_name_that_cannot_be_a_file_name_is_refused_with_how_to_fix_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    # The name is the stem of the diagram and vector files written into a folder.
    text = shipped_spec_text().replace('name = "workload"', f'name = "{name}"', 1)
    path = write(tmp_path, "named.toml", text)
    status, out, _ = run(capsys, "spec", "validate", str(path))
    assert status == 1
    (line,) = out.splitlines()
    assert line.startswith(f"{path}: spec.name: Value error, the name is the stem of the files")
    assert "not empty, holds no / or \\ and does not start with ." in line


def test_spec_validate_of_a_file_that_cannot_be_read_says_so_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.toml"
    status, out, err = run(capsys, "spec", "validate", str(missing), str(tmp_path))
    assert status == 1
    assert out.splitlines() == [
        f"{missing}: (file): cannot read the file: No such file or directory",
        f"{tmp_path}: (file): cannot read the file: Is a directory",
    ]
    assert "Traceback" not in out + err


def test_spec_validate_run_as_a_program_exits_1_without_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "copy.toml", THREE_PROBLEMS)
    done = subprocess.run(
        [sys.executable, "-m", "workwarden", "spec", "validate", str(path), str(SHIPPED_FILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert len(done.stdout.splitlines()) == 4
    assert done.stdout.splitlines()[-1] == f"{SHIPPED_FILE}: {OK_SUMMARY}"
    assert "Traceback" not in done.stderr


def test_spec_validate_needs_at_least_one_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "validate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("WORKWARDEN_USAGE: workwarden spec validate: ")
    assert "FILE" in err


def test_spec_show_prints_the_states_transitions_policies_and_deadlines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "spec", "show")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "spec workload (seed 0.15, contract version 2) from specs/workload.toml"
    for heading in (
        "States (12)",
        "Transitions (33)",
        "Policies (5; first matching rule decides)",
    ):
        assert heading in lines
    assert any(line.split()[:2] == ["CREATED", "transient"] for line in lines)
    assert any(line.split()[:3] == ["CLAIMED", "FAILED", "workload.failed"] for line in lines)
    assert "  failure, via FAILED: A worker reported that its attempt failed." in lines
    assert any(
        line.split()[:5] == ["4.", "always", "->", "READY", "(delay"] and "retry" in line
        for line in lines
    )
    assert any(line.split()[:3] == ["heartbeat", "last_heartbeat", "attempt"] for line in lines)


def test_spec_show_of_a_file_shows_that_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path, "copy.toml", shipped_spec_text().replace('name = "workload"', 'name = "mine"')
    )
    status, out, _ = run(capsys, "spec", "show", str(path))
    assert status == 0
    assert out.splitlines()[0] == f"spec mine (seed 0.15, contract version 2) from {path}"


def test_spec_show_of_an_invalid_file_prints_its_problems_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "copy.toml", THREE_PROBLEMS)
    status, out, _ = run(capsys, "spec", "show", str(path))
    assert status == 1
    assert len(out.splitlines()) == 3
    assert all(line.startswith(f"{path}: transitions[") for line in out.splitlines())


def test_spec_examples_prints_each_shipped_example_that_loads_from_any_folder(
    tmp_path: Path,
) -> None:
    # Outside the repository `specs/examples/pause.toml` is no path: the command
    # says where the installed package keeps them.
    run = subprocess.run(
        [sys.executable, "-m", "workwarden", "spec", "examples"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    paths = [Path(line) for line in run.stdout.splitlines()]
    assert {path.name for path in paths} >= {"pause.toml", "approval.toml", "claim_starts.toml"}
    for path in paths:
        assert path.is_absolute()
        assert main(["spec", "validate", str(path)]) == 0
