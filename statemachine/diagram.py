"""The legal-transition diagram, derived from the spec: DOT, SVG, PNG and Mermaid text.

Every state of the spec is a node, shaped and filled by its kind; every legal
transition is one edge, labelled with the operations that take it and coloured
by the actor classes that may take it (one parallel line per class when
several may). Optional overlays come from outside the table: a checker's
report (edges no step can take are dashed, states never at rest are marked),
one workload's history (each committed step numbered in order on the edge it
took) and observed counts per edge. A report from a check that stopped early
is drawn as partial: the title says so, and what it did not reach is not
called unreachable. The operations a spec adds with the effect `move` (a
pause, an approval) are named "(move)" on their edges. The outputs are deterministic: nodes and
edges in sorted order, sorted attributes, no timestamps, so a generated file
diffs cleanly and a freshness test can compare it exactly.

The operator view (`view="operator"`) adds what an operator does beside the
table, drawn from the spec's data: a purge (`Authority.purge`) as an operator
edge from each terminal state to a "purged" end, except from the states the
spec's `[retention] keep` list names (marked "kept by retention" instead,
since a purge passes them over); and a pause (`Authority.pause`, `resume`) as
the gate it is: every edge an operation of effect `lease` takes (a claim) is
guarded "if not paused", and a note says what a pause does. Neither is an
edge of the table, so neither is drawn in the default view.

SVG and PNG are rendered by Graphviz's `dot`; when it is missing, rendering
fails with `DiagramError` (`GRAPHVIZ_NOT_FOUND`) saying how to install it,
never falling back to another renderer.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Literal

import graphviz

from workwarden.statemachine.models import Event
from workwarden.statemachine.spec import ACTOR_CLASSES, Spec, TransitionSpec

__all__ = [
    "ACTOR_COLOURS",
    "FORMATS",
    "HISTORY_COLOUR",
    "KIND_ORDER",
    "PURGED_NODE",
    "VIEWS",
    "DiagramError",
    "diagram_dot",
    "diagram_graph",
    "diagram_mermaid",
    "render",
    "write_diagrams",
]

#: Every output format of `write_diagrams`, and the suffix of its file.
FORMATS: dict[str, str] = {"dot": ".dot", "svg": ".svg", "png": ".png", "mermaid": ".mmd"}

#: The kinds of state, in the order nodes are listed and the legend shows them.
KIND_ORDER: tuple[str, ...] = ("transient", "queued", "held", "active", "terminal")

#: The colour of each actor class (Okabe-Ito: told apart by colour-blind readers too).
ACTOR_COLOURS: dict[str, str] = {
    "worker": "#0072B2",
    "system": "#009E73",
    "operator": "#E69F00",
}

#: The colour of a drawn history's steps, and of observations off the table.
HISTORY_COLOUR = "#D00000"

#: The views a diagram can be drawn in: the table alone, or with the operator's
#: purge and pause gate beside it (see the module docstring).
VIEWS: tuple[str, ...] = ("table", "operator")

#: The node id of the operator view's "purged" end (not a state of the spec).
PURGED_NODE = "operator_purged"

# The operator view's note on the pause gate.
_PAUSE_NODE = "operator_pause"

# The guard the operator view puts on every claim edge.
_PAUSE_GUARD = "if not paused"

# The effect of the operations a pause stops (the claims).
_CLAIM_EFFECT = "lease"

# Label text in a darker shade of its edge's colour, so a label reads as its edge's.
_LABEL_COLOURS: dict[str, str] = {
    "worker": "#005A8C",
    "system": "#00704F",
    "operator": "#9A6500",
}

_INK = "#333333"
_FONT = "Helvetica"

# Shape and fill per kind. Terminal states have a double border; transient
# states (which exist only inside one commit) a dashed hexagon.
_KIND_NODE: dict[str, dict[str, str]] = {
    "transient": {"shape": "hexagon", "style": "dashed,filled", "fillcolor": "#FFFFFF"},
    "queued": {"shape": "box", "style": "rounded,filled", "fillcolor": "#FFF4CC"},
    "held": {"shape": "box", "style": "rounded,dashed,filled", "fillcolor": "#F3E5F5"},
    "active": {"shape": "box", "style": "filled", "fillcolor": "#DCEBF7"},
    "terminal": {
        "shape": "box",
        "style": "rounded,filled",
        "fillcolor": "#E4E4E4",
        "peripheries": "2",
    },
}

_KIND_MEANING: dict[str, str] = {
    "transient": "inside one commit only",
    "queued": "waiting for a worker",
    "held": "waiting for an operator",
    "active": "held by a worker",
    "terminal": "at rest, finished",
}

_MERMAID_STYLE: dict[str, str] = {
    "transient": "fill:#FFFFFF,stroke:#333333,stroke-dasharray:5 5",
    "queued": "fill:#FFF4CC,stroke:#333333",
    "held": "fill:#F3E5F5,stroke:#333333,stroke-dasharray:3 3",
    "active": "fill:#DCEBF7,stroke:#333333",
    "terminal": "fill:#E4E4E4,stroke:#333333,stroke-width:3px",
}

_MERMAID_PURGED = "fill:#FFFFFF,stroke:#E69F00,stroke-dasharray:5 5"


class DiagramError(Exception):
    """A diagram could not be drawn or rendered.

    `code` is stable: `DIAGRAM_INPUT_INVALID` (an overlay names a state or an
    edge the spec does not have, or an unknown format is asked for),
    `GRAPHVIZ_NOT_FOUND` (no `dot` executable), `GRAPHVIZ_FAILED` (`dot`
    refused the source) or `DIAGRAM_WRITE_FAILED` (a file could not be written).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class _Overlay:
    """The optional inputs, checked against the spec."""

    unreachable: frozenset[tuple[str, str]]
    never_at_rest: frozenset[str]
    # (from, to) -> the numbers (from 1, in order) of the history's steps that took it.
    steps: dict[tuple[str, str], list[int]]
    counts: dict[tuple[str, str], int]
    #: The report came from an exploration that stopped early: what it did not
    #: reach is not proven unreachable.
    partial: bool = False

    def off_table(self, spec: Spec) -> list[tuple[str, str]]:
        """Observed steps (history or counts) that no edge of the table allows, sorted."""
        return sorted((set(self.steps) | set(self.counts)) - set(spec.edges))


