"""A private PostgreSQL server for the suites, started the first time a test needs it.

pytest-postgresql refuses to run as root, and CI runs as root, so the suite
runs its own: the server binaries are found with `pg_config --bindir` or
under `/usr/lib/postgresql/*/bin`; `initdb --no-sync` makes a cluster in a
private temporary directory, run as the `postgres` OS user when the suite
runs as root (the server refuses root) and as the current user otherwise;
`postgres` itself is started directly, without durability (`fsync=off`),
listening only on a Unix socket in that directory. It is stopped, and the
directory removed, when the test run's interpreter exits; a small watchdog
process does it if that interpreter is killed instead.

Each test gets an empty database holding the store's schema: databases are
copied from a template once and then reused, emptied between tests with one
`DELETE` and a reset of the audit numbering (a couple of milliseconds, where
a fresh copy costs about 20 and dropping it about 60). A store cannot tell an
emptied database from a fresh one: no rows, audit numbering from 1.

Without server binaries the tests that need one are skipped, saying how to
install them; with `WORKWARDEN_REQUIRE_POSTGRES=1` they fail instead.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from workwarden.storage import Store, StoreError
from workwarden.storage.postgres import PostgresStore

__all__ = [
    "REQUIRE_ENV",
    "PostgresServer",
    "find_bindir",
    "postgres_database",
    "postgres_store",
    "server",
]

REQUIRE_ENV = "WORKWARDEN_REQUIRE_POSTGRES"
"""Set to 1 to fail, not skip, when no PostgreSQL server can be run."""

_INSTALL = "install the server binaries with `apt-get install postgresql`"
_TEMPLATE = "workwarden_template"
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 20.0

# Stops the server when the process that started it ends without stopping it
# (killed, or ended by a signal Python does not turn into an exception, so
# that `atexit` never runs): it waits for its stdin, a pipe only that process
# holds, to close, then stops the server and removes its directory, unless
# that was done already.
_WATCHDOG = """
import os, shutil, signal, sys, time
pid, root = int(sys.argv[1]), sys.argv[2]
sys.stdin.buffer.read()
if os.path.isdir(root):
    for sig, wait in ((signal.SIGINT, 20.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)
        if not os.path.exists(f"/proc/{pid}"):
            break
    shutil.rmtree(root, ignore_errors=True)
"""


def find_bindir() -> Path | None:
    """The directory holding `initdb` and `postgres`, or None."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        found = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if found:
            candidates.append(Path(found))

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(part) for part in name.split(".") if part.isdigit())

    candidates += [
        Path(path)
        for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    ]
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres")):
            return bindir
    return None


