"""The tools follow an extended spec with no code change: checker, replay, diagram, vectors, suite.

The specs of `specs/examples/` add held states and operator operations of
effect `move` (a pause and a resume; an approval and a rejection). The model
checker explores them (in small universes: the default universe of an example
takes minutes), covers every edge a move takes and catches a copy with a
wrong move target; its traces replay through a real authority; the diagram
draws the new states and edges; the conformance vectors of an example pass
against the reference adapter; and the stateful suite takes the moves on
every backend, says that its shadow model is off, and refuses to run the
shadow model under a table it cannot follow. The command-line errors of
these tools are one coded line each.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from backends import BACKENDS
from support import authority, request
from workwarden.cli import main
from workwarden.statemachine.check.abstraction import move_edges
from workwarden.statemachine.check.checker import CheckReport, check
from workwarden.statemachine.check.replay import replay_trace
from workwarden.statemachine.check.universe import Universe
from workwarden.statemachine.conformance.conform import run_conformance
from workwarden.statemachine.conformance.vectors import coverage, generate_vectors, read_vectors
from workwarden.statemachine.spec import Spec, default_spec, load_spec, load_spec_text
from workwarden.storage import MemoryStore
from workwarden.testing import ShadowModelOffWarning, authority_machine, run_authority_machine

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "specs" / "examples"
NAMES = ("pause", "approval")

#: The edges of the shipped table no step can take (docs/design.md), in the examples too.
UNTAKEABLE = {"CREATED -> CANCELLED", "FAILED -> CANCELLED", "READY -> DEAD_LETTER"}

#: Moves per workload each example needs for every move edge: a pause is undone by a
#: resume (two moves); an approval or a rejection is one.
MOVES = {"pause": 2, "approval": 1}


def example_path(name: str) -> Path:
    return EXAMPLES / f"{name}.toml"


def example(name: str) -> Spec:
    return load_spec(example_path(name))


def small(spec: Spec, name: str, **overrides: Any) -> Universe:
    """One workload, one worker: a few thousand states, seconds to explore."""
    settings_ = {"dependent": False, "workers": 1, "moves": MOVES[name], **overrides}
    return Universe.from_spec(spec, **settings_)


@pytest.fixture(scope="module", params=NAMES)
def explored(request: pytest.FixtureRequest) -> tuple[str, Spec, CheckReport]:
    name: str = request.param
    spec = example(name)
    return name, spec, check(spec, small(spec, name))


def one_line_error(capsys: pytest.CaptureFixture[str], code: str) -> str:
    """The single coded line the last command printed on stderr."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert re.match(rf"^{code}: .+", first), err
    return first


# -- the model checker ---------------------------------------------------------------------------


def test_the_checker_completes_on_each_example_with_no_violation(
    explored: tuple[str, Spec, CheckReport],
) -> None:
    _, _, report = explored
    assert report.complete
    assert report.violations == []
    assert report.policy_problems == []
    assert report.cannot_finish == 0
    assert report.ok


def test_every_edge_a_move_takes_is_covered_and_only_the_shipped_untakeable_edges_are_not(
    explored: tuple[str, Spec, CheckReport],
) -> None:
    _, spec, report = explored
    moves = {f"{a} -> {b}" for a, b in move_edges(spec)}
    assert moves, "an example adds operations of effect move"
    assert moves <= set(report.edges_taken)
    assert set(report.edges_never_taken) <= UNTAKEABLE
    new_states = set(spec.states) - set(default_spec().states)
    assert report.terminal_unreached == []
    assert new_states.isdisjoint(report.never_at_rest)


def test_the_moves_budget_bounds_how_many_moves_a_workload_takes() -> None:
    spec = example("pause")
    none = check(spec, small(spec, "pause", moves=0))
    one = check(spec, small(spec, "pause", moves=1))
    two = check(spec, small(spec, "pause", moves=2))
    assert "READY -> PAUSED" not in none.edges_taken
    # One move pauses; the resume would be a second, so it is cut off by the bound
    # (and a paused workload left there counts as cut off, not as stuck).
    assert "READY -> PAUSED" in one.edges_taken
    assert "PAUSED -> READY" not in one.edges_taken
    assert one.horizon_cut > 0
    assert one.cannot_finish == 0
    assert "PAUSED -> READY" in two.edges_taken
    assert none.states < one.states < two.states
    assert none.universe["moves"] == 0