def _invalid(message: str) -> DiagramError:
    return DiagramError("DIAGRAM_INPUT_INVALID", message)


def _overlay(
    spec: Spec,
    unreachable_edges: Collection[tuple[str, str]],
    never_at_rest: Collection[str],
    history: Sequence[Event],
    observed_counts: Mapping[tuple[str, str], int] | None,
    partial: bool = False,
) -> _Overlay:
    for source, target in sorted(unreachable_edges):
        if (source, target) not in spec.edges:
            raise _invalid(f"unreachable edge {source} -> {target} is not a transition of the spec")
    for state in sorted(never_at_rest):
        if state not in spec.states:
            raise _invalid(f"state {state} (never at rest) is not a state of the spec")
    steps: dict[tuple[str, str], list[int]] = {}
    taken = sorted(
        ((event.sequence, event.from_state, event.to) for event in history if event.from_state),
    )
    for number, (sequence, source, target) in enumerate(taken, start=1):
        for state in (source, target):
            if state not in spec.states:
                raise _invalid(
                    f"history step {number} (event {sequence}) names state {state}, "
                    "which the spec does not declare"
                )
        steps.setdefault((source, target), []).append(number)
    counts = dict(observed_counts or {})
    for (source, target), count in sorted(counts.items()):
        if source not in spec.states or target not in spec.states:
            raise _invalid(f"observed step {source} -> {target} names a state the spec lacks")
        if count < 0:
            raise _invalid(f"observed count of {source} -> {target} is negative ({count})")
    return _Overlay(
        unreachable=frozenset(unreachable_edges),
        never_at_rest=frozenset(never_at_rest),
        steps=steps,
        counts=counts,
        partial=partial,
    )


def _moves(spec: Spec) -> frozenset[str]:
    """The operations the spec adds with the effect `move` (none in the shipped spec)."""
    return frozenset(name for name, op in spec.operations.items() if op.spec.effect == "move")


