"""The stateful suite's batches: `admit_many`, `claim_many` and `report_many`, among the rest.

A batch is a fast path with the one-call methods' rules (`statemachine/batches.py`):
each slot of its answer is what its one-call method would answer, in turn. So the
shadow model predicts a batch as the same calls made one after another (each on the
world the earlier ones left), and each slot is held to its prediction; the batch must
append exactly the versions those calls would write. Without the shadow model each
slot must be a reply, or a refusal its operation can give, and the batch may write at
most one version per slot that succeeded or was refused with a refusal that records.

The batches mix what a worker's batch holds: held and stale fences, the same report
twice, two reports of one workload, new admissions and replays and reused keys in one
list, and a slot that is no request at all. They are made by any writer, between the
other rules' single calls and the held calls of another writer, so a batch often
decides on a version another writer has replaced since (the remembering writer's):
`RecordingBatchStore.batch_conflicts` counts those, and the coverage records them as
`(op, "batch conflict")`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import multiple, precondition, rule

from workwarden.statemachine import errors
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.commands import (
    AdmitReply,
    CheckpointCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    FailCommand,
    HeartbeatCommand,
    StartCommand,
    StateReply,
)
from workwarden.statemachine.models import Attempt, Checkpoint, Claim, CreateWorkload, Fence, Result
from workwarden.testing.admission_rules import AdmissionRules
from workwarden.testing.machine import WORKERS, WORKLOADS, WRITERS
from workwarden.testing.shadow import Outcome, ShadowModel
from workwarden.testing.support import (
    ALLOWED,
    APPLICATION,
    FAILURE_KINDS,
    LEASES,
    MAX_LIVE,
    REPORTS,
    SCOPES,
    TENANT,
    RecordingBatchStore,
    Worker,
    WorkloadPlan,
    fence_tuple,
    shadow_plan,
    workload_plans,
)
from workwarden.testing.worker_rules import WorkerRules

__all__ = ["BatchRules"]

_BATCH = "batch_slots_answer_as_single_calls"
#: How a report of a batch picks its fence: a held one, a forgotten one, the slot before's again.
_FENCES = ("held", "held", "held", "old", "again")
#: What an admission slot is: a new scope, a replay, a reused key, the new one before it again,
#: or no request at all.
_ADMISSIONS = ("new", "new", "again", "reused", "twice", "not a request")
#: The reply type each report's one-call method answers with.
_REPLIES: dict[str, type] = {
    "start": Attempt,
    "heartbeat": Claim,
    "checkpoint": Checkpoint,
    "complete": Result,
    "fail": StateReply,
    "confirm_cancel": StateReply,
}
_FINISHING = frozenset({"complete", "fail", "confirm_cancel"})


def _copy(shadow: ShadowModel) -> ShadowModel:
    """A scratch copy of the shadow model, to predict a batch's calls in turn."""
    return shadow.copy()


class _Slot:
    """One report of a batch: the call, who makes it, and what the one-call method gives."""

    def __init__(
        self, op: str, worker: Worker, key: str, fence: Fence, command: Command, label: str
    ) -> None:
        self.op = op
        self.worker = worker
        self.key = key
        self.fence = fence
        self.command = command
        self.label = label
        self.outcome: Outcome | None = None
        self.extra: tuple[Any, ...] = ()


