"""The runtime core names no state: which states play which role is the spec's to say.

The modules at the top of statemachine/ (the spec loader aside, which reads
the names from the file) must not spell a state of the shipped spec as a
string. Docstrings, f-string messages and `__all__` entries are not code
that decides, so they are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

from workwarden.statemachine import default_spec

CORE = Path(__file__).resolve().parents[1] / "statemachine"
#: The spec loader and the models of the spec file (which document the shipped names).
LOADER = {"spec.py", "spec_model.py", "spec_checks.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                ids.add(id(value))
    return ids


def _exempt(tree: ast.AST) -> set[int]:
    """The string constants that are documentation, messages or export lists."""
    ids = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            ids.update(id(part) for part in ast.walk(node))
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            ids.update(id(part) for part in ast.walk(node.value))
    return ids


def state_names_spelled_in(path: Path, states: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exempt = _exempt(tree)
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in states
        and id(node) not in exempt
    ]


def test_no_module_of_the_runtime_core_spells_a_state_name() -> None:
    states = set(default_spec().states)
    found = [
        hit
        for path in sorted(CORE.glob("*.py"))
        if path.name not in LOADER
        for hit in state_names_spelled_in(path, states)
    ]
    assert found == []


def test_the_check_sees_a_state_name_where_one_is_spelled(tmp_path: Path) -> None:
    module = tmp_path / "decides.py"
    module.write_text(
        '"""READY in a docstring is fine."""\n'
        '__all__ = ["READY"]\n'
        'def f(state):\n    return state == "READY" or f"{state} is not RUNNING"\n',
        encoding="utf-8",
    )
    assert state_names_spelled_in(module, {"READY", "RUNNING"}) == ["decides.py:4: 'READY'"]
