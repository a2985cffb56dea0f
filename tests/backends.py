"""The storage backends the suites run against, by name.

Each entry makes a fresh, empty store for one test and closes it afterwards.
Every test using the `store` fixture runs once per entry. The PostgreSQL
entry comes from `tests/pg.py`, which starts a private server.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from pg import postgres_store
from workwarden.storage import MemoryStore, SQLiteStore, Store

__all__ = ["BACKENDS", "memory_store", "postgres_store", "sqlite_store"]


@contextmanager
def memory_store() -> Iterator[Store]:
    """A fresh MemoryStore."""
    yield MemoryStore()


@contextmanager
def sqlite_store() -> Iterator[Store]:
    """A fresh SQLiteStore on a new file in its own temporary directory."""
    with tempfile.TemporaryDirectory(prefix="workwarden-") as directory:
        store = SQLiteStore(Path(directory) / "store.db")
        try:
            yield store
        finally:
            store.close()


BACKENDS: dict[str, Callable[[], AbstractContextManager[Store]]] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
    "postgres": postgres_store,
}
