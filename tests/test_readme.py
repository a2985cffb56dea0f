"""The README's example runs as written, and its first two commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_example_takes_a_workload_from_admission_to_success() -> None:
    blocks = _python_blocks()
    assert blocks, "the README has a Python example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    assert namespace["done"].state == "SUCCEEDED"  # type: ignore[attr-defined]


def test_the_readme_opens_with_the_demo_and_the_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = [line for line in first_block.group(1).splitlines() if line.strip()]
    assert "workwarden demo" in commands[0]
    assert "python -m pytest" in commands[1]
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "\npython -m pytest\n" in ci
    assert "\nworkwarden demo\n" in ci