class BatchRules(WorkerRules, AdmissionRules):
    """Batches of admissions, claims and reports, each slot held to its one-call answer."""

    # -- plumbing -------------------------------------------------------------------------------

    def _audit_length(self) -> int:
        return len(self.store.audit_log())

    def _batch_conflicts(self) -> int:
        store = self.store
        return store.batch_conflicts if isinstance(store, RecordingBatchStore) else 0

    def _batch(self, op: str, label: str, call: Callable[[], Any]) -> Any:
        """Make a batch call: it answers slot by slot and never raises for one of its slots."""
        note(f"[{self.now}] {label}")
        conflicts = self._batch_conflicts()
        try:
            answer = call()
        except errors.WorkloadError as exc:
            self._fail(_BATCH, f"{label} raised {exc.code}: {exc.message}")
            raise
        if self._batch_conflicts() > conflicts:
            note("    a write of the batch found another version: decided again on a fresh read")
            self._count(op, "batch conflict")
        return answer

    def _slot(
        self,
        op: str,
        label: str,
        answer: Any,
        outcome: Outcome | None,
        reply_type: type | None,
    ) -> errors.WorkloadError | None:
        """Hold one slot to its prediction (or to the refusals `op` gives); its error, if any."""
        if isinstance(answer, errors.WorkloadError):
            note(f"    {label}: refused {answer.code}")
            self._count(f"batch {op}", answer.code)
            self._records(answer.code)
            if outcome is not None and outcome.code != answer.code:
                self._fail(
                    _BATCH,
                    f"{label}: its one-call method gives {outcome.describe()}, "
                    f"the batch's slot is {answer.code}: {answer.message}",
                )
            elif outcome is None and answer.code not in ALLOWED.get(op, frozenset()):
                self._fail(_BATCH, f"{label}: {answer.code} is not a refusal {op} gives")
            return answer
        note(f"    {label}: ok")
        self._count(f"batch {op}", "ok")
        if outcome is not None and outcome.code is not None:
            self._fail(
                _BATCH,
                f"{label}: its one-call method gives {outcome.describe()}, the batch accepted it",
            )
        if reply_type is not None and not isinstance(answer, reply_type):
            self._fail(_BATCH, f"{label}: answered {answer!r}, not a {reply_type.__name__}")
        return None

    def _wrote(
        self, label: str, before: int, outcomes: Sequence[Outcome | None], bound: int
    ) -> None:
        """The batch appended one audit record per version its calls write, and no more."""
        written = self._audit_length() - before
        if self.shadow is not None:
            expected = sum(1 for o in outcomes if o is not None and o.writes)
            if written != expected:
                self._fail(
                    _BATCH, f"{label} wrote {written} versions, its one-call methods {expected}"
                )
        elif written > bound:
            self._fail(_BATCH, f"{label} wrote {written} versions for {bound} slots that may")

    # -- admissions -----------------------------------------------------------------------------

    @precondition(lambda self: bool(self._admitted))
    @rule(
        target=WORKLOADS,
        writer=WRITERS,
        slots=st.lists(
            st.tuples(st.sampled_from(_ADMISSIONS), st.integers(0, 7), workload_plans()),
            min_size=1,
            max_size=4,
        ),
    )
    def admit_batch(self, writer: Authority, slots: list[tuple[str, int, WorkloadPlan]]) -> Any:
        """`admit_many` of a mix: requests of unused scopes (while there is room), replays of
        admitted ones, admitted keys reused with another input, the batch's own new request
        again (answered as a replay of the first), and a mapping that is no request at all
        (WORKLOAD_INVALID in its slot alone)."""
        terminal = type(self).spec.terminal_states
        live = sum(1 for _, w in self._parsed.values() if w.state not in terminal)
        scratch = _copy(self.shadow) if self.shadow is not None else None
        requests: list[CreateWorkload | dict[str, Any]] = []
        plans: list[tuple[str, tuple[str, str] | None, WorkloadPlan | None, Outcome | None]] = []
        fresh: list[tuple[tuple[str, str], WorkloadPlan, CreateWorkload]] = []
        taken = set(self._scopes)
        admitted = sorted(self._admitted)
        for kind, pick, plan in slots:
            free = [s for s in SCOPES if s not in taken]
            if kind == "new" and (not free or live + len(fresh) >= MAX_LIVE):
                kind = "again"
            if kind == "twice" and not fresh:
                kind = "again"
            if kind == "not a request":
                requests.append({"tenant_id": TENANT})
                plans.append((kind, None, None, Outcome(None, errors.INVALID)))
                continue
            if kind == "new":
                scope = free[pick % len(free)]
                taken.add(scope)
                request = plan.request(scope[0], scope[1], self.now)
                fresh.append((scope, plan, request))
            elif kind == "twice":
                scope, plan, request = fresh[-1]
            else:
                picked = admitted[pick % len(admitted)]
                scope, plan, request = self._admitted[picked]
                # A purged workload's scope admits its own request afresh.
                if kind == "reused" and self.store.read(picked) is not None:
                    changed = {"input": {"payload": plan.payload + 1 + pick % 2}}
                    request = request.model_copy(update=changed)
            requests.append(request)
            outcome = None
            if scratch is not None:
                outcome = scratch.admit(scope, shadow_plan(plan, request), self.now)
                if outcome.created:
                    key = workload_id_for(request)
                    scratch.register_scope(scope, key)
                    scratch.apply(outcome, key=key)
            plans.append((kind, scope, plan, outcome))
        label = f"admit_many of {len(requests)}: {[kind for kind, *_ in plans]}"
        before = self._audit_length()
        answers = self._batch("admit_many", label, lambda: writer.admit_many(requests, self.now))
        self._expect(
            len(answers) == len(requests), f"{label} answered {len(answers)} slots", _BATCH
        )
        created: list[str] = []
        readmitted: list[tuple[tuple[str, str], WorkloadPlan, CreateWorkload]] = []
        may_write = 0
        for index, ((kind, where, slot_plan, expected), answer) in enumerate(
            zip(plans, answers, strict=True)
        ):
            what = f"slot {index} ({kind} {where})"
            error = self._slot("admit", what, answer, expected, AdmitReply)
            if error is not None:
                continue
            assert isinstance(answer, AdmitReply)
            expected_new = expected.created if expected is not None else kind == "new"
            self._expect(
                answer.created == expected_new,
                f"{what}: answered created={answer.created}",
                _BATCH,
            )
            if answer.created:
                may_write += 1
                created.append(answer.workload.workload_id)
                sent = requests[index]
                if kind not in ("new", "twice") and where is not None and slot_plan is not None:
                    assert isinstance(sent, CreateWorkload)
                    readmitted.append((where, slot_plan, sent))
        self._wrote(label, before, [o for *_, o in plans], may_write)
        keys = []
        for scope, plan, request in fresh:
            key = workload_id_for(request)
            if key not in created:
                continue
            outcome = (
                self.shadow.admit(scope, shadow_plan(plan, request), self.now)
                if self.shadow
                else None
            )
            keys.append(self._admitted_as(key, scope, plan, request, outcome))
        for scope, plan, request in readmitted:
            # A purged workload admitted again: the key is known, its life starts afresh.
            outcome = (
                self.shadow.admit(scope, shadow_plan(plan, request), self.now)
                if self.shadow
                else None
            )
            self._admitted_as(workload_id_for(request), scope, plan, request, outcome)
        return multiple(*keys)

    # -- claims ---------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._scopes))
    @rule(
        writer=WRITERS,
        worker=WORKERS,
        lease_ms=st.sampled_from(LEASES),
        limit=st.integers(1, 4),
        with_request_id=st.booleans(),
    )
    def claim_batch(
        self, writer: Authority, worker: Worker, lease_ms: int, limit: int, with_request_id: bool
    ) -> None:
        """`claim_many` of up to `limit` workloads: the claims `claim_next` would grant called
        that many times in turn (the best claimable first, timing out what a claim finds past
        its deadline on the way), each under its own fence; with a new request id or none."""
        request_id = self._request_id_for_batch() if with_request_id else None
        predicted: list[Outcome] = []
        if self.shadow is not None:
            scratch = _copy(self.shadow)
            grants = 0
            while grants < limit:
                outcomes = scratch.claim_next(worker.name, worker.capabilities, lease_ms, self.now)
                for outcome in outcomes:
                    scratch.apply(outcome)
                    predicted.append(outcome)
                    grants += outcome.code is None
                if not outcomes or outcomes[-1].code is not None:
                    break
        label = f"claim_many by {worker.name} for {lease_ms} ms, at most {limit}" + (
            f" (request {request_id})" if request_id else ""
        )
        before = self._audit_length()
        claims = self._batch(
            "claim_many",
            label,
            lambda: writer.claim_many(
                TENANT,
                APPLICATION,
                worker.name,
                worker.capabilities,
                self.now,
                lease_ms,
                limit,
                request_id=request_id,
            ),
        )
        got = [claim.workload_id for claim in claims]
        note(f"    claimed {got}")
        self._expect(len(claims) <= limit, f"{label} granted {len(claims)} claims", _BATCH)
        self._expect(len(set(got)) == len(got), f"{label} granted one workload twice", _BATCH)
        self._count("claim_many", "ok" if claims else "none")
        if self.shadow is not None:
            applied = self._claims_as_predicted(label, limit, predicted, got)
            self._wrote(label, before, applied, len(applied))
        for claim in claims:
            granted = None
            if self.shadow is not None:
                granted = self.shadow.claim(
                    claim.workload_id, worker.name, worker.capabilities, lease_ms, self.now
                )
            self._granted(worker, claim.workload_id, claim, lease_ms, granted)

    def _request_id_for_batch(self) -> str:
        count = int(self.__dict__.get("_batch_requests", 0)) + 1
        self.__dict__["_batch_requests"] = count
        return f"claim-batch-{count}"

    def _claims_as_predicted(
        self, label: str, limit: int, predicted: Sequence[Outcome], got: Sequence[str]
    ) -> list[Outcome]:
        """Hold the claims to `claim_next`'s grants in turn; settle what they leave before them.

        The claims must be the first grants, in order. The refusals written on the way (a
        claim that finds a deadline fallen times the work out) up to the next grant are
        settled in the shadow model; the grants are settled by the caller, as claims.
        """
        wanted = [o.key for o in predicted if o.code is None]
        if list(got) != wanted[: len(got)]:
            self._fail(
                _BATCH,
                f"{label}: claim_next in turn grants {wanted[:limit]}, the batch {list(got)}",
            )
        refusals_written = sum(1 for o in predicted if o.code is not None and o.writes)
        if len(got) < min(limit, len(wanted)) and len(got) + refusals_written < limit:
            # claim_many counts the work it times out toward `limit` (so it may grant
            # fewer claims than claim_next would, never more): anything short of that
            # is claimable work left behind.
            self._fail(
                _BATCH,
                f"{label}: claim_next in turn grants {wanted[:limit]}, the batch only {list(got)}",
            )
        assert self.shadow is not None
        settled: list[Outcome] = []
        grants = 0
        for outcome in predicted:
            if outcome.code is None:
                if grants == len(got):
                    break
                grants += 1
            else:
                self.shadow.apply(outcome)
            settled.append(outcome)
        return settled

    # -- reports --------------------------------------------------------------------------------

    def _has_fences(self) -> bool:
        return self._holding() or bool(self._old_claims())

    @precondition(lambda self: self._has_fences())
    @rule(
        writer=WRITERS,
        reports=st.lists(
            st.tuples(st.sampled_from(REPORTS), st.integers(0, 15), st.sampled_from(_FENCES)),
            min_size=1,
            max_size=5,
        ),
        extend_ms=st.sampled_from(LEASES),
        kind=st.sampled_from(FAILURE_KINDS),
    )
    def report_batch(
        self, writer: Authority, reports: list[tuple[str, int, str]], extend_ms: int, kind: str
    ) -> None:
        """`report_many` of a worker's mix: starts, heartbeats, checkpoints, completions,
        failure reports and confirmations, under held fences and forgotten (stale) ones, the
        slot before sent again, several reports of one workload; each slot answered as its
        one-call method would answer it after the slots before it."""
        slots: list[_Slot] = []
        for op, pick, how in reports:
            if how == "again" and slots:
                slots.append(slots[-1])
                continue
            old = self._old_claims()
            pool = old if how == "old" and old else self._held_claims() or old
            worker, key, fence = pool[pick % len(pool)]
            command, extra = self._report(op, key, fence, extend_ms, kind, pick)
            made = _Slot(
                op,
                worker,
                key,
                fence,
                command,
                f"{op} {key} by {worker.name} "
                f"(token {fence.token}{', forgotten' if how == 'old' else ''})",
            )
            made.extra = extra
            slots.append(made)
        self._send_reports(writer, slots, extend_ms)

    @precondition(lambda self: bool(self._live_claims()) and len(self._writers) > 1)
    @rule(
        pick=st.integers(0, 15),
        then=st.sampled_from(REPORTS),
        extend_ms=st.sampled_from(LEASES),
    )
    def report_batch_behind_another_writer(self, pick: int, then: str, extend_ms: int) -> None:
        """The race a batch hands to its one-call method: a writer that remembers its own
        writes heartbeats a held claim, another writer heartbeats it too, and the first sends
        a batch of reports on it (a heartbeat, then `then`), deciding on the version it
        remembers: the batch's compare-and-swap finds the other writer's, and each slot is
        decided again on a fresh read, answered as its one-call method would be."""
        remembering = [w for w in self._writers if w.remember]
        if not remembering:
            note("    no writer remembers its writes")
            return
        first = remembering[pick % len(remembering)]
        other = next(w for w in self._writers if w is not first)
        live = self._live_claims()
        worker, key, fence = live[pick % len(live)]
        self._heartbeat(first, worker, key, fence, extend_ms, "heartbeat")
        self._heartbeat(other, worker, key, fence, extend_ms, "another writer's heartbeat")
        if worker.held.get(key) != fence:
            return
        slots = []
        for op in ("heartbeat", then):
            command, extra = self._report(op, key, fence, extend_ms, "transient_connection", pick)
            made = _Slot(op, worker, key, fence, command, f"{op} {key} by {worker.name}")
            made.extra = extra
            slots.append(made)
        self._send_reports(first, slots, extend_ms)

    def _send_reports(self, writer: Authority, slots: Sequence[_Slot], extend_ms: int) -> None:
        """`report_many` of `slots`, each held to its one-call answer, then settled."""
        outcomes: list[Outcome | None] = []
        if self.shadow is not None:
            scratch = _copy(self.shadow)
            for made in slots:
                predicted = self._predict(scratch, made, extend_ms)
                scratch.apply(predicted)
                outcomes.append(predicted)
        else:
            outcomes = [None] * len(slots)
        label = f"report_many of {len(slots)}"
        before = self._audit_length()
        commands = [made.command for made in slots]
        answers = self._batch("report_many", label, lambda: writer.report_many(commands, self.now))
        self._expect(len(answers) == len(slots), f"{label} answered {len(answers)} slots", _BATCH)
        may_write = 0
        for index, (made, outcome, answer) in enumerate(zip(slots, outcomes, answers, strict=True)):
            what = f"slot {index}: {made.label}"
            error = self._slot(made.op, what, answer, outcome, _REPLIES[made.op])
            if error is None or self._records(error.code):
                may_write += 1
            if error is None:
                self._check_reply(what, made, outcome, answer, extend_ms)
        self._wrote(label, before, outcomes, may_write)
        for made, outcome, answer in zip(slots, outcomes, answers, strict=True):
            error = answer if isinstance(answer, errors.WorkloadError) else None
            if self.shadow is not None and outcome is not None:
                self.shadow.apply(outcome)
            if error is None and made.op == "complete":
                entry = (made.key, made.fence, *made.extra)
                if entry not in self._results:
                    self._results.append(entry)
            if error is None and made.op == "fail":
                entry = (made.key, made.fence, *made.extra)
                if entry not in self._failures:
                    self._failures.append(entry)
            if made.worker.held.get(made.key) == made.fence:
                finished = made.op in _FINISHING
                self._after_worker_call(made.worker, made.key, error, finished=finished)

    def _report(
        self, op: str, key: str, fence: Fence, extend_ms: int, kind: str, pick: int
    ) -> tuple[Command, tuple[Any, ...]]:
        """The command of one report, and what the suite records of it (a result, a failure)."""
        if op == "start":
            return StartCommand(workload_id=key, fence=fence), ()
        if op == "heartbeat":
            return HeartbeatCommand(workload_id=key, fence=fence, extend_ms=extend_ms), ()
        if op == "checkpoint":
            return CheckpointCommand(workload_id=key, fence=fence, state={"step": pick}), ()
        if op == "complete":
            rid = self._result_id(key, fence)
            data = {"output": pick % 3}
            command: Command = CompleteCommand(
                workload_id=key, fence=fence, result_id=rid, output=data
            )
            return command, (rid, data)
        if op == "fail":
            command = FailCommand(workload_id=key, fence=fence, kind=kind, error="batch failure")
            return command, (kind, "batch failure", None)
        return ConfirmCancelCommand(workload_id=key, fence=fence), ()

    def _predict(self, shadow: ShadowModel, made: _Slot, extend_ms: int) -> Outcome:
        """The shadow model's outcome of one report, made as a one-call method."""
        key, fenced, now = made.key, fence_tuple(made.fence), self.now
        if made.op == "start":
            return shadow.start(key, fenced, now)
        if made.op == "heartbeat":
            return shadow.heartbeat(key, fenced, extend_ms, now)
        if made.op == "checkpoint":
            return shadow.checkpoint(key, fenced, now)
        if made.op == "complete":
            rid, data = made.extra
            return shadow.complete(key, fenced, rid, data, now)
        if made.op == "fail":
            kind, message, effect = made.extra
            return shadow.fail(key, fenced, kind, message, effect, now)
        return shadow.confirm_cancel(key, fenced, now)

    def _check_reply(
        self, what: str, made: _Slot, outcome: Outcome | None, answer: Any, extend_ms: int
    ) -> None:
        """A slot's reply says what its one-call method's would."""
        if isinstance(answer, Claim):
            # A heartbeat's lease runs from this instant (a replayed one does not exist).
            self._expect(
                answer.expires_at == self.now + extend_ms, f"{what}: lease {answer}", _BATCH
            )
        elif isinstance(answer, Result):
            self._expect(
                answer.workload_id == made.key and answer.result_id == made.extra[0],
                f"{what}: result {answer.result_id} of {answer.workload_id}",
                _BATCH,
            )
        elif isinstance(answer, StateReply) and outcome is not None:
            self._expect(
                answer.state == outcome.state,
                f"{what}: answered {answer.state}, its one-call method {outcome.state}",
                _BATCH,
            )
        elif isinstance(answer, (Attempt, Checkpoint)):
            self._expect(
                answer.workload_id == made.key,
                f"{what}: the reply is of {answer.workload_id}",
                _BATCH,
            )
