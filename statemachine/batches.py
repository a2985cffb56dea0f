"""Batch calls: many workloads per round trip, each still decided by the core on its own.

`Authority.admit_many`, `Authority.claim_many` and `Authority.report_many`
are built here. A batch is a fast path, never a second set of rules: every
workload of a batch is decided by `decide` on its own document, exactly as
its one-call method would decide it, and only a decision that writes and
records no refusal is committed by the batch, all of them in one round trip
(`BatchStore.write_many`, or `BatchStore.claim_batch` for claims), each
write its own compare-and-swap with its own audit record. Everything else
(a refusal, an answer that writes nothing, a write whose compare-and-swap
found another version) is handed to the one-call method, which decides it
again on a fresh read. So each slot of a batch's answer is what the
one-call method would have answered for it, in order: the reply, or the
`WorkloadError` it would have raised. A batch never raises because of one of
its workloads.

A store that is not a `BatchStore` is written one write at a time, with
the same answers.

When the round trip of a batch itself fails, every workload that batch was
writing gets that failure in its slot: `WORKLOAD_STORAGE_FAILURE` (nothing
was written), or `WORKLOAD_OUTCOME_UNKNOWN` (the whole batch may or may not
have committed: the store commits a batch entirely or not at all). Repeating
the same batch is then safe: the replay rules answer what did commit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workwarden.statemachine import errors, inputs, replays, scheduler
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.commands import (
    AdmitCommand,
    AdmitReply,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    FailCommand,
    HeartbeatCommand,
    StartCommand,
)
from workwarden.statemachine.models import ClaimReply, CreateWorkload, Workload, shallow_copy
from workwarden.storage.base import (
    CLAIM_PAGES,
    BatchStore,
    StoreConflict,
    StoredDocument,
    StoreError,
    StoreLimited,
    StoreOutcomeUnknown,
    Write,
    WriteOutcome,
)

# The authority is handed in by `Authority`'s own methods; typed loosely so this
# module does not import the one that imports it.
Authority = Any
Prepared = Any

__all__ = [
    "MAX_BATCH",
    "REPORT_COMMANDS",
    "Outcome",
    "Report",
    "admit_many",
    "as_batch",
    "claim_many",
    "report_many",
]

MAX_BATCH = 1000
"""The most workloads one batch call takes (a longer batch is `WORKLOAD_INVALID`)."""

REPORT_COMMANDS = (
    StartCommand,
    HeartbeatCommand,
    CheckpointCommand,
    CompleteCommand,
    FailCommand,
    ConfirmCancelCommand,
)
"""The worker's reports `report_many` takes: the fenced calls that write."""

Report = (
    StartCommand
    | HeartbeatCommand
    | CheckpointCommand
    | CompleteCommand
    | FailCommand
    | ConfirmCancelCommand
)
"""One report of a `report_many` batch."""

Outcome = Any
"""One slot of a batch's answer: the one-call method's reply, or the `WorkloadError` it raises."""


def as_batch(items: Iterable[Any], what: str) -> list[Any]:
    """`items` as a batch's list: `WORKLOAD_INVALID` naming `what` when it is not a list
    (text, bytes of any kind, a mapping, a number) or holds more than `MAX_BATCH`, as every
    batch call refuses it (`HttpAuthority`'s too)."""
    if isinstance(items, (str, bytes, bytearray, memoryview, Mapping)) or not isinstance(
        items, Iterable
    ):
        raise errors.bad_argument(what, f"{what} must be a list")
    # One item past the most a batch takes is enough to refuse it: a longer
    # iterable (a generator that never ends) is not drawn on further.
    batch = list(itertools.islice(items, MAX_BATCH + 1))
    if len(batch) > MAX_BATCH:
        raise errors.bad_argument(what, f"at most {MAX_BATCH} {what} per batch")
    return batch