def test_the_shipped_spec_has_no_moves_and_its_universe_is_unchanged() -> None:
    spec = default_spec()
    assert move_edges(spec) == frozenset()
    universe = Universe.from_spec(spec)
    assert universe.moves == 1
    assert Universe.from_dict(universe.to_dict()) == universe


def test_the_moves_budget_is_read_from_the_check_table(tmp_path: Path) -> None:
    # The pause example asks for two moves (a pause, then a resume); approval says
    # nothing and gets the default, one.
    assert Universe.from_spec(load_spec(example_path("pause"))).moves == 2
    assert Universe.from_spec(load_spec(example_path("approval"))).moves == 1
    text = example_path("pause").read_text(encoding="utf-8")
    assert text.count("\nmoves = 2\n") == 1
    spec = load_spec_text(text.replace("\nmoves = 2\n", "\nmoves = 3\n"), "pause-moves")
    assert Universe.from_spec(spec).moves == 3
    assert Universe.from_spec(spec, moves=0).moves == 0


def wrong_resume(target: str) -> Spec:
    """The pause example with its resume edge led to `target` instead of READY."""
    text = example_path("pause").read_text(encoding="utf-8")
    old = '{ from = "PAUSED", to = "READY", event = "workload.resumed"'
    assert old in text
    new = old.replace('to = "READY"', f'to = "{target}"')
    return load_spec_text(text.replace(old, new), f"pause with resume to {target}")


def test_a_copy_with_a_wrong_move_target_is_caught_with_a_trace_that_replays() -> None:
    spec = wrong_resume("SUCCEEDED")
    universe = small(spec, "pause")
    report = check(spec, universe)
    assert not report.ok
    finding = report.violations[0]
    assert finding.property == "result_exactly_when_succeeded"
    assert [step["action"] for step in finding.trace] == ["move", "move"]
    assert [step["arg"] for step in finding.trace] == ["pause", "resume"]
    trace = {"universe": universe.to_dict(), "steps": list(finding.trace)}
    result = replay_trace(spec, trace, MemoryStore())
    assert result.violation is not None
    assert result.violation[:2] == (2, "result_exactly_when_succeeded")


def test_a_trace_with_moves_replays_on_a_real_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = example("pause")
    universe = small(spec, "pause")
    report = check(spec, universe)
    steps = list(report.witnesses["edge:PAUSED -> CANCELLED"])
    assert {"action": "move", "actor": "operator", "arg": "pause", "now": 0, "slot": 0} in steps
    path = tmp_path / "trace.json"
    trace = {"spec": str(example_path("pause")), "universe": universe.to_dict(), "steps": steps}
    path.write_text(json.dumps(trace), encoding="utf-8")
    store = f"sqlite:///{tmp_path / 'replay.db'}"
    assert main(["replay", str(path), "--store", store]) == 0
    out = capsys.readouterr().out
    assert '"arg": "pause"' in out
    assert "no property was violated" in out
    result = replay_trace(spec, trace, MemoryStore())
    assert result.violation is None
    assert [step["refusal"] for step in result.steps] == [None] * len(steps)


