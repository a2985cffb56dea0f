"""A scope's workloads a page at a time: `Authority.list_page`.

A page is the next `limit` workloads in `Authority.list`'s order (highest
priority first, then oldest, then by id) after a cursor, and the cursor of
the page after it. The cursor is opaque to callers: URL-safe text naming
where the page ended (the last workload's priority, creation instant and
id), so a workload purged since does not break the walk. A store that is a
`ListPages` reads only the page; any other store is listed whole and cut.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
from collections.abc import Callable
from typing import Any

from workwarden.statemachine import errors, inputs
from workwarden.statemachine.commands import WorkloadPage
from workwarden.storage.base import CandidateCursor, ListPages, Store, StoredDocument

__all__ = ["MAX_PAGE", "check_limit", "list_page", "parse_cursor", "read_page"]

# The authority is handed in by `Authority.list_page`; typed loosely so this module
# need not import the one that imports it.
Authority = Any

#: The most workloads one page may hold.
MAX_PAGE = 1_000

# A cursor longer than this names no page: an id is at most 256 characters.
_MAX_CURSOR = 2_048


def _cursor_text(priority: int, created_at: int, key: str) -> str:
    """The cursor of the page after one that ends at this (priority, created_at, key)."""
    raw = json.dumps([priority, created_at, key], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def parse_cursor(value: Any) -> CandidateCursor | None:
    """A caller's `after` as a store cursor; None for None; else `WORKLOAD_INVALID` naming it."""
    if value is None:
        return None
    problem = "after must be the `next` cursor of an earlier page"
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_CURSOR:
        raise errors.bad_argument("after", problem)
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        priority, created_at, key = json.loads(raw)
    except (binascii.Error, UnicodeError, ValueError, TypeError):
        raise errors.bad_argument("after", problem) from None
    # What a stored workload can hold: numbers a store's 64-bit columns take, an id
    # that is a name (a forged cursor is refused here, not by the store's driver).
    whole = all(
        isinstance(n, int) and not isinstance(n, bool) and -(2**63) < n < 2**63
        for n in (priority, created_at)
    )
    named = isinstance(key, str) and 0 < len(key) <= 256 and key.isprintable()
    if not whole or not named or _cursor_text(priority, created_at, key) != value:
        raise errors.bad_argument("after", problem)
    return CandidateCursor(priority=priority, created_at=created_at, key=key)


def check_limit(limit: Any) -> int:
    """A page's `limit`: a whole number from 1 to `MAX_PAGE`, else `WORKLOAD_INVALID`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise errors.bad_argument("limit", f"limit must be a whole number from 1 to {MAX_PAGE}")
    return limit


def _position(doc: StoredDocument) -> tuple[int, int, str]:
    return (doc.index.priority, doc.index.created_at, doc.key)


def _order(doc: StoredDocument) -> tuple[int, int, str]:
    return (-doc.index.priority, doc.index.created_at, doc.key)


def _direct(method: Callable[..., Any], *args: Any) -> Any:
    return method(*args)


def read_page(
    store: Store,
    tenant: Any,
    application: Any,
    limit: Any,
    after: Any = None,
    call: Callable[..., Any] | None = None,
) -> tuple[list[StoredDocument], str | None]:
    """A page of a scope's stored documents and the next page's cursor (None after the last).

    Checks what `Authority.list_page` checks (the scope, `limit`, `after`),
    and the store's answer: another scope's document, a page out of order,
    too long or not after its cursor is `WORKLOAD_STORAGE_FAILURE`. `call`
    runs each store call (the authority's, which turns store errors into
    coded refusals); by default the store is called as it is.
    """
    run: Callable[..., Any] = call if call is not None else _direct
    scope = inputs.as_full_scope(tenant, application)
    limit = check_limit(limit)
    cursor = parse_cursor(after)
    # Where the page must start: strictly after this place in `list`'s order.
    start = None if cursor is None else (-cursor.priority, cursor.created_at, cursor.key)
    docs: list[StoredDocument]
    if isinstance(store, ListPages):
        docs = list(run(store.list_page, *scope, limit, cursor))
    else:
        every = run(store.list, *scope)
        docs = [doc for doc in every if start is None or _order(doc) > start][:limit]
    if any((doc.index.tenant, doc.index.application) != scope for doc in docs):
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, "the store listed a workload of another scope"
        )
    if len(docs) > limit or any(_order(a) >= _order(b) for a, b in itertools.pairwise(docs)):
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, "the store's page is not in list order or is too long"
        )
    if start is not None and docs and _order(docs[0]) <= start:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, "the store's page does not start after its cursor"
        )
    last = docs[-1] if len(docs) == limit else None
    return docs, None if last is None else _cursor_text(*_position(last))


def list_page(
    authority: Authority, tenant: Any, application: Any, limit: Any, after: Any = None
) -> WorkloadPage:
    """See `Authority.list_page`."""
    docs, following = read_page(
        authority.store, tenant, application, limit, after, authority._store_call
    )
    workloads = [inputs.parse_stored(doc) for doc in docs]
    if any((w.tenant_id, w.application_id) != (tenant, application) for w in workloads):
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, "the store listed a workload of another scope"
        )
    return WorkloadPage(workloads=workloads, next=following)
