"""workwarden.storage: the compare-and-swap `Store` protocol and its backends.

`MemoryStore` for tests and tools, `SQLiteStore` for one machine, and
`open_store(url)` to name either (or PostgreSQL) in one string. Every backend
passes the same conformance suite, `workwarden.storage.testing`.
`ForwardingStore` is the base of wrappers that observe or change a few calls
of another store. `BatchStore` is the optional capability of reading,
writing and claiming many documents in one round trip (every shipped
backend has it), which the authority's batch calls use.

The PostgreSQL store is `workwarden.storage.postgres.PostgresStore`, not
imported here: it needs the `postgres` extra (`pip install
'workwarden[postgres]'`, psycopg and psycopg-pool), which a SQLite-only
install does without. Importing it, or opening a `postgresql://` URL with
`open_store`, without that extra raises `WorkloadError` with the code
`WORKLOAD_EXTRA_MISSING`, whose message is the command that installs it.

Thread-safety: every store may be shared by the threads of one process
(each call is one transaction, or one critical section for `MemoryStore`);
see each class and `docs/thread-safety.md`.
"""

# The library first: its modules name the store's types, and the store's modules its errors,
# so it is loaded whole before the store's own modules are, whichever is imported first.
import workwarden.statemachine  # noqa: F401
from workwarden.storage.base import (
    AuditRecord,
    BatchStore,
    CandidateCursor,
    IndexFields,
    Store,
    StoreConflict,
    StoredDocument,
    StoreError,
    StoreFailure,
    StoreLimited,
    StoreOutcomeUnknown,
    StoreRateLimited,
    Write,
)
from workwarden.storage.forwarding import ForwardingStore
from workwarden.storage.memory import MemoryStore
from workwarden.storage.sqlite import SQLiteStore
from workwarden.storage.urls import open_store

__all__ = [
    "AuditRecord",
    "BatchStore",
    "CandidateCursor",
    "ForwardingStore",
    "IndexFields",
    "MemoryStore",
    "SQLiteStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreFailure",
    "StoreLimited",
    "StoreOutcomeUnknown",
    "StoreRateLimited",
    "StoredDocument",
    "Write",
    "open_store",
]
