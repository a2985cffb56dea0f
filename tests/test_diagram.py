"""The legal-transition diagrams: derived from the spec, deterministic, kept fresh in diagrams/.

The DOT is read back through Graphviz itself (`dot -Tjson0`), so these tests
check what `dot` understands, not how the text happens to be spelled.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import graphviz
import pytest

from support import CAPS, request
from support import authority as make_authority
from workwarden.cli import main
from workwarden.statemachine import Authority, Event, RetryPolicy, default_spec
from workwarden.statemachine.diagram import (
    ACTOR_COLOURS,
    HISTORY_COLOUR,
    PURGED_NODE,
    DiagramError,
    diagram_dot,
    diagram_mermaid,
    render,
    write_diagrams,
)
from workwarden.statemachine.spec import Spec, load_spec_text
from workwarden.storage import MemoryStore, open_store

DIAGRAMS = Path(__file__).resolve().parent.parent / "diagrams"


def _read_back(dot: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The states (legend samples left out) and visible edges `dot` reads in `dot`."""
    data = json.loads(graphviz.pipe("dot", "json0", dot.encode("utf-8")))
    objects = [o for o in data["objects"] if "nodes" not in o]
    names = {o["_gvid"]: o["name"] for o in objects}
    nodes = {o["name"]: o for o in objects if not o["name"].startswith("legend_")}
    edges = [
        {**e, "tail": names[e["tail"]], "head": names[e["head"]]}
        for e in data["edges"]
        if e.get("style") != "invis"
    ]
    return nodes, edges


def _edge(edges: list[dict[str, Any]], source: str, target: str) -> dict[str, Any]:
    (found,) = [e for e in edges if (e["tail"], e["head"]) == (source, target)]
    return found


def _run_a_retried_lifecycle(authority: Authority) -> str:
    """Admit, fail the first attempt (retried), then checkpoint twice and complete."""
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "w1", CAPS, now=11_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, now=12_000)
    authority.fail(workload_id, claim.fence, "transient_connection", "reset", now=12_500)
    claim = authority.claim(workload_id, "w2", CAPS, now=14_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, now=15_000)
    authority.checkpoint(workload_id, claim.fence, {"page": 1}, now=15_500)
    authority.checkpoint(workload_id, claim.fence, {"page": 2}, now=15_600)
    authority.complete(workload_id, claim.fence, "r1", {"ok": True}, now=16_000)
    return workload_id


@pytest.fixture
def history() -> list[Event]:
    """The committed events of a real retried lifecycle over a MemoryStore."""
    authority = make_authority(MemoryStore())
    workload_id = _run_a_retried_lifecycle(authority)
    return list(authority.get(workload_id).execution_history)


def test_the_generated_diagrams_in_the_repository_are_up_to_date() -> None:
    spec = default_spec()
    hint = "diagrams/ is stale: run `workwarden diagram` at the repository root"
    assert (DIAGRAMS / "workload.dot").read_text(encoding="utf-8") == diagram_dot(spec), hint
    assert (DIAGRAMS / "workload.mmd").read_text(encoding="utf-8") == diagram_mermaid(spec), hint
    svg = ET.parse(DIAGRAMS / "workload.svg").getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    text = (DIAGRAMS / "workload.svg").read_text(encoding="utf-8")
    assert all(state in text for state in spec.states), hint


def test_the_dot_is_the_same_text_whatever_order_the_inputs_come_in() -> None:
    spec = default_spec()
    unreachable = [("DEAD_LETTER", "CANCELLED"), ("CREATED", "CANCELLED")]
    first = diagram_dot(spec, unreachable_edges=unreachable, never_at_rest=["READY", "CLAIMED"])
    second = diagram_dot(
        spec, unreachable_edges=unreachable[::-1], never_at_rest={"CLAIMED", "READY"}
    )
    assert first == second