def _store_failure(exc: StoreError, key: str) -> errors.WorkloadError:
    if isinstance(exc, StoreOutcomeUnknown):
        return errors.WorkloadError(
            errors.OUTCOME_UNKNOWN,
            "the batch may or may not have committed; call again with the same arguments",
            {"workload_id": key, "reason": str(exc)},
        )
    return errors.WorkloadError(errors.STORAGE_FAILURE, f"store failure: {exc}")


def _commit(
    authority: Authority, prepared: Sequence[Prepared]
) -> list[tuple[Write, WriteOutcome | StoreError]]:
    """Write every prepared decision in one round trip; each write with its outcome, in order."""
    writes = [authority._to_write(item, _written_workload(item)) for item in prepared]
    if not writes:
        return []
    store = authority.store
    if isinstance(store, BatchStore):
        try:
            return list(zip(writes, store.write_many(writes), strict=True))
        except StoreError as exc:
            return [(write, exc) for write in writes]
    outcomes: list[tuple[Write, WriteOutcome | StoreError]] = []
    for write in writes:
        try:
            version = store.write(
                write.key, write.document, write.index, write.expected_version, write.audit
            )
            outcomes.append((write, int(version)))
        except StoreError as exc:
            outcomes.append((write, exc))
    return outcomes


def _written_workload(item: Prepared) -> Workload:
    workload: Workload | None = item.decision.workload
    assert workload is not None, "only a decision that writes is committed by a batch"
    return workload


def _written(authority: Authority, item: Prepared, write: Write, version: int) -> Any:
    """Remember a committed write of a batch and give the reply its one-call method gives."""
    item._committed = True
    item.written = version
    authority._remembered_write(item, _written_workload(item), write, version)
    return item.decision.reply


def _single(authority: Authority, command: Command, now: int, operation: str) -> Outcome:
    """The one-call method's answer: decided again on a fresh read."""
    try:
        return authority._run(command, now, operation)
    except errors.WorkloadError as exc:
        return exc


def _settle(
    authority: Authority,
    now: int,
    slots: list[Outcome],
    pending: Sequence[tuple[int, Command, Prepared]],
) -> None:
    """Commit `pending` in one round trip and fill each one's slot."""
    outcomes = _commit(authority, [item for _, _, item in pending])
    for (slot, command, item), (write, outcome) in zip(pending, outcomes, strict=True):
        if isinstance(outcome, int):
            slots[slot] = _written(authority, item, write, outcome)
            continue
        authority._latest.forget(item.key)
        if isinstance(outcome, StoreConflict):
            slots[slot] = _single(authority, command, now, item.operation)
        else:
            slots[slot] = _store_failure(outcome, item.key)


def admit_many(
    authority: Authority, requests: Iterable[CreateWorkload | Mapping[str, Any]], now: int
) -> list[AdmitReply | errors.WorkloadError]:
    """Admit each request, one round trip for the batch; see `Authority.admit_many`."""
    inputs.check_now(now)
    batch = as_batch(requests, "requests")
    slots: list[Outcome] = [None] * len(batch)
    commands: list[tuple[int, AdmitCommand, str]] = []
    later: list[tuple[int, AdmitCommand]] = []
    keys: set[str] = set()
    for slot, request in enumerate(batch):
        try:
            command = AdmitCommand(request=inputs.as_request(request))
            authority.grants.verify(command.request.authorization_snapshot)
            key = workload_id_for(command.request)
        except errors.WorkloadError as exc:
            slots[slot] = exc
            continue
        if key in keys:
            # The same scoped key twice: the second is answered after the first committed.
            later.append((slot, command))
            continue
        keys.add(key)
        commands.append((slot, command, key))
    docs: Mapping[str, StoredDocument] = {}
    if authority.remember == 0 and commands:
        try:
            docs = _read_many(authority, [key for _, _, key in commands])
        except errors.WorkloadError as exc:
            # The read of the batch failed: each request it was for gets that
            # failure in its slot, as a failed write of the batch would give it.
            for slot, _, _ in commands:
                slots[slot] = exc
            commands = []
    pending: list[tuple[int, Command, Prepared]] = []
    for slot, command, key in commands:
        item = authority._unconfirmed(command, now, "admit", key, docs.get(key))
        if item is None:
            slots[slot] = _single_admit(authority, command, now)
        else:
            pending.append((slot, command, item))
    _settle(authority, now, slots, pending)
    for slot, command in later:
        slots[slot] = _single_admit(authority, command, now)
    for slot, outcome in enumerate(slots):
        if isinstance(outcome, errors.WorkloadError) and outcome.code == errors.CONFLICT:
            # A competing writer admitted the same scope first: converge on what it committed.
            command = AdmitCommand(request=inputs.as_request(batch[slot]))
            slots[slot] = _single(authority, command, now, "admit")
    return slots


