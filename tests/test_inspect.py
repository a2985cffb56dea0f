"""`workwarden inspect` and `workwarden list`: a store's workloads as readable tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import CAPS, request
from support import authority as authority_over
from workwarden.cli import main
from workwarden.statemachine import Timeouts
from workwarden.storage import SQLiteStore


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store with a running workload (lost once, then reclaimed) and a queued one."""
    store = SQLiteStore(tmp_path / "store.sqlite3")
    try:
        authority = authority_over(store)
        wid = authority.admit(
            request(priority=5, timeouts=Timeouts(execution_ms=60_000)), now=10_000
        ).workload.workload_id
        lost = authority.claim(wid, "worker-a", CAPS, now=11_000, lease_ms=1_000)
        authority.start(wid, lost.fence, now=11_500)
        authority.recover_expired(now=12_000)
        claim = authority.claim(wid, "worker-b", CAPS, now=13_000, lease_ms=10_000)
        authority.start(wid, claim.fence, now=13_100)
        authority.checkpoint(wid, claim.fence, {"step": 1}, now=13_200)
        authority.admit(request(idempotency_key="queued"), now=10_500)
        authority.admit(request(idempotency_key="elsewhere", application_id="other"), now=10_600)
    finally:
        store.close()
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


def _workload_id(key: str = "one", application: str = "app") -> str:
    from workwarden.statemachine import workload_id_for

    return workload_id_for(request(idempotency_key=key, application_id=application))


def test_inspect_shows_state_claim_attempts_and_history(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wid = _workload_id()
    assert main(["inspect", "--store", url, wid]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"workload {wid}"
    assert "  state          CHECKPOINTED (active)" in lines
    assert "  version        7, contract 2" in lines
    assert any(line.startswith("  claim          worker-b, token 2, claim_") for line in lines)
    assert "  attempts       2 of 3 (max_attempts 3 + 0 operator re-arms), retries 0" in lines
    assert "  deadlines      execution 60000 ms" in lines
    assert "attempts (2)" in lines
    assert any("worker-a" in line and "WORKER_LOST" in line for line in lines)
    assert "history (8 events; AT is ms since admission)" in lines
    recovering = next(line for line in lines if " RECOVERING " in line and "+2000" in line)
    assert "system.recovery (system)" in recovering
    assert "recovery_reason=lease_expired" in recovering


def test_list_shows_a_tenant_and_applications_workloads_by_priority(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "--store", url, "t", "app"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "WORKLOAD", "STATE", "PRIORITY", "ATTEMPTS", "VERSION", "CREATED", "UPDATED", "DEF",
    ]  # fmt: skip
    assert lines[1].split()[:5] == [_workload_id(), "CHECKPOINTED", "5", "2/3", "7"]
    assert lines[2].split()[:4] == [_workload_id("queued"), "READY", "0", "0/3"]
    assert lines[-1] == "2 workload(s)"
    assert main(["list", "--store", url, "t", "nothing"]) == 0
    assert capsys.readouterr().out == "no workloads for tenant t, application nothing\n"


def test_the_store_may_come_from_the_environment(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKWARDEN_STORE", url)
    assert main(["list", "t", "other"]) == 0
    assert _workload_id("elsewhere", "other") in capsys.readouterr().out


def test_errors_print_as_code_and_message(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["inspect", "--store", url, "no-such-workload"]) == 1
    assert capsys.readouterr().err == "WORKLOAD_NOT_FOUND: no workload no-such-workload\n"
    monkeypatch.delenv("WORKWARDEN_STORE", raising=False)
    assert main(["list", "t", "app"]) == 1
    assert capsys.readouterr().err == (
        "WORKLOAD_INVALID: no store: give --store URL or set WORKWARDEN_STORE\n"
    )
    assert main(["inspect", "--store", "ftp://example", "x"]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_INVALID: --store: unknown store URL scheme")
