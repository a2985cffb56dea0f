"""The store a worker claims through: claim candidates only of the definitions it can run.

`claim_next` and `claim_many` know capabilities, not definitions; a worker
must never claim work its app has no handler for, so its authority reads
candidates through `HandledOnly`, which leaves the others out of every page
(and out of every page `BatchStore.claim_batch` offers, over a store that
batches: `handled_only` picks the view that keeps the inner store's
batches). The view also remembers, from the documents its claims wrote,
each claimed workload's definition and attempt number, so the worker need
not read the workload back after a claim (`claimed`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from workwarden.storage.base import (
    AuditRecord,
    BatchStore,
    CandidateCursor,
    ChooseClaims,
    IndexFields,
    Store,
    StoredDocument,
    Write,
    WriteOutcome,
)
from workwarden.storage.forwarding import ForwardingStore

__all__ = ["HandledOnly", "HandledOnlyBatches", "handled_only"]

#: How many claimed workloads' descriptions a view keeps until the worker takes them.
DESCRIBED_LIMIT = 4_096

_CLAIMS = frozenset({"claim", "claim_next"})


def _parsed(document: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(document)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _definition(doc: StoredDocument) -> str | None:
    parsed = _parsed(doc.document)
    value = parsed.get("definition_id") if parsed is not None else None
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
        self._described: OrderedDict[tuple[str, int], tuple[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def claimed(self, key: str, token: int) -> tuple[str, int] | None:
        """`(definition_id, attempt_count)` of the claim of `key` under `token` this view wrote.

        Taken once (the entry is forgotten); None when this view did not see
        that claim written (or has forgotten it: at most `DESCRIBED_LIMIT`
        are kept).
        """
        with self._lock:
            return self._described.pop((key, token), None)

    def _remember(self, document: str) -> None:
        parsed = _parsed(document)
        if parsed is None:
            return
        key, token = parsed.get("workload_id"), parsed.get("fencing_token")
        definition, attempts = parsed.get("definition_id"), parsed.get("attempt_count")
        if not (
            isinstance(key, str)
            and isinstance(token, int)
            and isinstance(definition, str)
            and isinstance(attempts, int)
        ):
            return
        with self._lock:
            self._described[(key, token)] = (definition, attempts)
            while len(self._described) > DESCRIBED_LIMIT:
                self._described.popitem(last=False)

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """The inner store's `write`; a claim it commits is remembered for `claimed`."""
        version = self.inner.write(key, document, index, expected_version, audit)
        if audit.operation in _CLAIMS:
            self._remember(document)
        return version

    def held_claims(
        self, tenant: str, application: str, worker_id: str
    ) -> Sequence[StoredDocument]:
        """The inner store's `held_claims`, each remembered for `claimed` (a replayed claim)."""
        held = self.inner.held_claims(tenant, application, worker_id)
        for doc in held:
            self._remember(doc.document)
        return held

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


class HandledOnlyBatches(HandledOnly):
    """`HandledOnly` over a `BatchStore`: the inner store's batches, candidates narrowed."""

    def __init__(self, inner: Store, definitions: frozenset[str]) -> None:
        if not isinstance(inner, BatchStore):
            raise TypeError(f"{type(inner).__name__} is not a BatchStore: use HandledOnly")
        super().__init__(inner, definitions)
        self.batches: BatchStore = inner

    def read_many(self, keys: Sequence[str]) -> dict[str, StoredDocument]:
        """The inner store's `read_many`."""
        return self.batches.read_many(keys)

    def write_many(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        """The inner store's `write_many`; the claims it commits are remembered for `claimed`."""
        outcomes = self.batches.write_many(writes)
        self._remember_claims(zip(writes, outcomes, strict=True))
        return outcomes

    def claim_batch(
        self,
        tenant: str,
        application: str,
        now: int,
        limit: int,
        choose: ChooseClaims,
    ) -> list[tuple[Write, WriteOutcome]]:
        """The inner store's `claim_batch`, each page offered without other definitions.

        The inner store pages on its own pages' lengths, so a page thinned
        here never ends the paging early.
        """

        def handled(page: Sequence[StoredDocument]) -> Sequence[Write]:
            return choose([doc for doc in page if _definition(doc) in self.definitions])

        results = self.batches.claim_batch(tenant, application, now, limit, handled)
        self._remember_claims(results)
        return results

    def _remember_claims(self, results: Any) -> None:
        for write, outcome in results:
            if isinstance(outcome, int) and write.audit.operation in _CLAIMS:
                self._remember(write.document)


def handled_only(inner: Store, definitions: frozenset[str]) -> HandledOnly:
    """The view of `inner` a worker claims through: `HandledOnlyBatches` over a `BatchStore`."""
    if isinstance(inner, BatchStore):
        return HandledOnlyBatches(inner, definitions)
    return HandledOnly(inner, definitions)
