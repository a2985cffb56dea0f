"""workwarden.storage: the compare-and-swap `Store` protocol and its backends.

`MemoryStore` for tests and tools, `SQLiteStore` for one machine, and
`open_store(url)` to name either (or PostgreSQL) in one string. Every backend
passes the same conformance suite, `workwarden.storage.testing`.
`ForwardingStore` is the base of wrappers that observe or change a few calls
of another store.
"""

from workwarden.storage.base import (
    AuditRecord,
    CandidateCursor,
    IndexFields,
    Store,
    StoreConflict,
    StoredDocument,
    StoreError,
    StoreFailure,
    StoreOutcomeUnknown,
)
from workwarden.storage.forwarding import ForwardingStore
from workwarden.storage.memory import MemoryStore
from workwarden.storage.sqlite import SQLiteStore
from workwarden.storage.urls import open_store

__all__ = [
    "AuditRecord",
    "CandidateCursor",
    "ForwardingStore",
    "IndexFields",
    "MemoryStore",
    "SQLiteStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreFailure",
    "StoreOutcomeUnknown",
    "StoredDocument",
    "open_store",
]
