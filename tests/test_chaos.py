"""Processes killed at random against one store: nothing lost, nothing done twice, no stale write.

`workwarden chaos` runs small here on SQLite and on PostgreSQL: four worker processes
(two of them batched: `claim_many` and `report_many`, on the same store as the two that
make one call per workload) and a sweeper, one of them killed with SIGKILL every few
hundred milliseconds and replaced, then a drain and an audit of the whole store and its
audit log. The audit itself is held to account too: handed a store with a write
committed under a stale fence, a missing audit record or a lost acknowledged completion,
it says so. And a named regression test: a call whose instant is earlier than the
workload's last change writes nothing (the chaos run found histories going back in time
without it).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

import pg
from pg import postgres_database, postgres_url
from support import CAPS, request
from support import authority as make_authority
from workwarden.chaos import ChaosConfig, ChaosReport, print_report, run_chaos
from workwarden.chaos.audit import audit_store, claim_ending_operations
from workwarden.chaos.workers import COUNTERS, _Slot
from workwarden.cli import main
from workwarden.statemachine import Workload, WorkloadError, default_spec
from workwarden.statemachine.errors import CONFLICT, INVALID, OUTCOME_UNKNOWN, STORAGE_FAILURE
from workwarden.storage import AuditRecord, MemoryStore, SQLiteStore, Store
from workwarden.storage.pgserver import PrivateServer

WORKLOADS = 1_200
KILL_SECONDS = 12.0


def _assert_clean(report: ChaosReport) -> None:
    printed = io.StringIO()
    print_report(report, printed)
    assert report.violations == [], printed.getvalue()
    assert report.drained, printed.getvalue()
    figures = report.figures
    assert figures is not None
    assert report.admitted == WORKLOADS
    assert figures.documents == WORKLOADS
    assert sum(figures.outcomes.values()) == WORKLOADS
    # The run really did break things, and the authority really did recover.
    assert sum(report.kills.values()) >= 10
    assert report.unexpected_exits == 0
    assert figures.recoveries > 0
    assert figures.claims > figures.completions > WORKLOADS // 2
    assert figures.acknowledged > 0
    # The batched workers took part: claims by claim_many, reports by report_many.
    assert report.counters["batch_claims"] > 0
    assert report.counters["batch_reports"] > 0
    assert report.counters["claims"] > report.counters["batch_claims"]
    assert "violations   0" in printed.getvalue()


def test_killed_workers_on_sqlite_lose_nothing_and_finish_nothing_twice(tmp_path: Path) -> None:
    # NORMAL is as safe as FULL against a killed process (only a power cut
    # tells them apart), and keeps the disk's sync latency out of the run.
    url = f"sqlite://{tmp_path / 'chaos.db'}?synchronous=NORMAL"
    config = ChaosConfig(url=url, workloads=WORKLOADS, seconds=KILL_SECONDS, drain_seconds=60)
    _assert_clean(run_chaos(config))


@pytest.mark.postgres
def test_killed_workers_on_postgresql_lose_nothing_and_finish_nothing_twice() -> None:
    with postgres_database() as dsn:
        config = ChaosConfig(
            url=postgres_url(dsn), workloads=WORKLOADS, seconds=KILL_SECONDS, drain_seconds=60
        )
        _assert_clean(run_chaos(config))


def test_the_chaos_command_prints_its_figures_and_exits_0_when_nothing_is_violated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path / 'small.db'}?synchronous=NORMAL"
    status = main(["chaos", "--store", url, "--workloads", "30", "--seconds", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    for label in ("(2 batched)", "kills", "drain        done", "outcomes", "audit", "batches"):
        assert label in out
    assert "violations   0" in out


def test_a_run_with_more_batched_workers_than_workers_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'never.db'}"
    for batched in (5, -1):
        with pytest.raises(WorkloadError) as refused:
            run_chaos(ChaosConfig(url=url, workloads=5, workers=4, batched_workers=batched))
        assert refused.value.code == INVALID
    assert not (tmp_path / "never.db").exists()


def test_the_chaos_command_refuses_a_store_that_already_holds_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "used.db"
    with closing(SQLiteStore(path)) as store:
        make_authority(store).admit(request(), 10_000)
    status = main(["chaos", "--store", f"sqlite://{path}", "--workloads", "5", "--seconds", "1"])
    assert status == 1
    assert capsys.readouterr().err.startswith(
        "WORKLOAD_STORE_UNUSABLE: a chaos run needs an empty store"
    )


@pytest.mark.parametrize(
    ("option", "status"),
    [
        (("--batched-workers", "5"), 1),
        (("--batched-workers", "-1"), 2),
        (("--workers", "65"), 2),
        (("--workloads", "1000001"), 2),
        (("--seconds", "86401"), 2),
        (("--drain-seconds", "1e300"), 2),
    ],
)
def test_the_chaos_command_refuses_a_run_it_cannot_make_before_it_creates_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: tuple[str, ...], status: int
) -> None:
    path = tmp_path / "never.db"
    assert main(["chaos", "--store", str(path), "--workloads", "5", *option]) == status
    (first, *_) = capsys.readouterr().err.splitlines()
    assert first.startswith("WORKLOAD_INVALID: " if status == 1 else "WORKWARDEN_USAGE: "), first
    assert list(tmp_path.iterdir()) == []


# -- no process outlives its run ------------------------------------------------------


def _session(sid: int) -> list[int]:
    """The processes of session `sid` that are still running (not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _until_gone(sid: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _chaos_process(tmp_path: Path, url: str, *options: str) -> subprocess.Popen[str]:
    """`workwarden chaos` in a session of its own, its temporary files under tmp_path/tmp."""
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "WORKWARDEN_STORE"}
    return subprocess.Popen(
        [sys.executable, "-m", "workwarden", "chaos", "--store", url, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env | {"TMPDIR": str(tmp_path / "tmp")},
        start_new_session=True,
    )


def _read_until(stream: IO[str] | None, text: str) -> None:
    assert stream is not None
    for line in stream:
        if text in line:
            return
    raise AssertionError(f"the run ended before printing {text!r}")


@pytest.fixture
def chaos_processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Runs started by a test; whatever is left of their sessions is killed at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        for pid in _session(process.pid):
            os.kill(pid, signal.SIGKILL)
        process.kill()
        process.communicate()


@pytest.mark.parametrize(
    ("how", "status"), [("SIGTERM", 143), ("Ctrl-C", 130), ("SIGKILL", -signal.SIGKILL)]
)
def test_a_chaos_run_stopped_in_its_kill_phase_leaves_no_process_running(
    tmp_path: Path, chaos_processes: list[subprocess.Popen[str]], how: str, status: int
) -> None:
    url = f"sqlite://{tmp_path / 'chaos.db'}?synchronous=NORMAL"
    run = _chaos_process(tmp_path, url, "--workloads", "2000", "--seconds", "60")
    chaos_processes.append(run)
    _read_until(run.stdout, "admitted")
    time.sleep(2.0)
    assert len(_session(run.pid)) >= 6, "the run, its workers and its sweeper"
    if how == "Ctrl-C":
        os.killpg(run.pid, signal.SIGINT)  # as a terminal sends it: to every process
    else:
        run.send_signal(getattr(signal, how))
    _, err = run.communicate(timeout=60)
    assert run.returncode == status, err
    assert "Traceback" not in err, err
    assert _until_gone(run.pid, 15.0) == [], "processes of the run still running"
    if how != "SIGKILL":  # a killed run cannot remove its folder
        assert list((tmp_path / "tmp").iterdir()) == []


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """A PostgreSQL server of this test's own, so stopping it disturbs no other test."""
    with pg.own_server() as server:
        yield server


@pytest.mark.postgres
@pytest.mark.parametrize("when", ["admitted", "kill phase over"])
def test_a_chaos_run_whose_postgresql_server_goes_away_says_nothing_was_audited(
    tmp_path: Path,
    private_server: PrivateServer,
    chaos_processes: list[subprocess.Popen[str]],
    when: str,
) -> None:
    with psycopg.connect(private_server.dsn("postgres"), autocommit=True) as admin:
        admin.execute("CREATE DATABASE chaos")
    run = _chaos_process(
        tmp_path,
        postgres_url(private_server.dsn("chaos")),
        *("--workloads", "3000", "--seconds", "2", "--drain-seconds", "60"),
    )
    chaos_processes.append(run)
    _read_until(run.stdout, when)
    # In the kill phase, or while the run drains the store it has opened again.
    time.sleep(1.0)
    private_server.stop()
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("chaos: ")]
    assert lines[0].startswith(
        "WORKLOAD_STORAGE_FAILURE: the store failed while the run drained and audited it,"
        " so nothing was audited: "
    ), err
    assert _until_gone(run.pid, 15.0) == [], "processes of the run still running"
    assert list((tmp_path / "tmp").iterdir()) == []


# -- the audit is not vacuous --------------------------------------------------------


def _history_with_a_recovery(store: Store) -> tuple[str, str]:
    """Claimed by w1, recovered, claimed by w2 and completed; returns (id, w1's claim id)."""
    authority = make_authority(store)
    wid = authority.admit(request(), 10_000).workload.workload_id
    first = authority.claim(wid, "w1", CAPS, 20_000, 1_000)
    authority.start(wid, first.fence, 20_001)
    assert authority.recover_expired(25_000) == [wid]
    second = authority.claim(wid, "w2", CAPS, 26_000, 1_000)
    authority.start(wid, second.fence, 26_001)
    authority.complete(wid, second.fence, "r-1", {"ok": True}, 26_002)
    return wid, first.claim_id


def _forge(store: Store, key: str, **changes: Any) -> AuditRecord:
    """Commit the current document again, as if a writer had written it with `changes`."""
    doc = store.read(key)
    assert doc is not None
    record = AuditRecord(
        transaction_id="tx_forged",
        key=key,
        version=0,
        actor="w1",
        operation="complete",
        tenant=doc.index.tenant,
        application=doc.index.application,
        at=27_000,
        digest="0" * 64,
        worker="w1",
        attempt=None,
        fencing_token=1,
    )
    record = replace(record, **changes)
    store.write(key, doc.document, doc.index, doc.version, record)
    return record


def test_the_audit_passes_a_store_the_authority_wrote() -> None:
    store = MemoryStore()
    wid, _ = _history_with_a_recovery(store)
    figures, violations = audit_store(store, default_spec(), [wid], [(wid, 2, "r-1")])
    assert violations == []
    assert (figures.claims, figures.recoveries, figures.completions) == (2, 1, 1)


def test_the_audit_flags_a_write_committed_under_a_stale_fence() -> None:
    store = MemoryStore()
    wid, _ = _history_with_a_recovery(store)
    forged = _forge(store, wid)
    _, violations = audit_store(store, default_spec(), [wid])
    stale = [v for v in violations if v.property == "no_write_from_a_stale_fence"]
    assert len(stale) == 1
    assert "stale fence" in stale[0].message
    assert stale[0].record is not None
    assert stale[0].record.transaction_id == forged.transaction_id
    # The report shows the workload's history and the record.
    assert "READY -> CLAIMED" in str(stale[0])
    assert "fencing_token 1" in str(stale[0])


def test_the_audit_flags_a_document_whose_last_record_is_not_its_digest() -> None:
    store = MemoryStore()
    wid, _ = _history_with_a_recovery(store)
    _forge(store, wid, actor="system.recovery", operation="recover_expired", fencing_token=None)
    _, violations = audit_store(store, default_spec(), [wid])
    assert [(v.property, v.message) for v in violations] == [
        ("audit_matches_the_documents", "the last record's digest is not version 8's")
    ]


def test_the_audit_flags_lost_work_and_an_acknowledged_completion_not_stored() -> None:
    store = MemoryStore()
    wid, _ = _history_with_a_recovery(store)
    _, violations = audit_store(
        store, default_spec(), [wid, "workload_missing"], [(wid, 1, "r-by-the-stale-worker")]
    )
    messages = sorted((v.property, v.message) for v in violations)
    assert messages == [
        (
            "acknowledged_completions_are_stored",
            "completion r-by-the-stale-worker under token 1 was acknowledged but is not stored",
        ),
        ("admitted_work_is_stored", "admitted but not in the store"),
    ]


def test_the_audit_flags_work_left_unfinished() -> None:
    store = MemoryStore()
    wid = make_authority(store).admit(request(), 10_000).workload.workload_id
    _, violations = audit_store(store, default_spec(), [wid])
    assert [(v.property, v.message) for v in violations] == [
        ("work_finishes_after_draining", "not terminal after draining: READY")
    ]


def test_the_operations_that_end_a_claim_are_read_from_the_spec() -> None:
    assert claim_ending_operations(default_spec()) == {
        "complete",
        "confirm_cancel",
        "enforce_deadlines",
        "fail",
        "recover_expired",
        "timeout",
    }


# -- regression: a lagging instant --------------------------------------------------


def test_a_call_whose_instant_is_before_the_last_change_writes_nothing() -> None:
    # Found by the chaos run: a claimer read its clock, the sweeper recovered
    # the workload at a later instant, and the claim was then committed with
    # the earlier instant, so the history went back in time.
    store = MemoryStore()
    authority = make_authority(store)
    wid = authority.admit(request(), 10_000).workload.workload_id
    authority.claim(wid, "w1", CAPS, 20_000, 1_000)
    assert authority.recover_expired(25_000) == [wid]
    before = (store.read(wid), list(store.audit_log()))

    with pytest.raises(WorkloadError) as refused:
        authority.claim(wid, "w2", CAPS, 24_000, 1_000)
    assert refused.value.code == CONFLICT
    assert refused.value.details == {"workload_id": wid, "now": 24_000, "updated_at": 25_000}
    assert authority.claim_next("t", "app", "w2", CAPS, 24_000, 1_000) is None
    assert (store.read(wid), list(store.audit_log())) == before

    # A call at or after the last change goes ahead, and the history is valid.
    authority.claim(wid, "w2", CAPS, 25_000, 1_000)
    workload = authority.get(wid)
    assert [event.at for event in workload.execution_history] == sorted(
        event.at for event in workload.execution_history
    )


def test_a_lagging_instant_still_gets_answers_that_write_nothing() -> None:
    store = MemoryStore()
    authority = make_authority(store)
    admitted = authority.admit(request(), 10_000)
    wid = admitted.workload.workload_id
    claim = authority.claim(wid, "w1", CAPS, 20_000, 60_000)
    authority.start(wid, claim.fence, 20_001)
    authority.complete(wid, claim.fence, "r-1", {"ok": True}, 20_002)
    # A replayed admission and a replayed completion, at instants before the last change.
    assert authority.admit(request(), 9_000).created is False
    assert authority.complete(wid, claim.fence, "r-1", {"ok": True}, 20_000).result_id == "r-1"
    assert authority.recover_expired(15_000) == []
    doc = store.read(wid)
    assert doc is not None
    assert Workload.model_validate_json(doc.document).state == "SUCCEEDED"


@pytest.mark.parametrize("code", [STORAGE_FAILURE, OUTCOME_UNKNOWN])
def test_a_call_the_store_failed_or_could_not_confirm_counts_as_a_store_failure(
    code: str,
) -> None:
    # claim_many's reply lost after its claims were sent is WORKLOAD_OUTCOME_UNKNOWN: the
    # run's figures count it among the store failures, as a storage failure is.
    shared = [0] * len(COUNTERS)
    _Slot(shared, 0).refused(WorkloadError(code, "the store went away"))
    assert dict(zip(COUNTERS, shared, strict=True))["store_failures"] == 1
