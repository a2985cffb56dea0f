"""The scheduler: which workload `Authority.claim_next` hands out, and in what order.

It owns the walk over one tenant and application's claim candidates: pages
in the store's order (highest priority first, then oldest, then key), the
first page smaller than the rest; the gates a candidate must pass before a
claim of it is tried (its scope, its eligibility at `now`, the capabilities
it needs, the states its dependencies must be in); and which refusals of a
tried claim skip the candidate instead of ending the call.

It decides nothing itself: the authority decides and commits each claim it
is handed (`try_claim`), so the core stays the one place that says whether a
claim is granted. The scheduler only does I/O through the callables it is
given, so it never touches a store directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from workwarden.statemachine import errors
from workwarden.statemachine.models import ClaimReply, Workload
from workwarden.storage.base import CandidateCursor, StoredDocument

__all__ = [
    "FIRST_PAGE",
    "PAGE",
    "SKIPPABLE_AT_CLAIM",
    "Candidates",
    "Parse",
    "Read",
    "Seeker",
    "TryClaim",
    "claim_best",
    "dependencies_met",
]

PAGE = 64
"""How many rows one page of a scan of the store asks for (claim candidates after the first
page, and the keys a sweep finds due)."""

FIRST_PAGE = 16
"""The first page of claim candidates is smaller: nearly every call claims one of its first
rows, and each row read is a whole document fetched and decoded."""

SKIPPABLE_AT_CLAIM = frozenset(
    {
        errors.CONFLICT,
        errors.TIMED_OUT,
        errors.ATTEMPTS_EXHAUSTED,
        errors.NOT_READY,
        errors.NOT_YET_ELIGIBLE,
        errors.CAPABILITY_DENIED,
        errors.CONCURRENCY_LIMITED,
        errors.RATE_LIMITED,
    }
)
"""The refusals of a tried claim that skip the candidate: it changed since its page was read
(most likely another claimer took it), the claim dead-lettered or timed it out, or its
concurrency key is at its limit or has spent its rate (the workload stays READY, untouched)."""

#: The refusals that close a concurrency key for the rest of a walk.
_KEY_FULL = frozenset({errors.CONCURRENCY_LIMITED, errors.RATE_LIMITED})

Candidates: TypeAlias = Callable[[int, "CandidateCursor | None"], Sequence[StoredDocument]]
"""Reads a page of claim candidates: at most `limit` rows, after the cursor (None: from the
start)."""

Read: TypeAlias = Callable[[str], "StoredDocument | None"]
"""Reads the committed document of a key (a dependency), or None."""

Parse: TypeAlias = Callable[[StoredDocument], Workload]
"""Decodes a stored document as a workload (or refuses it as a storage failure)."""

TryClaim: TypeAlias = Callable[[StoredDocument, Workload], ClaimReply]
"""Decides and commits a claim of a candidate (the document and its decoded workload); returns
the claim or raises the refusal."""


@dataclass(frozen=True, slots=True)
class Seeker:
    """A worker asking for work: its tenant and application, the capabilities it holds, and
    the instant it asks at."""

    tenant: str
    application: str
    now: int
    capabilities: frozenset[str]

    def may_try(self, workload: Workload) -> bool:
        """Is `workload` of this scope, eligible at `now`, and within the capabilities held?

        (Its dependencies are checked after, with `dependencies_met`: that may read.)
        """
        return (
            workload.tenant_id == self.tenant
            and workload.application_id == self.application
            and workload.is_eligible_at(self.now)
            and self.capabilities.issuperset(workload.capability_snapshot)
        )


def dependencies_met(
    workload: Workload, cache: dict[str, Workload | None], read: Read, parse: Parse
) -> bool:
    """Is every dependency of `workload` committed, in its scope, and in the required state?

    Each dependency is read once per call: `cache` keeps what was read (None: absent).
    """
    for dependency in workload.dependencies:
        if dependency.workload_id not in cache:
            doc = read(dependency.workload_id)
            cache[dependency.workload_id] = parse(doc) if doc is not None else None
        other = cache[dependency.workload_id]
        if (
            other is None
            or other.tenant_id != workload.tenant_id
            or other.application_id != workload.application_id
            or other.state != dependency.required_state
        ):
            return False
    return True


def claim_best(
    seeker: Seeker,
    candidates: Candidates,
    read: Read,
    parse: Parse,
    try_claim: TryClaim,
) -> ClaimReply | None:
    """The first candidate, in the store's order, that passes every gate and whose claim is
    granted; None when there is none.

    A candidate that fails a gate is passed over, and so is one whose claim is refused with
    one of `SKIPPABLE_AT_CLAIM`; any other refusal ends the call. Once a claim is refused for
    its concurrency key's limit, the later candidates of that key are passed over untried for
    the rest of the walk (their claims would be refused alike).
    """
    cursor: CandidateCursor | None = None
    states: dict[str, Workload | None] = {}
    full: set[str] = set()
    while True:
        page = candidates(PAGE if cursor is not None else FIRST_PAGE, cursor)
        if not page:
            return None
        for doc in page:
            if doc.index.concurrency_key is not None and doc.index.concurrency_key in full:
                continue
            workload = parse(doc)
            if not seeker.may_try(workload) or not dependencies_met(workload, states, read, parse):
                continue
            try:
                return try_claim(doc, workload)
            except errors.WorkloadError as exc:
                if exc.code in _KEY_FULL and doc.index.concurrency_key:
                    full.add(doc.index.concurrency_key)
                if exc.code in SKIPPABLE_AT_CLAIM:
                    continue
                raise
        last = page[-1]
        cursor = CandidateCursor(last.index.priority, last.index.created_at, last.key)
