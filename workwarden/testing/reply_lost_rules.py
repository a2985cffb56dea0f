"""The stateful suite's lost replies: a call commits, its reply never arrives, it is made again.

A caller that cannot tell whether its call committed (the connection broke
after the commit) calls again with the same arguments (`specs/README.md`,
"Replays"). `ReplyLostRules` makes a worker or operator call through a store
that commits the write and then raises, as such a connection would; then
makes the same call again, with the same arguments at the same instant, and
holds the second answer to what the first would have been: the shadow
model's prediction of one call, made before the first (where the shadow
model runs), and the invariants after every step (always). The repeat must
write nothing: the documents, their histories, attempts and checkpoints,
and the audit log are what the first call left.

The calls: `claim_next` (with a claim request id, and without), `start`,
`checkpoint` (with its sequence), and an operator's `cancel`, `timeout` and
`retry` (with an operator request id). `reply_lost_calls` (a class
attribute) lists the ones the rule picks from.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, ClassVar

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import Claim, Fence, Workload
from workwarden.storage.base import AuditRecord, IndexFields, Store, StoreFailure
from workwarden.storage.forwarding import ForwardingStore
from workwarden.testing.machine import WORKERS
from workwarden.testing.operator_rules import OperatorRules
from workwarden.testing.shadow import Outcome
from workwarden.testing.support import (
    ALLOWED,
    APPLICATION,
    LEASES,
    TENANT,
    VERIFIER,
    Worker,
    allowed_refusals,
    fence_tuple,
    operator_targets,
)
from workwarden.testing.worker_rules import WorkerRules

__all__ = ["REPLY_LOST_CALLS", "LosesNextReply", "ReplyLostRules"]

REPLY_LOST_CALLS: tuple[str, ...] = (
    "claim_next_with_request_id",
    "start",
    "checkpoint",
    "cancel",
    "timeout",
    "retry",
)
"""Every call `ReplyLostRules` knows how to lose the reply of."""


class LosesNextReply(ForwardingStore):
    """Commits every write; while `losing`, raises after the first commit, as if its reply
    had been lost on the way back, and stops losing."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.losing = False
        self.lost = 0
        """How many replies it has lost."""

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """The wrapped store's `write`; while `losing`, its reply lost once it has committed."""
        version = self.inner.write(key, document, index, expected_version, audit)
        if self.losing:
            self.losing = False
            self.lost += 1
            raise StoreFailure("the connection broke after the commit")
        return version


