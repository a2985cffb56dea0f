"""The PostgreSQL store's concurrency check: which claims of a batch would pass their key's limit.

A write that makes a document hold a claim, of a concurrency key with a limit
(`IndexFields.limited`), is checked inside the transaction that writes it:
`over_limit_writes` takes a transaction-scoped advisory lock per concurrency
key, in key order, and only then reads the documents of those keys that hold
a claim. Every claimer of a key takes the same lock before it counts, so two
claims of one key are never counted at once; the lock ends with the commit,
after which the next claimer's count (a statement begun after its lock was
granted) sees the claim committed. Releasing a claim takes no lock: it can
only lower the count, so a count that missed it errs on the safe side.
"""

from __future__ import annotations

from collections.abc import Sequence

from workwarden.storage.base import StoreLimited, Write, over_limit
from workwarden.storage.pg_connections import _Connection
from workwarden.storage.pg_schema import _CONCURRENCY_HOLDERS, _CONCURRENCY_LOCK

__all__ = ["over_limit_writes"]


def over_limit_writes(conn: _Connection, writes: Sequence[Write]) -> dict[str, StoreLimited]:
    """The writes of `writes` refused for their key's limit, by key, in the caller's transaction.

    A write is refused when it makes its document hold a claim, the committed
    document holds none, and as many documents of its key as its limit hold
    one, counting those the earlier writes of the batch let through.
    """
    limited = [write for write in writes if write.index.limited]
    if not limited:
        return {}
    keys = sorted({str(write.index.concurrency_key) for write in limited})
    conn.execute(_CONCURRENCY_LOCK, {"keys": keys}).fetchall()
    holders: dict[str, set[str]] = {key: set() for key in keys}
    for concurrency_key, key in conn.execute(_CONCURRENCY_HOLDERS, {"keys": keys}).fetchall():
        holders[concurrency_key].add(key)
    refused: dict[str, StoreLimited] = {}
    for write in limited:
        held = holders[str(write.index.concurrency_key)]
        if write.key in held:
            continue
        limit = write.index.concurrency_limit
        if limit is not None and len(held) >= limit:
            refused[write.key] = over_limit(write.index, len(held))
        else:
            held.add(write.key)
    return refused