class PostgresServer:
    """One throwaway PostgreSQL cluster in a temporary directory, reachable by Unix socket."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="workwarden-pg-"))
        self.socket_dir = self.root / "socket"
        self.data_dir = self.root / "data"
        self.log_path = self.root / "server.log"
        self._as_user: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._admin: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._free: list[str] = []
        self._keepers: dict[str, psycopg.Connection[Any]] = {}
        self._made = 0

    def dsn(self, dbname: str) -> str:
        """The connection string of database `dbname` on this server."""
        return psycopg.conninfo.make_conninfo(
            host=str(self.socket_dir), user="postgres", dbname=dbname
        )

    def start(self) -> None:
        """Create the cluster, start the server, wait until it answers, make the template."""
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            # The server refuses to run as root: run it as `postgres`.
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "running as root and there is no `postgres` OS user to run the server as; "
                    + _INSTALL
                ) from None
            for path in (self.root, self.socket_dir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            self._as_user = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        self.socket_dir.chmod(0o700)
        initdb = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "--pgdata",
                str(self.data_dir),
                "--no-sync",
                "--auth=trust",
                "--username=postgres",
                "--no-locale",
                "--encoding=UTF8",
            ],
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            **self._as_user,
        )
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({initdb.returncode}):\n{initdb.stderr}")
        settings = {
            "fsync": "off",
            "full_page_writes": "off",
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": "200",
            "log_min_messages": "warning",
        }
        command = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                command,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._as_user,
            )
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self._process.pid), str(self.root)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        self._admin = self._wait_until_answering()
        self._admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_TEMPLATE)))
        PostgresStore(self.dsn(_TEMPLATE), pool_size=1).close()

    def _wait_until_answering(self) -> psycopg.Connection[Any]:
        assert self._process is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                return psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=2)
            except psycopg.OperationalError as exc:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = self.log_path.read_text(errors="replace")
                    self.stop()
                    raise RuntimeError(
                        f"the PostgreSQL server did not start: {exc}\n{log}"
                    ) from exc
            time.sleep(0.02)

    @property
    def pid(self) -> int | None:
        """The server's process id, while it was started and not stopped."""
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        """Stop the server (fast shutdown, then harder) and remove its directory."""
        for keeper in self._keepers.values():
            keeper.close()
        self._keepers.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
                process.send_signal(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(_STOP_TIMEOUT_S)
                    break
        shutil.rmtree(self.root, ignore_errors=True)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.close()  # the directory is gone: it ends without doing anything
            watchdog.wait(_STOP_TIMEOUT_S)

    def _admin_connection(self) -> psycopg.Connection[Any]:
        if self._admin is None:
            raise RuntimeError("the server is not running")
        return self._admin

    def acquire(self) -> str:
        """An empty database holding the store's schema, for one user at a time."""
        with self._lock:
            if self._free:
                return self._free.pop()
            self._made += 1
            name = f"workwarden_test_{self._made}"
            self._admin_connection().execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(_TEMPLATE)
                )
            )
            self._keepers[name] = psycopg.connect(self.dsn(name), autocommit=True)
            return name

    def release(self, name: str) -> None:
        """Empty `name`, ending whatever still uses it, and keep it for the next user."""
        with self._lock:
            keeper = self._keepers[name]
            self._admin_connection().execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid NOT IN (pg_backend_pid(), %s)",
                (name, keeper.info.backend_pid),
            )
            # Deleting the few rows a test leaves is several times faster than
            # TRUNCATE, which makes new files for every table and index.
            keeper.execute(
                "SET lock_timeout = '10s';"
                " DELETE FROM workwarden_documents;"
                " DELETE FROM workwarden_audit;"
                " SELECT setval(pg_get_serial_sequence('workwarden_audit', 'sequence'), 1, false)"
            )
            self._free.append(name)

    def empty_database(self) -> str:
        """A new database without the store's schema (never reused)."""
        with self._lock:
            self._made += 1
            name = f"workwarden_empty_{self._made}"
            self._admin_connection().execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name))
            )
            return name


_lock = threading.Lock()
_server: PostgresServer | None = None
_failure: str | None = None


def _stop_at_exit() -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None


def server() -> PostgresServer:
    """The run's server, started on first use; skips (or fails) the test when there is none."""
    global _server, _failure
    with _lock:
        if _server is not None:
            return _server
        if _failure is None:
            bindir = find_bindir()
            if bindir is None:
                reason = (
                    "no PostgreSQL server binaries (looked at `pg_config --bindir` and "
                    f"/usr/lib/postgresql/*/bin); {_INSTALL}"
                )
                if os.environ.get(REQUIRE_ENV) == "1":
                    pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
                pytest.skip(f"{reason}, or set {REQUIRE_ENV}=1 to make this a failure")
            candidate = PostgresServer(bindir)
            try:
                candidate.start()
            except (OSError, RuntimeError, psycopg.Error, StoreError) as exc:
                candidate.stop()
                _failure = f"the private PostgreSQL server could not be started: {exc}"
            else:
                _server = candidate
                atexit.register(_stop_at_exit)
                return _server
        pytest.fail(_failure, pytrace=False)


@contextlib.contextmanager
def postgres_database(*, schema: bool = True) -> Iterator[str]:
    """The connection string of an empty database, with the store's schema unless told not."""
    running = server()
    if not schema:
        yield running.dsn(running.empty_database())
        return
    name = running.acquire()
    try:
        yield running.dsn(name)
    finally:
        running.release(name)


@contextlib.contextmanager
def postgres_store() -> Iterator[Store]:
    """A fresh `PostgresStore` on an empty database."""
    with postgres_database() as dsn:
        store = PostgresStore(dsn)
        try:
            yield store
        finally:
            store.close()
