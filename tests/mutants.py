"""Deliberately broken variants of the store, the authority, the core and the spec.

The stateful suite must catch every one of them (`test_stateful_mutants.py`).
Each is built beside the real part, by subclassing it, wrapping it, patching
one function for the length of a `with` block, or editing a copy of the spec
text; the real code is never changed.

- `VersionBlindStore`: a store that ignores the expected version of a write.
- `UnfencedCompleteAuthority`: an authority that skips the fence check on
  `complete` (it checks the current claim's fence instead of the caller's).
- `BlindRecoveryAuthority`: a recovery that does not re-check the committed
  version: when its write conflicts, it re-reads only the version number and
  writes the decision it made on the stale read anyway.
- `late_deadlines()`: a deadline check one millisecond late.
- `budgetless_failure_spec()` and `BudgetlessFailureAuthority`: a failure
  policy that retries past the attempt budget, deployed while the suite checks
  the shipped spec; `budgetless_spec()`: a policy file with no budget rule at
  all, checked as the user's own spec.
- `batch_commits_refusals()`: a `report_many` that commits a report its
  one-call method refuses for its fence (stale, expired, or no claim): the
  batch decides it again under the workload's current claim and writes it,
  audited with the caller's token. Only the batch path is broken.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from workwarden.statemachine import batches, core, errors
from workwarden.statemachine.authority import Authority, Prepared
from workwarden.statemachine.commands import Command, CompleteCommand
from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.grants import GrantVerifier
from workwarden.statemachine.models import Workload
from workwarden.statemachine.spec import Spec, load_spec_text, shipped_spec_text
from workwarden.storage import AuditRecord, IndexFields, MemoryStore, Store

__all__ = [
    "BlindRecoveryAuthority",
    "BudgetlessFailureAuthority",
    "UnfencedCompleteAuthority",
    "VersionBlindStore",
    "batch_commits_refusals",
    "budgetless_failure_spec",
    "budgetless_spec",
    "late_deadlines",
]

_BUDGET_RULE = (
    '  { when = ["budget_exhausted"], decision = "attempt_budget_exhausted",'
    ' to = "DEAD_LETTER" },\n'
)


class VersionBlindStore(MemoryStore):
    """(a) A memory store whose write takes whatever version is committed as the expected one."""

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        current = self.read(key)
        version = current.version if current is not None else None
        return super().write(key, document, index, version, audit)


class UnfencedCompleteAuthority(Authority):
    """(b) `complete` decides under the current claim's fence, not the one the caller presents.

    The audit record still carries the caller's token: what was accepted, from whom.
    """

    def _prepare(self, command: Command, now: int, operation: str) -> Prepared:
        if isinstance(command, CompleteCommand):
            doc = self.store.read(command.workload_id)
            claim = Workload.model_validate_json(doc.document).current_claim if doc else None
            if claim is not None and claim.fence != command.fence:
                current = command.model_copy(update={"fence": claim.fence})
                prepared = super()._prepare(current, now, operation)
                prepared.fencing_token = command.fence.token
                return prepared
        return super()._prepare(command, now, operation)


class BlindRecoveryAuthority(Authority):
    """(c) A recovery that, when another writer committed first, overwrites it with its decision."""

    def _write(self, prepared: Prepared, workload: Workload) -> int:
        try:
            return super()._write(prepared, workload)
        except errors.WorkloadError as exc:
            if exc.code != errors.CONFLICT or prepared.operation != "recover_expired":
                raise
            current = self.store.read(prepared.key)
            prepared.expected_version = current.version if current is not None else None
            return super()._write(prepared, workload)


@contextmanager
def late_deadlines() -> Iterator[None]:
    """(d) For the length of the block, the core finds a deadline fallen one millisecond late."""

    def one_ms_late(spec: Spec, workload: Workload, now: int) -> tuple[str, int] | None:
        return deadline_breach(spec, workload, now - 1)

    original = core.deadline_breach
    core.deadline_breach = one_ms_late
    try:
        yield
    finally:
        core.deadline_breach = original


def _without_budget_rules(text: str, policies: tuple[str, ...]) -> str:
    out: list[str] = []
    section = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("["):
            section = line.strip()
        if line == _BUDGET_RULE and section in {f"[policies.{p}]" for p in policies}:
            continue
        if section == "[policies.claim]" and "claim" in policies and "budget_exhausted" in line:
            continue
        out.append(line)
    changed = "".join(out)
    assert changed != text, "the spec text no longer has the budget rules this mutant removes"
    return changed


@cache
def budgetless_failure_spec() -> Spec:
    """(e) The shipped spec whose failure policy lacks the attempt-budget rule."""
    text = _without_budget_rules(shipped_spec_text(), ("failure",))
    return load_spec_text(text, "mutant: failure policy without the budget rule")


@cache
def budgetless_spec() -> Spec:
    """(e) The shipped spec with no attempt-budget rule in any policy (the claim's included)."""
    policies = ("failure", "recovery", "deadline", "operator_timeout", "claim")
    text = _without_budget_rules(shipped_spec_text(), policies)
    return load_spec_text(text, "mutant: no budget rule in any policy")


class BudgetlessFailureAuthority(Authority):
    """(e) An authority deployed with `budgetless_failure_spec()`, whatever spec it is given."""

    def __init__(
        self, store: Store, *, grants: GrantVerifier, spec: Spec | None = None, remember: int = 0
    ) -> None:
        super().__init__(store, grants=grants, spec=budgetless_failure_spec(), remember=remember)


_FENCE_REFUSALS = frozenset({errors.STALE_FENCE, errors.LEASE_EXPIRED, errors.CLAIM_INVALID})


@contextmanager
def batch_commits_refusals() -> Iterator[None]:
    """(f) For the length of the block, `report_many` commits the reports refused for their fence.

    A slot its one-call method refuses for the fence is decided again under the
    workload's current claim, and written with the caller's token in its audit
    record (what was accepted, from whom). The one-call methods are unchanged.
    """

    def committing(authority: Authority, command: Command, now: int, operation: str) -> Any:
        answer = original(authority, command, now, operation)
        fence = getattr(command, "fence", None)
        if not isinstance(answer, errors.WorkloadError) or answer.code not in _FENCE_REFUSALS:
            return answer
        doc = authority.store.read(command.workload_id)
        claim = Workload.model_validate_json(doc.document).current_claim if doc else None
        if claim is None or fence is None:
            return answer
        current = command.model_copy(update={"fence": claim.fence})
        try:
            prepared = authority._prepare(current, now, operation)
            prepared.fencing_token = fence.token
            return prepared.commit()
        except errors.WorkloadError as again:
            return again

    original = batches._single
    batches._single = committing
    try:
        yield
    finally:
        batches._single = original
