"""Retention: finished work older than the spec's age is purged, audited; dead letters stay.

On every backend: a purge deletes terminal workloads whose last change is old
enough, keeps the `[retention] keep` states and younger work, records an audit
record for each, exports each first when asked, never reuses a version when a
purged key is admitted again, and the `workwarden purge` command does the same.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support import CAPS, VERIFIER, request, store_snapshot
from workwarden.cli import main
from workwarden.statemachine import Authority, Fence, RetryPolicy, WorkloadError, errors
from workwarden.statemachine.commands import AdmitCommand, AdmitReply
from workwarden.statemachine.properties.history import validate_workload
from workwarden.storage import SQLiteStore, Store, StoredDocument

NOW = 10_000
DAY = 86_400_000
LEASE = 30_000


def _finish(authority: Authority, key: str, now: int) -> str:
    workload_id = authority.admit(request(idempotency_key=key), now).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, now, LEASE)
    authority.start(workload_id, claim.fence, now)
    authority.complete(workload_id, claim.fence, f"result-{key}", {"ok": True}, now + 1)
    return workload_id


def _dead_letter(authority: Authority, key: str, now: int) -> str:
    workload_id = authority.admit(
        request(idempotency_key=key, retry_policy=RetryPolicy(max_attempts=1)), now
    ).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, now, LEASE)
    authority.start(workload_id, claim.fence, now)
    authority.fail(workload_id, claim.fence, "validation", "bad input", now + 1)
    return workload_id


def test_a_purge_deletes_old_finished_work_and_keeps_dead_letters_and_young_work(
    authority: Authority, store: Store
) -> None:
    old = _finish(authority, "old", NOW)
    dead = _dead_letter(authority, "dead", NOW)
    young = _finish(authority, "young", NOW + 40 * DAY)
    waiting = authority.admit(request(idempotency_key="waiting"), NOW).workload.workload_id
    assert authority.get(dead).state == "DEAD_LETTER"
    exported: list[StoredDocument] = []
    report = authority.purge(NOW + 45 * DAY, actor="ops", export=exported.append)
    assert report.purged == [old]
    assert (report.kept, report.young) == (1, 1)
    assert [doc.key for doc in exported] == [old]
    with pytest.raises(WorkloadError) as gone:
        authority.get(old)
    assert gone.value.code == errors.NOT_FOUND
    for kept in (dead, young, waiting):
        authority.get(kept)
    (record,) = [r for r in store.audit_log() if r.operation == "purge"]
    assert (record.key, record.actor, record.at) == (old, "ops", NOW + 45 * DAY)
    # A later purge with a shorter age takes the young one too; dead letters stay.
    assert authority.purge(NOW + 45 * DAY, older_than_ms=DAY).purged == [young]
    authority.get(dead)


def test_a_dry_run_writes_nothing_and_a_bad_age_is_refused(
    authority: Authority, store: Store
) -> None:
    old = _finish(authority, "old", NOW)
    before = store_snapshot(store)
    assert authority.purge(NOW + 45 * DAY, dry_run=True).purged == [old]
    for bad in (-1, 1.5, "30d", True):
        with pytest.raises(WorkloadError) as refused:
            authority.purge(NOW + 45 * DAY, older_than_ms=bad)  # type: ignore[arg-type]
        assert refused.value.code == errors.INVALID
    # Read by truth, a dry_run of None or 0 purged for real; an export that
    # cannot be called failed only once it was handed a document.
    for field, value in (("dry_run", None), ("dry_run", 0), ("dry_run", "no"), ("export", 5)):
        with pytest.raises(WorkloadError) as refused:
            authority.purge(NOW + 45 * DAY, **{field: value})  # type: ignore[arg-type]
        assert refused.value.code == errors.INVALID
        assert refused.value.details is not None
        assert refused.value.details["field"] == field
    assert store_snapshot(store) == before


def test_a_purged_key_admitted_again_never_reuses_a_version(
    authority: Authority, store: Store
) -> None:
    old = _finish(authority, "again", NOW)
    last = store.read(old)
    assert last is not None
    authority.purge(NOW + 45 * DAY)
    assert store.read(old) is None
    again = authority.admit(request(idempotency_key="again"), NOW + 46 * DAY)
    assert again.created
    assert again.workload.workload_id == old
    fresh = store.read(old)
    assert fresh is not None
    assert fresh.version > last.version + 1, "past the purge's own audited version"
    # Its result id was freed with it: the new attempt may record it again.
    claim = authority.claim(old, "w", CAPS, NOW + 46 * DAY, LEASE)
    authority.start(old, claim.fence, NOW + 46 * DAY)
    authority.complete(old, claim.fence, "result-again", {"ok": 2}, NOW + 46 * DAY + 1)


def _purged_then_admitted_again(authority: Authority, worker: str) -> tuple[str, Fence]:
    """A workload whose first claim went stale, finished by another worker, purged and
    admitted again under its key; its id, and the first worker's stale fence."""
    workload_id = authority.admit(request(idempotency_key="again"), NOW).workload.workload_id
    stale = authority.claim(workload_id, worker, CAPS, NOW, LEASE).fence
    assert authority.recover_expired(NOW + LEASE) == [workload_id]
    claim = authority.claim(workload_id, "other", CAPS, NOW + LEASE + 1, LEASE)
    authority.start(workload_id, claim.fence, NOW + LEASE + 1)
    authority.complete(workload_id, claim.fence, "result-1", {"ok": 1}, NOW + LEASE + 2)
    assert authority.purge(NOW + 45 * DAY).purged == [workload_id]
    again = authority.admit(request(idempotency_key="again"), NOW + 46 * DAY)
    assert again.created
    return workload_id, stale


