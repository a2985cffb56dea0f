"""workwarden.storage: the compare-and-swap `Store` protocol and its backends.

`MemoryStore` for tests and tools. Every backend passes the same conformance
suite.
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
)
from workwarden.storage.memory import MemoryStore

__all__ = [
    "AuditRecord",
    "CandidateCursor",
    "IndexFields",
    "MemoryStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreFailure",
    "StoredDocument",
]