def _single_admit(authority: Authority, command: AdmitCommand, now: int) -> Outcome:
    try:
        return authority.admit(command.request, now)
    except errors.WorkloadError as exc:
        return exc


def _read_many(authority: Authority, keys: Sequence[str]) -> Mapping[str, StoredDocument]:
    store = authority.store
    if isinstance(store, BatchStore):
        docs: Mapping[str, StoredDocument] = authority._store_call(store.read_many, keys)
        return docs
    found: dict[str, StoredDocument] = {}
    for key in keys:
        doc = authority._store_call(store.read, key)
        if doc is not None:
            found[key] = doc
    return found


def report_many(
    authority: Authority, reports: Iterable[Command | Mapping[str, Any]], now: int
) -> list[Outcome]:
    """Decide and commit each report, one round trip per round; see `Authority.report_many`."""
    inputs.check_now(now)
    batch = as_batch(reports, "reports")
    slots: list[Outcome] = [None] * len(batch)
    # Rounds: a key at most once per round, its reports in the order given. A
    # completion naming a result id another report of the batch named before
    # it is decided in a later round than that one: which of them holds the
    # id is then what the one calls, made in order, would have made it.
    rounds: list[list[tuple[int, Report]]] = []
    depth: dict[tuple[str, str], int] = {}
    for slot, report in enumerate(batch):
        try:
            command = inputs.as_command(report)
        except errors.WorkloadError as exc:
            slots[slot] = exc
            continue
        if not isinstance(command, REPORT_COMMANDS):
            slots[slot] = errors.bad_argument(
                f"reports[{slot}]",
                "a report is one of: "
                + ", ".join(model.model_fields["op"].default for model in REPORT_COMMANDS),
            )
            continue
        keys = [("workload", command.workload_id)]
        if isinstance(command, CompleteCommand):
            keys.append(("result", command.result_id))
        level = max(depth.get(key, 0) for key in keys)
        for key in keys:
            depth[key] = level + 1
        if level == len(rounds):
            rounds.append([])
        rounds[level].append((slot, command))
    for reports_of_round in rounds:
        _report_round(authority, now, slots, reports_of_round)
    return slots


def _report_round(
    authority: Authority, now: int, slots: list[Outcome], round_: Sequence[tuple[int, Report]]
) -> None:
    pending: list[tuple[int, Command, Prepared]] = []
    unknown: list[tuple[int, Report]] = []
    for slot, command in round_:
        key = command.workload_id
        known = authority._latest.get(key) if authority.remember else None
        if known is None:
            unknown.append((slot, command))
            continue
        doc, decoded = known
        item = authority._unconfirmed(command, now, command.op, key, doc, decoded)
        if item is None:
            slots[slot] = _single(authority, command, now, command.op)
        else:
            pending.append((slot, command, item))
    if unknown:
        docs: Mapping[str, StoredDocument] | None
        try:
            docs = _read_many(authority, [command.workload_id for _, command in unknown])
        except errors.WorkloadError as exc:
            for slot, _ in unknown:
                slots[slot] = exc
            docs = None
        if docs is not None:
            for slot, command in unknown:
                key = command.workload_id
                found = docs.get(key)
                item = (
                    authority._unconfirmed(command, now, command.op, key, found)
                    if found is not None
                    else None
                )
                if item is None:
                    slots[slot] = _single(authority, command, now, command.op)
                else:
                    pending.append((slot, command, item))
    # A report's caller is given its reply only, never the workload decided:
    # the workload may be kept decoded for the next report, as after a one-call
    # method (`Remembered.wrote`).
    for _, _, item in pending:
        item._private = True
    _settle(authority, now, slots, pending)