def test_a_trace_naming_its_spec_relative_to_another_folder_replays_with_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `check --spec specs/examples/pause.toml`, run in a checkout, writes that relative
    # path into the trace; replayed from another folder, `--spec` names the file.
    spec = example("pause")
    universe = small(spec, "pause")
    steps = list(check(spec, universe).witnesses["edge:PAUSED -> CANCELLED"])
    path = tmp_path / "trace.json"
    named = "specs/examples/pause.toml"
    trace = {"spec": named, "universe": universe.to_dict(), "steps": steps}
    path.write_text(json.dumps(trace), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert not Path(named).exists()
    assert main(["replay", str(path), "--spec", str(example_path("pause"))]) == 0
    assert "no property was violated" in capsys.readouterr().out
    # The same file by another path agrees with the trace too.
    (tmp_path / "specs").symlink_to(example_path("pause").parent.parent)
    assert main(["replay", str(path), "--spec", f"./{named}"]) == 0
    assert "no property was violated" in capsys.readouterr().out
    # Another file than the one the trace's path names does not.
    assert main(["replay", str(path), "--spec", str(example_path("approval"))]) == 1
    line = one_line_error(capsys, "WORKLOAD_INVALID")
    assert named in line


# -- the check command ---------------------------------------------------------------------------


def test_check_takes_the_spec_by_option_or_by_position_and_the_moves_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(example_path("approval"))
    small_args = ["--single", "--workers", "1", "--moves", "1"]
    out = tmp_path / "report.json"
    assert main(["check", "--spec", path, *small_args, "--json", str(out)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["complete"]
    assert report["ok"]
    assert report["universe"]["moves"] == 1
    assert {"AWAITING_APPROVAL -> READY", "AWAITING_APPROVAL -> REJECTED"} <= set(
        report["edges_taken"]
    )
    assert main(["check", path, "--spec", path, *small_args]) == 0
    assert "workload-approval" not in capsys.readouterr().err
    assert main(["check", path, "--spec", str(example_path("pause")), *small_args]) == 1
    line = one_line_error(capsys, "WORKLOAD_INVALID")
    assert "two spec files" in line


def test_an_incomplete_check_exits_3_and_its_diagram_is_drawn_as_partial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(example_path("pause"))
    out = tmp_path / "report.json"
    status = main(["check", "--spec", path, "--single", "--max-states", "50", "--json", str(out)])
    assert status == 3
    captured = capsys.readouterr()
    assert "INCOMPLETE" in captured.out
    assert "--max-states" in captured.err
    assert json.loads(out.read_text(encoding="utf-8"))["complete"] is False
    drawn = tmp_path / "drawn"
    formats = ["--format", "dot,mermaid"]
    status = main(
        ["diagram", "--spec", path, "--report", str(out), "--out-dir", str(drawn), *formats]
    )
    assert status == 0
    dot = (drawn / "workload-pause.dot").read_text(encoding="utf-8")
    mermaid = (drawn / "workload-pause.mmd").read_text(encoding="utf-8")
    assert "PARTIAL" in dot
    assert "not reached (partial check)" in dot
    assert "<I>unreachable</I>" not in dot
    assert "PARTIAL" in mermaid.splitlines()[1]


def test_an_unknown_mutant_is_one_coded_line_naming_the_mutants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--mutant", "no_such_mutant"]) == 1
    line = one_line_error(capsys, "WORKLOAD_INVALID")
    assert "no_such_mutant" in line
    assert "complete_skips_fence" in line


def test_an_unwritable_output_is_one_coded_line_before_any_exploring(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A path under a regular file cannot be written, even by root.
    assert main(["check", "--json", "/etc/passwd/report.json"]) == 1
    assert "/etc/passwd/report.json" in one_line_error(capsys, "WORKWARDEN_OUTPUT_UNWRITABLE")
    assert main(["vectors", "--out", "/etc/passwd/vectors.jsonl"]) == 1
    one_line_error(capsys, "WORKWARDEN_OUTPUT_UNWRITABLE")


@pytest.fixture
def bad_traces(tmp_path: Path) -> dict[str, Path]:
    files = {
        "missing": tmp_path / "absent.json",
        "directory": tmp_path,
        "not json": tmp_path / "text.json",
        "json lines": tmp_path / "lines.json",
        "a list": tmp_path / "list.json",
        "no steps": tmp_path / "nosteps.json",
        "a bad step": tmp_path / "badstep.json",
        "an unknown move": tmp_path / "unknownmove.json",
    }
    universe = Universe(dependent=False, workers=1).to_dict()
    files["not json"].write_text("not json at all", encoding="utf-8")
    files["json lines"].write_text('{"a": 1}\n{"b": 2}\n', encoding="utf-8")
    files["a list"].write_text("[1, 2]", encoding="utf-8")
    files["no steps"].write_text(json.dumps({"universe": universe}), encoding="utf-8")
    files["a bad step"].write_text(
        json.dumps({"universe": universe, "steps": [{"action": "jump", "to": "soon"}]}),
        encoding="utf-8",
    )
    files["an unknown move"].write_text(
        json.dumps({"universe": universe, "steps": [{"action": "move", "arg": "pause"}]}),
        encoding="utf-8",
    )
    return files


@pytest.mark.parametrize(
    "kind",
    [
        "missing",
        "directory",
        "not json",
        "json lines",
        "a list",
        "no steps",
        "a bad step",
        "an unknown move",
    ],
)
def test_a_bad_trace_file_is_one_coded_line(
    kind: str, bad_traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(bad_traces[kind])]) == 1
    unreadable = kind in ("missing", "directory")
    line = one_line_error(
        capsys, "WORKWARDEN_INPUT_UNREADABLE" if unreadable else "WORKLOAD_INVALID"
    )
    assert str(bad_traces[kind]) in line
    if kind == "json lines":
        assert "JSON Lines" in line


def test_a_replay_refused_part_way_leaves_no_store_it_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first step is taken; the second names a worker that holds nothing.
    universe = Universe(dependent=False).to_dict()
    steps = [
        {"action": "claim_next", "actor": "worker-A", "now": 0, "worker": 0},
        {"action": "heartbeat", "actor": "worker-B", "now": 0, "slot": 0, "worker": 1},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"universe": universe, "steps": steps}), encoding="utf-8")
    store = tmp_path / "replay.db"
    assert main(["replay", str(path), "--store", str(store)]) == 1
    line = one_line_error(capsys, "WORKLOAD_INVALID")
    assert "step 2" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    # So the replay of a good trace can use the same store.
    path.write_text(json.dumps({"universe": universe, "steps": steps[:1]}), encoding="utf-8")
    assert main(["replay", str(path), "--store", str(store)]) == 0
    assert store.exists()


def test_replay_into_an_unknown_store_url_is_one_coded_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.json"
    path.write_text(
        json.dumps({"universe": Universe(dependent=False).to_dict(), "steps": []}),
        encoding="utf-8",
    )
    assert main(["replay", str(path), "--store", "bogus://somewhere"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.match(r"^WORKLOAD_[A-Z_]+: .+", err.splitlines()[0]), err


# -- the diagram ---------------------------------------------------------------------------------


def test_a_move_is_audited_by_its_own_name_as_the_checker_records_it() -> None:
    # An approval and a rejection are told apart in the audit log (`workwarden audit`, the
    # console's audit page), as the checker's model names a move's write.
    store = MemoryStore()
    warden = authority(store, example("approval"))
    approved = warden.admit(request(), 10_000).workload.workload_id
    rejected = warden.admit(request(idempotency_key="two"), 10_000).workload.workload_id
    assert warden.operate(approved, "approve", "ops", 11_000) == "READY"
    command = {"op": "operator", "operation": "reject", "workload_id": rejected, "actor": "ops"}
    assert warden.prepare(command, 11_000).commit().state == "REJECTED"
    moves = [(r.key, r.operation) for r in store.audit_log() if r.actor == "ops"]
    assert moves == [(approved, "approve"), (rejected, "reject")]


@pytest.mark.parametrize("name", NAMES)
def test_the_diagram_of_an_example_draws_its_held_states_and_its_moves(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = example(name)
    path = str(example_path(name))
    assert (
        main(["diagram", "--spec", path, "--out-dir", str(tmp_path), "--format", "dot,mermaid"])
        == 0
    )
    dot = (tmp_path / f"workload-{name}.dot").read_text(encoding="utf-8")
    mermaid = (tmp_path / f"workload-{name}.mmd").read_text(encoding="utf-8")
    held = [s for s, row in spec.states.items() if row.kind == "held"]
    assert held
    for state in set(spec.states) - set(default_spec().states):
        assert re.search(rf"^\s*{state} \[", dot, re.MULTILINE)
        assert f"{state} : {state}<br/>{spec.states[state].kind}" in mermaid
    for source, target in move_edges(spec):
        edge = re.search(rf"^\s*{source} -> {target} \[(.*)$", dot, re.MULTILINE)
        assert edge is not None
        assert "(move)" in edge.group(1)
        # Coloured by the actor class that takes it (the operator's).
        assert 'color="#E69F00"' in edge.group(1)
        assert re.search(rf"{source} --> {target} : .*\(move\).*\(operator\)", mermaid)
    assert "held" in dot  # the legend's sample of the kind
    capsys.readouterr()
    other = str(example_path("approval" if name == "pause" else "pause"))
    assert main(["diagram", path, "--spec", other, "--out-dir", str(tmp_path)]) == 1
    one_line_error(capsys, "WORKLOAD_INVALID")


# -- the conformance vectors ---------------------------------------------------------------------


def test_the_vectors_of_an_example_keep_its_shipped_scenarios_and_witness_every_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = example_path("pause")
    spec = example("pause")
    assert main(["vectors", "--spec", str(path), "--out", f"{tmp_path}/"]) == 0
    written = tmp_path / "workload-pause.jsonl"
    assert f"to {written}" in capsys.readouterr().err
    vectors = read_vectors(written.read_text(encoding="ascii"))
    shipped = generate_vectors()
    by_name = {vector.name: vector for vector in shipped}
    kept = [vector for vector in vectors if vector.name in by_name]
    added = [vector for vector in vectors if vector.name not in by_name]
    # A pause changes nothing of what the shipped scenarios do: they are kept, as they were
    # (but for those of repeated reports where the example lacks a shipped replay rule).
    assert len(kept) > len(shipped) // 2
    for vector in kept:
        assert vector.spec == "workload-pause"
        assert vector.model_dump(exclude={"spec"}) == by_name[vector.name].model_dump(
            exclude={"spec"}
        )
    assert added
    assert all(v.name.startswith("checker/workload-pause/") for v in added)
    taken = coverage(spec, vectors)
    assert move_edges(spec) <= set(taken.edges)
    assert {f"{a} -> {b}" for a, b in taken.missing_edges} <= UNTAKEABLE
    results = run_conformance(
        [sys.executable, "-m", "workwarden.adapter", "--spec", str(path)], vectors, timeout=30
    )
    failed = [result.name for result in results if not result.passed]
    assert failed == []
    assert len(results) == len(vectors)


# -- the stateful suite --------------------------------------------------------------------------


def with_the_shipped_replays(name: str) -> Spec:
    """The example, with the replay rule of each shipped operation it lacks one for.

    The examples are the shipped spec plus data; the shipped operations'
    `replay` rules (a repeat after a lost reply answered as the first call)
    are part of the shipped data the suite's replay rules rely on. Where an
    example already carries them this changes nothing.
    """
    text = example_path(name).read_text(encoding="utf-8")
    spec = load_spec_text(text, str(example_path(name)))
    for operation, row in default_spec().data.operations.items():
        own = spec.data.operations.get(operation)
        if row.replay is None or own is None or own.replay is not None:
            continue
        header = f"[operations.{operation}]\n"
        assert text.count(header) == 1
        text = text.replace(header, f'{header}replay = "{row.replay}"\n')
    return load_spec_text(text, str(example_path(name)))


RUNS = settings(
    max_examples=12,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@pytest.mark.parametrize("name", NAMES)
def test_the_stateful_suite_takes_the_moves_and_keeps_every_invariant(
    name: str, backend: str
) -> None:
    with pytest.warns(ShadowModelOffWarning, match="without its shadow model") as caught:
        run_authority_machine(BACKENDS[backend], with_the_shipped_replays(name), settings=RUNS)
    assert len([w for w in caught if issubclass(w.category, ShadowModelOffWarning)]) == 1


@pytest.mark.postgres
def test_the_stateful_suite_takes_the_moves_on_postgres() -> None:
    quick = settings(RUNS, max_examples=6)
    spec = with_the_shipped_replays("approval")
    with pytest.warns(ShadowModelOffWarning):
        run_authority_machine(BACKENDS["postgres"], spec, settings=quick)


def test_the_moves_are_taken_and_each_move_edge_is_reached() -> None:
    from workwarden.testing import Coverage

    spec = with_the_shipped_replays("approval")
    seen = Coverage()
    with pytest.warns(ShadowModelOffWarning):
        run_authority_machine(MemoryStore, spec, settings=RUNS, coverage=seen)
    assert move_edges(spec) <= set(seen.edges)
    assert seen.outcomes[("approve", "ok")] > 0
    assert seen.outcomes[("reject", "ok")] > 0
    assert seen.outcomes[("approve", "WORKLOAD_TRANSITION_DENIED")] > 0


def test_the_shadow_model_is_refused_under_a_table_it_cannot_follow() -> None:
    with pytest.raises(ValueError, match="cannot follow"):
        authority_machine(MemoryStore, example("pause"), shadow=True)


def test_the_warning_is_given_once_per_machine_and_not_when_the_shadow_is_declined() -> None:
    with pytest.warns(ShadowModelOffWarning) as caught:
        machine = authority_machine(MemoryStore, example("pause"))
    assert len(caught) == 1
    assert "MoveRules" in [base.__name__ for base in machine.__mro__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        declined = authority_machine(MemoryStore, example("pause"), shadow=False)
        shipped = authority_machine(MemoryStore)
    assert not declined.shadow_enabled
    assert shipped.shadow_enabled
    assert "MoveRules" not in [base.__name__ for base in shipped.__mro__]
    assert issubclass(ShadowModelOffWarning, UserWarning)