def _claims(spec: Spec) -> frozenset[str]:
    """The operations a pause stops: those of effect `lease` (the claims)."""
    return frozenset(
        name for name, op in spec.operations.items() if op.spec.effect == _CLAIM_EFFECT
    )


def _claim_edges(spec: Spec) -> list[TransitionSpec]:
    """The edges a claim takes, sorted: the ones the pause gate guards."""
    claims = _claims(spec)
    return [edge for edge in _sorted_edges(spec) if claims & set(edge.operations)]


def _purgeable(spec: Spec) -> list[str]:
    """The terminal states a purge deletes work from: all but the `[retention] keep` ones."""
    keep = set(spec.data.retention.keep)
    return sorted(state for state in spec.terminal_states if state not in keep)


def _kept(spec: Spec) -> frozenset[str]:
    """The terminal states a purge passes over (`[retention] keep`)."""
    return frozenset(spec.data.retention.keep) & frozenset(spec.terminal_states)


def _age(ms: int) -> str:
    """A retention age in the largest whole unit (30 d, 12 h, 90 s, 250 ms)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _check_view(view: str) -> None:
    if view not in VIEWS:
        raise _invalid(f"unknown view {view!r}; choose from {', '.join(VIEWS)}")


def _states_by_kind(spec: Spec) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {kind: [] for kind in KIND_ORDER}
    for name in sorted(spec.states):
        groups[spec.states[name].kind].append(name)
    return groups


def _sorted_edges(spec: Spec) -> list[TransitionSpec]:
    return [spec.edges[key] for key in sorted(spec.edges)]


def _classes(edge: TransitionSpec) -> list[str]:
    """The edge's actor classes in the canonical order (worker, system, operator)."""
    return [actor for actor in ACTOR_CLASSES if actor in edge.actors]


def _numbers(steps: Iterable[int]) -> str:
    return ", ".join(str(step) for step in steps)


def _stack(lines: Iterable[str]) -> str:
    """An HTML-like label of centred lines, one table row each (rows keep lines apart)."""
    rows = "".join(f"<TR><TD>{line}</TD></TR>" for line in lines)
    return f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">{rows}</TABLE>>'


def _small(text: str) -> str:
    return f'<FONT POINT-SIZE="9">{text}</FONT>'


def _node_label(name: str, kind: str, never_at_rest: bool, kept: bool = False) -> str:
    lines = [f"<B>{escape(name)}</B>", _small(kind)]
    if never_at_rest:
        lines.append(_small("<I>never at rest</I>"))
    if kept:
        lines.append(_small("<I>kept by retention</I>"))
    return _stack(lines)


def _edge_label(
    edge: TransitionSpec | None,
    steps: list[int],
    count: int | None,
    unreachable: bool,
    moves: frozenset[str] = frozenset(),
    partial: bool = False,
    guard: str | None = None,
) -> str:
    lines: list[str] = []
    if steps:
        lines.append(
            f'<FONT COLOR="{HISTORY_COLOUR}" POINT-SIZE="12"><B>{_numbers(steps)}</B></FONT>'
        )
    if edge is None:
        lines.append(f'<FONT COLOR="{HISTORY_COLOUR}"><I>not in the table</I></FONT>')
    else:
        lines.extend(
            f"<I>{escape(operation)}</I> (move)" if operation in moves else escape(operation)
            for operation in edge.operations
        )
        if edge.exit is not None:
            lines.append(f"<I>exit: {edge.exit}</I>")
    if guard is not None:
        lines.append(f"[{escape(guard)}]")
    if unreachable:
        lines.append("<I>not reached (partial check)</I>" if partial else "<I>unreachable</I>")
    if count is not None:
        lines.append(f"<B>\u00d7{count}</B>")
    # A padded cell keeps the text clear of its edge (dot sets a label right beside it).
    return (
        '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="3"><TR><TD>'
        + "<BR/>".join(lines)
        + "</TD></TR></TABLE>>"
    )


def _swatch(colour: str, meaning: str) -> str:
    return (
        f'<TR><TD BGCOLOR="{colour}" WIDTH="28" HEIGHT="4" FIXEDSIZE="TRUE"></TD>'
        f'<TD ALIGN="LEFT">{meaning}</TD></TR>'
    )