@pytest.mark.parametrize("remember", [256, 0])
def test_a_purged_key_admitted_again_never_issues_a_fence_of_its_purged_namesake(
    store: Store, remember: int
) -> None:
    """A worker whose claim on the purged workload went stale cannot act on the new one.

    Before, the new workload counted its tokens from 1 again, so the first
    worker's next claim carried the very fence it held on the purged one
    (claim ids derive from workload, token and worker): its stale handler
    then started and completed the new work with the old work's result.
    """
    authority = Authority(store, grants=VERIFIER, remember=remember)
    workload_id, stale = _purged_then_admitted_again(authority, "w1")
    fresh = authority.claim(workload_id, "w1", CAPS, NOW + 46 * DAY + 1, LEASE)
    assert fresh.fence.token > stale.token
    assert fresh.fence != stale
    for call in (
        lambda: authority.start(workload_id, stale, NOW + 46 * DAY + 2),
        lambda: authority.heartbeat(workload_id, stale, NOW + 46 * DAY + 2, LEASE),
        lambda: authority.complete(workload_id, stale, "old", {"stale": 1}, NOW + 46 * DAY + 2),
    ):
        with pytest.raises(WorkloadError) as refused:
            call()
        assert refused.value.code == errors.STALE_FENCE
    authority.start(workload_id, fresh.fence, NOW + 46 * DAY + 2)
    done = authority.complete(workload_id, fresh.fence, "result-2", {"ok": 2}, NOW + 46 * DAY + 3)
    assert done.output == {"ok": 2}
    # Its history says where its tokens start, and holds as any other does.
    workload = authority.get(workload_id)
    assert workload.execution_history[0].evidence["fencing_floor"] == str(
        workload.fencing_token - 1
    )
    assert validate_workload(authority.spec, workload) is None


def test_an_admission_decided_unaware_of_a_purge_creates_nothing(
    authority: Authority, store: Store
) -> None:
    """A create that expects "never written" of a key purged since is a conflict, not a write.

    An admission decided before the key's first life and committed after its
    purge would otherwise bring the key back with its tokens from 1.
    """
    held = authority.prepare(AdmitCommand(request=request(idempotency_key="again")), NOW)
    workload_id = _finish(authority, "again", NOW)
    assert authority.purge(NOW + 45 * DAY).purged == [workload_id]
    before = store_snapshot(store)
    with pytest.raises(WorkloadError) as refused:
        held.commit()
    assert refused.value.code == errors.CONFLICT
    assert store_snapshot(store) == before
    # Decided again, now knowing the purge, it is admitted past the purged tokens.
    again = authority.admit(request(idempotency_key="again"), NOW + 46 * DAY)
    assert again.created
    assert again.workload.fencing_token > 1


