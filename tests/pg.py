"""A private PostgreSQL server for the suites, started the first time a test needs it.

pytest-postgresql refuses to run as root, and CI runs as root, so the suite
runs its own, a `workwarden.storage.pgserver.PrivateServer`: the binaries
found by `find_bindir`, the cluster in a private temporary directory, the
server run as the `postgres` OS user when the suite runs as root, listening
only on a Unix socket in that directory. Here it runs without durability
(`fsync=off`, `full_page_writes=off`). It is stopped, and the directory
removed, when the test run's interpreter exits; a small watchdog process does
it if that interpreter is killed instead.

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
import os
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from workwarden.storage import Store, StoreError
from workwarden.storage.pgserver import INSTALL_HINT, PrivateServer, find_bindir
from workwarden.storage.postgres import PostgresStore

__all__ = [
    "REQUIRE_ENV",
    "PostgresServer",
    "postgres_database",
    "postgres_store",
    "server",
]

REQUIRE_ENV = "WORKWARDEN_REQUIRE_POSTGRES"
"""Set to 1 to fail, not skip, when no PostgreSQL server can be run."""

_TEMPLATE = "workwarden_template"

# Without durability: the suite's databases are thrown away with the server.
_SETTINGS = {"fsync": "off", "full_page_writes": "off", "max_connections": "200"}


class PostgresServer(PrivateServer):
    """The suite's private server: a template database, and databases handed out from it."""

    def __init__(self, bindir: Path) -> None:
        super().__init__(bindir, settings=_SETTINGS)
        self._admin: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._free: list[str] = []
        self._keepers: dict[str, psycopg.Connection[Any]] = {}
        self._made = 0

    def start(self) -> None:
        """Create the cluster, start the server, wait until it answers, make the template."""
        super().start()
        self._admin = psycopg.connect(self.dsn("postgres"), autocommit=True)
        self._admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_TEMPLATE)))
        PostgresStore(self.dsn(_TEMPLATE), pool_size=1).close()

    def stop(self) -> None:
        """Close the suite's connections, stop the server and remove its directory."""
        for keeper in self._keepers.values():
            keeper.close()
        self._keepers.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        super().stop()

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
                " DELETE FROM workwarden_pauses;"
                " DELETE FROM workwarden_pause_versions;"
                " DELETE FROM workwarden_tombstones;"
                " DELETE FROM workwarden_key_rates;"
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
                    f"/usr/lib/postgresql/*/bin); {INSTALL_HINT}"
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
def own_server() -> Iterator[PrivateServer]:
    """A PostgreSQL server of the caller's own, for a test that stops or restarts it
    (the run's shared server would take every other test down with it)."""
    bindir = find_bindir()
    if bindir is None:
        server()  # skips, or fails under WORKWARDEN_REQUIRE_POSTGRES=1, saying why
        raise AssertionError("unreachable")
    private = PrivateServer(bindir, settings={"fsync": "off", "max_connections": "200"})
    try:
        private.start()
        yield private
    finally:
        private.stop()


def postgres_url(dsn: str) -> str:
    """A libpq key=value connection string as a `postgresql://` URL (as `--store` takes)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    dbname = params.pop("dbname")
    query = urllib.parse.urlencode({key: str(value) for key, value in params.items()})
    return f"postgresql:///{urllib.parse.quote(str(dbname))}?{query}"


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