def test_every_state_is_one_node_and_every_transition_one_edge() -> None:
    spec = default_spec()
    nodes, edges = _read_back(diagram_dot(spec))
    assert set(nodes) == set(spec.states)
    pairs = [(e["tail"], e["head"]) for e in edges]
    assert sorted(pairs) == sorted(spec.edges)
    assert len(pairs) == len(spec.data.transitions) == 33


def test_states_are_shaped_by_kind_and_terminal_states_have_a_double_border() -> None:
    spec = default_spec()
    nodes, _ = _read_back(diagram_dot(spec))
    for name, state in spec.states.items():
        node = nodes[name]
        assert state.kind in node["label"]
        assert (node.get("peripheries") == "2") == (state.kind == "terminal"), name
        assert ("dashed" in node["style"]) == (state.kind == "transient"), name
    assert nodes["SUCCEEDED"]["shape"] == "box"
    assert nodes["RECOVERING"]["shape"] == "hexagon"


def test_edges_are_labelled_with_operations_and_coloured_by_actor_class() -> None:
    spec = default_spec()
    _, edges = _read_back(diagram_dot(spec))
    claim = _edge(edges, "READY", "CLAIMED")
    assert claim["color"] == ACTOR_COLOURS["worker"]
    assert "claim<BR/>claim_next" in claim["label"]
    # Several classes: one parallel line each, in the order worker, system, operator.
    timeout = _edge(edges, "RUNNING", "TIMED_OUT")
    assert timeout["color"] == f"{ACTOR_COLOURS['system']}:{ACTOR_COLOURS['operator']}"
    confirm = _edge(edges, "CANCELLATION_REQUESTED", "CANCELLED")
    assert confirm["color"] == f"{ACTOR_COLOURS['worker']}:{ACTOR_COLOURS['system']}"
    assert "exit: rearm" in _edge(edges, "DEAD_LETTER", "READY")["label"]
    for edge in edges:
        for operation in spec.edges[(edge["tail"], edge["head"])].operations:
            assert operation in edge["label"]


def test_an_unreachable_edge_is_dashed_and_says_so() -> None:
    _, edges = _read_back(
        diagram_dot(default_spec(), unreachable_edges=[("DEAD_LETTER", "CANCELLED")])
    )
    unreachable = _edge(edges, "DEAD_LETTER", "CANCELLED")
    assert unreachable["style"] == "dashed"
    assert "unreachable" in unreachable["label"]
    others = [e for e in edges if (e["tail"], e["head"]) != ("DEAD_LETTER", "CANCELLED")]
    assert not any("dashed" in e.get("style", "") for e in others)


def test_a_state_never_at_rest_is_marked_like_a_transient_one() -> None:
    nodes, _ = _read_back(diagram_dot(default_spec(), never_at_rest=["CLAIMED"]))
    assert "never at rest" in nodes["CLAIMED"]["label"]
    assert "dashed" in nodes["CLAIMED"]["style"]
    assert "never at rest" not in nodes["RUNNING"]["label"]


def test_a_history_is_numbered_in_order_on_the_edges_it_took(history: list[Event]) -> None:
    assert [(e.from_state, e.to) for e in history][:3] == [
        ("CREATED", "READY"),
        ("READY", "CLAIMED"),
        ("CLAIMED", "RUNNING"),
    ]
    _, edges = _read_back(diagram_dot(default_spec(), history=history))
    taken = {(e["tail"], e["head"]): e for e in edges if e["color"] == HISTORY_COLOUR}
    assert set(taken) == {(e.from_state, e.to) for e in history}
    # Steps 2 and 6 both claimed; step 5 was the policy's retry; 9 re-checkpointed.
    assert "<B>1</B>" in taken[("CREATED", "READY")]["label"]
    assert "<B>2, 6</B>" in taken[("READY", "CLAIMED")]["label"]
    assert "<B>3, 7</B>" in taken[("CLAIMED", "RUNNING")]["label"]
    assert "<B>4</B>" in taken[("RUNNING", "FAILED")]["label"]
    assert "<B>5</B>" in taken[("FAILED", "READY")]["label"]
    assert "<B>9</B>" in taken[("CHECKPOINTED", "CHECKPOINTED")]["label"]
    assert "<B>10</B>" in taken[("CHECKPOINTED", "SUCCEEDED")]["label"]
    untaken = _edge(edges, "READY", "TIMED_OUT")
    assert untaken["color"] != HISTORY_COLOUR
    assert "<B>" not in untaken["label"]


