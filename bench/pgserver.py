"""A private PostgreSQL server for the harnesses, or an existing one named by a DSN.

The private server is a `workwarden.storage.pgserver.PrivateServer`: a
throwaway cluster in a temporary directory, listening only on a Unix socket
there, run as the `postgres` OS user when the harness runs as root. Unlike
the test suite's server it keeps durability on by default (`fsync=on`,
`synchronous_commit=on`) and has a deployment's memory (`shared_buffers`,
`max_wal_size`), so that its commits cost what a deployment's do
(`--pg-fsync off` measures without). It is stopped and its directory removed
when the harness ends, or by a watchdog if the harness is killed.

`--server-dsn` uses an existing server instead (a maintenance database on it,
such as `postgres`, as a role that may create databases): each harness makes
its own databases there, named `bench_<pid>_<n>`, and drops them afterwards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psycopg
from psycopg import conninfo, sql

from workwarden.storage.pgserver import INSTALL_HINT, PrivateServer, find_bindir

__all__ = ["Server", "server"]


def _settings(fsync: bool) -> dict[str, str]:
    """The private server's settings: durable unless told not, with a deployment's memory."""
    on = "on" if fsync else "off"
    return {
        "fsync": on,
        "full_page_writes": on,
        "synchronous_commit": "on",
        "max_connections": "100",
        "shared_buffers": "512MB",
        "max_wal_size": "4GB",
    }


class Server:
    """A PostgreSQL server the harness may create databases on."""

    def __init__(
        self, admin_dsn: str, *, private: PrivateServer | None = None, describe: str = ""
    ) -> None:
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
        raise SystemExit(f"no PostgreSQL server binaries found; {INSTALL_HINT}")
    private = PrivateServer(bindir, settings=_settings(fsync), prefix="workwarden-bench-pg-")
    private.start()
    running = Server(
        private.dsn("postgres"),
        private=private,
        describe=f"a private cluster ({bindir}), fsync={'on' if fsync else 'off'}",
    )
    try:
        yield running
    finally:
        running.stop()
