"""The runtime's benchmark harness still runs: once, at tiny sizes, on SQLite, into a scratch dir.

Not a measurement (the figures are in `bench/RESULTS.md`, with the command).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_runtime_harness_writes_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    try:
        harness = importlib.import_module("bench.runtime")
        status = harness.main(
            ["--idle-s", "0.2", "--latency-n", "2", "--no-postgres", "--out", str(tmp_path)]
        )
    finally:
        for name in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
            del sys.modules[name]
    assert status == 0
    result = json.loads((tmp_path / "results" / "runtime.json").read_text(encoding="utf-8"))
    rows = {(row["backend"], row["mode"]): row for row in result["rows"]}
    assert set(rows) == {("sqlite", "wake-ups"), ("sqlite", "poll")}
    assert all(row["latency_n"] == 2 for row in rows.values())
