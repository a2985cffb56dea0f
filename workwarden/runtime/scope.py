"""The store a worker claims through: claim candidates only of the definitions it can run.

`claim_next` knows capabilities, not definitions; a worker must never claim
work its app has no handler for, so its authority reads candidates through
`HandledOnly`, which leaves the others out of every page.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from workwarden.storage.base import CandidateCursor, Store, StoredDocument
from workwarden.storage.forwarding import ForwardingStore

__all__ = ["HandledOnly"]


def _definition(doc: StoredDocument) -> str | None:
    try:
        parsed = json.loads(doc.document)
    except ValueError:
        return None
    value = parsed.get("definition_id") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else None


class HandledOnly(ForwardingStore):
    """A store whose claim candidates are only documents of `definitions`.

    A page is filled from as many of the inner store's pages as it takes;
    a candidate left out only makes the next page start a little earlier
    (the cursor is the last candidate kept), so none is ever skipped.
    """

    def __init__(self, inner: Store, definitions: frozenset[str]) -> None:
        super().__init__(inner)
        self.definitions = definitions

    def claim_candidates(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        after: CandidateCursor | None = None,
    ) -> Sequence[StoredDocument]:
        """The inner store's candidates of the handled definitions, in its order."""
        kept: list[StoredDocument] = []
        cursor = after
        while len(kept) < limit:
            page = self.inner.claim_candidates(tenant, application, now, limit, cursor)
            kept.extend(doc for doc in page if _definition(doc) in self.definitions)
            if len(page) < limit:
                break
            last = page[-1]
            cursor = CandidateCursor(last.index.priority, last.index.created_at, last.key)
        return kept[:limit]
