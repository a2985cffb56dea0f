"""The authority: the thin shell around the pure core.

`Authority.prepare(command, now)` reads the committed workload, verifies what
needs keys (grant signatures) or other documents (a result id's owner, once
the output is checked), and calls `decide`. `Prepared.commit()` writes the
decided workload with the version it was decided on; if another writer
committed first, nothing of this call is written and it raises
`WORKLOAD_CONFLICT`, and the next call decides on the committed version. The
one-call methods (`admit`, `claim`, ...) are prepare then commit. What a
caller hands in is turned into models, or refused, by
`workwarden.statemachine.inputs`.

Deciding without reading first: a one-call method may decide on a version
the authority did not read just now, and let the compare-and-swap confirm it.
`claim_next` decides on the candidate page it read; an authority that
remembers its writes (`remember=N`, on by default) decides a command on the
version it last wrote itself for that key (one of its N latest writes), and
an admission on absence. Only a
decision that writes, and records no refusal, is committed that way: the
write succeeding proves the version was the committed one. Anything else (a
refusal, an answer that writes nothing, a conflict) is decided again on a
fresh read, so a refusal is never issued from an unconfirmed version.

Which candidate `claim_next` tries, and in what order, is the scheduler's
(`workwarden.statemachine.scheduler`); what is kept of the latest writes is
`workwarden.statemachine.remembered`'s.
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic_core import PydanticSerializationError

from workwarden.statemachine import (
    batches,
    errors,
    fairness,
    inputs,
    listing,
    pauses,
    replays,
    retention,
    scheduler,
)
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.commands import (
    OPERATOR_COMMANDS,
    AdmitCommand,
    AdmitReply,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    SweepReply,
    TimeoutCommand,
    WorkloadPage,
)
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.grants import GrantVerifier
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.inputs import invalid_from_validation
from workwarden.statemachine.models import (
    Attempt,
    Checkpoint,
    Claim,
    ClaimReply,
    CreateWorkload,
    ExecutionContext,
    Fence,
    Result,
    Workload,
    shallow_copy,
)
from workwarden.statemachine.remembered import DEFAULT_REMEMBER, Remembered
from workwarden.statemachine.safety import as_interrupt, check_json
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import (
    AuditRecord,
    CandidateCursor,
    PauseRecord,
    Store,
    StoreConflict,
    StoredDocument,
    StoreError,
    StoreLimited,
    StoreOutcomeUnknown,
    StoreRateLimited,
    Tombstones,
    Write,
)

__all__ = [
    "DEFAULT_REMEMBER",
    "Authority",
    "Prepared",
    "invalid_from_validation",
    "serialise",
]


def _in_scope(workload: Workload, tenant: str | None, application: str | None) -> bool:
    return (tenant is None or workload.tenant_id == tenant) and (
        application is None or workload.application_id == application
    )


#: The refusals of a commit decided on an unconfirmed version that are decided again on a
#: fresh read: a lost compare-and-swap, and a concurrency limit or rate checked against a
#: version that may no longer be the committed one (a holder's own write spends nothing).
_DECIDE_AGAIN = frozenset({errors.CONFLICT, errors.CONCURRENCY_LIMITED, errors.RATE_LIMITED})


def _audited_as(command: Command) -> str:
    """The operation a command's audit record names: a move its own (`approve`, `pause`),
    as the checker's model records it, not the `op` every move shares; else its `op`."""
    return command.operation if isinstance(command, OperatorCommand) else command.op


def serialise(workload: Workload) -> str:
    """The document text a store keeps for `workload`."""
    # `model_dump_json(by_alias=True)` exactly, without its keyword handling on every write.
    try:
        return _DOCUMENT.to_json(workload, by_alias=True).decode()
    except PydanticSerializationError as exc:
        # A signal that landed inside the serialiser (Ctrl-C, SIGTERM) stops as itself.
        raise as_interrupt(exc) from None


_DOCUMENT = Workload.__pydantic_serializer__


class Prepared:
    """A decided call, not yet written: `commit()` writes it with the version it was decided on."""

    def __init__(
        self,
        authority: Authority,
        key: str,
        expected_version: int | None,
        decision: Decision,
        now: int,
        fencing_token: int | None,
        operation: str,
        request_id: str | None = None,
    ) -> None:
        self.authority = authority
        self.key = key
        self.expected_version = expected_version
        self.decision = decision
        self.now = now
        self.fencing_token = fencing_token
        self.operation = operation
        self.request_id = request_id
        """The caller's request id the write is audited with (None: it gave none)."""
        self.written: int | None = None
        """The version `commit()` wrote, once it has."""
        self._committed = False
        # Made inside a one-call method: no caller sees the decision, only
        # its reply.
        self._private = False

    @property
    def writes(self) -> bool:
        """Does committing write anything? (Replays and refusals decided earlier do not.)"""
        return self.decision.workload is not None

    def commit(self) -> Any:
        """Write the decision (if it changes anything); return the reply or raise the refusal."""
        if self._committed:
            raise errors.invalid("commit", "a prepared call commits once")
        self._committed = True
        decision = self.decision
        workload = decision.workload
        if workload is not None:
            self.written = self.authority._write(self, workload)
        if decision.refusal is not None:
            raise decision.refusal
        return decision.reply