def _legend(graph: graphviz.Digraph, spec: Spec, overlay: _Overlay, view: str = "table") -> None:
    """A legend cluster: a sample node per kind the spec uses, then what edges mean."""
    rows = [_swatch(ACTOR_COLOURS[actor], actor) for actor in ACTOR_CLASSES]
    rows.append(f'<TR><TD COLSPAN="2" ALIGN="LEFT">{_small("several: one line each")}</TD></TR>')
    if view == "operator":
        rows.append(
            f'<TR><TD>[{_PAUSE_GUARD}]</TD><TD ALIGN="LEFT">a claim, stopped by a pause</TD></TR>'
        )
        rows.append(
            '<TR><TD><I>purge</I></TD><TD ALIGN="LEFT">retention deletes the work</TD></TR>'
        )
    if _moves(spec):
        rows.append(
            '<TR><TD><I>op</I> (move)</TD><TD ALIGN="LEFT">an operation the spec adds</TD></TR>'
        )
    if overlay.unreachable:
        taken = "no step of the partial check took it" if overlay.partial else "no step can take it"
        rows.append(f'<TR><TD>- - -</TD><TD ALIGN="LEFT">{taken}</TD></TR>')
    if overlay.steps:
        rows.append(_swatch(HISTORY_COLOUR, "history, steps in order"))
    if overlay.counts:
        rows.append('<TR><TD>\u00d7N</TD><TD ALIGN="LEFT">times observed</TD></TR>')
    table = (
        '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="3" CELLPADDING="1">'
        '<TR><TD COLSPAN="2" ALIGN="LEFT"><B>edges: actor class</B></TD></TR>'
        + "".join(rows)
        + "</TABLE>>"
    )
    kinds = _states_by_kind(spec)
    with graph.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", fontsize="11", color="#AAAAAA", style="rounded")
        samples = []
        for kind in KIND_ORDER:
            if kinds[kind]:
                samples.append(f"legend_{kind}")
                legend.node(
                    samples[-1],
                    label=_stack([f"<B>{kind}</B>", _small(_KIND_MEANING[kind])]),
                    **_KIND_NODE[kind],
                )
        legend.node("legend_edges", label=table, shape="plaintext")
        # Invisible edges stack the samples in order, the edge key last.
        for tail, head in zip(samples, [*samples[1:], "legend_edges"], strict=True):
            legend.edge(tail, head, style="invis")