def test_observed_counts_are_shown_and_a_step_off_the_table_is_drawn_apart() -> None:
    counts = {("READY", "CLAIMED"): 12, ("SUCCEEDED", "READY"): 1}
    _, edges = _read_back(diagram_dot(default_spec(), observed_counts=counts))
    assert "\u00d712" in _edge(edges, "READY", "CLAIMED")["label"]
    off = _edge(edges, "SUCCEEDED", "READY")
    assert "not in the table" in off["label"]
    assert off["style"] == "dashed"
    assert len(edges) == len(default_spec().edges) + 1


@pytest.mark.parametrize(
    "options",
    [
        {"unreachable_edges": [("SUCCEEDED", "READY")]},
        {"never_at_rest": ["PAUSED"]},
        {"observed_counts": {("READY", "PAUSED"): 1}},
    ],
)
def test_an_overlay_naming_what_the_spec_lacks_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(DiagramError) as caught:
        diagram_dot(default_spec(), **options)
    assert caught.value.code == "DIAGRAM_INPUT_INVALID"


def test_the_mermaid_text_starts_and_ends_at_the_pseudo_state_and_labels_every_edge() -> None:
    spec = default_spec()
    text = diagram_mermaid(spec)
    lines = text.splitlines()
    assert "stateDiagram-v2" in lines
    assert "    [*] --> CREATED" in lines
    for state in ("SUCCEEDED", "CANCELLED", "DEAD_LETTER"):
        assert f"    {state} --> [*]" in lines
    assert "    READY --> CLAIMED : claim, claim_next (worker)" in lines
    assert "    TIMED_OUT --> READY : timeout, enforce_deadlines, retry (system, operator)" in lines
    assert "    class CREATED,FAILED,RECOVERING,TIMED_OUT transient" in lines
    assert any(line.startswith("    classDef transient") and "dasharray" in line for line in lines)
    transitions = [line for line in lines if " --> " in line and "[*]" not in line]
    assert len(transitions) == len(spec.edges)
    assert text == diagram_mermaid(spec)


@pytest.mark.parametrize("name", ["v2: draft #3", 'say "hi"', "- a list?", "工作"])
def test_the_mermaid_title_is_the_spec_name_whatever_characters_it_holds(name: str) -> None:
    # The front matter is YAML: unquoted, `v2: draft #3` is a mapping and a comment,
    # and Mermaid refuses the diagram. A double-quoted JSON string is the same in YAML.
    text = SHIPPED_SPEC.read_text(encoding="utf-8")
    spec = load_spec_text(text.replace('name = "workload"', f"name = {json.dumps(name)}", 1))
    lines = diagram_mermaid(spec).splitlines()
    assert lines[0] == lines[2] == "---"
    key, value = lines[1].split(": ", 1)
    assert key == "title"
    assert json.loads(value) == f"{name} - the legal transitions"


def test_the_mermaid_text_carries_the_overlays(history: list[Event]) -> None:
    text = diagram_mermaid(
        default_spec(),
        history=history,
        unreachable_edges=[("DEAD_LETTER", "CANCELLED")],
        never_at_rest=["CLAIMED"],
    )
    assert "READY --> CLAIMED : claim, claim_next (worker) steps 2, 6" in text
    assert "DEAD_LETTER --> CANCELLED : cancel (operator) exit close unreachable" in text
    assert "CLAIMED : CLAIMED<br/>active - never at rest" in text


