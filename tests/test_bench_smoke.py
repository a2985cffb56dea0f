"""The benchmark harnesses still run: each once, at tiny sizes, writing to a scratch directory.

Not a measurement: the sizes are far too small for the figures to mean
anything. Each harness runs in this process (its `main(argv)`), against the
test run's private PostgreSQL server where it needs one (`--server-dsn`),
and must write its results file (and its plot, when matplotlib is installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pg import server

ROOT = Path(__file__).resolve().parent.parent
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAS_PROCRASTINATE = importlib.util.find_spec("procrastinate") is not None


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Import `bench.NAME` from the repository (it is not installed)."""
    monkeypatch.syspath_prepend(str(ROOT))

    def load(name: str) -> ModuleType:
        return importlib.import_module(f"bench.{name}")

    yield load
    for name in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
        del sys.modules[name]


def _common(out: Path) -> list[str]:
    plot = [] if HAS_MATPLOTLIB else ["--no-plot"]
    return ["--reps", "1", "--max-load", "1000", "--out", str(out), *plot]


def _written(out: Path, name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / "results" / f"{name}.json").read_text())
    assert result["machine"]["nproc"] >= 1
    if HAS_MATPLOTLIB:
        assert (out / "plots" / f"{name}.png").stat().st_size > 0
    return result


def _admin_dsn() -> str:
    return server().dsn("postgres")


@pytest.mark.postgres
def test_the_storage_limit_harness_runs_on_every_backend(bench: Any, tmp_path: Path) -> None:
    bench("cas").main(
        [
            "--backends",
            "memory,sqlite-normal,postgres",
            "--lifecycles",
            "4",
            "--server-dsn",
            _admin_dsn(),
            "--dir",
            str(tmp_path),
            *_common(tmp_path),
        ]
    )
    result = _written(tmp_path, "cas")
    assert [row["backend"] for row in result["rows"]] == ["memory", "sqlite-normal", "postgres"]
    for row in result["rows"]:
        assert row["raw_writes_per_s"]["median"] > 0
        assert row["authority"]["lifecycles_per_s"]["median"] > 0
        assert row["reading"]["ratio"] > 0


@pytest.mark.postgres
def test_the_growth_harness_runs_on_both_backends(bench: Any, tmp_path: Path) -> None:
    bench("growth").main(
        [
            "--sizes",
            "30,60",
            "--claims",
            "2",
            "--sweeps",
            "1",
            "--server-dsn",
            _admin_dsn(),
            "--dir",
            str(tmp_path),
            *_common(tmp_path),
        ]
    )
    result = _written(tmp_path, "growth")
    for backend in ("sqlite", "postgres"):
        for size in ("30", "60"):
            point = result["series"][backend][size]
            assert all(point["ms"][name]["median"] > 0 for name in point["ms"])
            assert point["rss_after_mib"]["median"] > 0


@pytest.mark.postgres
def test_the_procrastinate_harness_runs_the_workwarden_side(bench: Any, tmp_path: Path) -> None:
    systems = ["workwarden-reading"]
    if HAS_PROCRASTINATE:
        systems.insert(0, "procrastinate")
    bench("procrastinate").main(
        [
            "--jobs",
            "12",
            "--workers",
            "2",
            "--systems",
            ",".join(systems),
            "--server-dsn",
            _admin_dsn(),
            *_common(tmp_path),
        ]
    )
    result = _written(tmp_path, "procrastinate")
    assert list(result["systems"]) == systems
    for system in systems[-1:]:
        assert result["systems"][system]["first_try_claim_rate"]["median"] > 0


def test_the_procrastinate_harness_says_how_to_install_procrastinate(
    bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "procrastinate", None)  # as if not installed
    with pytest.raises(SystemExit, match=r"pip install -e \"\.\[bench\]\""):
        bench("procrastinate").main(["--systems", "procrastinate", *_common(tmp_path)])


@pytest.mark.postgres
def test_the_throughput_harness_drains_and_checks_every_side(bench: Any, tmp_path: Path) -> None:
    sides = ["workwarden", "workwarden-batched", "workwarden-batched-claim-starts"]
    if importlib.util.find_spec("pgqueuer") is not None:
        sides.insert(0, "pgqueuer")
    if HAS_PROCRASTINATE:
        sides.insert(0, "procrastinate")
    sizes = ["--jobs", "8", "--workers", "1", "--batch", "3", "--chunk", "5"]
    sizes += ["--warmup-jobs", "4"]  # run and checked, but not among the runs
    sqlite = ["--sqlite-lifecycles", "20", "--sqlite-batch", "10"]
    server_dsn = ["--server-dsn", _admin_dsn()]
    bench("throughput").main(
        [*sizes, *sqlite, "--sides", ",".join(sides), *server_dsn, *_common(tmp_path)]
    )
    result = _written(tmp_path, "throughput")
    assert sorted(result["drain"]) == sorted(sides)
    for side in sides:
        (run,) = result["drain"][side]["runs"]
        assert run["checked"] == {"rows": 8, "done": 8, "once": 8}
        assert run["drain_per_s"] > 0
        assert run["admission_per_s"] > 0
    runs = {side: result["drain"][side]["runs"][0] for side in sides}
    assert runs["workwarden-batched"]["starts_reported"] == 8
    assert runs["workwarden-batched-claim-starts"]["starts_reported"] == 0
    assert result["sqlite"]["batched / raw"]["median"] > 0


@pytest.mark.skipif(
    importlib.util.find_spec("workwarden.statemachine.check.checker") is None,
    reason="the model checker module is not there",
)
def test_the_checker_harness_runs(bench: Any, tmp_path: Path) -> None:
    bench("checker").main(["--max-states", "200", *_common(tmp_path)])
    result = _written(tmp_path, "checker")
    assert result["states"] > 0


def test_the_stateful_suite_harness_runs_a_suite(bench: Any, tmp_path: Path) -> None:
    suite = tmp_path / "test_tiny.py"
    suite.write_text("def test_nothing():\n    pass\n")
    bench("stateful").main(["--files", str(suite), *_common(tmp_path)])
    result = _written(tmp_path, "stateful")
    assert result["runs"][0]["rc"] == 0


def test_the_fairness_harness_reads_the_shares_from_the_audit_log(
    bench: Any, tmp_path: Path
) -> None:
    sizes = ["--flood", "60", "--calm", "6", "--workers", "2", "--batch", "4"]
    server_dsn = ["--server-dsn", _admin_dsn()]
    assert bench("fairness").main([*sizes, *server_dsn, *_common(tmp_path)]) == 0
    rows = _written(tmp_path, "fairness")["rows"]
    assert sorted((r["store"], r["policy"]) for r in rows) == sorted(
        (store, policy)
        for store in ("sqlite", "postgresql")
        for policy in ("round_robin", "weighted", "list_order")
    )
    by_policy = {(row["store"], row["policy"]): row for row in rows}
    for row in rows:
        assert row["exactly_once"] is True
        assert row["jobs"] == 66
        if row["policy"] == "list_order":
            # The flood is older: asked first, it is drained before the calm tenant.
            assert row["claims_until_calm_drained"] == 66
        else:
            # A fair policy serves the calm tenant while the flood still waits, however
            # the two claimers' batches interleave (the share itself moves with them).
            unfair = by_policy[(row["store"], "list_order")]
            assert row["claims_until_calm_drained"] < unfair["claims_until_calm_drained"]
            assert row["calm_share"] > unfair["calm_share"]
