"""Deliberately broken variants of the authority, to prove the checks have teeth.

Each mutant breaks one promise the way a real implementation might. The
model checker (`workwarden check --mutant NAME`) and `workwarden replay
--mutant NAME` take them by name; a test asserts that the checker finds each
one, with a shortest counterexample that replay reproduces on a real store.
They are never used outside those checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.commands import (
    Command,
    CompleteCommand,
    RecoverCommand,
)
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.deadlines import deadline_breach
from workwarden.statemachine.models import Fence, Workload
from workwarden.statemachine.spec import Spec, default_spec, load_spec_text, shipped_spec_text
from workwarden.storage.base import AuditRecord, IndexFields, Store
from workwarden.storage.forwarding import ForwardingStore

__all__ = ["MUTANTS", "Mutant"]

DecideFn = Callable[[Spec, Workload | None, Command, int], Decision]


@dataclass(frozen=True)
class Mutant:
    """One broken variant: what it breaks and the parts it replaces."""

    name: str
    breaks: str
    decide_fn: DecideFn = decide
    commit_checks_version: bool = True
    spec_text: Callable[[str], str] | None = None
    wrap_store: Callable[[Store], Store] | None = None

    def spec(self, spec: Spec) -> Spec:
        """The spec this mutant runs under (a broken copy, or `spec` itself)."""
        if self.spec_text is None:
            return spec
        return load_spec_text(self.spec_text(_text_of(spec)), f"{spec.source} ({self.name})")

    def authority_cls(self) -> type[Authority]:
        """An `Authority` whose core is this mutant's `decide`."""
        decide_fn = self.decide_fn
        if decide_fn is decide:
            return Authority

        class MutantAuthority(Authority):
            def _decide(
                self,
                workload: Workload | None,
                command: Command,
                now: int,
                tombstone: int | None = None,
            ) -> Decision:
                if tombstone is not None:
                    # An admission of a purged key: no universe purges, no mutant changes it.
                    return decide(self.spec, workload, command, now, tombstone=tombstone)
                return decide_fn(self.spec, workload, command, now)

        return MutantAuthority


def _text_of(spec: Spec) -> str:
    """The text of the file `spec` was loaded from (the shipped text for the shipped spec)."""
    if spec is default_spec():
        return shipped_spec_text()
    try:
        return Path(spec.source).read_text(encoding="utf-8")
    except OSError:
        return shipped_spec_text()


def _complete_without_fence(
    spec: Spec, workload: Workload | None, command: Command, now: int
) -> Decision:
    """Completion that believes whatever fence it is shown."""
    if isinstance(command, CompleteCommand) and workload is not None:
        claim = workload.current_claim
        if claim is not None and claim.claim_id != command.fence.claim_id:
            forged = Fence(
                claim_id=claim.claim_id, worker_id=claim.worker_id, token=claim.fencing_token
            )
            command = command.model_copy(update={"fence": forged})
    return decide(spec, workload, command, now)


def _recover_without_recheck(
    spec: Spec, workload: Workload | None, command: Command, now: int
) -> Decision:
    """Recovery that trusts it was asked about an expired lease, without re-checking."""
    if isinstance(command, RecoverCommand) and workload is not None:
        claim = workload.current_claim
        if claim is not None and claim.expires_at > now:
            early = workload.model_copy(
                update={"current_claim": claim.model_copy(update={"expires_at": now})}
            )
            return decide(spec, early, command, now)
    return decide(spec, workload, command, now)


def _late_deadline(spec: Spec, workload: Workload | None, command: Command, now: int) -> Decision:
    """Deadlines enforced one millisecond late."""
    if workload is None or deadline_breach(spec, workload, now) is None:
        return decide(spec, workload, command, now)
    if deadline_breach(spec, workload, now - 1) is not None:
        return decide(spec, workload, command, now)
    # At the very instant the deadline falls, behave as if it had not.
    shifted = workload.model_copy(update={"contract_version": 0})
    decision = decide(spec, shifted, command, now)
    if decision.workload is None:
        return decision
    restored = decision.workload.model_copy(update={"contract_version": workload.contract_version})
    return replace(decision, workload=restored)


def _retry_past_budget(text: str) -> str:
    """The failure policy without its budget rule: retries never stop."""
    budget_rule = (
        '  { when = ["budget_exhausted"], decision = "attempt_budget_exhausted", '
        'to = "DEAD_LETTER" },\n'
        '  { when = [], decision = "retry", to = "READY", delay = "backoff" },'
    )
    assert budget_rule in text, "the shipped failure policy changed; update the mutant"
    return text.replace(
        budget_rule, '  { when = [], decision = "retry", to = "READY", delay = "backoff" },'
    )


class _IgnoresExpectedVersion(ForwardingStore):
    """A store wrapper whose writes succeed whatever version they expected."""

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        current = self.inner.read(key)
        actual = None if current is None else current.version
        return self.inner.write(key, document, index, actual, audit)


#: The mutants, by name.
MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "store_ignores_expected_version",
            "a write lands whatever version it was decided on (a lost update)",
            commit_checks_version=False,
            wrap_store=_IgnoresExpectedVersion,
        ),
        Mutant(
            "complete_skips_fence",
            "completion does not check the presented fence",
            decide_fn=_complete_without_fence,
        ),
        Mutant(
            "recovery_skips_recheck",
            "recovery does not re-check on the committed version that the lease expired",
            decide_fn=_recover_without_recheck,
        ),
        Mutant(
            "deadline_one_ms_late",
            "a deadline is enforced one millisecond after it falls",
            decide_fn=_late_deadline,
        ),
        Mutant(
            "retry_past_budget",
            "the failure policy retries past the attempt budget",
            spec_text=_retry_past_budget,
        ),
    )
}