def test_dot_renders_the_diagram_as_svg_and_png() -> None:
    dot = diagram_dot(default_spec())
    svg = ET.fromstring(render(dot, "svg"))
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert render(dot, "png").startswith(b"\x89PNG\r\n\x1a\n")


def test_without_dot_rendering_fails_loudly_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    out = tmp_path / "out"
    with pytest.raises(DiagramError) as caught:
        write_diagrams(default_spec(), out, formats=["dot", "svg"])
    assert caught.value.code == "GRAPHVIZ_NOT_FOUND"
    assert "apt-get install graphviz" in caught.value.message
    assert not out.exists()
    # The text formats need no Graphviz.
    written = write_diagrams(default_spec(), out, formats=["dot", "mermaid"])
    assert [p.name for p in written] == ["workload.dot", "workload.mmd"]


def test_a_file_that_cannot_be_written_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    # The SVG's name is taken by a folder: the DOT before it in the order is not
    # written either, and an earlier DOT keeps its text.
    (tmp_path / "workload.svg").mkdir()
    (tmp_path / "workload.dot").write_text("an earlier drawing", encoding="utf-8")
    with pytest.raises(DiagramError) as caught:
        write_diagrams(default_spec(), tmp_path)
    assert caught.value.code == "DIAGRAM_WRITE_FAILED"
    assert caught.value.message == f"cannot write {tmp_path / 'workload.svg'}: it is a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["workload.dot", "workload.svg"]
    assert (tmp_path / "workload.dot").read_text(encoding="utf-8") == "an earlier drawing"


def test_a_name_too_long_for_a_file_leaves_no_file_and_no_folder(tmp_path: Path) -> None:
    out = tmp_path / "made" / "here"
    with pytest.raises(DiagramError) as caught:
        write_diagrams(default_spec(), out, formats=["dot", "mermaid"], name="n" * 300)
    assert caught.value.code == "DIAGRAM_WRITE_FAILED"
    assert "File name too long" in caught.value.message
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "there").mkdir()
    with pytest.raises(DiagramError):
        write_diagrams(default_spec(), tmp_path / "there", formats=["dot"], name="n" * 300)
    assert list((tmp_path / "there").iterdir()) == []


def test_a_rewritten_diagram_keeps_the_mode_and_the_link_of_the_file_it_replaces(
    tmp_path: Path,
) -> None:
    write_diagrams(default_spec(), tmp_path, formats=["dot", "mermaid"])
    (tmp_path / "workload.dot").chmod(0o640)
    (tmp_path / "docs.mmd").symlink_to(tmp_path / "workload.mmd")
    (tmp_path / "workload.mmd").write_text("stale", encoding="utf-8")
    write_diagrams(default_spec(), tmp_path, formats=["dot", "mermaid"])
    write_diagrams(default_spec(), tmp_path, formats=["mermaid"], name="docs")
    assert (tmp_path / "workload.dot").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "docs.mmd").is_symlink()
    assert (tmp_path / "workload.mmd").read_text(encoding="utf-8") == diagram_mermaid(
        default_spec()
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "docs.mmd",
        "workload.dot",
        "workload.mmd",
    ]