def diagram_graph(
    spec: Spec,
    *,
    unreachable_edges: Collection[tuple[str, str]] = (),
    never_at_rest: Collection[str] = (),
    history: Sequence[Event] = (),
    observed_counts: Mapping[tuple[str, str], int] | None = None,
    name: str | None = None,
    partial: bool = False,
    view: str = "table",
) -> graphviz.Digraph:
    """The legal-transition diagram of `spec` as a `graphviz.Digraph`.

    - `unreachable_edges`: `(from, to)` edges no step can take (a checker's
      finding); drawn dashed and labelled "unreachable".
    - `never_at_rest`: states no committed step leaves the work in; marked
      "never at rest", with a dashed border like a transient state's.
    - `history`: one workload's committed events. Each step (events with a
      from-state, in `sequence` order, numbered from 1) is drawn bold red on
      the edge it took; an edge taken several times lists every number. A
      step no edge allows is drawn as an extra red dashed edge labelled
      "not in the table".
    - `observed_counts`: `(from, to) -> times observed`, shown as "xN" on the
      edge (a step off the table as for the history).
    - `name`: the graph's name (the spec's name by default).
    - `partial`: the report came from a check that stopped early (`complete`
      false): the title says the drawing is partial, and its unreached edges
      are labelled "not reached (partial check)", not "unreachable".

    - `view`: `"table"` (the default) draws the table alone; `"operator"` adds
      the purge edges to a "purged" end, the "kept by retention" marks and
      the pause gate on the claim edges (see the module docstring).

    Edges an operation of effect `move` takes (an operation the spec adds,
    such as a pause) name it in italics with "(move)", coloured by its actor
    class like every edge.

    Raises `DiagramError` (`DIAGRAM_INPUT_INVALID`) when an overlay names a
    state or an edge the spec does not have, or `view` is not one of `VIEWS`.
    """
    _check_view(view)
    overlay = _overlay(spec, unreachable_edges, never_at_rest, history, observed_counts, partial)
    moves = _moves(spec)
    operator = view == "operator"
    kept = _kept(spec) if operator else frozenset()
    guarded = {(e.from_state, e.to) for e in _claim_edges(spec)} if operator else set()
    header = spec.data.spec
    graph = graphviz.Digraph(
        name or header.name,
        comment=(
            f"The legal transitions of the {header.name} spec (seed {header.seed_version}). "
            "Generated by `workwarden diagram`; do not edit."
        ),
    )
    title = f"<B>{escape(header.name)}</B>: the legal transitions"
    if overlay.steps:
        title += f", and the {sum(len(s) for s in overlay.steps.values())} steps of one workload"
    if operator:
        title += ", with the operator's pause and purge"
    if partial:
        title += (
            "<BR/><I>PARTIAL: drawn from an incomplete check, which proves nothing unreachable</I>"
        )
    # Chosen by rendering the shipped spec and checking that no edge crosses a
    # label: wide node and rank separation, more crossing-minimisation passes.
    graph.attr(
        label=f"<{title}>",
        labelloc="t",
        fontname=_FONT,
        fontsize="16",
        rankdir="TB",
        nodesep="0.6",
        ranksep="1.2",
        mclimit="4",
        pad="0.3",
        splines="spline",
    )
    graph.attr("node", fontname=_FONT, fontsize="12", color=_INK, margin="0.12,0.06")
    graph.attr("edge", fontname=_FONT, fontsize="10", fontcolor=_INK, arrowsize="0.7")

    for kind, names in _states_by_kind(spec).items():
        if not names:
            continue
        with graph.subgraph(name=f"kind_{kind}") as group:
            for state in names:
                attrs = dict(_KIND_NODE[kind])
                marked = state in overlay.never_at_rest
                if marked and "dashed" not in attrs["style"]:
                    attrs["style"] += ",dashed"
                label = _node_label(state, kind, marked, state in kept)
                group.node(state, label=label, **attrs)

    for edge in _sorted_edges(spec):
        key = (edge.from_state, edge.to)
        steps = overlay.steps.get(key, [])
        unreachable = key in overlay.unreachable
        classes = _classes(edge)
        attrs = {
            "color": ":".join(ACTOR_COLOURS[actor] for actor in classes),
            "fontcolor": _LABEL_COLOURS[classes[0]] if len(classes) == 1 else _INK,
        }
        if steps:
            attrs = {"color": HISTORY_COLOUR, "fontcolor": _INK, "penwidth": "2.5"}
        if unreachable:
            attrs["style"] = "dashed"
        guard = _PAUSE_GUARD if key in guarded else None
        label = _edge_label(
            edge, steps, overlay.counts.get(key), unreachable, moves, overlay.partial, guard
        )
        graph.edge(edge.from_state, edge.to, label=label, **attrs)

    for source, target in overlay.off_table(spec):
        key = (source, target)
        graph.edge(
            source,
            target,
            label=_edge_label(None, overlay.steps.get(key, []), overlay.counts.get(key), False),
            color=HISTORY_COLOUR,
            penwidth="2.5",
            style="dashed",
        )

    if operator:
        _operator_view(graph, spec)
    _legend(graph, spec, overlay, view)
    return graph