def test_a_purged_key_admitted_again_in_a_batch_continues_its_tokens(
    authority: Authority, store: Store
) -> None:
    old = _finish(authority, "again", NOW)
    first_token = authority.get(old).fencing_token
    authority.purge(NOW + 45 * DAY)
    (again, new) = authority.admit_many(
        [request(idempotency_key="again"), request(idempotency_key="new")], NOW + 46 * DAY
    )
    assert isinstance(again, AdmitReply)
    assert isinstance(new, AdmitReply)
    assert again.created
    assert new.created
    assert again.workload.fencing_token > first_token
    assert new.workload.fencing_token == 0
    claim = authority.claim(old, "w", CAPS, NOW + 46 * DAY, LEASE)
    assert claim.fence.token == again.workload.fencing_token + 1


def test_the_purge_command_exports_then_deletes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        warden = Authority(store, grants=VERIFIER)
        old = _finish(warden, "old", NOW)
        _dead_letter(warden, "dead", NOW)
    out = tmp_path / "purged.jsonl"
    now = str(NOW + 45 * DAY)
    assert main(["purge", "--store", str(db), "--dry-run", "--now", now]) == 0
    assert capsys.readouterr().out.split() == [old]
    argv = ["purge", "--store", str(db), "--export", str(out), "--now", now]
    assert main(argv) == 0
    assert "purged 1 workload(s); kept 1" in capsys.readouterr().err
    (line,) = out.read_text(encoding="ascii").splitlines()
    exported = json.loads(line)
    assert exported["key"] == old
    assert exported["document"]["state"] == "SUCCEEDED"
    with SQLiteStore(db) as store:
        assert store.read(old) is None
    assert main(["purge", "--store", str(db), "--older-than", "soon"]) == 2


def test_an_export_that_cannot_be_written_stops_the_purge_and_keeps_the_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        old = _finish(Authority(store, grants=VERIFIER), "old", NOW)
        before = store_snapshot(store)
    now = str(NOW + 45 * DAY)
    # The export file may grow by 100 bytes at most (the process's file size limit),
    # so the first workload's line cannot be written: a real write failing mid-purge.
    out = tmp_path / "purged.jsonl"
    out.write_bytes(b"\n" * max(256 * 1024, db.stat().st_size * 4))
    limit = out.stat().st_size + 100

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = ["purge", "--store", str(db), "--export", str(out), "--now", now]
    purge = subprocess.run(
        [sys.executable, "-m", "workwarden", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_files,
    )
    assert purge.returncode == 1, purge.stderr
    (first, *_) = purge.stderr.splitlines()
    assert first.startswith(f"WORKWARDEN_OUTPUT_UNWRITABLE: --export {out}: cannot write")
    assert "the 0 workload(s) written before were purged, this one and the rest are kept" in first
    with SQLiteStore(db) as store:
        assert store.read(old) is not None
        assert store_snapshot(store) == before


@pytest.mark.parametrize("target", ["/dev/null", "/dev/full", "fifo", "directory", "missing/x"])
def test_an_export_to_what_is_not_a_file_is_refused_before_anything_is_purged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        _finish(Authority(store, grants=VERIFIER), "old", NOW)
        before = store_snapshot(store)
    path = target if target.startswith("/") else str(tmp_path / target)
    if target == "fifo":
        os.mkfifo(path)
    elif target == "directory":
        os.mkdir(path)
    argv = ["purge", "--store", str(db), "--export", path, "--now", str(NOW + 45 * DAY)]
    assert main(argv) == 1
    (first, *_) = capsys.readouterr().err.splitlines()
    assert first.startswith(f"WORKWARDEN_OUTPUT_UNWRITABLE: cannot write --export {path}: ")
    with SQLiteStore(db) as store:
        assert store_snapshot(store) == before


@pytest.mark.parametrize(
    "refusal",
    [
        ["--store", "{missing}"],
        ["--store", "{db}", "--now", "-5"],
        ["--store", "{db}", "--tenant", ""],
        ["--store", "{db}", "--actor", "a\x01"],
    ],
)
def test_a_refused_purge_leaves_no_export_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], refusal: list[str]
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        _finish(Authority(store, grants=VERIFIER), "old", NOW)
    out = tmp_path / "purged.jsonl"
    names = {"{missing}": str(tmp_path / "nosuch.db"), "{db}": str(db)}
    argv = ["purge", *(names.get(arg, arg) for arg in refusal), "--export", str(out)]
    assert main(argv) != 0
    assert capsys.readouterr().err.startswith(("WORKLOAD_", "WORKWARDEN_USAGE: "))
    assert not out.exists()