def test_the_command_refuses_a_file_in_the_way_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "workload.mmd").mkdir()
    assert main(["diagram", "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("DIAGRAM_WRITE_FAILED: cannot write ")
    assert "workload.mmd: it is a directory" in err
    assert [p.name for p in tmp_path.iterdir()] == ["workload.mmd"]


def test_the_command_writes_the_default_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diagram", "--out-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "workload.dot",
        "workload.mmd",
        "workload.svg",
    ]
    assert (tmp_path / "workload.dot").read_text(encoding="utf-8") == diagram_dot(default_spec())
    assert ET.parse(tmp_path / "workload.svg").getroot().tag.endswith("svg")
    assert capsys.readouterr().out.splitlines() == [
        str(tmp_path / "workload.dot"),
        str(tmp_path / "workload.svg"),
        str(tmp_path / "workload.mmd"),
    ]


def test_the_command_takes_a_spec_file_a_name_and_formats(tmp_path: Path) -> None:
    spec_file = tmp_path / "copy.toml"
    spec_file.write_text(
        (Path(__file__).resolve().parent.parent / "specs" / "workload.toml").read_text("utf-8"),
        encoding="utf-8",
    )
    status = main(
        [
            "diagram",
            str(spec_file),
            "--out-dir",
            str(tmp_path / "out"),
            "--format",
            "png,mermaid",
            "--name",
            "copy",
        ]
    )
    assert status == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["copy.mmd", "copy.png"]


def test_the_command_draws_a_workload_history_from_a_sqlite_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'work.sqlite3'}"
    store = open_store(url, mode="create")
    try:
        workload_id = _run_a_retried_lifecycle(make_authority(store))
    finally:
        store.close()
    out = tmp_path / "out"
    status = main(
        ["diagram", "--history", url, workload_id, "--out-dir", str(out), "--format", "dot"]
    )
    assert status == 0
    dot = (out / f"workload-{workload_id}.dot").read_text(encoding="utf-8")
    _, edges = _read_back(dot)
    assert "<B>2, 6</B>" in _edge(edges, "READY", "CLAIMED")["label"]
    assert _edge(edges, "CHECKPOINTED", "SUCCEEDED")["color"] == HISTORY_COLOUR


def test_the_command_reports_a_missing_workload_as_not_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    open_store(url, mode="create").close()
    status = main(["diagram", "--history", url, "nobody", "--out-dir", str(tmp_path / "out")])
    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith("WORKLOAD_NOT_FOUND: ")
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--format", "dot,jpeg"], "DIAGRAM_INPUT_INVALID"),
        (["--history", "ftp://example", "w"], "WORKLOAD_STORE_URL_INVALID"),
        (["no-such-spec.toml"], "WORKLOAD_SPEC_INVALID"),
    ],
)
def test_the_command_prints_errors_as_code_and_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: str
) -> None:
    status = main(["diagram", *argv, "--out-dir", str(tmp_path / "out")])
    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{code}: ")
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


# -- the operator view: purge and the pause gate -------------------------------------------

SHIPPED_SPEC = Path(__file__).resolve().parent.parent / "specs" / "workload.toml"


def _spec_keeping(keep: list[str]) -> Spec:
    """The shipped spec with `[retention] keep` set to `keep`."""
    text = SHIPPED_SPEC.read_text(encoding="utf-8")
    assert 'keep = ["DEAD_LETTER"]' in text
    return load_spec_text(text.replace('keep = ["DEAD_LETTER"]', f"keep = {json.dumps(keep)}"))


def _purge_edges(dot: str) -> list[dict[str, Any]]:
    _, edges = _read_back(dot)
    return [e for e in edges if e["head"] == PURGED_NODE]


def test_the_operator_view_in_the_repository_is_up_to_date() -> None:
    spec = default_spec()
    hint = "diagrams/ is stale: run `workwarden diagram --view operator` at the repository root"
    dot = diagram_dot(spec, view="operator", name="workload-operator")
    assert (DIAGRAMS / "workload-operator.dot").read_text(encoding="utf-8") == dot, hint
    mermaid = diagram_mermaid(spec, view="operator")
    assert (DIAGRAMS / "workload-operator.mmd").read_text(encoding="utf-8") == mermaid, hint
    assert ET.parse(DIAGRAMS / "workload-operator.svg").getroot().tag.endswith("svg")


