"""`workwarden inspect`, `list` and `stats`: a store's workloads as readable tables.

And the progress lines long commands print where no terminal shows a bar.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import CAPS, request
from support import authority as authority_over
from workwarden.cli import main
from workwarden.cli.progress import Progress
from workwarden.cli.stats import duration
from workwarden.statemachine import Timeouts
from workwarden.statemachine.spec import load_spec
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
    summary = lines[1 : lines.index("")]
    fields = dict(line.strip().split("  ", 1) for line in summary)
    fields = {name: value.strip() for name, value in fields.items()}
    assert lines[0] == f"workload {wid}"
    assert fields["state"] == "CHECKPOINTED (active)"
    assert fields["version"] == "7, contract 2"
    assert fields["created"] == "1970-01-01T00:00:10.000Z (10000)"
    assert fields["claim"].startswith("worker-b, token 2, claim_")
    assert fields["lease until"] == "1970-01-01T00:00:23.000Z (23000)"
    assert fields["attempts"] == "2 of 3 (max_attempts 3 + 0 operator re-arms), retries 0"
    assert fields["deadlines"] == "execution 60000 ms"
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
    assert lines[1].split()[:6] == [
        _workload_id(), "CHECKPOINTED", "5", "2/3", "7", "1970-01-01T00:00:10.000Z",
    ]  # fmt: skip
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


def test_list_keeps_the_workloads_in_the_state_asked_for(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "--store", url, "--state", "READY", "t", "app"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == [_workload_id("queued")]
    assert lines[-1] == "1 workload(s)"
    assert main(["list", "--store", url, "--state", "SUCCEEDED", "t", "app"]) == 0
    assert capsys.readouterr().out == (
        "no workloads in state SUCCEEDED for tenant t, application app\n"
    )


def test_list_walks_a_scope_a_page_at_a_time(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--store", url, "--limit", "1", "t", "app"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[0] == _workload_id()
    assert lines[-2] == "1 workload(s)"
    assert lines[-1].startswith("next page: --limit 1 --after ")
    after = lines[-1].split()[-1]
    # The page after, kept to READY: the option for the page after it is printed too.
    assert main(["list", "--store", url, "--limit", "1", "--after", after, "t", "app"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[0] == _workload_id("queued")
    last = lines[-1].split()[-1]
    assert main(["list", "--store", url, "--limit", "1", "--after", last, "t", "app"]) == 0
    assert capsys.readouterr().out == "no workloads on this page for tenant t, application app\n"
    assert main(["list", "--store", url, "--limit", "2", "t", "app"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "next page: --limit 2 --after " + last
    assert main(["list", "--store", url, "--limit", "1", "--state", "READY", "t", "app"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "no workloads in state READY on this page for tenant t, application app",
        f"next page: --limit 1 --after {after}",
    ]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--limit", "0"], 2, "argument --limit: a page is 1 to 1000 workloads, not '0'"),
        (["--limit", "+3"], 2, "argument --limit: a page is 1 to 1000 workloads, not '+3'"),
        (["--after", "x"], 2, "list: --after continues a page; give --limit with it"),
        (["--limit", "3", "--after", "x"], 1, "after must be the `next` cursor"),
    ],
)
def test_a_bad_page_option_is_refused_naming_it(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    assert main(["list", "--store", url, *argv, "t", "app"]) == code
    assert message in capsys.readouterr().err


def test_an_unknown_state_is_a_usage_error_naming_the_states(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "--store", url, "--state", "DONE", "t", "app"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("WORKWARDEN_USAGE: workwarden list: argument --state: no state 'DONE'")
    assert "READY, CLAIMED" in err


def test_list_keeps_a_state_of_the_spec_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # PAUSED is a state of the pause example only: `--state PAUSED` needs its `--spec`.
    pause = Path(__file__).resolve().parents[1] / "specs" / "examples" / "pause.toml"
    store = SQLiteStore(tmp_path / "paused.sqlite3")
    try:
        warden = authority_over(store, load_spec(pause))
        held = warden.admit(request(), now=10_000).workload.workload_id
        warden.admit(request(idempotency_key="queued"), now=10_000)
        warden.operate(held, "pause", "ops", 11_000)
    finally:
        store.close()
    url = f"sqlite:///{tmp_path / 'paused.sqlite3'}"
    argv = ["list", "--store", url, "--state", "PAUSED"]
    assert main([*argv, "--spec", str(pause), "t", "app"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:-1]] == [[held, "PAUSED"]]
    assert main([*argv, "t", "app"]) == 2
    assert "a state of your own spec needs --spec FILE" in capsys.readouterr().err


def test_inspect_names_the_kind_of_a_state_of_the_spec_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    approval = Path(__file__).resolve().parents[1] / "specs" / "examples" / "approval.toml"
    store = SQLiteStore(tmp_path / "gated.sqlite3")
    try:
        held = authority_over(store, load_spec(approval)).admit(request(), now=10_000)
    finally:
        store.close()
    argv = ["inspect", "--store", f"sqlite:///{tmp_path / 'gated.sqlite3'}"]
    assert main([*argv, "--spec", str(approval), held.workload.workload_id]) == 0
    assert "  state          AWAITING_APPROVAL (held)\n" in capsys.readouterr().out


def test_errors_print_as_code_and_message(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["inspect", "--store", url, "no-such-workload"]) == 1
    assert capsys.readouterr().err.startswith("WORKLOAD_NOT_FOUND: no workload no-such-workload\n")
    monkeypatch.delenv("WORKWARDEN_STORE", raising=False)
    assert main(["list", "t", "app"]) == 1
    assert capsys.readouterr().err.startswith(
        "WORKLOAD_STORE_URL_INVALID: no store: give --store URL or set WORKWARDEN_STORE\n"
    )
    assert main(["inspect", "--store", "ftp://example", "x"]) == 1
    assert capsys.readouterr().err.startswith(
        "WORKLOAD_STORE_URL_INVALID: unknown store URL scheme 'ftp'"
    )


def test_reading_a_store_never_creates_or_changes_its_file(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.sqlite3"
    assert main(["list", "--store", str(missing), "t", "app"]) == 1
    assert capsys.readouterr().err.startswith(f"WORKLOAD_STORE_NOT_FOUND: no store at {missing}")
    assert not missing.exists()
    path = Path(url.removeprefix("sqlite://"))
    before = path.read_bytes()
    assert main(["list", "--store", url, "t", "app"]) == 0
    assert main(["inspect", "--store", url, _workload_id()]) == 0
    assert path.read_bytes() == before


def test_stats_counts_each_scope_by_state_and_names_the_longest_waiting_ready_work(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", "--store", url, "--now", "70500"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "workloads by state at 1970-01-01T00:01:10.500Z (70500)"
    assert lines[1].split() == [
        "TENANT", "APPLICATION", "TOTAL", "READY", "CHECKPOINTED", "OLDEST", "READY",
    ]  # fmt: skip
    assert lines[2].split()[:6] == ["t", "app", "2", "1", "1", "1m"]
    assert f"({_workload_id('queued')}, since 1970-01-01T00:00:10.500Z (10500))" in lines[2]
    assert lines[3].split()[:5] == ["t", "other", "1", "1", "0"]
    assert lines[-1] == "3 workload(s) in 2 scope(s): READY 2, CHECKPOINTED 1"


def test_stats_as_json_for_one_tenant_and_application(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["stats", "--store", url, "--tenant", "t", "--application", "app", "--json"]
    assert main([*argv, "--now", "20000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {
        "now": 20_000,
        "total": 2,
        "by_state": {"CHECKPOINTED": 1, "READY": 1},
        "scopes": [
            {
                "tenant": "t",
                "application": "app",
                "total": 2,
                "by_state": {"CHECKPOINTED": 1, "READY": 1},
                "oldest_ready": {
                    "workload_id": _workload_id("queued"),
                    "since": 10_500,
                    "age_ms": 9_500,
                },
            }
        ],
    }
    assert main(["stats", "--store", url, "--tenant", "nobody"]) == 0
    assert capsys.readouterr().out == "no workloads for tenant nobody\n"


@pytest.mark.parametrize(
    ("ms", "text"),
    [(250, "250 ms"), (9_500, "9.5s"), (61_000, "1m 01s"), (3_725_000, "1h 02m 05s"),
     (90_000_000, "1d 01h 00m")],
)  # fmt: skip
def test_an_age_reads_in_days_hours_minutes_and_seconds(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_progress_prints_periodic_plain_lines_where_there_is_no_terminal() -> None:
    out = io.StringIO()
    with Progress("importing", total=4, unit="lines", stream=out, every_s=0.0) as progress:
        for _ in range(4):
            progress.advance(note="reading")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("importing: 1 of 4 lines (25%), 0 s")
    assert lines[-1].startswith("importing: 4 of 4 lines (100%), 0 s")
    assert lines[-1].endswith(", reading")
    assert len(lines) == 4
    quiet = io.StringIO()
    with Progress("short", stream=quiet) as progress:
        progress.advance()
    assert quiet.getvalue() == ""


def test_a_store_file_nobody_may_write_is_still_read(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The suite runs as root, whom file modes do not stop: the immutable
    # attribute refuses every write, root's included, as a read-only file or
    # file system refuses a user's.
    folder = tmp_path / "readonly"
    folder.mkdir()
    copy = folder / "store.sqlite3"
    shutil.copyfile(url.removeprefix("sqlite://"), copy)
    before = copy.read_bytes()
    subprocess.run(["chattr", "+i", str(copy), str(folder)], check=True)
    try:
        assert main(["list", "--store", str(copy), "t", "app"]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "2 workload(s)"
        assert main(["stats", "--store", str(copy), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["total"] == 3
        assert main(["export", "--store", str(copy)]) == 0
        exported = capsys.readouterr().out
        assert len(exported.splitlines()) == 3
        dump = tmp_path / "export.jsonl"
        dump.write_text(exported, encoding="ascii")
        assert main(["import", "--store", str(copy), str(dump)]) == 1
        assert capsys.readouterr().err.startswith("WORKLOAD_STORE_UNUSABLE: ")
    finally:
        subprocess.run(["chattr", "-i", str(copy), str(folder)], check=True)
    assert copy.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["store.sqlite3"]


def test_audit_prints_every_write_in_commit_order_and_filters_by_workload(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wid = _workload_id()
    assert main(["audit", "--store", url, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["sequence"] for r in records] == list(range(1, len(records) + 1))
    mine = [r for r in records if r["key"] == wid]
    assert [r["operation"] for r in mine] == [
        "admit",
        "claim",
        "start",
        "recover_expired",
        "claim",
        "start",
        "checkpoint",
    ]
    assert [r["version"] for r in mine] == list(range(1, 8))
    assert mine[4]["worker"] == "worker-b"
    assert mine[4]["fencing_token"] == 2
    assert main(["audit", "--store", url, "--workload", wid, "--after", "3", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "audit records, oldest first"
    assert lines[1].split()[:5] == ["SEQ", "AT", "KEY", "VERSION", "OPERATION"]
    # The instant takes two columns of text: ISO-8601, then the milliseconds in brackets.
    assert [line.split()[5] for line in lines[2:]] == ["recover_expired", "claim"]
    assert main(["audit", "--store", url, "--workload", "workload_none"]) == 0
    assert capsys.readouterr().out == "no audit records of workload_none\n"


def test_a_workloads_own_text_is_shown_as_text_each_row_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A handler's failure message is the handler's text: line breaks, escape sequences and
    # square brackets (`list[int]`, rich's markup) are shown as they are, never obeyed.
    message = "expected list[int]\n[/x] \x1b[2J done"
    with SQLiteStore(tmp_path / "store.db") as store:
        authority = authority_over(store)
        wid = authority.admit(request(), now=10_000).workload.workload_id
        claim = authority.claim(wid, "w1", CAPS, now=11_000, lease_ms=5_000)
        authority.fail(wid, claim.fence, "timeout", message, now=12_000)
    url = str(tmp_path / "store.db")
    shown = "expected list[int]\\n[/x] \\x1b[2J done"
    assert main(["inspect", "--store", url, wid]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert f"  last failure   timeout: {shown}" in out.splitlines()
    assert any(
        line.endswith(f"FAILED  -        1970-01-01T00:00:12.000Z (12000)  {shown}")
        for line in out.splitlines()
    )
    # On a terminal, drawn by rich: the same text, not taken for markup.
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["inspect", "--store", url, wid]) == 0
    out = capsys.readouterr().out
    assert "\x1b[2J" not in out
    assert shown in out


def test_an_id_with_control_characters_is_echoed_escaped_on_one_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A C0 control character makes it no name (WORKLOAD_INVALID, as `Authority.get`
    # refuses it); a C1 one may stand in a name, and is echoed as its escape.
    assert main(["inspect", "--store", url, "x\x1b[2Jy\x85z"]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "\x85" not in err
    assert err.splitlines()[0].startswith("WORKLOAD_INVALID: WORKLOAD_ID: ")
    assert main(["inspect", "--store", url, "x\x85z"]) == 1
    err = capsys.readouterr().err
    assert "\x85" not in err
    assert err.splitlines()[0] == "WORKLOAD_NOT_FOUND: no workload x\\x85z"