def claim_many(
    authority: Authority,
    tenant: Any,
    application: Any,
    worker_id: Any,
    capabilities: Any,
    now: int,
    lease_ms: Any,
    limit: Any,
    request_id: Any,
) -> list[ClaimReply]:
    """Claim up to `limit` workloads in one transaction; see `Authority.claim_many`."""
    inputs.check_now(now)
    tenant, application = inputs.as_full_scope(tenant, application)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
        raise errors.bad_argument("limit", f"limit must be a whole number from 1 to {MAX_BATCH}")
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
        held = _held_claims(authority, tenant, application, probe, now)
        if held:
            return held[:limit]
    seeker = scheduler.Seeker(tenant, application, now, frozenset(probe.capabilities))
    claims: list[ClaimReply] = []
    try:
        _claim_into(claims, authority, seeker, probe, now, limit)
    except errors.WorkloadError as exc:
        # A step that failed and committed nothing, after steps that committed
        # claims: those claims are held, and are the answer (fewer than asked for,
        # as when the work runs out). Any other refusal, or a failure with no claim
        # made yet, is the call's.
        if exc.code != errors.STORAGE_FAILURE or not claims:
            raise
    return claims


def _claim_into(
    claims: list[ClaimReply],
    authority: Authority,
    seeker: scheduler.Seeker,
    probe: ClaimCommand,
    now: int,
    limit: int,
) -> None:
    """`claim_many`'s claims, appended to `claims` as each step commits them."""
    store = authority.store
    if not isinstance(store, BatchStore):
        _claim_walk(authority, seeker, probe, now, limit, claims)
        return
    waiting: list[StoredDocument] = []
    full: set[str] = set()
    # A claim that times out or dead-letters its candidate writes that
    # decision, not a claim, and one refused for its concurrency key's limit
    # or rate writes nothing: another round claims in their place, as
    # `claim_next` would pass over them to the next candidate (and, for the
    # rest of the call, over every candidate of a key found full).
    unseen = True
    for _ in range(CLAIM_PAGES):
        wanted = limit - len(claims)
        got, passed_over, pages = _claim_round(
            authority, store, seeker, probe, now, wanted, waiting, full
        )
        claims.extend(got)
        if len(claims) >= limit:
            unseen = False
            break
        if not passed_over:
            # The store offers pages until one comes back short, or
            # `CLAIM_PAGES` of them: after that many, claimable work may remain.
            unseen = pages >= CLAIM_PAGES
            break
    if len(claims) < limit and waiting:
        unique = list({doc.key: doc for doc in waiting}.values())
        _claim_waiting(authority, seeker, probe, now, limit, unique, claims)
    if len(claims) < limit and unseen:
        # More candidates than the rounds' pages hold were passed over (work
        # needing a capability the worker lacks, waiting on a dependency, or
        # of a full concurrency key): walk on past them as `claim_next` does.
        _claim_walk(authority, seeker, probe, now, limit, claims, full)