def test_the_operator_view_purges_every_terminal_state_but_the_kept_ones() -> None:
    spec = default_spec()
    edges = _purge_edges(diagram_dot(spec, view="operator"))
    assert sorted(e["tail"] for e in edges) == ["CANCELLED", "SUCCEEDED"]
    for edge in edges:
        assert edge["color"] == ACTOR_COLOURS["operator"]
        assert edge["style"] == "dashed"
        assert "purge" in edge["label"]
        assert "older than 30 d" in edge["label"]
    nodes, _ = _read_back(diagram_dot(spec, view="operator"))
    assert "kept by retention" in nodes["DEAD_LETTER"]["label"]
    assert all("kept by retention" not in nodes[s]["label"] for s in ("CANCELLED", "SUCCEEDED"))
    # The keep list is read from the spec, not from the code.
    keeping = _spec_keeping(["DEAD_LETTER", "CANCELLED"])
    assert [e["tail"] for e in _purge_edges(diagram_dot(keeping, view="operator"))] == ["SUCCEEDED"]
    keeping_none = _spec_keeping([])
    assert sorted(e["tail"] for e in _purge_edges(diagram_dot(keeping_none, view="operator"))) == [
        "CANCELLED",
        "DEAD_LETTER",
        "SUCCEEDED",
    ]


def test_the_purge_edges_are_the_states_a_real_purge_deletes_from() -> None:
    spec = default_spec()
    authority = make_authority(MemoryStore())
    finished = {"SUCCEEDED": _run_a_retried_lifecycle(authority)}
    cancelled = authority.admit(request(idempotency_key="cancelled"), now=10_000)
    authority.cancel(cancelled.workload.workload_id, "ops", now=10_500)
    finished["CANCELLED"] = cancelled.workload.workload_id
    dead = authority.admit(
        request(idempotency_key="dead", retry_policy=RetryPolicy(max_attempts=1)), now=10_000
    ).workload.workload_id
    claim = authority.claim(dead, "w1", CAPS, now=11_000, lease_ms=10_000)
    authority.fail(dead, claim.fence, "validation", "bad input", now=11_500)
    finished["DEAD_LETTER"] = dead
    assert {state: authority.get(w).state for state, w in finished.items()} == {
        s: s for s in finished
    }
    report = authority.purge(10_000 + spec.data.retention.after_ms + 60_000)
    purged = sorted(state for state, w in finished.items() if w in report.purged)
    assert purged == sorted(e["tail"] for e in _purge_edges(diagram_dot(spec, view="operator")))
    assert report.kept == 1


def test_the_operator_view_guards_every_claim_edge_with_the_pause_gate() -> None:
    spec = default_spec()
    nodes, edges = _read_back(diagram_dot(spec, view="operator"))
    claims = {n for n, op in spec.operations.items() if op.spec.effect == "lease"}
    for edge in edges:
        if edge["tail"] == "operator_pause" or edge["head"] == PURGED_NODE:
            continue
        operations = set(spec.edges[(edge["tail"], edge["head"])].operations)
        assert ("[if not paused]" in edge["label"]) == bool(operations & claims), edge["tail"]
    note = [e for e in edges if e["tail"] == "operator_pause"]
    assert [e["head"] for e in note] == ["READY"]
    assert "pause / resume" in nodes["operator_pause"]["label"]
    assert nodes["operator_pause"]["shape"] == "note"


def test_the_default_view_draws_neither_purge_nor_pause() -> None:
    spec = default_spec()
    dot = diagram_dot(spec)
    assert dot == diagram_dot(spec, view="table")
    assert "operator_" not in dot
    assert "if not paused" not in dot
    assert "purged" not in diagram_mermaid(spec)
    assert "paused" not in diagram_mermaid(spec)


def test_the_mermaid_operator_view_has_the_purge_edges_the_guard_and_the_note() -> None:
    text = diagram_mermaid(default_spec(), view="operator")
    assert "    SUCCEEDED --> operator_purged : purge (operator) older than 30 d" in text
    assert "    CANCELLED --> operator_purged : purge (operator) older than 30 d" in text
    assert "DEAD_LETTER --> operator_purged" not in text
    assert "READY --> CLAIMED : claim, claim_next (worker) [if not paused]" in text
    assert "    note left of READY" in text
    assert "DEAD_LETTER<br/>terminal - kept by retention" in text