def _operator_view(graph: graphviz.Digraph, spec: Spec) -> None:
    """The operator view's additions: the purge edges and their end, and the pause note."""
    purgeable = _purgeable(spec)
    if purgeable:
        graph.node(
            PURGED_NODE,
            label=_stack(
                ["<B>purged</B>", _small("deleted, audited"), _small("its versions never reused")]
            ),
            shape="box",
            style="rounded,dashed",
            color=ACTOR_COLOURS["operator"],
        )
    age = _age(spec.data.retention.after_ms)
    for state in purgeable:
        graph.edge(
            state,
            PURGED_NODE,
            label=_stack(["<I>purge</I> (operator)", _small(f"older than {age}")]),
            color=ACTOR_COLOURS["operator"],
            fontcolor=_LABEL_COLOURS["operator"],
            style="dashed",
        )
    sources = sorted({edge.from_state for edge in _claim_edges(spec)})
    if not sources:
        return
    graph.node(
        _PAUSE_NODE,
        label=_stack(
            [
                "<B>pause / resume</B> (operator)",
                _small("a tenant, an application or a definition"),
                _small(f"closes the claim gate [{_PAUSE_GUARD}]"),
                _small("in-flight work runs on; deadlines run"),
            ]
        ),
        shape="note",
        color=ACTOR_COLOURS["operator"],
        fontcolor=_LABEL_COLOURS["operator"],
    )
    for state in sources:
        graph.edge(
            _PAUSE_NODE,
            state,
            style="dotted",
            arrowhead="none",
            color=ACTOR_COLOURS["operator"],
        )


def diagram_dot(
    spec: Spec,
    *,
    unreachable_edges: Collection[tuple[str, str]] = (),
    never_at_rest: Collection[str] = (),
    history: Sequence[Event] = (),
    observed_counts: Mapping[tuple[str, str], int] | None = None,
    name: str | None = None,
    partial: bool = False,
    view: str = "table",
) -> str:
    """The DOT source of the diagram (the options are `diagram_graph`'s).

    Deterministic: the same spec and options give the same text, byte for byte.
    """
    graph = diagram_graph(
        spec,
        unreachable_edges=unreachable_edges,
        never_at_rest=never_at_rest,
        history=history,
        observed_counts=observed_counts,
        name=name,
        partial=partial,
        view=view,
    )
    source: str = graph.source
    return source