def test_a_purge_that_purges_nothing_leaves_no_export_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        _finish(Authority(store, grants=VERIFIER), "old", NOW)
    out = tmp_path / "purged.jsonl"
    assert main(["purge", "--store", str(db), "--export", str(out), "--now", str(NOW + 1)]) == 0
    assert "purged 0 workload(s)" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "text", ["\uff11\uff10d", "10 d 5", "99999999999999999999999d", "-1", "1e3"]
)
def test_a_duration_that_is_not_ascii_whole_units_within_range_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    db = tmp_path / "work.db"
    SQLiteStore(db).close()
    assert main(["purge", "--store", str(db), "--older-than", text]) == 2
    assert capsys.readouterr().err.startswith("WORKWARDEN_USAGE: ")


def test_a_dry_run_makes_no_export_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        old = _finish(Authority(store, grants=VERIFIER), "old", NOW)
    out = tmp_path / "purged.jsonl"
    argv = ["purge", "--store", str(db), "--dry-run", "--export", str(out)]
    assert main([*argv, "--now", str(NOW + 45 * DAY)]) == 0
    assert capsys.readouterr().out.split() == [old]
    assert not out.exists()


def test_a_purge_run_again_after_a_failure_exports_each_workload_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each workload is exported before it is deleted: a purge stopped between the two (a
    # store failure here; SIGTERM or a crash alike) leaves its line in the file and the
    # workload in the store. Run again, it must not append the same line a second time,
    # which would make the file one `import` refuses (a workload on two lines).
    from workwarden.storage import StoreFailure

    db = tmp_path / "work.db"
    with SQLiteStore(db) as store:
        warden = Authority(store, grants=VERIFIER)
        first, second = _finish(warden, "one", NOW), _finish(warden, "two", NOW)
    out = tmp_path / "purged.jsonl"
    argv = ["purge", "--store", str(db), "--export", str(out), "--now", str(NOW + 45 * DAY)]
    purge = SQLiteStore.purge

    def failing(self: SQLiteStore, *args: object, **kwargs: object) -> bool:
        raise StoreFailure("the disk went away")

    monkeypatch.setattr(SQLiteStore, "purge", failing)
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_STORAGE_FAILURE: ")
    assert len(out.read_text(encoding="ascii").splitlines()) == 1
    # A line cut short (a kill mid-write) is not glued to the next one written.
    cut = '{"document":{"contract_vers'
    with out.open("a", encoding="ascii") as file:
        file.write(cut)
    monkeypatch.setattr(SQLiteStore, "purge", purge)
    assert main(argv) == 0
    assert "purged 2 workload(s)" in capsys.readouterr().err
    lines = out.read_text(encoding="ascii").splitlines()
    assert lines[1] == cut
    del lines[1]
    out.write_text("".join(line + "\n" for line in lines), encoding="ascii")
    assert sorted(json.loads(line)["key"] for line in lines) == sorted([first, second])
    assert main(["import", "--store", str(tmp_path / "archive.db"), "--create", str(out)]) == 0
    assert "imported 2 workload(s)" in capsys.readouterr().out