def test_an_unknown_view_is_refused() -> None:
    for draw in (diagram_dot, diagram_mermaid):
        with pytest.raises(DiagramError) as refused:
            draw(default_spec(), view="operators")
        assert refused.value.code == "DIAGRAM_INPUT_INVALID"
        assert "table, operator" in refused.value.message


def test_the_command_writes_the_operator_view(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diagram", "--view", "operator", "--out-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "workload-operator.dot",
        "workload-operator.mmd",
        "workload-operator.svg",
    ]
    written = (tmp_path / "workload-operator.dot").read_text(encoding="utf-8")
    assert written == diagram_dot(default_spec(), view="operator", name="workload-operator")
    assert "operator_purged" in written


@pytest.mark.parametrize(
    ("report", "why"),
    [
        ([1, 2], "a JSON object was expected, not a list"),
        (
            {"edges_never_taken": [1], "never_at_rest": []},
            'edges_never_taken must be a list of "A -> B"',
        ),
        (
            {"edges_never_taken": ["A"], "never_at_rest": []},
            'edges_never_taken must be a list of "A -> B"',
        ),
        ({"edges_never_taken": [], "never_at_rest": {"a": 1}}, "never_at_rest must be a list"),
        ({"edges_never_taken": [], "never_at_rest": [], "complete": "yes"}, "complete must be"),
    ],
)
def test_a_report_of_the_wrong_shape_says_which_field_without_python_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report: Any, why: str
) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    status = main(["diagram", "--report", str(path), "--out-dir", str(tmp_path / "out")])
    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith(f"WORKLOAD_INVALID: --report {path}: not a checker report ({why}")
    for python in ("indices", "object has no attribute", "not subscriptable", "Traceback"):
        assert python not in err
    assert not (tmp_path / "out").exists()


EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"


@pytest.mark.parametrize(
    ("checked", "drawn", "why"),
    [
        # Another table (the report names no spec, as one written before it did): the
        # approval spec's report lacks the shipped spec's edges.
        ("approval", None, "the spec drawn has the edge"),
        ("approval", "pause", "it is a check of the spec 'workload-approval'"),
        # The same table, another spec: the report names the spec it checked.
        ("claim_starts", None, "it is a check of the spec 'workload-claim_starts'"),
    ],
)
def test_a_report_of_another_spec_is_refused_and_nothing_is_drawn(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    checked: str,
    drawn: str | None,
    why: str,
) -> None:
    path = tmp_path / "report.json"
    small = ["--single", "--workers", "1", "--max-states", "20", "--json", str(path)]
    assert main(["check", str(EXAMPLES / f"{checked}.toml"), *small]) == 3
    capsys.readouterr()
    if "edge" in why:
        report = json.loads(path.read_text(encoding="utf-8"))
        del report["spec_name"]
        path.write_text(json.dumps(report), encoding="utf-8")
    spec = [] if drawn is None else ["--spec", str(EXAMPLES / f"{drawn}.toml")]
    out = tmp_path / "out"
    assert main(["diagram", *spec, "--report", str(path), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"DIAGRAM_INPUT_INVALID: --report {path} is not a check of the spec")
    assert why in err
    assert not out.exists()
    # On the spec it checked, it is drawn.
    home = ["--spec", str(EXAMPLES / f"{checked}.toml"), "--format", "dot"]
    assert main(["diagram", *home, "--report", str(path), "--out-dir", str(out)]) == 0


def test_a_report_that_cannot_be_read_is_input_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "check.json"
    status = main(["diagram", "--report", str(missing), "--out-dir", str(tmp_path / "out")])
    assert status == 1
    assert capsys.readouterr().err.startswith(
        f"WORKWARDEN_INPUT_UNREADABLE: cannot read --report {missing}: "
    )
    assert not (tmp_path / "out").exists()
