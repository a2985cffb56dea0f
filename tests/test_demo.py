"""`workwarden demo`: the README's first command runs, checks every history, and is repeatable.

Run small (60 workloads) so the suite stays fast; the default run is the
same code with more workloads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from workwarden.cli import main
from workwarden.demo import run_demo
from workwarden.storage import SQLiteStore


def _run(directory: Path, seed: int) -> dict[str, object]:
    store = SQLiteStore(directory / "demo.sqlite3", synchronous="NORMAL")
    try:
        return run_demo(store=store, seed=seed, workloads=60).summary()
    finally:
        store.close()


def test_the_demo_runs_every_workload_to_rest_and_finds_every_history_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["demo", "--workloads", "60", "--seed", "11", "--out-dir", str(tmp_path)])
    assert status == 0
    out = capsys.readouterr().out
    assert "workwarden demo: 60 workloads for 2 tenants, 8 threads" in out
    assert "every history valid against the spec: 60 of 60" in out
    for heading in ("outcome", "decision by rule", "attempts (claims)", "conflicts lost"):
        assert heading in out
    dot = tmp_path / "demo-observed.dot"
    assert f"diagram with observed counts: {dot}" in out
    assert "\u00d7" in dot.read_text("utf-8"), "edges carry their observed counts"


def test_the_same_seed_gives_the_same_summary_whatever_the_threads_do(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _run(tmp_path / "a", seed=5)
    second = _run(tmp_path / "b", seed=5)
    assert first == second
    outcomes = first["outcomes"]
    assert isinstance(outcomes, dict)
    assert sum(outcomes.values()) == 60
    assert set(outcomes) <= {"SUCCEEDED", "DEAD_LETTER", "CANCELLED"}
    assert first["invalid_histories"] == []


def test_the_demo_exercises_failures_recoveries_and_the_operator(tmp_path: Path) -> None:
    summary = _run(tmp_path, seed=7)
    decisions = summary["decisions"]
    assert isinstance(decisions, dict)
    assert decisions["claim claimable"] == summary["attempts"]
    assert any(key.startswith("failure ") for key in decisions)
    assert any(key.startswith("recovery ") for key in decisions)
    assert summary["crashes"] or summary["lease_losses"]
    edges = summary["edges"]
    assert isinstance(edges, dict)
    assert edges["READY->CLAIMED"] == summary["attempts"]


def test_a_demo_on_a_store_that_holds_work_is_refused_and_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "busy.db"
    with SQLiteStore(db) as store:
        run_demo(store=store, seed=3, workloads=5)
        before = sorted((doc.key, doc.version) for doc in store.scan())
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    capsys.readouterr()  # what the first run logged

    assert main(["demo", "--store", str(db), "--workloads", "5"]) == 1

    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("WORKLOAD_STORE_UNUSABLE: the demo needs an empty store")
    with SQLiteStore(db) as store:
        assert sorted((doc.key, doc.version) for doc in store.scan()) == before
    assert list(temporary.iterdir()) == []
    assert main(["demo", "--store", "bogus://x", "--workloads", "5"]) == 1
    assert list(temporary.iterdir()) == []


def test_a_refused_demo_leaves_none_of_the_folders_its_out_dir_would_have_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "busy.db"
    with SQLiteStore(db) as store:
        run_demo(store=store, seed=3, workloads=5)
    out_dir = tmp_path / "diagrams" / "observed"
    capsys.readouterr()  # what the first run logged

    assert main(["demo", "--store", str(db), "--out-dir", str(out_dir)]) == 1

    assert capsys.readouterr().err.startswith("WORKLOAD_STORE_UNUSABLE: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy.db"]


def _demo(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "WORKWARDEN_STORE"}
    return subprocess.Popen(
        [sys.executable, "-m", "workwarden", "demo", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env | {"TMPDIR": str(tmp_path / "tmp")},
    )


def _until(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the demo did not get under way"
        time.sleep(0.05)


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_demo_stopped_midway_leaves_no_temporary_folder(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    (tmp_path / "tmp").mkdir()
    demo = _demo(tmp_path, "--workloads", "3000")
    made = tmp_path / "tmp"
    _until(lambda: any(made.glob("*/demo.sqlite3")), 60)
    time.sleep(0.5)
    demo.send_signal(sig)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == status, err
    assert "Traceback" not in err
    assert list(made.iterdir()) == []


def test_a_demo_stopped_midway_removes_the_store_it_created_and_runs_again_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tmp").mkdir()
    db = tmp_path / "demo.db"
    out_dir = tmp_path / "out"
    demo = _demo(tmp_path, "--workloads", "3000", "--store", str(db), "--out-dir", str(out_dir))
    _until(db.exists, 60)
    time.sleep(0.5)
    demo.send_signal(signal.SIGINT)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 130, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]

    assert main(["demo", "--workloads", "5", "--store", str(db), "--out-dir", str(out_dir)]) == 0
    assert "every history valid against the spec: 5 of 5" in capsys.readouterr().out
