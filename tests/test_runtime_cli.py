"""`workwarden worker` and `workwarden sweeper` as real processes on a SQLite file.

The app is a module written into the test's directory and named with
`--app MODULE:ATTR`, as a user's would be; work is admitted through an
authority on the same file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import CAPS, SIGNER, authority, grant_for, request
from workwarden.statemachine.spec import Spec, load_spec
from workwarden.storage import SQLiteStore

APP = textwrap.dedent(
    """
    import time
    from workwarden import App

    app = App()

    @app.handler("send", needs=("email:send",))
    def send(job):
        time.sleep(job.input.get("sleep", 0))
        return {"sent": job.input["id"]}
    """
)


CLAIM_STARTS = Path(__file__).resolve().parent.parent / "specs" / "examples" / "claim_starts.toml"


def _admit(path: Path, count: int, sleep: float = 0.0, spec: Spec | None = None) -> list[str]:
    store = SQLiteStore(path)
    try:
        auth = authority(store, spec)
        now = int(time.time() * 1000)
        grant = SIGNER.sign(grant_for(expires_at=now + 3_600_000))
        return [
            auth.admit(
                request(
                    idempotency_key=f"k{i}",
                    input={"id": i, "sleep": sleep},
                    authorization_snapshot=grant,
                    capability_snapshot=CAPS,
                ),
                now,
            ).workload.workload_id
            for i in range(count)
        ]
    finally:
        store.close()


def _states(path: Path) -> list[str]:
    store = SQLiteStore(path)
    try:
        return sorted(w.state for w in authority(store).list("t", "app"))
    finally:
        store.close()


def _worker(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    (tmp_path / "tasks.py").write_text(APP, encoding="utf-8")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workwarden",
            "worker",
            "--store",
            f"sqlite:///{tmp_path / 'store.db'}",
            "--app",
            "tasks:app",
            "--tenant",
            "t",
            "--application",
            "app",
            *extra,
        ],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )


def _events(stderr: str, name: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.split(" ", 1)[0] == name]


def test_a_worker_process_runs_every_workload_to_success_and_exits_when_idle(
    tmp_path: Path,
) -> None:
    _admit(tmp_path / "store.db", 6)
    worker = _worker(tmp_path, "--until-idle", "--concurrency", "3")
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert _states(tmp_path / "store.db") == ["SUCCEEDED"] * 6
    claimed = _events(stderr, "claimed")
    assert len(claimed) == 6
    assert all("attempt=1" in line and "token=" in line for line in claimed)
    assert len(_events(stderr, "completed")) == 6
    assert _events(stderr, "stopped")


def test_a_worker_of_every_scope_drains_every_tenant_it_finds(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    _admit(path, 3)
    store = SQLiteStore(path)
    try:
        auth = authority(store)
        now = int(time.time() * 1000)
        grant = SIGNER.sign(grant_for(tenant="u", expires_at=now + 3_600_000))
        for i in range(2):
            auth.admit(
                request(
                    idempotency_key=f"u{i}",
                    tenant_id="u",
                    input={"id": i},
                    authorization_snapshot=grant,
                    capability_snapshot=CAPS,
                ),
                now,
            )
    finally:
        store.close()
    (tmp_path / "tasks.py").write_text(APP, encoding="utf-8")
    command = [sys.executable, "-m", "workwarden", "worker", "--store", f"sqlite:///{path}"]
    done = subprocess.run(
        [*command, "--app", "tasks:app", "--all-scopes", "--until-idle"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert _states(path) == ["SUCCEEDED"] * 3
    store = SQLiteStore(path)
    try:
        assert [w.state for w in authority(store).list("u", "app")] == ["SUCCEEDED"] * 2
    finally:
        store.close()
    unnamed = subprocess.run(
        [*command, "--app", "tasks:app", "--until-idle"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert unnamed.returncode == 2
    assert unnamed.stderr.startswith("WORKWARDEN_USAGE: worker: name --tenant and --application")


def test_a_worker_decides_under_the_spec_it_is_given(tmp_path: Path) -> None:
    # Under the claim-starts example a claim starts the attempt in its own commit, so a
    # worker deciding under it reports no start; under the shipped spec it would.
    _admit(tmp_path / "store.db", 4, spec=load_spec(CLAIM_STARTS))
    worker = _worker(tmp_path, "--until-idle", "--spec", str(CLAIM_STARTS))
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    store = SQLiteStore(tmp_path / "store.db")
    try:
        operations = [record.operation for record in store.audit_log()]
    finally:
        store.close()
    assert operations.count("complete") == 4
    assert "start" not in operations
    assert _states(tmp_path / "store.db") == ["SUCCEEDED"] * 4


def test_a_spec_with_a_remote_warden_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(APP, encoding="utf-8")
    command = ["worker", "--app", "tasks:app", "--tenant", "t", "--application", "app"]
    remote = ["--warden", "http://127.0.0.1:9", "--token", "t0ken", "--spec", str(CLAIM_STARTS)]
    worker = subprocess.run(
        [sys.executable, "-m", "workwarden", *command, *remote],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    stderr = worker.stderr
    assert worker.returncode == 2, stderr
    assert "--spec goes with --store" in stderr


@pytest.mark.parametrize(
    ("flags", "window"),
    [((), "batch_window_ms=2"), (("--no-batch",), "batch=off")],
    ids=["batch", "no-batch"],
)
def test_the_batch_switch_and_window_reach_the_worker(
    tmp_path: Path, flags: tuple[str, ...], window: str
) -> None:
    _admit(tmp_path / "store.db", 4)
    worker = _worker(tmp_path, "--until-idle", "--concurrency", "2", *flags)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert _states(tmp_path / "store.db") == ["SUCCEEDED"] * 4
    (started,) = _events(stderr, "started")
    assert window in started.split()


@pytest.mark.parametrize("value", ["-1", "1.5", "soon"])
def test_a_batch_window_that_is_not_whole_milliseconds_is_a_usage_error(
    tmp_path: Path, value: str
) -> None:
    worker = _worker(tmp_path, "--batch-window-ms", value)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 2
    assert stderr.startswith("WORKWARDEN_USAGE: ")
    assert "--batch-window-ms" in stderr


def _loading(process: subprocess.Popen[str]) -> None:
    """Wait until `process` is loading the command line: the library's pydantic is mapped
    (the entry point itself imports none of it), most of a second before it could run."""
    maps = Path(f"/proc/{process.pid}/maps")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError):
            if "pydantic_core" in maps.read_text(encoding="utf-8"):
                return
        time.sleep(0.001)
    raise AssertionError("the command never began loading its library")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_loads_stops_a_worker_quietly_with_status_0(
    tmp_path: Path, sig: signal.Signals
) -> None:
    _admit(tmp_path / "store.db", 1)
    worker = _worker(tmp_path)
    _loading(worker)
    worker.send_signal(sig)
    _, stderr = worker.communicate(timeout=60)
    assert (worker.returncode, stderr) == (0, "")
    assert _states(tmp_path / "store.db") == ["READY"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("command", ["worker", "sweeper"])
def test_a_signal_while_the_parser_loads_the_subcommands_stops_quietly_with_status_0(
    tmp_path: Path, sig: signal.Signals, command: str
) -> None:
    # After the entry point has loaded `workwarden.cli`, building the parser loads the
    # subcommands' modules (most of a second more) before the command has handlers of
    # its own: the signal is sent from inside that step, so no timing decides the test.
    _admit(tmp_path / "store.db", 1)
    (tmp_path / "tasks.py").write_text(APP, encoding="utf-8")
    script = textwrap.dedent(
        f"""
        import os, workwarden.cli as cli
        from workwarden._launch import main
        build = cli.build_parser
        def build_parser():
            os.kill(os.getpid(), {int(sig)})
            return build()
        cli.build_parser = build_parser
        raise SystemExit(main())
        """
    )
    store = ["--store", f"sqlite:///{tmp_path / 'store.db'}"]
    app = ["--app", "tasks:app", "--tenant", "t", "--application", "app"]
    args = [command, *store, *(app if command == "worker" else [])]
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert _states(tmp_path / "store.db") == ["READY"]


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_another_command_loads_ends_it_with_the_signals_status(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    _admit(tmp_path / "store.db", 1)
    export = subprocess.Popen(
        [sys.executable, "-m", "workwarden", "export", "--store", str(tmp_path / "store.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _loading(export)
    export.send_signal(sig)
    out, err = export.communicate(timeout=60)
    assert (export.returncode, out, err) == (status, "", "")


def test_sigterm_lets_the_running_handler_finish_then_exits_zero(tmp_path: Path) -> None:
    _admit(tmp_path / "store.db", 1, sleep=1.5)
    worker = _worker(tmp_path, "--lease-ms", "1000")
    deadline = time.monotonic() + 30
    while _states(tmp_path / "store.db") != ["RUNNING"] and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert _states(tmp_path / "store.db") == ["SUCCEEDED"]
    assert _events(stderr, "stopping")
    assert _events(stderr, "completed")


def test_a_second_signal_exits_at_once_with_the_signals_status(tmp_path: Path) -> None:
    _admit(tmp_path / "store.db", 1, sleep=30)
    worker = _worker(tmp_path)
    deadline = time.monotonic() + 30
    while _states(tmp_path / "store.db") != ["RUNNING"] and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.send_signal(signal.SIGINT)
    time.sleep(0.3)
    worker.send_signal(signal.SIGINT)
    worker.communicate(timeout=30)
    assert worker.returncode == 130


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_exits_at_once_while_standard_error_is_not_read(
    tmp_path: Path, sig: int, status: int
) -> None:
    # A log reader that stopped reading: the worker blocks writing a line to a full pipe.
    # The second signal is how an operator ends it, and it must not wait for that pipe.
    _admit(tmp_path / "store.db", 1_000)
    worker = _worker(tmp_path, "--concurrency", "4")
    try:
        done, still = -1, 0
        deadline = time.monotonic() + 60
        while still < 4 and time.monotonic() < deadline:
            time.sleep(0.25)
            states = _states(tmp_path / "store.db")
            now_done = states.count("SUCCEEDED")
            still = still + 1 if now_done == done and now_done < len(states) else 0
            done = now_done
        assert still == 4, "the worker never blocked on its standard error"
        worker.send_signal(sig)
        time.sleep(0.5)
        worker.send_signal(sig)
        assert worker.wait(timeout=10) == status
    finally:
        worker.kill()
        worker.wait()
        assert worker.stderr is not None
        worker.stderr.close()


def test_a_sweeper_process_recovers_a_lease_a_killed_worker_left(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    [wid] = _admit(path, 1, sleep=30)
    worker = _worker(tmp_path, "--lease-ms", "500")
    deadline = time.monotonic() + 30
    while _states(path) != ["RUNNING"] and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.kill()
    worker.wait(timeout=30)
    sweeper = subprocess.run(
        [
            sys.executable,
            "-m",
            "workwarden",
            "sweeper",
            "--store",
            f"sqlite:///{path}",
            "--until-idle",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sweeper.returncode == 0, sweeper.stderr
    assert any(wid in line for line in _events(sweeper.stderr, "recovered"))
    assert _states(path) == ["READY"]


@pytest.mark.parametrize(
    ("module", "target", "said"),
    [
        ("boomtasks", "boomtasks:app", "importing boomtasks raised RuntimeError: boom"),
        ("brokentasks", "brokentasks:app", "importing brokentasks raised SyntaxError"),
        (None, "../tasks:app", "'../tasks' is not a module name"),
        ("exittasks", "exittasks:app", "importing exittasks raised SystemExit: 0"),
        ("halttasks", "halttasks:app", "importing halttasks raised Halt: halt"),
        (
            "mutetasks",
            "mutetasks:app",
            "importing mutetasks raised Mute: (its text could not be made: RuntimeError)",
        ),
    ],
    ids=["raises", "syntax-error", "a-path", "exits", "raises-a-base-exception", "mute"],
)
@pytest.mark.parametrize("command", ["worker", "scheduler"])
def test_an_app_module_that_cannot_be_imported_is_refused_with_a_coded_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    module: str | None,
    target: str,
    said: str,
    command: str,
) -> None:
    from workwarden.cli import main

    (tmp_path / "boomtasks.py").write_text("raise RuntimeError('boom')\n", encoding="utf-8")
    (tmp_path / "brokentasks.py").write_text("def (\n", encoding="utf-8")
    # A module that ends the process as it is imported (a script's `sys.exit`), or raises
    # an exception that is not an `Exception`, is refused as any other failed import.
    (tmp_path / "exittasks.py").write_text("import sys\nsys.exit(0)\n", encoding="utf-8")
    (tmp_path / "halttasks.py").write_text(
        "class Halt(BaseException): pass\nraise Halt('halt')\n", encoding="utf-8"
    )
    (tmp_path / "mutetasks.py").write_text(
        "class Mute(Exception):\n    def __str__(self):\n        raise RuntimeError\nraise Mute\n",
        encoding="utf-8",
    )
    SQLiteStore(tmp_path / "store.db").close()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command adds the directory
    store = ["--store", str(tmp_path / "store.db")]
    if command == "worker":
        argv = ["worker", *store, "--app", target, "--tenant", "t", "--application", "app"]
    else:
        argv = ["scheduler", *store, "--schedules", target, "--no-grant-signatures", "--once"]
    assert main(argv) == 1
    (line,) = capsys.readouterr().err.splitlines()
    option = "--app" if command == "worker" else "--schedules"
    assert line.startswith(f"WORKLOAD_INVALID: {option} {target}: {said}")
    if module is not None:
        assert module not in sys.modules


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--lease-ms", str(2**53 - 1)),
        ("--lease-ms", "9223372036854775807"),
        ("--batch-window-ms", "3600001"),
        ("--metrics-port", "70000"),
    ],
)
def test_an_out_of_range_worker_option_is_a_usage_error_before_it_starts(
    tmp_path: Path, option: str, value: str
) -> None:
    _admit(tmp_path / "store.db", 1)
    worker = _worker(tmp_path, "--until-idle", option, value)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 2
    (line,) = stderr.splitlines()
    assert line.startswith(f"WORKWARDEN_USAGE: workwarden worker: argument {option}: ")
    assert _states(tmp_path / "store.db") == ["READY"]


@pytest.mark.parametrize(
    ("command", "options", "said"),
    [
        ("worker", ["--concurrency", str(2**60)], "WORKLOAD_INVALID: concurrency "),
        ("worker", ["--lease-ms", "3"], "WORKLOAD_INVALID: batch_window_ms "),
        ("worker", ["--also-serve", "t"], "WORKLOAD_INVALID: each scope "),
        ("worker", ["--worker-id", "w" * 244], "WORKLOAD_INVALID: worker_id "),
        ("worker", ["--spec", "no-such.toml"], "WORKLOAD_SPEC_INVALID: "),
        ("worker", ["--metrics-port", "{busy}"], "WORKWARDEN_USAGE: --metrics-port "),
        ("sweeper", ["--tenant", ""], "WORKLOAD_INVALID: tenant"),
        ("sweeper", ["--spec", "no-such.toml"], "WORKLOAD_SPEC_INVALID: "),
        ("sweeper", ["--metrics-port", "{busy}"], "WORKWARDEN_USAGE: --metrics-port "),
    ],
)
def test_an_option_refused_with_create_leaves_no_store_behind(
    tmp_path: Path, command: str, options: list[str], said: str
) -> None:
    # Options the worker or sweeper itself refuses are refused before --create makes the
    # store: a first deployment whose command line is wrong does not leave an empty store
    # that the next, corrected, command would take as the real one.
    (tmp_path / "tasks.py").write_text(APP, encoding="utf-8")
    app = ["--app", "tasks:app", "--tenant", "t", "--application", "app"]
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        refused = subprocess.run(
            [
                sys.executable,
                "-m",
                "workwarden",
                command,
                "--store",
                f"sqlite:///{tmp_path / 'store.db'}",
                "--create",
                "--until-idle",
                *(app if command == "worker" else []),
                *(option.replace("{busy}", port) for option in options),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONPATH": ""},
        )
    line = refused.stderr.splitlines()[0]  # the coded line; the error's details follow
    assert line.startswith(said), refused.stderr
    assert "Traceback" not in refused.stderr
    assert refused.returncode == (2 if said.startswith("WORKWARDEN_USAGE") else 1)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tasks.py"]


def test_a_grace_of_zero_seconds_is_taken_and_the_work_still_drains(tmp_path: Path) -> None:
    _admit(tmp_path / "store.db", 2)
    worker = _worker(tmp_path, "--until-idle", "--grace-s", "0")
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert _states(tmp_path / "store.db") == ["SUCCEEDED", "SUCCEEDED"]


def test_a_worker_creates_its_store_only_when_asked_and_then_waits_for_work(
    tmp_path: Path,
) -> None:
    # The first command of a new deployment may be its worker: without --create it
    # is refused (the store URL may be mistyped), with it the store is made empty.
    refused = _worker(tmp_path, "--until-idle")
    _, stderr = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert "WORKLOAD_STORE_NOT_FOUND" in stderr
    assert "--create" in stderr
    assert not (tmp_path / "store.db").exists()
    created = _worker(tmp_path, "--until-idle", "--create")
    _, stderr = created.communicate(timeout=60)
    assert created.returncode == 0, stderr
    assert _states(tmp_path / "store.db") == []
    _admit(tmp_path / "store.db", 2)
    again = _worker(tmp_path, "--until-idle", "--create")
    _, stderr = again.communicate(timeout=60)
    assert again.returncode == 0, stderr
    assert _states(tmp_path / "store.db") == ["SUCCEEDED"] * 2
    sweeper = subprocess.run(
        [
            sys.executable,
            "-m",
            "workwarden",
            "sweeper",
            "--warden",
            "http://x",
            "--token",
            "t",
            "--create",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sweeper.returncode == 2
    assert "--create goes with --store" in sweeper.stderr


def test_the_postgresql_pools_warnings_are_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging

    from workwarden.cli.worker import _configure_logging

    _configure_logging()
    try:
        raise OSError("connection refused\nIs the server running?")
    except OSError:
        logging.getLogger("psycopg.pool").warning(
            "error connecting in 'workwarden':\nconnection failed", exc_info=True
        )
    logging.getLogger("psycopg.pool").info("not shown")
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        'library_log logger=psycopg.pool level=WARNING message="error connecting in'
        " 'workwarden': | connection failed (OSError: connection refused Is the server"
        ' running?)"'
    )
