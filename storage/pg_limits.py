"""The PostgreSQL store's checks of a concurrency key: which claims of a batch pass them.

A write that makes a document hold a claim, of a concurrency key with a limit
or a rate (`IndexFields.gated`), is checked inside the transaction that writes
it: `over_limit_writes` takes a transaction-scoped advisory lock per
concurrency key, in key order, and only then reads the documents of those keys
that hold a claim and the keys' rate marks. Every claimer of a key takes the
same lock before it counts, so two claims of one key are never counted at
once; the lock ends with the commit, after which the next claimer's count (a
statement begun after its lock was granted) sees the claim committed.
Releasing a claim takes no lock: it can only lower the count, so a count that
missed it errs on the safe side.

The rate marks the let-through claims move their keys to are written in the
same transaction, before the writes' own statement: a claim whose
compare-and-swap then fails has still spent its token, which errs on the safe
side too (the key's next claim may wait one interval longer; the rate is never
passed).
"""

from __future__ import annotations

from collections.abc import Sequence

from workwarden.storage.base import StoreLimited, Write, over_limit, spend_rate
from workwarden.storage.pg_connections import _Connection
from workwarden.storage.pg_schema import (
    _CONCURRENCY_HOLDERS,
    _CONCURRENCY_LOCK,
    _GATED_VERSIONS,
    _RATE_MARKS,
    _SET_RATE_MARKS,
)

__all__ = ["over_limit_writes"]


def over_limit_writes(conn: _Connection, writes: Sequence[Write]) -> dict[str, StoreLimited]:
    """The writes of `writes` refused for their key's limit or rate, by key, in the transaction.

    A write is refused when it makes its document hold a claim, the committed
    document holds none, and as many documents of its key as its limit hold
    one (counting those the earlier writes of the batch let through), or its
    key's rate has no token at the write's instant (`StoreRateLimited`).
    """
    gated = [write for write in writes if write.index.gated]
    if not gated:
        return {}
    versions: dict[str, int] = dict(
        conn.execute(_GATED_VERSIONS, {"keys": sorted({w.key for w in gated})}).fetchall()
    )
    # A write expecting another version than the committed one fails its
    # compare-and-swap: a conflict, neither counted nor spending a token.
    gated = [write for write in gated if versions.get(write.key) == write.expected_version]
    if not gated:
        return {}
    keys = sorted({str(write.index.concurrency_key) for write in gated})
    conn.execute(_CONCURRENCY_LOCK, {"keys": keys}).fetchall()
    holders: dict[str, set[str]] = {key: set() for key in keys}
    for concurrency_key, key in conn.execute(_CONCURRENCY_HOLDERS, {"keys": keys}).fetchall():
        holders[concurrency_key].add(key)
    marks: dict[str, int] = {}
    if any(write.index.rated for write in gated):
        marks = dict(conn.execute(_RATE_MARKS, {"keys": keys}).fetchall())
    moved: set[str] = set()
    refused: dict[str, StoreLimited] = {}
    for write in gated:
        concurrency_key = str(write.index.concurrency_key)
        held = holders[concurrency_key]
        if write.key in held:
            continue
        limit = write.index.concurrency_limit
        if write.index.limited and limit is not None and len(held) >= limit:
            refused[write.key] = over_limit(write.index, len(held))
            continue
        if write.index.rated:
            try:
                marks[concurrency_key] = spend_rate(
                    write.index, marks.get(concurrency_key), write.audit.at
                )
            except StoreLimited as exc:
                refused[write.key] = exc
                continue
            moved.add(concurrency_key)
        held.add(write.key)
    if moved:
        order = sorted(moved)
        conn.execute(_SET_RATE_MARKS, {"keys": order, "marks": [marks[k] for k in order]})
    return refused
