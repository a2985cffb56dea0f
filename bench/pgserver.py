"""A private PostgreSQL server for the harnesses, or an existing one named by a DSN.

The private server is a throwaway cluster in a temporary directory: the
binaries are found with `pg_config --bindir` or under
`/usr/lib/postgresql/*/bin`, `initdb` makes the cluster (run as the
`postgres` OS user when the harness runs as root, since the server refuses
root), and `postgres` listens only on a Unix socket in that directory. Unlike
the test suite's server it keeps durability on by default (`fsync=on`,
`synchronous_commit=on`), so that its commits cost what a deployment's do
(`--pg-fsync off` measures without). It is stopped and its directory removed
when the harness ends, or by a watchdog if the harness is killed.

`--server-dsn` uses an existing server instead (a maintenance database on it,
such as `postgres`, as a role that may create databases): each harness makes
its own databases there, named `bench_<pid>_<n>`, and drops them afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

__all__ = ["Server", "find_bindir", "server"]

_INSTALL = "install the server binaries with `apt-get install postgresql`"

_WATCHDOG = """
import os, shutil, signal, sys, time
pid, root = int(sys.argv[1]), sys.argv[2]
sys.stdin.buffer.read()
if os.path.isdir(root):
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 10.0
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
        return tuple(int(p) for p in Path(path).parent.name.split(".") if p.isdigit())

    candidates += [
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    ]
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres")):
            return bindir
    return None


class Server:
    """A PostgreSQL server the harness may create databases on."""

    def __init__(self, admin_dsn: str, *, private: Any = None, describe: str = "") -> None:
        self.admin_dsn = admin_dsn
        self.describe = describe
        self._private = private
        self._made = 0
        self._databases: list[str] = []

    def dsn(self, dbname: str) -> str:
        """The connection string of database `dbname` on this server."""
        params = conninfo.conninfo_to_dict(self.admin_dsn)
        params["dbname"] = dbname
        return conninfo.make_conninfo(**{k: v for k, v in params.items() if v is not None})

    def create_database(self) -> tuple[str, str]:
        """A new empty database: (name, dsn)."""
        self._made += 1
        name = f"bench_{os.getpid()}_{self._made}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name))
            )
        self._databases.append(name)
        return name, self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop `name`, ending whatever still uses it."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        if name in self._databases:
            self._databases.remove(name)

    def settings(self) -> dict[str, str]:
        """The server's version and the settings that decide what a commit costs."""
        names = ("server_version", "fsync", "synchronous_commit", "shared_buffers", "wal_level")
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            return {
                name: str(
                    admin.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]
                )  # type: ignore[index]
                for name in names
            }

    def stop(self) -> None:
        """Drop the databases made here; stop the private server, if any."""
        for name in list(self._databases):
            with contextlib.suppress(psycopg.Error):
                self.drop_database(name)
        if self._private is not None:
            self._private.stop()
            self._private = None


class _Private:
    """The throwaway cluster behind a private `Server`."""

    def __init__(self, bindir: Path, fsync: bool) -> None:
        self.bindir = bindir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="workwarden-bench-pg-"))
        self.socket_dir = self.root / "socket"
        self.data_dir = self.root / "data"
        self.log_path = self.root / "server.log"
        self._as_user: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    def admin_dsn(self) -> str:
        return conninfo.make_conninfo(host=str(self.socket_dir), user="postgres", dbname="postgres")

    def start(self) -> None:
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
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
        on = "on" if self.fsync else "off"
        settings = {
            "fsync": on,
            "full_page_writes": on,
            "synchronous_commit": "on",
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": "100",
            "shared_buffers": "512MB",
            "max_wal_size": "4GB",
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
        deadline = time.monotonic() + 30.0
        while True:
            try:
                psycopg.connect(self.admin_dsn(), autocommit=True, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log_text = self.log_path.read_text(errors="replace")
                    self.stop()
                    raise RuntimeError(
                        f"the PostgreSQL server did not start: {exc}\n{log_text}"
                    ) from exc
            time.sleep(0.05)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
                process.send_signal(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(20.0)
                    break
        shutil.rmtree(self.root, ignore_errors=True)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.close()
            watchdog.wait(20.0)


@contextlib.contextmanager
def server(existing_dsn: str | None = None, *, fsync: bool = True) -> Iterator[Server]:
    """The existing server `existing_dsn` names, or a private one started for the block."""
    if existing_dsn:
        running = Server(existing_dsn, describe="an existing server (--server-dsn)")
        try:
            yield running
        finally:
            running.stop()
        return
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit(f"no PostgreSQL server binaries found; {_INSTALL}")
    private = _Private(bindir, fsync)
    private.start()
    running = Server(
        private.admin_dsn(),
        private=private,
        describe=f"a private cluster ({bindir}), fsync={'on' if fsync else 'off'}",
    )
    try:
        yield running
    finally:
        running.stop()
