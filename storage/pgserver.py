"""A throwaway PostgreSQL server in a private directory, for test suites and benchmarks.

`find_bindir()` finds the server binaries: `pg_config --bindir`, then the
newest `/usr/lib/postgresql/*/bin`. `PrivateServer` makes a cluster with
`initdb` in a new temporary directory and starts `postgres` on it directly,
listening only on a Unix socket in that directory, with the settings it is
given (durability, memory, connections). When the process runs as root both
run as the `postgres` OS user, since the server refuses root; otherwise as
the current user. `stop()` stops the server and removes the directory; a
small watchdog process does both if the process that started the server is
killed instead.

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit(f"no PostgreSQL server binaries found; {INSTALL_HINT}")
    server = PrivateServer(bindir, settings={"fsync": "off"})
    server.start()
    try:
        store = PostgresStore(server.dsn("postgres"))
        ...
    finally:
        server.stop()

No server needs to be installed to import this module.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import conninfo

__all__ = ["INSTALL_HINT", "PrivateServer", "find_bindir"]

INSTALL_HINT: Final = "install the server binaries with `apt-get install postgresql`"
"""How to get the server binaries, for messages saying they are missing."""

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 20.0

# Stops the server when the process that started it ends without stopping it
# (killed, or ended by a signal Python does not turn into an exception, so
# that no clean-up runs): it waits for its stdin, a pipe only that process
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


class PrivateServer:
    """One throwaway PostgreSQL cluster in a temporary directory, reachable by Unix socket.

    `settings` are passed to `postgres` as `-c name=value`, after
    `log_min_messages=warning` (which they may override) and before the
    socket settings (which they may not: the server listens on no TCP
    address). The directory, `root`, is made at once, named with `prefix`;
    it holds the cluster (`data_dir`), the socket (`socket_dir`) and the
    server's log (`log_path`).
    """

    def __init__(
        self,
        bindir: Path,
        *,
        settings: Mapping[str, str] | None = None,
        prefix: str = "workwarden-pg-",
    ) -> None:
        self.bindir = bindir
        self.settings = dict(settings or {})
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.socket_dir = self.root / "socket"
        self.data_dir = self.root / "data"
        self.log_path = self.root / "server.log"
        self._as_user: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    def dsn(self, dbname: str) -> str:
        """The connection string of database `dbname` on this server, as `postgres`."""
        return conninfo.make_conninfo(host=str(self.socket_dir), user="postgres", dbname=dbname)

    @property
    def pid(self) -> int | None:
        """The server's process id, while it was started and not stopped."""
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Create the cluster, start the server and wait until it answers.

        Raises `RuntimeError` saying why when it cannot (no `postgres` OS
        user to run as under root, `initdb` failed, or the server did not
        answer within 30 seconds: the message then holds its log).
        """
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            # The server refuses to run as root: run it as `postgres`.
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "running as root and there is no `postgres` OS user to run the server as; "
                    + INSTALL_HINT
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
        self._launch()

    def _launch(self) -> None:
        """Start `postgres` on the cluster, with a watchdog, and wait until it answers."""
        settings = {
            "log_min_messages": "warning",
            **self.settings,
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
        }
        command = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with self.log_path.open("ab") as log:
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
        self._wait_until_answering()

    def _wait_until_answering(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = self.log_path.read_text(errors="replace")
                    self.stop()
                    raise RuntimeError(
                        f"the PostgreSQL server did not start: {exc}\n{log}"
                    ) from exc
            time.sleep(0.02)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server (fast shutdown) and start it again on the same cluster.

        The data is kept; every connection to the server ends, as after an
        operator's `pg_ctl restart`. The server stays down for `down_s`
        seconds before it is started again; `restart` returns once it
        answers. Raises `RuntimeError` when the server was not running, or
        did not answer again within 30 seconds.
        """
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError("the server is not running")
        self._halt()
        # The old watchdog watches a process that has ended: it is replaced
        # (ended without acting, since it never saw its stdin close).
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait(_STOP_TIMEOUT_S)
            if watchdog.stdin is not None:
                watchdog.stdin.close()
        time.sleep(max(down_s, 0.0))
        self._launch()

    def _halt(self) -> None:
        """Stop the server process (fast shutdown, then harder), keeping its directory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
                process.send_signal(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(_STOP_TIMEOUT_S)
                    break

    def stop(self) -> None:
        """Stop the server (fast shutdown, then harder) and remove its directory.

        Harmless when the server was never started or is stopped already.
        """
        self._halt()
        shutil.rmtree(self.root, ignore_errors=True)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.close()  # the directory is gone: it ends without doing anything
            watchdog.wait(_STOP_TIMEOUT_S)
