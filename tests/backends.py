"""The storage backends the suites run against, by name.

Each entry makes a fresh, empty store for one test. The PostgreSQL and
SQLite entries are added by the storage suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from workwarden.storage import MemoryStore, Store


@contextmanager
def memory_store() -> Iterator[Store]:
    """A fresh MemoryStore."""
    yield MemoryStore()


BACKENDS: dict[str, Callable[[], "contextmanager[Store]"]] = {  # type: ignore[type-arg]
    "memory": memory_store,
}