def _claim_round(
    authority: Authority,
    store: BatchStore,
    seeker: scheduler.Seeker,
    probe: ClaimCommand,
    now: int,
    limit: int,
    waiting: list[StoredDocument],
    full: set[str],
) -> tuple[list[ClaimReply], int, int]:
    """One `claim_batch`: the claims it made, how many candidates it passed over instead, and
    how many pages of candidates the store offered.

    Passed over: timed out or dead-lettered by the claim, or refused for a
    concurrency key at its limit or out of its rate. Such a key is added to
    `full`, and this call's later rounds skip its candidates untried.
    """
    chosen: dict[str, Prepared] = {}
    pages = 0

    def choose(page: Sequence[StoredDocument]) -> list[Write]:
        # Called again with the same pages when the store starts over: a key
        # decided again replaces its first decision; at most `limit` writes.
        nonlocal pages
        pages += 1
        writes: list[Write] = []
        for doc in page:
            if len(chosen) >= limit and doc.key not in chosen:
                break
            if doc.index.concurrency_key in full:
                continue
            item = _decide_claim(authority, seeker, probe, now, doc, waiting)
            if item is not None:
                chosen[doc.key] = item
                writes.append(authority._to_write(item, _written_workload(item)))
        return writes

    try:
        results = store.claim_batch(seeker.tenant, seeker.application, now, limit, choose)
    except StoreError as exc:
        for key in chosen:
            authority._latest.forget(key)
        if isinstance(exc, StoreOutcomeUnknown):
            # The claims were sent: they may be held now, as a lost reply
            # leaves them. A repeat with the same request id is answered with them.
            raise errors.WorkloadError(
                errors.OUTCOME_UNKNOWN,
                "the claims may or may not have committed; call again with the same"
                " arguments and request id",
                {"workload_ids": sorted(chosen), "reason": str(exc)},
            ) from None
        raise errors.WorkloadError(errors.STORAGE_FAILURE, f"store failure: {exc}") from None
    claims: list[ClaimReply] = []
    passed_over = 0
    for write, outcome in results:
        item = chosen[write.key]
        if not isinstance(outcome, int):
            authority._latest.forget(write.key)
            if isinstance(outcome, StoreLimited) and write.index.concurrency_key is not None:
                full.add(write.index.concurrency_key)
                passed_over += 1
            continue
        reply = _written(authority, item, write, outcome)
        if item.decision.refusal is None and isinstance(reply, ClaimReply):
            claims.append(reply)
        else:
            passed_over += 1
    return claims, passed_over, pages


def _decide_claim(
    authority: Authority,
    seeker: scheduler.Seeker,
    probe: ClaimCommand,
    now: int,
    doc: StoredDocument,
    waiting: list[StoredDocument],
) -> Prepared | None:
    """The claim of a candidate held for this batch, decided by the core; None to pass it over.

    A candidate with dependencies is set aside in `waiting`: checking them reads
    other documents, which is not done while the batch holds its candidates.
    """
    workload = inputs.parse_stored(doc)
    if not seeker.may_try(workload):
        return None
    if workload.dependencies:
        waiting.append(doc)
        return None
    command = shallow_copy(probe, workload_id=doc.key)
    try:
        decision = authority._decide(workload, command, now)
    except errors.WorkloadError as exc:
        if exc.code in scheduler.SKIPPABLE_AT_CLAIM:
            return None
        raise
    if decision.workload is None:
        return None
    # The candidate is held for this batch: its version is the committed one,
    # so a decision that writes a refusal (a claim that dead-letters or times
    # the work out) is committed here too, as a fresh read's would be.
    item = authority._prepared(command, doc.key, doc.version, decision, now, "claim_next")
    item._private = True
    return item


def _claim_waiting(
    authority: Authority,
    seeker: scheduler.Seeker,
    probe: ClaimCommand,
    now: int,
    limit: int,
    waiting: Sequence[StoredDocument],
    claims: list[ClaimReply],
) -> None:
    """Claims, one call each, of candidates with dependencies whose dependencies are met,
    appended to `claims` until it holds `limit`."""
    states: dict[str, Workload | None] = {}
    for doc in waiting:
        if len(claims) >= limit:
            break
        workload = inputs.parse_stored(doc)
        if not scheduler.dependencies_met(
            workload, states, _reader(authority), inputs.parse_stored
        ):
            continue
        claim = _try_single_claim(authority, probe, now, doc, workload)
        if claim is not None:
            claims.append(claim)