class ReplyLostRules(WorkerRules, OperatorRules):
    """A call whose reply was lost, made again: answered as the first, writing nothing more."""

    #: The calls the rule picks from (a subset of `REPLY_LOST_CALLS`).
    reply_lost_calls: ClassVar[tuple[str, ...]] = REPLY_LOST_CALLS

    def _request_id(self, kind: str) -> str:
        """A request id no earlier call of this run used."""
        numbers = self.__dict__.setdefault("_reply_lost_requests", itertools.count(1))
        return f"{kind}-request-{next(numbers)}"

    def _unstarted_claims(self, worker: Worker) -> list[tuple[str, Workload]]:
        """The committed workloads of the suite's scope whose live claim `worker` holds, not
        yet started (read from every document: a store of any release answers it)."""
        out = []
        for doc in self.store.scan():
            if doc.index.tenant != TENANT or doc.index.application != APPLICATION:
                continue
            workload = Workload.model_validate_json(doc.document)
            claim = workload.current_claim
            if (
                claim is not None
                and claim.worker_id == worker.name
                and claim.expires_at > self.now
                and workload.attempts[-1].started_at is None
            ):
                out.append((doc.key, workload))
        return out

    def _losing_writer(self) -> tuple[LosesNextReply, Authority]:
        """The store that loses replies over the machine's store, and a writer over it.

        The writer decides on a fresh read every call (`remember=0`): what it
        wrote before its reply was lost is known to it only through the store.
        """
        made = self.__dict__.get("_reply_losing")
        if made is None:
            lossy = LosesNextReply(self.store)
            cls = type(self)
            writer = cls.authority_class(lossy, grants=VERIFIER, spec=cls.spec, remember=0)
            made = (lossy, writer)
            self.__dict__["_reply_losing"] = made
        lossy_store, lossy_writer = made
        assert isinstance(lossy_store, LosesNextReply)
        assert isinstance(lossy_writer, Authority)
        return lossy_store, lossy_writer

    def _committed_workload(self, key: str) -> Workload | None:
        doc = self.store.read(key)
        return None if doc is None else Workload.model_validate_json(doc.document)

    @precondition(lambda self: bool(self._admitted))
    @rule(
        worker=WORKERS,
        which=st.integers(0, 15),
        pick=st.integers(0, 15),
        lease_ms=st.sampled_from(LEASES),
    )
    def reply_lost_then_called_again(
        self, worker: Worker, which: int, pick: int, lease_ms: int
    ) -> None:
        """Make a call whose reply is lost after it committed, then the same call again: the
        second answer is what one call answers, and it writes nothing."""
        calls = type(self).reply_lost_calls
        call = calls[which % len(calls)]
        lossy, writer = self._losing_writer()
        repeat = self._repeatable(call, writer, worker, pick, lease_ms)
        if repeat is None:
            return
        label, make, again = repeat
        note(f"[{self.now}] {label}, its reply lost")
        lossy.losing = True
        try:
            make()
        except errors.WorkloadError as exc:
            note(f"    the first call raised {exc.code}")
        finally:
            lost = lossy.lost
            lossy.losing = False
        after_first = self._snapshot()
        note(f"    {'the reply was lost' if lost else 'nothing was written'}; called again")
        lossy.lost = 0
        self.__dict__["_reply_lost_key"] = self.store.audit_log()[-1].key if lost else None
        if lost and self.shadow is None and not self._lost_own_write(call, worker):
            # Without a shadow model a lost write that was not the call's own (a claim
            # that dead-lettered a candidate first) cannot be told from a repeat's.
            return
        again()
        if self._snapshot() != after_first:
            self._fail(
                "replies_are_consistent",
                f"{label}: the call repeated after a lost reply wrote again",
            )

    # -- each call: what to make, and how to make it again under the machine's checks --------------

    def _repeatable(
        self, call: str, writer: Authority, worker: Worker, pick: int, lease_ms: int
    ) -> tuple[str, Callable[[], Any], Callable[[], None]] | None:
        """The call's label, the call itself, and its repeat held to the checks; None when
        the call cannot be made now or one call of it would record a refusal (a deadline
        fallen: the repeat then meets what the refusal left, not the call)."""
        if call == "claim_next_with_request_id":
            if not self._scopes:
                return None
            # The shadow model knows no request ids; a worker's unstarted claims
            # made with other ids are left out of this rule.
            if self._unstarted_claims(worker):
                return None
            request_id = self._request_id("claim")

            def claim_next() -> Any:
                return writer.claim_next(
                    TENANT,
                    APPLICATION,
                    worker.name,
                    worker.capabilities,
                    self.now,
                    lease_ms,
                    request_id=request_id,
                )

            predicted = (
                self.shadow.claim_next(worker.name, worker.capabilities, lease_ms, self.now)
                if self.shadow
                else None
            )
            if predicted is not None and any(o.code is not None for o in predicted):
                return None  # a candidate a claim dead-letters or times out first
            return (
                f"claim_next by {worker.name} ({request_id})",
                claim_next,
                lambda: self._claim_next_again(worker, lease_ms, claim_next),
            )
        if call in ("start", "checkpoint"):
            self._make_ready_for(call, worker)
            if not worker.held:
                return None
            # A start prefers a claimed workload, a checkpoint a started one, so that the
            # call is one that writes.
            wanted = ("CLAIMED",) if call == "start" else ("RUNNING", "CHECKPOINTED")
            keys = sorted(worker.held)
            states = self._states()
            preferred = [k for k in keys if states.get(k) in wanted]
            keys = preferred or keys
            key = keys[pick % len(keys)]
            fence = worker.held[key]
            if call == "start":
                outcome = self._peek(lambda s: s.start(key, fence_tuple(fence), self.now))
                if outcome is False:
                    return None
                return (
                    f"start {key} by {worker.name}",
                    lambda: writer.start(key, fence, self.now),
                    lambda: self._start(writer, worker, key, fence, "start again"),
                )
            workload = self._committed_workload(key)
            if workload is None:
                return None
            sequence = len(workload.checkpoints) + 1
            if self._peek(lambda s: s.checkpoint(key, fence_tuple(fence), self.now)) is False:
                return None
            state = {"step": sequence}
            return (
                f"checkpoint {sequence} of {key} by {worker.name}",
                lambda: writer.checkpoint(key, fence, state, self.now, sequence=sequence),
                lambda: self._checkpoint_again(writer, worker, key, fence, state, sequence),
            )
        key = self._in_state(operator_targets(type(self).spec)[call], pick)
        if self._peek(lambda s: self._predict_operator(call, key)) is False:
            return None
        request_id = self._request_id("operator")
        calls: dict[str, Callable[[], str]] = {
            "cancel": lambda: writer.cancel(key, "operator-1", self.now, request_id=request_id),
            "timeout": lambda: writer.timeout(key, "operator-1", self.now, request_id=request_id),
            "retry": lambda: writer.retry(
                key, "operator-1", self.now, reason="re-arm", request_id=request_id
            ),
        }
        return (
            f"{call} {key} (operator, {request_id})",
            calls[call],
            lambda: self._operator_again(call, key, calls[call]),
        )

    def _make_ready_for(self, call: str, worker: Worker) -> None:
        """Bring `worker` to where `call` writes, by the machine's own checked calls: a claim
        when it holds nothing, and before a checkpoint the start of an unstarted claim."""
        writer = self._writers[0]
        if not worker.held and self._scopes:
            self._claim_next(writer, worker, max(LEASES))
        if call != "checkpoint" or not worker.held:
            return
        states = self._states()
        held = sorted(worker.held)
        if any(states.get(k) in ("RUNNING", "CHECKPOINTED") for k in held):
            return
        claimed = [k for k in held if states.get(k) == "CLAIMED"]
        if claimed:
            self._start(writer, worker, claimed[0], worker.held[claimed[0]], "start")

    def _states(self) -> dict[str, str]:
        """The committed state of every workload, read now."""
        return {doc.key: doc.index.state for doc in self.store.scan()}

    def _lost_own_write(self, call: str, worker: Worker) -> bool:
        """Was the lost write the call's own: for a claim_next, the worker's claim?"""
        if not call.startswith("claim_next"):
            return True
        last = self.store.audit_log()[-1]
        return last.worker == worker.name and last.fencing_token is not None

    def _peek(self, predict: Callable[[Any], Outcome | None]) -> Outcome | bool | None:
        """The shadow model's prediction of one call (None: no shadow model); False when one
        call would record a refusal."""
        if self.shadow is None:
            return None
        outcome = predict(self.shadow)
        if outcome is not None and outcome.code is not None and outcome.writes:
            return False
        return outcome

    def _claim_next_again(
        self, worker: Worker, lease_ms: int, claim_next: Callable[[], Any]
    ) -> None:
        outcomes = (
            self.shadow.claim_next(worker.name, worker.capabilities, lease_ms, self.now)
            if self.shadow
            else None
        )
        reply, error = self._call(
            "claim_next",
            f"claim_next by {worker.name} again",
            claim_next,
            Outcome(None, None, None) if self.shadow else None,
            ALLOWED["claim_next"],
        )
        if error is not None:
            return
        got = reply.workload_id if isinstance(reply, Claim) else None
        # The worker must not be left holding the claim whose reply it lost: while that
        # claim is live and unstarted, it is what the repeat answers.
        lost_key = self.__dict__.get("_reply_lost_key")
        for key, workload in self._unstarted_claims(worker):
            claim = workload.current_claim
            assert claim is not None
            if key == lost_key and key != got:
                self._fail(
                    "replies_are_consistent",
                    f"claim_next by {worker.name} repeated after a lost reply answered {got}"
                    f" while {key} is {workload.state} by {worker.name} (token"
                    f" {claim.fencing_token})",
                )
        granted = None
        if outcomes is not None and self.shadow is not None:
            for outcome in outcomes:
                if outcome.code is None:
                    granted = outcome
            wanted = granted.key if granted is not None else None
            if wanted != got:
                self._fail(
                    "shadow_model",
                    f"claim_next by {worker.name} repeated after a lost reply: the shadow model"
                    f" picks {wanted}, the authority {got}",
                )
        if isinstance(reply, Claim):
            note(f"    claimed {reply.workload_id}")
            self._granted(worker, reply.workload_id, reply, lease_ms, granted)

    def _checkpoint_again(
        self,
        writer: Authority,
        worker: Worker,
        key: str,
        fence: Fence,
        state: Any,
        sequence: int,
    ) -> None:
        outcome = self.shadow.checkpoint(key, fence_tuple(fence), self.now) if self.shadow else None

        def one_checkpoint(reply: Any) -> None:
            if reply is not None:
                self._expect(
                    reply.sequence == sequence,
                    f"checkpoint {sequence} repeated answered checkpoint {reply.sequence}",
                )

        self._worker_call(
            "checkpoint",
            worker,
            key,
            fence,
            "checkpoint again",
            lambda: writer.checkpoint(key, fence, state, self.now, sequence=sequence),
            outcome,
            detail=f" (sequence {sequence})",
            check=one_checkpoint,
        )

    def _operator_again(self, op: str, key: str, call: Callable[[], str]) -> None:
        outcome = self._predict_operator(op, key)
        allowed = allowed_refusals(type(self).spec)[op]
        reply, error = self._call(op, f"{op} {key} (operator) again", call, outcome, allowed)
        if error is None and outcome is not None:
            self._expect(
                reply == outcome.state,
                f"{op} repeated answered {reply}, the shadow model decides {outcome.state}",
                "shadow_model",
            )
        self._settle(outcome, error)