def render(dot_source: str, fmt: Literal["svg", "png"]) -> bytes:
    """Render DOT source to SVG or PNG bytes with Graphviz's `dot`.

    Raises `DiagramError`: `GRAPHVIZ_NOT_FOUND` when `dot` is not installed
    (the message says how to install Graphviz), `GRAPHVIZ_FAILED` when `dot`
    rejects the source.
    """
    try:
        output: bytes = graphviz.pipe("dot", fmt, dot_source.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound:
        raise DiagramError(
            "GRAPHVIZ_NOT_FOUND",
            f"rendering {fmt.upper()} needs Graphviz's `dot`, which is not on PATH; install "
            "Graphviz (`apt-get install graphviz`, or `brew install graphviz`), or ask only "
            "for the dot and mermaid formats",
        ) from None
    except graphviz.CalledProcessError as exc:
        stderr = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else ""
        raise DiagramError(
            "GRAPHVIZ_FAILED", f"`dot` could not render {fmt.upper()}: {stderr.strip()}"
        ) from None
    return output


def _mermaid_label(
    edge: TransitionSpec | None,
    steps: list[int],
    count: int | None,
    unreachable: bool,
    moves: frozenset[str] = frozenset(),
    partial: bool = False,
    guard: str | None = None,
) -> str:
    if edge is None:
        parts = ["not in the table"]
    else:
        names = [f"{op} (move)" if op in moves else op for op in edge.operations]
        parts = [", ".join(names), "(" + ", ".join(_classes(edge)) + ")"]
        if edge.exit is not None:
            parts.append(f"exit {edge.exit}")
    if guard is not None:
        parts.append(f"[{guard}]")
    if unreachable:
        parts.append("not reached (partial check)" if partial else "unreachable")
    if steps:
        parts.append("steps " + _numbers(steps))
    if count is not None:
        parts.append(f"x{count}")
    # A colon or semicolon would end the label early.
    return " ".join(parts).replace(":", " ").replace(";", ",")


def diagram_mermaid(
    spec: Spec,
    *,
    unreachable_edges: Collection[tuple[str, str]] = (),
    never_at_rest: Collection[str] = (),
    history: Sequence[Event] = (),
    observed_counts: Mapping[tuple[str, str], int] | None = None,
    partial: bool = False,
    view: str = "table",
) -> str:
    """The diagram as Mermaid `stateDiagram-v2` text, for Markdown documents.

    Each state shows its name and kind and is styled by its kind (transient
    states with a dashed border); states no edge enters start from `[*]` and
    terminal states lead to `[*]`. Edges are labelled with their operations
    and, in parentheses, the actor classes that take them (Mermaid cannot
    colour single transitions). The overlays (see `diagram_graph`) add
    "unreachable", "never at rest", "steps N, M" and "xN" as text.
    Deterministic, and sorted like the DOT source. With `partial`, the title
    says the drawing comes from an incomplete check. The operator view
    (`view="operator"`) adds the purge edges to a `purged` end, "kept by
    retention" on the kept states, "[if not paused]" on the claim edges and a
    note on the pause gate, as `diagram_graph` draws them.
    """
    _check_view(view)
    overlay = _overlay(spec, unreachable_edges, never_at_rest, history, observed_counts, partial)
    moves = _moves(spec)
    operator = view == "operator"
    kept = _kept(spec) if operator else frozenset()
    guarded = {(e.from_state, e.to) for e in _claim_edges(spec)} if operator else set()
    header = spec.data.spec
    suffix = " (PARTIAL - from an incomplete check)" if partial else ""
    if operator:
        suffix = " - with the operator's pause and purge" + suffix
    # Quoted: the front matter is YAML, where a name like `v2: draft #3` means something.
    title = json.dumps(f"{header.name} - the legal transitions{suffix}", ensure_ascii=False)
    lines = [
        "---",
        f"title: {title}",
        "---",
        "stateDiagram-v2",
        f"    %% The legal transitions of the {header.name} spec (seed {header.seed_version}).",
        "    %% Generated by `workwarden diagram`; do not edit.",
        "    direction TB",
    ]
    kinds = _states_by_kind(spec)
    for kind in KIND_ORDER:
        for state in kinds[kind]:
            note = " - never at rest" if state in overlay.never_at_rest else ""
            if state in kept:
                note += " - kept by retention"
            lines.append(f"    {state} : {state}<br/>{kind}{note}")
    if operator and _purgeable(spec):
        lines.append(f"    {PURGED_NODE} : purged<br/>deleted, audited, versions never reused")
    entered = {target for _, target in spec.edges}
    lines += [f"    [*] --> {state}" for state in sorted(spec.states) if state not in entered]
    for edge in _sorted_edges(spec):
        key = (edge.from_state, edge.to)
        label = _mermaid_label(
            edge,
            overlay.steps.get(key, []),
            overlay.counts.get(key),
            key in overlay.unreachable,
            moves,
            partial,
            _PAUSE_GUARD if key in guarded else None,
        )
        lines.append(f"    {edge.from_state} --> {edge.to} : {label}")
    for key in overlay.off_table(spec):
        label = _mermaid_label(None, overlay.steps.get(key, []), overlay.counts.get(key), False)
        lines.append(f"    {key[0]} --> {key[1]} : {label}")
    if operator:
        age = _age(spec.data.retention.after_ms)
        lines += [
            f"    {state} --> {PURGED_NODE} : purge (operator) older than {age}"
            for state in _purgeable(spec)
        ]
    lines += [f"    {state} --> [*]" for state in kinds["terminal"]]
    if operator:
        for state in sorted({edge.from_state for edge in _claim_edges(spec)}):
            lines += [
                f"    note left of {state}",
                "        pause / resume (operator) - a tenant, an application or a definition",
                f"        closes the claim gate [{_PAUSE_GUARD}]",
                "        in-flight work runs on, deadlines run",
                "    end note",
            ]
    for kind in KIND_ORDER:
        if kinds[kind]:
            lines.append(f"    classDef {kind} {_MERMAID_STYLE[kind]}")
    for kind in KIND_ORDER:
        if kinds[kind]:
            lines.append(f"    class {','.join(kinds[kind])} {kind}")
    marked = sorted(overlay.never_at_rest - set(kinds["transient"]))
    if marked:
        lines.append(f"    class {','.join(marked)} transient")
    if operator and _purgeable(spec):
        lines.append(f"    classDef purged {_MERMAID_PURGED}")
        lines.append(f"    class {PURGED_NODE} purged")
    return "\n".join(lines) + "\n"


def write_diagrams(
    spec: Spec,
    out_dir: str | Path,
    *,
    formats: Collection[str] = ("dot", "svg", "mermaid"),
    name: str | None = None,
    unreachable_edges: Collection[tuple[str, str]] = (),
    never_at_rest: Collection[str] = (),
    history: Sequence[Event] = (),
    observed_counts: Mapping[tuple[str, str], int] | None = None,
    partial: bool = False,
    view: str = "table",
) -> list[Path]:
    """Write the diagram of `spec` into `out_dir` in each of `formats`; return the paths.

    Files are named `<name><suffix>` (`name` defaults to the spec's name; the
    suffixes are in `FORMATS`: `.dot`, `.svg`, `.png`, `.mmd`) and returned
    in the order of `FORMATS`. Everything is rendered before anything is
    written, so a missing `dot` (`DiagramError`) leaves the directory as it
    was. The files are written whole or not at all: each goes to a new file
    beside its target, and only when every one is written are they moved
    over the targets (a symlink is followed; a file replaced keeps its mode).
    A target that cannot be written (a directory or another non-file in the
    way, a folder that cannot be made or written in) is `DIAGRAM_WRITE_FAILED`
    naming it, and then no file is replaced and no folder is left made.
    `view` is `diagram_graph`'s.
    """
    _check_view(view)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise _invalid(f"unknown format(s) {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    stem = name or spec.data.spec.name
    dot = diagram_dot(
        spec,
        unreachable_edges=unreachable_edges,
        never_at_rest=never_at_rest,
        history=history,
        observed_counts=observed_counts,
        name=stem,
        partial=partial,
        view=view,
    )
    outputs: dict[str, bytes] = {}
    for fmt in FORMATS:
        if fmt not in formats:
            continue
        if fmt == "dot":
            outputs[fmt] = dot.encode("utf-8")
        elif fmt == "mermaid":
            mermaid = diagram_mermaid(
                spec,
                unreachable_edges=unreachable_edges,
                never_at_rest=never_at_rest,
                history=history,
                observed_counts=observed_counts,
                partial=partial,
                view=view,
            )
            outputs[fmt] = mermaid.encode("utf-8")
        else:
            outputs[fmt] = render(dot, "svg" if fmt == "svg" else "png")
    directory = Path(out_dir)
    files = {directory / f"{stem}{FORMATS[fmt]}": data for fmt, data in outputs.items()}
    _write_whole(directory, files)
    return list(files)


def _write_failed(path: Path, reason: str) -> DiagramError:
    return DiagramError("DIAGRAM_WRITE_FAILED", f"cannot write {path}: {reason}")


def _write_whole(directory: Path, files: Mapping[Path, bytes]) -> None:
    """Write every file of `files` (all in `directory`, made if absent) whole, or none of them."""
    made: list[Path] = []
    scratches: dict[Path, Path] = {}
    where = directory
    try:
        if directory.exists() and not directory.is_dir():
            raise DiagramError(
                "DIAGRAM_WRITE_FAILED", f"cannot write into {directory}: it is not a directory"
            )
        for path in files:
            where = path
            if path.exists() and not path.is_file():
                kind = "a directory" if path.is_dir() else "not a regular file"
                raise _write_failed(path, f"it is {kind}")
        where = directory
        made = [folder for folder in (directory, *directory.parents) if not folder.exists()]
        directory.mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            where = path
            target = Path(os.path.realpath(path))
            # Short, so that any name a target may have leaves room for it.
            scratch = target.parent / f".{target.name[:32]}.{secrets.token_hex(4)}"
            # Created as `open` creates files (0666 less the umask); a replaced file's mode kept.
            handle = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            scratches[target] = scratch
            with os.fdopen(handle, "wb") as out:
                if target.is_file():
                    os.fchmod(out.fileno(), stat.S_IMODE(target.stat().st_mode))
                out.write(data)
    except OSError as exc:
        # Nothing was replaced yet: take back the new files, then the folders made (deepest first).
        for scratch in scratches.values():
            with contextlib.suppress(OSError):
                scratch.unlink()
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise _write_failed(where, exc.strerror or str(exc)) from None
    for target, scratch in scratches.items():
        os.replace(scratch, target)