def _reader(authority: Authority) -> Any:
    def read(key: str) -> StoredDocument | None:
        doc: StoredDocument | None = authority._store_call(authority.store.read, key)
        return doc

    return read


def _try_single_claim(
    authority: Authority, probe: ClaimCommand, now: int, doc: StoredDocument, workload: Workload
) -> ClaimReply | None:
    command = shallow_copy(probe, workload_id=doc.key)
    prepared = authority._unconfirmed(command, now, "claim_next", doc.key, doc, workload)
    if prepared is None:
        prepared = authority._prepare(command, now, "claim_next")
    prepared._private = True
    try:
        claim: ClaimReply = prepared.commit()
    except errors.WorkloadError as exc:
        if exc.code in scheduler.SKIPPABLE_AT_CLAIM:
            return None
        raise
    return claim


def _claim_walk(
    authority: Authority,
    seeker: scheduler.Seeker,
    probe: ClaimCommand,
    now: int,
    limit: int,
    claims: list[ClaimReply],
    full: set[str] | frozenset[str] = frozenset(),
) -> None:
    """`claim_many` on a store without batches: candidates walked as `claim_next` walks them,
    each claim appended to `claims` until it holds `limit`.

    A candidate of a concurrency key in `full` (found at its limit or out of
    its rate earlier in the call) is passed over untried.
    """
    while len(claims) < limit:
        taken = {claim.workload_id for claim in claims}

        def candidates(size: int, after: Any, taken: set[str] = taken) -> Sequence[StoredDocument]:
            page: Sequence[StoredDocument] = authority._store_call(
                authority.store.claim_candidates,
                seeker.tenant,
                seeker.application,
                now,
                size,
                after,
            )
            return [doc for doc in page if doc.key not in taken]

        def try_claim(doc: StoredDocument, workload: Workload) -> ClaimReply:
            if doc.index.concurrency_key in full:
                raise errors.WorkloadError(errors.CONCURRENCY_LIMITED, "its key is full")
            claim = _try_single_claim(authority, probe, now, doc, workload)
            if claim is None:
                raise errors.WorkloadError(errors.CONFLICT, "passed over")
            return claim

        claim = scheduler.claim_best(
            seeker, candidates, _reader(authority), inputs.parse_stored, try_claim
        )
        if claim is None:
            break
        claims.append(claim)


def _held_claims(
    authority: Authority, tenant: str, application: str, probe: ClaimCommand, now: int
) -> list[ClaimReply]:
    """The claims made with `probe`'s request id that answer a repeat of the batch.

    The live, unstarted claims the worker holds made with that id; when it
    holds none but one of them has started, the request was answered and its
    work begun: `WORKLOAD_NOT_READY`, as for `claim_next`.
    """
    held = authority._store_call(authority.store.held_claims, tenant, application, probe.worker_id)
    answers: list[ClaimReply] = []
    started: Workload | None = None
    for doc in held:
        workload = inputs.parse_stored(doc)
        if workload.tenant_id != tenant or workload.application_id != application:
            continue
        answer = replays.held_claim(
            authority.spec, workload, probe.worker_id, probe.request_id, now
        )
        if answer == replays.STARTED:
            started = workload
        elif isinstance(answer, ClaimReply):
            answers.append(answer)
    if not answers and started is not None:
        raise errors.WorkloadError(
            authority.spec.operations["claim_next"].spec.denied,
            "the claim request was answered and its attempt has started",
            {
                "state": started.state,
                "request_id": probe.request_id,
                "workload_id": started.workload_id,
            },
        )
    return answers