class Authority:
    """Admits work, leases it behind fencing tokens, and decides what becomes of it.

    `grants` is required: a `GrantVerifier` with the keys admissions are
    signed with, or `GrantVerifier.without_signatures()` to say explicitly
    that signatures are not checked. `spec` defaults to the shipped spec.

    `remember` (default `DEFAULT_REMEMBER`, 256; 0 turns it off) is how
    many of its latest writes the authority keeps, to decide the next
    one-call command on such a key without reading it first (see the module
    docstring): a worker's claim, start, heartbeat and completion then cost
    one round trip each instead of two. The compare-and-swap confirms every
    such decision, so it is safe with any store that honours the expected
    version, shared with any number of other writers; when another writer
    did commit in between, the call costs one failed write more and is
    decided again on a fresh read. What is kept is the document text of
    each write and, after a claim, start or heartbeat, the decoded workload
    too (so the next call on it skips decoding the text); at most `remember`
    of them, a few KiB each. A decoded workload is kept only when nothing the
    caller received shares a part of it, so no caller can change what the
    next decision is made on. It relies on what every store promises: a
    key's version only grows, so one version of a key is one document. A
    store emptied and filled again under a running authority breaks that
    (a re-admitted workload starts again at version 1); build a new
    authority after such a reset, or use `remember=0`.

    Thread-safety: one authority may be shared by every thread of a process,
    as long as its store may (every shipped store may). It keeps no state of
    its own between calls but the latest writes it remembers, behind a lock;
    the spec and the grant verifier are immutable. Several authorities, in
    one process or many, may share one store: the compare-and-swap decides
    between them. A `Prepared` decision belongs to the caller that made it.
    Bad arguments (`store` not a `Store`, `spec` not a `Spec`, `grants` not a
    `GrantVerifier`, a negative `remember`) are refused when it is built.
    """

    def __init__(
        self,
        store: Store,
        *,
        grants: GrantVerifier,
        spec: Spec | None = None,
        remember: int = DEFAULT_REMEMBER,
    ) -> None:
        if not isinstance(store, Store):
            raise errors.bad_argument(
                "store", "store must be a Store (MemoryStore, SQLiteStore, PostgresStore, ...)"
            )
        if spec is not None and not isinstance(spec, Spec):
            raise errors.bad_argument("spec", "spec must be a Spec (see load_spec), or None")
        if not isinstance(grants, GrantVerifier):
            raise errors.bad_argument(
                "grants", "grants must be a GrantVerifier (or GrantVerifier.without_signatures())"
            )
        if isinstance(remember, bool) or not isinstance(remember, int) or remember < 0:
            raise errors.bad_argument(
                "remember", "remember must be a whole number of writes, 0 or more"
            )
        self.store = store
        self.grants = grants
        self.spec = spec if spec is not None else default_spec()
        self.remember = remember
        self._latest = Remembered(remember)
        self._provided: tuple[object, dict[type, bool]] = (store, {})

    def _provides(self, protocol: type) -> bool:
        """Does the store implement `protocol` (a runtime-checkable one of `storage.base`)?

        Asked once per store object and protocol: checking a protocol looks up
        each of its methods, and the pause check runs on every claim by id.
        """
        store = self.store
        store_of, answers = self._provided
        if store_of is not store:
            answers = {}
            self._provided = (store, answers)
        answer = answers.get(protocol)
        if answer is None:
            answer = answers[protocol] = isinstance(store, protocol)
        return answer

    # -- the two phases --------------------------------------------------

    def prepare(self, command: Command | Mapping[str, Any], now: int) -> Prepared:
        """Read and decide `command` at `now`; nothing is written until `commit()`."""
        parsed = inputs.as_command(command)
        inputs.check_now(now)
        if isinstance(parsed, ClaimCommand):
            self._refuse_paused(parsed.workload_id)
        return self._prepare(parsed, now, _audited_as(parsed))

    def _prepare(self, command: Command, now: int, operation: str) -> Prepared:
        if isinstance(command, AdmitCommand):
            self.grants.verify(command.request.authorization_snapshot)
            key = workload_id_for(command.request)
        else:
            key = command.workload_id
        if isinstance(command, CompleteCommand):
            self._check_result_owner(command, key)
        self._check_request_owner(command, key)
        doc = self._store_call(self.store.read, key)
        if doc is None and isinstance(command, AdmitCommand):
            # A key purged before is admitted again after its tombstone, its
            # fencing tokens continuing past it (`decide`); the create expects it.
            tombstone = self._tombstone(key)
            decision = self._decide(None, command, now, tombstone)
            return self._prepared(command, key, tombstone, decision, now, operation)
        workload = inputs.parse_stored(doc) if doc is not None else None
        decision = self._decide(workload, command, now)
        version = doc.version if doc is not None else None
        return self._prepared(command, key, version, decision, now, operation)

    def _tombstone(self, key: str) -> int | None:
        """The version the store's last purge of `key` left; None if never purged (or no purges)."""
        if not isinstance(self.store, Tombstones):
            return None
        version = self._store_call(self.store.tombstone, key)
        return None if version is None else int(version)

    def _check_result_owner(self, command: CompleteCommand, key: str) -> None:
        """Refuse a completion naming a result id another workload holds.

        The output is checked first, as the seed checks it: an output with a
        secret, too deep or too large, is refused for that before the store is
        asked who owns the result id. (`decide` checks it again, as it hashes
        it; only the core could take the text made here.)
        """
        check_json(self.spec, command.output, "output")
        owner = self._store_call(self.store.find_result, command.result_id)
        if owner is not None and owner != key:
            raise errors.WorkloadError(
                errors.RESULT_DUPLICATE, "result id belongs to another workload"
            )

    def _check_request_owner(self, command: Command, key: str) -> None:
        """Refuse an operator request id the audit log records for another workload.

        The same id on the same workload is its replay rule's to answer, from
        the document; on another workload it is `WORKLOAD_CONFLICT`.
        """
        if not isinstance(command, OPERATOR_COMMANDS) or command.request_id is None:
            return
        first = self._store_call(self.store.find_request, command.request_id)
        if first is not None and first.key != key:
            raise errors.WorkloadError(
                errors.CONFLICT,
                "the request id was used for another workload",
                {"request_id": command.request_id, "workload_id": key},
            )

    def _prepared(
        self,
        command: Command,
        key: str,
        version: int | None,
        decision: Decision,
        now: int,
        operation: str | None = None,
    ) -> Prepared:
        fence = getattr(command, "fence", None)
        token = fence.token if isinstance(fence, Fence) else None
        if isinstance(command, ClaimCommand) and decision.workload is not None:
            # The claim issues the token its audit record carries.
            claim = decision.workload.current_claim
            token = claim.fencing_token if claim is not None else None
        request_id = (
            command.request_id if isinstance(command, (ClaimCommand, *OPERATOR_COMMANDS)) else None
        )
        return Prepared(
            self,
            key,
            version,
            decision,
            now,
            token,
            operation or command.op,
            request_id,
        )

    def _unconfirmed(
        self,
        command: Command,
        now: int,
        operation: str,
        key: str,
        doc: StoredDocument | None,
        workload: Workload | None = None,
    ) -> Prepared | None:
        """A decision on `doc` (None: absent), a version not read just now, if it may commit.

        None when the decision refuses, writes nothing or records a refusal:
        only a fresh read may decide those.
        """
        if workload is None and doc is not None:
            workload = inputs.parse_stored(doc)
        try:
            decision = self._decide(workload, command, now)
        except errors.WorkloadError:
            return None
        if decision.workload is None or decision.refusal is not None:
            return None
        version = doc.version if doc is not None else None
        return self._prepared(command, key, version, decision, now, operation)

    def _speculate(self, command: Command, now: int, operation: str) -> Prepared | None:
        """With `remember`, a decision on this authority's own last write of the key."""
        if self.remember == 0:
            return None
        if isinstance(command, AdmitCommand):
            self.grants.verify(command.request.authorization_snapshot)
            key = workload_id_for(command.request)
            return self._unconfirmed(command, now, operation, key, None)
        key = command.workload_id
        known = self._latest.get(key)
        if known is None:
            return None
        self._check_request_owner(command, key)
        doc, decoded = known
        return self._unconfirmed(command, now, operation, key, doc, decoded)

    def _run(
        self, command: Command, now: int, operation: str, prepared: Prepared | None = None
    ) -> Any:
        """Commit `prepared`, decided on an unconfirmed version, or else decide on a fresh read.

        When the unconfirmed version did not hold (a conflict, nothing
        written), the command is decided again on a fresh read.
        """
        if prepared is not None:
            prepared._private = True
            try:
                return prepared.commit()
            except errors.WorkloadError as exc:
                if exc.code not in _DECIDE_AGAIN or prepared.written is not None:
                    raise
        fresh = self._prepare(command, now, operation)
        fresh._private = True
        return fresh.commit()

    def _decide(
        self, workload: Workload | None, command: Command, now: int, tombstone: int | None = None
    ) -> Decision:
        """The core's decision; the one place the shell calls it."""
        if tombstone is None:
            return decide(self.spec, workload, command, now)
        return decide(self.spec, workload, command, now, tombstone=tombstone)

    def execute(self, command: Command | Mapping[str, Any], now: int) -> Any:
        """Prepare and commit `command` in one call."""
        if self.remember == 0:
            return self.prepare(command, now).commit()
        parsed = inputs.as_command(command)
        inputs.check_now(now)
        if isinstance(parsed, ClaimCommand):
            self._refuse_paused(parsed.workload_id)
        operation = _audited_as(parsed)
        return self._run(parsed, now, operation, self._speculate(parsed, now, operation))

    def _call(self, model: type[Command], now: int, /, **fields: Any) -> Any:
        """Execute a `model` command made of a one-call method's arguments."""
        return self.execute(inputs.build(model, **fields), now)

    def _store_call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except StoreError as exc:
            raise errors.WorkloadError(errors.STORAGE_FAILURE, f"store failure: {exc}") from None

    def _to_write(self, prepared: Prepared, workload: Workload) -> Write:
        """The compare-and-swap that commits `workload` for `prepared`, with its audit record."""
        document = serialise(workload)
        digest = hashlib.sha256(document.encode("utf-8")).hexdigest()
        decision = prepared.decision
        tx_seed = f"{prepared.key}\x1f{prepared.expected_version}\x1f{digest}".encode()
        audit = AuditRecord(
            transaction_id="tx_" + hashlib.sha256(tx_seed).hexdigest()[:24],
            key=prepared.key,
            version=0,
            actor=decision.actor,
            operation=prepared.operation,
            tenant=workload.tenant_id,
            application=workload.application_id,
            at=prepared.now,
            digest=digest,
            worker=decision.worker_id,
            attempt=workload.attempts[-1].attempt_id if workload.attempts else None,
            result=workload.result.result_id if workload.result is not None else None,
            fencing_token=prepared.fencing_token,
            request_id=prepared.request_id,
        )
        index = index_fields(self.spec, workload)
        return Write(prepared.key, document, index, prepared.expected_version, audit)

    def _write(self, prepared: Prepared, workload: Workload) -> int:
        write = self._to_write(prepared, workload)
        try:
            version = int(
                self.store.write(
                    write.key, write.document, write.index, write.expected_version, write.audit
                )
            )
        except StoreRateLimited as exc:
            raise errors.WorkloadError(
                errors.RATE_LIMITED,
                "the workload's concurrency key has spent its rate; nothing was committed",
                {"workload_id": prepared.key, "retry_at": exc.retry_at, "reason": str(exc)},
            ) from None
        except StoreLimited as exc:
            raise errors.WorkloadError(
                errors.CONCURRENCY_LIMITED,
                "the workload's concurrency key is at its limit; nothing was committed",
                {"workload_id": prepared.key, "reason": str(exc)},
            ) from None
        except StoreConflict as exc:
            if self.remember:
                self._latest.forget(prepared.key)
            raise errors.WorkloadError(
                errors.CONFLICT,
                "another writer committed this workload first; nothing was committed",
                {"workload_id": prepared.key, "reason": str(exc)},
            ) from None
        except StoreOutcomeUnknown as exc:
            if self.remember:
                self._latest.forget(prepared.key)
            raise errors.WorkloadError(
                errors.OUTCOME_UNKNOWN,
                "the write may or may not have committed; call again with the same arguments",
                {"workload_id": prepared.key, "reason": str(exc)},
            ) from None
        except StoreError as exc:
            if self.remember:
                self._latest.forget(prepared.key)
            raise errors.WorkloadError(errors.STORAGE_FAILURE, f"store failure: {exc}") from None
        self._remembered_write(prepared, workload, write, version)
        return version

    def _remembered_write(
        self, prepared: Prepared, workload: Workload, write: Write, version: int
    ) -> None:
        """Keep a committed write as this authority's latest of its key (with `remember`)."""
        if self.remember:
            stored = StoredDocument(prepared.key, version, write.document, write.index)
            self._latest.wrote(stored, workload, prepared.decision.reply, prepared._private)

    # -- reads ------------------------------------------------------------

    def get(
        self, workload_id: str, *, tenant: str | None = None, application: str | None = None
    ) -> Workload:
        """The committed workload, or `WORKLOAD_NOT_FOUND`.

        Scoped by `tenant` and/or `application`, a workload of another tenant
        or application is `WORKLOAD_NOT_FOUND` too, with the same message and
        details as one that does not exist: a scoped read never tells that
        another scope's work exists. Unscoped (the default), any id is read.
        """
        key = inputs.as_name(workload_id, "workload_id")
        tenant, application = inputs.as_scope(tenant, application)
        doc = self._store_call(self.store.read, key)
        workload = inputs.parse_stored(doc) if doc is not None else None
        if workload is None or not _in_scope(workload, tenant, application):
            raise errors.WorkloadError(errors.NOT_FOUND, "workload not found", {"workload_id": key})
        return workload

    def list(self, tenant: str, application: str) -> list[Workload]:
        """Every workload of a tenant and application, highest priority first, then oldest.

        A store that answers with another scope's workload is a
        `WORKLOAD_STORAGE_FAILURE`, never a leak.
        """
        scope = inputs.as_full_scope(tenant, application)
        workloads = [inputs.parse_stored(doc) for doc in self._store_call(self.store.list, *scope)]
        if any(not _in_scope(workload, *scope) for workload in workloads):
            raise errors.WorkloadError(
                errors.STORAGE_FAILURE, "the store listed a workload of another scope"
            )
        return workloads

    def list_page(
        self, tenant: str, application: str, limit: int, after: str | None = None
    ) -> WorkloadPage:
        """The next `limit` workloads of a scope in `list`'s order, and the next page's cursor.

        `after` is None for the first page, then the `next` of the page
        before (an opaque cursor; any other text is `WORKLOAD_INVALID`
        naming `after`). `limit` is 1 to `listing.MAX_PAGE` (1,000). A page
        is read at one instant; a workload written between two pages is
        listed once, unless its priority changed in between. On a store
        that is a `ListPages` only the page is read; on any other the scope
        is listed whole and cut. See `workwarden.statemachine.listing`.
        """
        return listing.list_page(self, tenant, application, limit, after)

    # -- admission and the worker's calls ---------------------------------

    def admit(self, request: CreateWorkload | Mapping[str, Any], now: int) -> AdmitReply:
        """Admit `request`, or answer the original admission of the same scoped key.

        When a competing writer admits the same scope first, this call
        converges on what it committed: the original for the same request,
        `IDEMPOTENCY_KEY_REUSED` for a different one.
        """
        command = AdmitCommand(request=inputs.as_request(request))
        try:
            reply: AdmitReply = self.execute(command, now)
        except errors.WorkloadError as exc:
            if exc.code != errors.CONFLICT:
                raise
            reply = self.execute(command, now)
        return reply

    def admit_many(
        self, requests: Iterable[CreateWorkload | Mapping[str, Any]], now: int
    ) -> builtins.list[AdmitReply | errors.WorkloadError]:
        """Admit every request of a batch in one round trip; each slot its own answer, in order.

        Each request is decided on its own as `admit` decides it: a new
        workload (`AdmitReply`), the original admission of the same scoped
        key (`replayed`), or its own refusal, given as the `WorkloadError`
        in its slot (nothing of that request is written; the others are).
        At most `batches.MAX_BATCH` (1,000) requests, taken from any iterable
        (a list, a generator, read no further than one item past the limit);
        a longer batch, or `requests` not an iterable of requests (a str, a
        mapping), is `WORKLOAD_INVALID` and writes nothing.
        The same scoped key twice in one batch: the second is answered
        after the first committed, as a second `admit` call would be. On a
        store that is a `BatchStore` every admission decided on absence is
        written in one transaction (`BatchStore.write_many`); the rest, one
        call each. See `workwarden.statemachine.batches`.
        """
        return batches.admit_many(self, requests, now)

    def claim_many(
        self,
        tenant: str,
        application: str,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        limit: int,
        *,
        request_id: str | None = None,
    ) -> builtins.list[ClaimReply]:
        """Claim up to `limit` claimable workloads of the scope at once; [] when there are none.

        Each claim is decided by the core on its own document, as
        `claim_next` decides one, in the scheduler's order (highest priority,
        then oldest), and each has its own fencing token, lease and attempt
        (`ClaimReply`). On a `BatchStore` the candidates are held for this
        call while they are decided (PostgreSQL: `FOR UPDATE SKIP LOCKED`;
        SQLite: the write lock) and every claim is written in the same
        transaction (`BatchStore.claim_batch`): a candidate another claimer
        holds is skipped, never claimed twice. Candidates with dependencies
        are claimed after, one call each, once their dependencies are read.
        A candidate this worker cannot claim (its concurrency key full or out
        of rate, a capability it lacks, a dependency unmet) is passed over
        for the work behind it, as `claim_next` passes it over: such
        candidates never leave a batch short while work this worker may
        take waits behind them.
        `limit` is 1 to `batches.MAX_BATCH`.

        `request_id`: every claim of the batch is recorded with it; a repeat
        of the call (its reply lost) is answered with the live, unstarted
        claims made with it, and writes nothing (`own_claim`); when none is
        live and one has started, the repeat is `WORKLOAD_NOT_READY`.

        A store that cannot be reached is `WORKLOAD_STORAGE_FAILURE`; a
        batch of claims sent whose answer was lost is
        `WORKLOAD_OUTCOME_UNKNOWN` (its claims may be held now), and the
        repeat with the same `request_id` answers them. A call that takes
        several steps (another round past candidates it passed over, a walk
        past blocked ones) and whose later step cannot reach the store, after
        earlier steps committed claims, answers those claims: they are held,
        and nothing of the failed step was written.
        """
        return batches.claim_many(
            self, tenant, application, worker_id, capabilities, now, lease_ms, limit, request_id
        )

    def report_many(
        self, reports: Iterable[Command | Mapping[str, Any]], now: int
    ) -> builtins.list[Any]:
        """Decide and commit many worker reports in one round trip; each slot its own answer.

        A report is a `start`, `heartbeat`, `checkpoint`, `complete`, `fail`
        or `confirm_cancel` command (a model, or a mapping with its `op`),
        each fenced. Each slot of the answer is what the one-call method
        would return for it (an `Attempt`, a `Claim`, a `Checkpoint`, a
        `Result`, a `StateReply`), or the `WorkloadError` it would raise, in
        order; one report's refusal never stops the others. Reports of one
        workload are decided in the order given, each after the one before
        it committed; a result id named by two completions goes to the
        earlier slot, as one call at a time would give it. At most
        `batches.MAX_BATCH` reports, read no further than one past the limit.
        """
        return batches.report_many(self, reports, now)

    def fair_share(self, scopes: Iterable[Any]) -> fairness.FairShare:
        """A fair-share ledger over `scopes` (`(tenant, application)` pairs), as `[fairness]` says.

        Keep it for as long as the claimer serves those scopes and hand it to
        every `claim_fair`; see `workwarden.statemachine.fairness`.
        """
        return fairness.FairShare.from_spec(self.spec, scopes)

    def claim_fair(
        self,
        share: fairness.FairShare,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        *,
        limit: int = 1,
        request_id: str | None = None,
    ) -> builtins.list[ClaimReply]:
        """Claim up to `limit` workloads across many tenants and applications, fairly; [] if none.

        `share` (from `fair_share`) is the claimer's ledger: its scopes are
        asked in its order (`[fairness]`: round robin, or weighted fair
        share), each claim decided by the core on its own document as
        `claim_next` and `claim_many` decide them (every gate of the scope:
        pauses, concurrency limits, dependencies, capabilities), and the
        ledger is told what each scope yielded. While a scope has claimable
        work, at most `share.bound(scope)` of this ledger's claims go to
        other scopes before one goes to it. With `request_id`, each call to
        a scope is made with `request_id.N` (N counting the calls), so the
        same ledger repeating a call whose reply was lost is answered with
        the claims already made.
        """
        return fairness.claim_fair(
            self, share, worker_id, capabilities, now, lease_ms, limit, request_id
        )

    def claim(
        self,
        workload_id: str,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        *,
        request_id: str | None = None,
    ) -> ClaimReply:
        """Claim READY work by id: a lease until `now + lease_ms` under a new fencing token.

        The reply is the claim with the work it leases: the attempt id, the
        input and every checkpoint so far (`ClaimReply`). `request_id`, the
        caller's claim request id, is recorded with the claim: the same
        worker repeating it (its reply lost) is answered with that claim
        while it is live and unstarted, and writes nothing; once the attempt
        has started, the repeat is `WORKLOAD_NOT_READY`, as any claim of a
        running workload is (`specs/README.md`, "Replays", `own_claim`).
        """
        caps = inputs.as_names(capabilities, "capabilities")
        claim: ClaimReply = self._call(
            ClaimCommand,
            now,
            workload_id=workload_id,
            worker_id=worker_id,
            capabilities=caps,
            lease_ms=lease_ms,
            request_id=request_id,
        )
        return claim

    def claim_next(
        self,
        tenant: str,
        application: str,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        *,
        request_id: str | None = None,
    ) -> ClaimReply | None:
        """Claim the best claimable workload of a tenant and application, or None.

        Highest priority first, then oldest. Skips work that is not yet
        eligible, needs a capability the worker lacks, or waits on a
        dependency; work that a claim dead-letters or times out is skipped
        too. Never raises because of one ineligible workload. The reply is
        the claim with the work it leases (`ClaimReply`), as for `claim`.

        With `request_id` (the caller's claim request id, recorded with the
        claim), a call repeated after its reply was lost is answered with the
        claim the first call made, and writes nothing (`own_claim`): the
        store is first asked for the claims `worker_id` holds in the scope
        (`Store.held_claims`), and the one made with that id is answered
        while it is live and unstarted; once its attempt has started the
        repeat is `WORKLOAD_NOT_READY`. A new id claims new work even while
        the worker holds other claims. Without a request id every call
        claims new work (a worker may hold several unstarted claims at
        once), so a caller that may repeat a `claim_next` passes one; the
        worker runtime always does.
        """
        inputs.check_now(now)
        tenant, application = inputs.as_full_scope(tenant, application)
        caps = inputs.as_names(capabilities, "capabilities")
        probe = inputs.build(
            ClaimCommand,
            workload_id="-",
            worker_id=worker_id,
            capabilities=caps,
            lease_ms=lease_ms,
            request_id=request_id,
        )
        if request_id is not None:
            held = self._held_claim(tenant, application, probe, now)
            if held is not None:
                return held
        seeker = scheduler.Seeker(tenant, application, now, frozenset(probe.capabilities))

        def candidates(limit: int, after: CandidateCursor | None) -> Sequence[StoredDocument]:
            page: Sequence[StoredDocument] = self._store_call(
                self.store.claim_candidates, tenant, application, now, limit, after
            )
            return page

        def read(key: str) -> StoredDocument | None:
            doc: StoredDocument | None = self._store_call(self.store.read, key)
            return doc

        def try_claim(doc: StoredDocument, workload: Workload) -> ClaimReply:
            command = shallow_copy(probe, workload_id=doc.key)
            # Decided on the page's version; the write confirms it. When it
            # conflicts, the candidate changed since the page was read (most
            # likely another claimer took it): the scheduler skips it without
            # a re-read, as a conflict after a fresh read is. A refusal is
            # decided again on a fresh read.
            prepared = self._unconfirmed(command, now, "claim_next", doc.key, doc, workload)
            if prepared is None:
                prepared = self._prepare(command, now, "claim_next")
            prepared._private = True
            claim: ClaimReply = prepared.commit()
            return claim

        return scheduler.claim_best(seeker, candidates, read, inputs.parse_stored, try_claim)

    def _refuse_paused(self, workload_id: Any) -> None:
        """`WORKLOAD_NOT_READY` for a claim by id of work in a paused scope."""
        in_force = pauses.paused(self)
        if not in_force:
            return
        key = inputs.as_name(workload_id, "workload_id")
        doc = self._store_call(self.store.read, key)
        if doc is None:
            return
        workload = inputs.parse_stored(doc)
        for record in in_force:
            if record.scope.covers(
                workload.tenant_id,
                workload.application_id,
                workload.definition_id,
                workload.concurrency_key,
            ):
                raise errors.WorkloadError(
                    self.spec.operations["claim"].spec.denied,
                    "claiming is paused for the workload's scope",
                    {"state": workload.state, "paused": record.scope.key},
                )

    def _held_claim(
        self, tenant: str, application: str, probe: ClaimCommand, now: int
    ) -> ClaimReply | None:
        """The claim `probe`'s worker holds in the scope that answers a repeat of it, or None."""
        held = self._store_call(self.store.held_claims, tenant, application, probe.worker_id)
        for doc in held:
            workload = inputs.parse_stored(doc)
            if workload.tenant_id != tenant or workload.application_id != application:
                continue
            answer = replays.held_claim(self.spec, workload, probe.worker_id, probe.request_id, now)
            if answer == replays.STARTED:
                raise errors.WorkloadError(
                    self.spec.operations["claim_next"].spec.denied,
                    "the claim request was answered and its attempt has started",
                    {
                        "state": workload.state,
                        "request_id": probe.request_id,
                        "workload_id": workload.workload_id,
                    },
                )
            if isinstance(answer, ClaimReply):
                return answer
        return None

    def start(self, workload_id: str, fence: Fence, now: int) -> Attempt:
        """Start the claimed attempt."""
        attempt: Attempt = self._call(StartCommand, now, workload_id=workload_id, fence=fence)
        return attempt

    def heartbeat(self, workload_id: str, fence: Fence, now: int, extend_ms: int) -> Claim:
        """Extend the lease to `now + extend_ms`; returns the claim with its new expiry.

        A lease that would end after `MAX_INSTANT` (2**53 - 1) is `WORKLOAD_INVALID`.

        A heartbeat still succeeds once an operator has requested cancellation;
        the worker learns of it when its `checkpoint`, `complete` or `fail` is
        refused with `WORKLOAD_TRANSITION_DENIED` (`details["state"]` is the
        cancelling state), or from `get`, and then calls `confirm_cancel`.
        """
        claim: Claim = self._call(
            HeartbeatCommand, now, workload_id=workload_id, fence=fence, extend_ms=extend_ms
        )
        return claim

    def execution_context(
        self, workload_id: str, fence: Fence, now: int, secret_references: Iterable[str] = ()
    ) -> ExecutionContext:
        """The input, every checkpoint so far, and the scopes, read through the fence.

        `secret_references`: at most 256 `secret://` references (more is `WORKLOAD_INVALID`).
        """
        context: ExecutionContext = self._call(
            ExecutionContextCommand,
            now,
            workload_id=workload_id,
            fence=fence,
            secret_references=inputs.as_names(secret_references, "secret_references"),
        )
        return context

    def checkpoint(
        self,
        workload_id: str,
        fence: Fence,
        state: Any,
        now: int,
        *,
        sequence: int | None = None,
    ) -> Checkpoint:
        """Record progress of the running attempt.

        With `sequence` (the workload's checkpoints so far plus one), a call
        repeated after a lost reply is answered with the checkpoint it recorded
        instead of recording a second (`specs/README.md`, "Replays").
        """
        checkpoint: Checkpoint = self._call(
            CheckpointCommand,
            now,
            workload_id=workload_id,
            fence=fence,
            state=state,
            sequence=sequence,
        )
        return checkpoint

    def complete(
        self,
        workload_id: str,
        fence: Fence,
        result_id: str,
        output: Any,
        now: int,
        *,
        artifacts: Iterable[str] = (),
        schema_version: int = 1,
    ) -> Result:
        """Record the attempt's result; the same report repeated returns the same result.

        `artifacts` names at most 256 artifacts (more is `WORKLOAD_INVALID`).
        """
        result: Result = self._call(
            CompleteCommand,
            now,
            workload_id=workload_id,
            fence=fence,
            result_id=result_id,
            output=output,
            artifacts=inputs.as_names(artifacts, "artifacts"),
            schema_version=schema_version,
        )
        return result

    def fail(
        self,
        workload_id: str,
        fence: Fence,
        kind: str,
        error: str,
        now: int,
        *,
        effect: str | None = None,
    ) -> str:
        """Report the attempt's failure; returns the state the failure policy decided.

        `kind` is a failure kind the spec declares (`[failures.kinds]`: in the
        shipped spec `timeout`, `transient_connection`, `worker_failure`,
        `validation`); another is `WORKLOAD_INVALID`, naming the valid ones,
        and writes nothing. `effect`: `"none"` (the attempt had no effect),
        `"unknown"` (it may have had one), or None (not said). The failure
        policy retries the work (READY after its backoff) when its retry
        policy lists the kind, or dead-letters it.
        """
        reply: StateReply = self._call(
            FailCommand,
            now,
            workload_id=workload_id,
            fence=fence,
            kind=kind,
            error=error,
            effect=effect,
        )
        return reply.state

    def confirm_cancel(self, workload_id: str, fence: Fence, now: int) -> str:
        """The holding worker confirms a requested cancellation; returns `CANCELLED`.

        Refused (`WORKLOAD_TRANSITION_DENIED`) when no cancellation was requested.
        """
        reply: StateReply = self._call(
            ConfirmCancelCommand, now, workload_id=workload_id, fence=fence
        )
        return reply.state

    # -- operators ---------------------------------------------------------

    def cancel(
        self, workload_id: str, actor: str, now: int, *, request_id: str | None = None
    ) -> str:
        """Cancel queued work, or request cancellation from the worker holding it.

        `request_id`, the operator's request id: the same operator repeating
        the same call with it is answered as the first call was, and writes
        nothing; the id used for another operation, by another operator or
        on another workload is `WORKLOAD_CONFLICT` (`specs/README.md`,
        "Replays"). The same holds for `timeout`, `retry` and `operate`.
        """
        reply: StateReply = self._call(
            CancelCommand, now, workload_id=workload_id, actor=actor, request_id=request_id
        )
        return reply.state

    def timeout(
        self, workload_id: str, actor: str, now: int, *, request_id: str | None = None
    ) -> str:
        """An operator times the workload out; returns the state the policy decided.

        `request_id`: the operator's request id, as for `cancel`.
        """
        reply: StateReply = self._call(
            TimeoutCommand, now, workload_id=workload_id, actor=actor, request_id=request_id
        )
        return reply.state

    def retry(
        self,
        workload_id: str,
        actor: str,
        now: int,
        reason: str | None = None,
        *,
        request_id: str | None = None,
    ) -> str:
        """Re-arm failed, timed-out or dead-lettered work: one more attempt, with `reason`.

        `request_id`: the operator's request id, as for `cancel`.
        """
        reply: StateReply = self._call(
            RetryCommand,
            now,
            workload_id=workload_id,
            actor=actor,
            reason=reason,
            request_id=request_id,
        )
        return reply.state

    def operate(
        self,
        workload_id: str,
        operation: str,
        actor: str,
        now: int,
        reason: str | None = None,
        *,
        request_id: str | None = None,
    ) -> str:
        """Take `operation`, an operation the spec adds with the effect `move`; the new state.

        A pause and a resume, an approval and a rejection: the operation's edge
        out of the workload's state is found in the table, and `reason` is
        recorded with it. An operation the spec lacks is `WORKLOAD_INVALID`;
        one the state has no edge for is its `denied` code. `request_id`: the
        operator's request id, as for `cancel` (the operation's row names the
        replay `same_move_request`; without it a repeat is taken again).
        """
        reply: StateReply = self._call(
            OperatorCommand,
            now,
            operation=operation,
            workload_id=workload_id,
            actor=actor,
            reason=reason,
            request_id=request_id,
        )
        return reply.state

    # -- pauses ------------------------------------------------------------

    def pause(
        self,
        actor: str,
        now: int,
        *,
        tenant: str,
        application: str | None = None,
        definition: str | None = None,
        concurrency_key: str | None = None,
        reason: str | None = None,
        request_id: str | None = None,
    ) -> PauseRecord:
        """Pause claiming for a tenant, one of its applications, or one definition of it.

        With `concurrency_key`, only the work of that concurrency key in the
        scope is paused. No claim takes work of the scope until `resume`;
        in-flight work is not affected, and deadlines keep running
        (`workwarden.statemachine.pauses`). Written with an audit record
        (operation `pause`); pausing a paused scope writes nothing and returns
        the pause in force. `reason` is checked as an operator's reason is
        (free text without NUL, no plaintext secrets). `request_id` is
        recorded with the audit record, for tracing the call; it is not
        matched against earlier calls (a pause is idempotent by its scope
        already), so one id may name a pause and a later resume.
        """
        scope = pauses.scope_of(tenant, application, definition, concurrency_key)
        return pauses.pause(self, scope, actor, now, reason, request_id)

    def resume(
        self,
        actor: str,
        now: int,
        *,
        tenant: str,
        application: str | None = None,
        definition: str | None = None,
        concurrency_key: str | None = None,
        request_id: str | None = None,
    ) -> bool:
        """Resume claiming for the scope; True if it was paused (an audit record `resume`)."""
        scope = pauses.scope_of(tenant, application, definition, concurrency_key)
        return pauses.resume(self, scope, actor, now, request_id)

    def pauses(self, tenant: str | None = None) -> builtins.list[PauseRecord]:
        """The pauses in force, of `tenant` or of every tenant."""
        return pauses.paused(self, tenant)

    # -- retention ----------------------------------------------------------

    def purge(
        self,
        now: int,
        *,
        older_than_ms: int | None = None,
        tenant: str | None = None,
        application: str | None = None,
        actor: str | None = None,
        export: Callable[[StoredDocument], None] | None = None,
        dry_run: bool = False,
        limit: int | None = None,
    ) -> retention.PurgeReport:
        """Delete finished work older than the spec's `[retention] after_ms`, audited.

        Terminal workloads whose last change is at least `older_than_ms` old
        (default: the spec's `after_ms`) are deleted one compare-and-swap each,
        with an audit record (operation `purge`, `actor` or
        `system.retention`), but those in a `[retention] keep` state (dead
        letters by default). `export` receives each stored document before it
        goes (a purge stops at the first one it raises for);
        `dry_run` (a bool) reports and writes nothing; `limit` bounds how many are
        purged. Scoped by `tenant` and/or `application`. Needs a store that
        can purge (`workwarden.storage.base.Purges`; every shipped one can).
        See `workwarden.statemachine.retention`.
        """
        return retention.purge(
            self,
            now,
            older_than_ms=older_than_ms,
            tenant=tenant,
            application=application,
            actor=actor,
            export=export,
            dry_run=dry_run,
            limit=limit,
        )

    # -- sweeps --------------------------------------------------------------

    def _sweep(
        self,
        due: Any,
        make: Any,
        now: int,
        tenant: str | None,
        application: str | None,
    ) -> builtins.list[str]:
        inputs.check_now(now)
        tenant, application = inputs.as_scope(tenant, application)
        changed: builtins.list[str] = []
        seen: set[str] = set()
        while True:
            keys = [
                key
                for key in self._store_call(due, now, scheduler.PAGE, tenant, application)
                if key not in seen
            ]
            if not keys:
                return changed
            for key in keys:
                seen.add(key)
                try:
                    reply: SweepReply = self.execute(make(workload_id=key), now)
                except errors.WorkloadError as exc:
                    # Another writer committed it first (its own sweep, a
                    # heartbeat, a completion): that commit decided.
                    if exc.code in (errors.CONFLICT, errors.NOT_FOUND):
                        continue
                    raise
                if reply.changed:
                    changed.append(key)

    def recover_expired(
        self, now: int, *, tenant: str | None = None, application: str | None = None
    ) -> builtins.list[str]:
        """Recover every workload whose lease expired at or before `now`; returns their ids.

        Scoped by `tenant` and/or `application`, only that scope's work is touched.
        """
        return self._sweep(self.store.expired_leases, RecoverCommand, now, tenant, application)

    def enforce_deadlines(
        self, now: int, *, tenant: str | None = None, application: str | None = None
    ) -> builtins.list[str]:
        """Time out every workload with a deadline fallen at or before `now`; returns their ids.

        Scoped by `tenant` and/or `application`, only that scope's work is touched.
        """
        return self._sweep(
            self.store.deadlines_due, EnforceDeadlineCommand, now, tenant, application
        )
