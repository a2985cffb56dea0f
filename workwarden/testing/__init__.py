"""The stateful suite, shipped in the package: hold an authority over your store to every rule.

`AuthorityMachine` is a Hypothesis `RuleBasedStateMachine` that drives
several writers (`Authority` objects over one store) and several workers
through random programs: admissions (new, replayed, conflicting), claims,
the worker calls, failures of every kind and effect, cancellation, operator
timeouts and re-arms, both sweeps, a clock that steps, leaps and jumps exactly
to the next lease expiry or deadline, workers that crash and come back with
old fences, and a writer's `prepare` held while others commit, then
committed (every read-decide-write race, without threads or sleeps).

After every step it checks the committed store against the named invariants
of `workwarden.statemachine.properties.invariants`, and before every call it asks an
independent shadow model (`workwarden.testing.shadow`) what must happen: the call
fails the run when the authority disagrees. A refused call must change
nothing. A failing run prints the shortest program Hypothesis found, step by
step, with each call and its outcome noted.

Run it against your own store (needs the `test` extra, for Hypothesis):

    import pathlib, tempfile
    from workwarden.storage import SQLiteStore  # or your own store
    from workwarden.testing import authority_machine

    TestMyStore = authority_machine(
        lambda: SQLiteStore(pathlib.Path(tempfile.mkdtemp()) / "store.db")
    ).TestCase

The factory returns a fresh, empty store, or a context manager yielding one;
the machine opens one per example and closes it when the example ends.
`run_authority_machine(store_factory, ...)` runs it once, in any test. The
rules, invariants and profiles are described in `docs/testing.md`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any, ClassVar

try:
    import hypothesis  # noqa: F401  (the stateful suite is built on it)
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError(
        "workwarden.testing needs Hypothesis: pip install 'workwarden[test]'"
    ) from None

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pydantic import ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority, Prepared
from workwarden.statemachine.commands import (
    AdmitCommand,
    AdmitReply,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    FailCommand,
    HeartbeatCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    SweepReply,
    TimeoutCommand,
)
from workwarden.statemachine.models import (
    Claim,
    CreateWorkload,
    Fence,
    Result,
    Workload,
)
from workwarden.statemachine.properties.invariants import (
    check_audit,
    check_scopes,
    check_store,
    check_workload,
    check_write,
)
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import (
    IndexFields,
    StoredDocument,
)
from workwarden.testing.shadow import Outcome, ShadowModel
from workwarden.testing.support import (
    ALLOWED,
    APPLICATION,
    CAPABILITY_SETS,
    FAILURE_KINDS,
    GIVE_UP,
    HOLDER_CALLS,
    LEASES,
    MAX_HELD,
    MAX_LIVE,
    OPERATOR_TARGETS,
    RACED,
    RACES,
    REPLAYS,
    SCOPES,
    START,
    SWEEPS,
    TENANT,
    VERIFIER,
    WORKER_CALLS,
    CheckFailed,
    Coverage,
    Held,
    RecordingStore,
    StoreFactory,
    Worker,
    WorkloadPlan,
    fence_tuple,
    open_store,
    same_rules,
    shadow_plan,
    workload_plans,
)

__all__ = [
    "AuthorityMachine",
    "CheckFailed",
    "Coverage",
    "RecordingStore",
    "StoreFactory",
    "WorkloadPlan",
    "authority_machine",
    "run_authority_machine",
    "workload_plans",
]


class AuthorityMachine(RuleBasedStateMachine):
    """Writers and workers over one store, checked after every step.

    Build a concrete machine with `authority_machine(...)`; the class
    attributes below are what it sets.
    """

    store_factory: ClassVar[StoreFactory]
    spec: ClassVar[Spec]
    writer_count: ClassVar[int] = 2
    remember: ClassVar[tuple[int, ...]] = (0,)
    worker_count: ClassVar[int] = 3
    authority_class: ClassVar[type[Authority]] = Authority
    shadow_enabled: ClassVar[bool] = True
    coverage: ClassVar[Coverage | None] = None

    writers = Bundle("writers")
    workers = Bundle("workers")
    workloads = Bundle("workloads")
    prepared = Bundle("prepared")

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        self._resources = ExitStack()
        try:
            inner = open_store(cls.store_factory, self._resources)
        except BaseException:
            self._resources.close()
            raise
        self.store = RecordingStore(inner)
        self.now = START
        self.shadow = ShadowModel() if cls.shadow_enabled else None
        self._writers: list[Authority] = []
        self._workers: list[Worker] = []
        self._admitted: dict[str, tuple[tuple[str, str], WorkloadPlan, CreateWorkload]] = {}
        self._scopes: dict[tuple[str, str], str] = {}
        self._results: list[tuple[str, Fence, str, Any]] = []
        self._failures: list[tuple[str, Fence, str, str, str | None]] = []
        self._parsed: dict[str, tuple[int, Workload]] = {}
        self._index: dict[str, IndexFields] = {}
        self._grants: dict[str, list[Fence]] = {}
        self._records_checked = 0
        self._pending = 0
        self._failed = False

    def teardown(self) -> None:
        """Check the whole committed store once more, every version and every write of it,
        with `check_store` (unless a check already failed); then close the store (and
        whatever its factory opened)."""
        try:
            if not self._failed:
                documents = list(self.store.scan())
                audit = list(self.store.audit_log())
                found = check_store(type(self).spec, documents, audit, self.store.versions)
                if found:
                    self._fail(found[0].invariant, "\n".join(str(v) for v in found))
        finally:
            self._resources.close()

    # -- plumbing ---------------------------------------------------------------------------------

    def _fail(self, check: str, message: str) -> None:
        self._failed = True
        raise CheckFailed(check, message)

    def _snapshot(self) -> tuple[Any, ...]:
        docs = tuple((d.key, d.version, d.document, d.index) for d in self.store.scan())
        return docs, tuple(self.store.audit_log())

    def _records(self, code: str) -> bool:
        entry = type(self).spec.errors.get(code)
        if entry is None:
            self._fail("refusal_is_in_the_catalogue", f"{code} is not in the error catalogue")
        return entry is not None and entry.records

    def _call(
        self,
        op: str,
        label: str,
        call: Callable[[], Any],
        predicted: Outcome | None,
        allowed: frozenset[str],
    ) -> tuple[Any, errors.WorkloadError | None]:
        """Make one call and hold its outcome to the prediction (or to what `op` may refuse)."""
        before = self._snapshot()
        note(f"[{self.now}] {label}")
        try:
            reply = call()
        except errors.WorkloadError as exc:
            note(f"    refused {exc.code}: {exc.message}")
            self._count(op, exc.code, exc.details or {})
            if predicted is not None:
                if predicted.code != exc.code:
                    self._fail(
                        "shadow_model",
                        f"{label}: the shadow model predicts {predicted.describe()}, "
                        f"the authority refused with {exc.code}: {exc.message}",
                    )
            elif exc.code not in allowed:
                self._fail(
                    "refusal_is_one_the_operation_gives",
                    f"{label}: {exc.code} is not among {sorted(allowed)}",
                )
            if not self._records(exc.code) and self._snapshot() != before:
                self._fail(
                    "refusals_change_nothing", f"{label} was refused with {exc.code} but wrote"
                )
            return None, exc
        note("    ok")
        self._count(op, "ok")
        if predicted is not None:
            if predicted.code is not None:
                self._fail(
                    "shadow_model",
                    f"{label}: the shadow model predicts {predicted.describe()}, "
                    "the authority accepted it",
                )
            single = predicted.key is not None
            if single and not predicted.writes and self._snapshot() != before:
                self._fail(
                    "shadow_model",
                    f"{label}: the shadow model predicts no write, the store changed",
                )
        return reply, None

    def _count(self, op: str, outcome: str, details: Mapping[str, Any] | None = None) -> None:
        coverage = type(self).coverage
        if coverage is None:
            return
        coverage.outcomes[(op, outcome)] += 1
        instant = (details or {}).get("expired_at", (details or {}).get("deadline_at"))
        if instant == self.now:
            coverage.at_the_instant[(op, outcome)] += 1

    def _settle(self, outcome: Outcome | None, error: errors.WorkloadError | None) -> None:
        """Commit a confirmed prediction to the shadow model."""
        if (
            self.shadow is not None
            and outcome is not None
            and (error is None or error.code == outcome.code)
        ):
            self.shadow.apply(outcome)

    def _expect(self, check: bool, message: str, name: str = "replies_are_consistent") -> None:
        if not check:
            self._fail(name, message)

    def _room(self) -> bool:
        """Is there an unused scope, and fewer than MAX_LIVE workloads not yet at rest?"""
        terminal = type(self).spec.terminal_states
        live = sum(1 for _, w in self._parsed.values() if w.state not in terminal)
        return len(self._scopes) < len(SCOPES) and live < MAX_LIVE

    def _held_claims(self) -> list[tuple[Worker, str, Fence]]:
        return [(w, key, fence) for w in self._workers for key, fence in sorted(w.held.items())]

    def _old_claims(self) -> list[tuple[Worker, str, Fence]]:
        return [(w, key, fence) for w in self._workers for key, fence in w.old]

    def _after_worker_call(
        self,
        worker: Worker,
        key: str,
        error: errors.WorkloadError | None,
        *,
        finished: bool = False,
    ) -> None:
        if (error is None and finished) or (error is not None and error.code in GIVE_UP):
            worker.drop(key)

    # -- who takes part ---------------------------------------------------------------------------

    @initialize(target=writers)
    def open_writers(self) -> Any:
        """Two or more authorities over the one store: the writers that race. Each remembers
        as many of its own latest writes as `remember` gives it (cycled over the writers), so
        one-call methods also decide on versions they did not read just now."""
        cls = type(self)
        memory = itertools.cycle(cls.remember)
        self._writers = []
        for _ in range(cls.writer_count):
            self._writers.append(
                cls.authority_class(
                    self.store, grants=VERIFIER, spec=cls.spec, remember=next(memory)
                )
            )
        return multiple(*self._writers)

    @initialize(target=workers)
    def start_workers(self) -> Any:
        """Workers with different capabilities (all, email only, none)."""
        self._workers = [
            Worker(f"worker-{i}", CAPABILITY_SETS[i % len(CAPABILITY_SETS)])
            for i in range(type(self).worker_count)
        ]
        return multiple(*self._workers)

    @initialize(target=workloads, writer=writers, plan=workload_plans())
    def admit_first(self, writer: Authority, plan: WorkloadPlan) -> Any:
        """Every run starts with one admitted workload."""
        return self.admit_new(writer, 0, plan)

    # -- admission --------------------------------------------------------------------------------

    @precondition(lambda self: self._room())
    @rule(target=workloads, writer=writers, scope=st.integers(0, 7), plan=workload_plans())
    def admit_new(self, writer: Authority, scope: int, plan: WorkloadPlan) -> Any:
        """Admit a request under an unused idempotency scope: it must create the workload."""
        free = [s for s in SCOPES if s not in self._scopes]
        agent, key = free[scope % len(free)]
        request = plan.request(agent, key, self.now)
        planned = shadow_plan(plan, request)
        outcome = self.shadow.admit((agent, key), planned, self.now) if self.shadow else None
        reply, error = self._call(
            "admit",
            f"admit {agent}/{key} (new): {plan}",
            lambda: writer.admit(request, self.now),
            outcome,
            ALLOWED["admit"],
        )
        if error is not None:
            return multiple()
        assert isinstance(reply, AdmitReply)
        self._expect(reply.created, f"a new scope {agent}/{key} was answered as a replay")
        return self._admitted_as(reply.workload.workload_id, (agent, key), plan, request, outcome)

    def _admitted_as(
        self,
        key: str,
        scope: tuple[str, str],
        plan: WorkloadPlan,
        request: CreateWorkload,
        outcome: Outcome | None,
    ) -> Any:
        self._scopes[scope] = key
        self._admitted[key] = (scope, plan, request)
        if self.shadow is not None and outcome is not None:
            self.shadow.register_scope(scope, key)
            self.shadow.apply(outcome, key=key)
        return key

    @rule(writer=writers, workload=workloads, change=st.sampled_from((0, 0, 1, 2)))
    def admit_again(self, writer: Authority, workload: str, change: int) -> None:
        """Send an admitted scope's request again: unchanged (`change=0`) it is a replay that
        answers the original and writes nothing; with another input it is refused with
        IDEMPOTENCY_KEY_REUSED naming `input`."""
        scope, plan, request = self._admitted[workload]
        if change:
            request = request.model_copy(update={"input": {"payload": plan.payload + change}})
        outcome = (
            self.shadow.admit(scope, shadow_plan(plan, request), self.now) if self.shadow else None
        )
        how = "with another input (conflict)" if change else "again (replay)"
        reply, error = self._call(
            "admit",
            f"admit {scope[0]}/{scope[1]} {how}",
            lambda: writer.admit(request, self.now),
            outcome,
            ALLOWED["admit"] if change else frozenset(),
        )
        if error is not None and error.code == errors.IDEMPOTENCY_KEY_REUSED:
            fields = (error.details or {}).get("fields")
            self._expect(fields == ["input"], f"the conflict names {fields}, not ['input']")
        elif error is None:
            assert isinstance(reply, AdmitReply)
            self._expect(
                not change and not reply.created and reply.workload.workload_id == workload,
                f"admitting {workload} {how} answered {reply.workload.workload_id} "
                f"created={reply.created}",
            )

    # -- claims -----------------------------------------------------------------------------------

    def _in_state(self, states: tuple[str, ...], pick: int) -> str:
        """A workload in one of `states` (by the last committed snapshot), else any workload."""
        keys = sorted(self._admitted)
        fitting = [k for k in keys if k in self._parsed and self._parsed[k][1].state in states]
        chosen = fitting or keys
        return chosen[pick % len(chosen)]

    @precondition(lambda self: bool(self._admitted))
    @rule(
        writer=writers,
        worker=workers,
        pick=st.integers(0, 15),
        lease_ms=st.sampled_from(LEASES),
    )
    def claim(self, writer: Authority, worker: Worker, pick: int, lease_ms: int) -> None:
        """Claim a workload by id: a READY one when there is one (else any, to be refused)."""
        self._claim(writer, worker, self._in_state(("READY",), pick), lease_ms)

    def _claim(self, writer: Authority, worker: Worker, workload: str, lease_ms: int) -> None:
        outcome = (
            self.shadow.claim(workload, worker.name, worker.capabilities, lease_ms, self.now)
            if self.shadow
            else None
        )
        reply, error = self._call(
            "claim",
            f"claim {workload} by {worker.name} for {lease_ms} ms",
            lambda: writer.claim(workload, worker.name, worker.capabilities, self.now, lease_ms),
            outcome,
            ALLOWED["claim"],
        )
        if error is None:
            assert isinstance(reply, Claim)
            self._granted(worker, workload, reply, lease_ms, outcome)
        else:
            self._settle(outcome, error)

    def _granted(
        self,
        worker: Worker,
        key: str,
        claim: Claim,
        lease_ms: int,
        outcome: Outcome | None,
    ) -> None:
        self._expect(
            claim.workload_id == key
            and claim.worker_id == worker.name
            and claim.expires_at == claim.claimed_at + lease_ms,
            f"claim {claim} does not match the call",
        )
        if outcome is not None and outcome.after is not None:
            self._expect(
                claim.fencing_token == outcome.after.token,
                f"claim token {claim.fencing_token}, the shadow model counts {outcome.after.token}",
                "shadow_model",
            )
            self._settle(outcome.with_claim_id(claim.claim_id), None)
        worker.drop(key)
        worker.held[key] = claim.fence
        self._grants.setdefault(key, []).append(claim.fence)
        note(f"    {worker.name} holds {key} under token {claim.fencing_token}")

    @precondition(lambda self: bool(self._scopes))
    @rule(writer=writers, worker=workers, lease_ms=st.sampled_from(LEASES))
    def claim_next(self, writer: Authority, worker: Worker, lease_ms: int) -> None:
        """Claim the best claimable workload for this worker, or none."""
        self._claim_next(writer, worker, lease_ms)

    def _claim_next(self, writer: Authority, worker: Worker, lease_ms: int) -> None:
        outcomes = (
            self.shadow.claim_next(worker.name, worker.capabilities, lease_ms, self.now)
            if self.shadow
            else None
        )
        reply, _ = self._call(
            "claim_next",
            f"claim_next by {worker.name} for {lease_ms} ms",
            lambda: writer.claim_next(
                TENANT, APPLICATION, worker.name, worker.capabilities, self.now, lease_ms
            ),
            Outcome(None, None, None) if self.shadow else None,
            ALLOWED["claim_next"],
        )
        granted = None
        if outcomes is not None and self.shadow is not None:
            for outcome in outcomes:
                if outcome.code is None:
                    granted = outcome
                else:
                    self.shadow.apply(outcome)
            wanted = granted.key if granted is not None else None
            got = reply.workload_id if isinstance(reply, Claim) else None
            if wanted != got:
                self._fail(
                    "shadow_model",
                    f"claim_next by {worker.name}: the shadow model picks {wanted}, "
                    f"the authority {got}",
                )
        if isinstance(reply, Claim):
            note(f"    claimed {reply.workload_id}")
            self._granted(worker, reply.workload_id, reply, lease_ms, granted)

    # -- the holder's calls -----------------------------------------------------------------------

    def _pick_held(self, pick: int) -> tuple[Worker, str, Fence]:
        held = self._held_claims()
        return held[pick % len(held)]

    def _live_claims(self) -> list[tuple[Worker, str, Fence]]:
        """Held claims that are the workload's current claim (by the last snapshot)."""
        live = []
        for worker, key, fence in self._held_claims():
            claim = self._parsed[key][1].current_claim if key in self._parsed else None
            if claim is not None and claim.fence == fence:
                live.append((worker, key, fence))
        return live

    def _holding(self) -> bool:
        return any(w.held for w in self._workers)

    @precondition(lambda self: self._holding())
    @rule(
        writer=writers,
        pick=st.integers(0, 15),
        call=st.sampled_from(HOLDER_CALLS),
        extend_ms=st.sampled_from(LEASES),
    )
    def holder_call(self, writer: Authority, pick: int, call: str, extend_ms: int) -> None:
        """The holder of a claim makes one call with its fence, whatever state the work is in:
        start, heartbeat (extend the lease), execution_context (read input and checkpoints),
        checkpoint, or confirm_cancel."""
        worker, key, fence = self._pick_held(pick)
        self._holder(writer, worker, key, fence, call, extend_ms, call)

    def _holder(
        self,
        writer: Authority,
        worker: Worker,
        key: str,
        fence: Fence,
        call: str,
        extend_ms: int,
        how: str,
    ) -> None:
        if call == "start":
            self._start(writer, worker, key, fence, how)
        elif call == "heartbeat":
            self._heartbeat(writer, worker, key, fence, extend_ms, how)
        elif call == "execution_context":
            self._execution_context(writer, worker, key, fence, how)
        elif call == "checkpoint":
            self._checkpoint(writer, worker, key, fence, extend_ms % 7, how)
        else:
            self._confirm_cancel(writer, worker, key, fence, how)

    def _worker_call(
        self,
        op: str,
        worker: Worker,
        key: str,
        fence: Fence,
        how: str,
        call: Callable[[], Any],
        outcome: Outcome | None,
        *,
        detail: str = "",
        check: Callable[[Any], None] | None = None,
    ) -> None:
        """A fenced call of `worker`: made, held to the prediction (and `check`), then settled."""
        reply, error = self._call(
            op,
            f"{how} {key} by {worker.name} (token {fence.token}){detail}",
            call,
            outcome,
            ALLOWED[op],
        )
        if check is not None:
            check(reply)
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error)

    def _start(self, writer: Authority, worker: Worker, key: str, fence: Fence, how: str) -> None:
        outcome = self.shadow.start(key, fence_tuple(fence), self.now) if self.shadow else None
        self._worker_call(
            "start", worker, key, fence, how, lambda: writer.start(key, fence, self.now), outcome
        )

    def _heartbeat(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, extend_ms: int, how: str
    ) -> None:
        outcome = (
            self.shadow.heartbeat(key, fence_tuple(fence), extend_ms, self.now)
            if self.shadow
            else None
        )

        def lease_extended(reply: Any) -> None:
            if isinstance(reply, Claim):
                self._expect(
                    reply.expires_at == self.now + extend_ms,
                    f"heartbeat lease ends {reply.expires_at}",
                )

        self._worker_call(
            "heartbeat",
            worker,
            key,
            fence,
            how,
            lambda: writer.heartbeat(key, fence, self.now, extend_ms),
            outcome,
            detail=f" for {extend_ms} ms",
            check=lease_extended,
        )

    def _execution_context(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, how: str
    ) -> None:
        outcome = (
            self.shadow.execution_context(key, fence_tuple(fence), self.now)
            if self.shadow
            else None
        )
        self._worker_call(
            "execution_context",
            worker,
            key,
            fence,
            how,
            lambda: writer.execution_context(key, fence, self.now),
            outcome,
        )

    def _checkpoint(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, step: int, how: str
    ) -> None:
        outcome = self.shadow.checkpoint(key, fence_tuple(fence), self.now) if self.shadow else None
        self._worker_call(
            "checkpoint",
            worker,
            key,
            fence,
            how,
            lambda: writer.checkpoint(key, fence, {"step": step}, self.now),
            outcome,
        )

    @precondition(lambda self: self._holding())
    @rule(writer=writers, pick=st.integers(0, 15), output=st.integers(0, 2))
    def complete(self, writer: Authority, pick: int, output: int) -> None:
        """The holder records its result."""
        worker, key, fence = self._pick_held(pick)
        self._complete(writer, worker, key, fence, output, "complete")

    def _result_id(self, key: str, fence: Fence) -> str:
        return f"result-{key[-8:]}-{fence.token}"

    def _complete(
        self,
        writer: Authority,
        worker: Worker,
        key: str,
        fence: Fence,
        output: int,
        how: str,
        result_id: str | None = None,
        value: Any = None,
        allowed: frozenset[str] | None = None,
    ) -> None:
        rid = result_id or self._result_id(key, fence)
        data = value if value is not None else {"output": output}
        outcome = (
            self.shadow.complete(key, fence_tuple(fence), rid, data, self.now)
            if self.shadow
            else None
        )
        reply, error = self._call(
            "complete",
            f"{how} {key} by {worker.name} (token {fence.token}) as {rid}",
            lambda: writer.complete(key, fence, rid, data, self.now),
            outcome,
            allowed if allowed is not None else ALLOWED["complete"],
        )
        if isinstance(reply, Result):
            self._expect(
                reply.result_id == rid and reply.workload_id == key, f"result {reply.result_id}"
            )
            entry = (key, fence, rid, data)
            if entry not in self._results:
                self._results.append(entry)
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error, finished=True)

    @precondition(lambda self: bool(self._results or self._failures))
    @rule(
        writer=writers,
        pick=st.integers(0, 15),
        report=st.sampled_from(REPLAYS),
        workload=workloads,
    )
    def report_again(self, writer: Authority, pick: int, report: str, workload: str) -> None:
        """A worker sends a recorded report again. `completion`: the same completion answers
        the recorded result, nothing written; `other output`: the same result id with another
        output is WORKLOAD_RESULT_CONFLICT; `taken id`: another workload's recorded result id
        is WORKLOAD_RESULT_DUPLICATE; `failure`: the same failure report answers again,
        nothing written. (A report of a kind not recorded yet falls back to the other kind.)"""
        if (report == "failure" and self._failures) or not self._results:
            key, fence, kind, message, effect = self._failures[pick % len(self._failures)]
            worker = self._worker_named(fence.worker_id)
            how = "replay the failure of"
            self._fail_call(writer, worker, key, fence, kind, effect, message, how)
            return
        key, fence, rid, data = self._results[pick % len(self._results)]
        worker = self._worker_named(fence.worker_id)
        owned = [entry for entry in self._results if entry[0] != workload]
        if report == "taken id" and owned:
            _, fence, rid, data = owned[pick % len(owned)]
            allowed = frozenset({errors.RESULT_DUPLICATE})
            self._complete(writer, worker, workload, fence, 0, "complete", rid, data, allowed)
        elif report == "other output":
            value = {"output": data["output"] + 10}
            allowed = frozenset({errors.RESULT_CONFLICT})
            how = "complete with another output"
            self._complete(writer, worker, key, fence, 0, how, rid, value, allowed)
        else:
            how = "replay the completion of"
            self._complete(writer, worker, key, fence, 0, how, rid, data, frozenset())

    def _worker_named(self, name: str) -> Worker:
        for worker in self._workers:
            if worker.name == name:
                return worker
        raise AssertionError(f"no worker {name}")

    @precondition(lambda self: self._holding())
    @rule(
        writer=writers,
        pick=st.integers(0, 15),
        kind=st.sampled_from(FAILURE_KINDS),
        effect=st.sampled_from((None, "none", "unknown")),
        message=st.sampled_from(("connection reset", "worker crashed")),
    )
    def fail(
        self, writer: Authority, pick: int, kind: str, effect: str | None, message: str
    ) -> None:
        """The holder reports a failure of some kind, with its effect none, unknown or omitted."""
        worker, key, fence = self._pick_held(pick)
        self._fail_call(writer, worker, key, fence, kind, effect, message, "fail")

    def _fail_call(
        self,
        writer: Authority,
        worker: Worker,
        key: str,
        fence: Fence,
        kind: str,
        effect: str | None,
        message: str,
        how: str,
    ) -> None:
        outcome = (
            self.shadow.fail(key, fence_tuple(fence), kind, message, effect, self.now)
            if self.shadow
            else None
        )
        reply, error = self._call(
            "fail",
            f"{how} {key} by {worker.name} (token {fence.token}): {kind}, effect {effect}",
            lambda: writer.fail(key, fence, kind, message, self.now, effect=effect),
            outcome,
            ALLOWED["fail"],
        )
        if error is None:
            if outcome is not None:
                self._expect(
                    reply == outcome.state,
                    f"fail answered {reply}, the shadow model decides {outcome.state}",
                    "shadow_model",
                )
            entry = (key, fence, kind, message, effect)
            if entry not in self._failures:
                self._failures.append(entry)
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error, finished=True)

    def _confirm_cancel(
        self, writer: Authority, worker: Worker, key: str, fence: Fence, how: str
    ) -> None:
        outcome = (
            self.shadow.confirm_cancel(key, fence_tuple(fence), self.now) if self.shadow else None
        )
        _, error = self._call(
            "confirm_cancel",
            f"{how} {key} by {worker.name} (token {fence.token})",
            lambda: writer.confirm_cancel(key, fence, self.now),
            outcome,
            ALLOWED["confirm_cancel"],
        )
        self._settle(outcome, error)
        self._after_worker_call(worker, key, error, finished=True)

    @precondition(lambda self: bool(self._admitted))
    @rule(
        writer=writers,
        worker=workers,
        steps=st.integers(1, 4),
        ending=st.sampled_from(("complete", "fail", "checkpoint", "crash")),
    )
    def work(self, writer: Authority, worker: Worker, steps: int, ending: str) -> None:
        """A worker works like a normal worker: holding no claim, it first asks for the next
        workload (claim_next, 1 s lease; when none is eligible yet, it waits until the next
        one is, and asks again); then it makes the next `steps` calls of the attempt
        on a claim it holds, each for the state it finds the work in (start it, checkpoint
        it, and with the last step complete it or report a transient failure, as `ending`
        says; confirm a requested cancellation), and stops once it no longer holds the claim.
        With `ending="crash"` it crashes after its last call, leaving its lease to lapse."""
        if not worker.held:
            self._claim_next(writer, worker, 1000)
        eligible = [i.eligible_at for i in self._index.values() if i.eligible_at is not None]
        later = [at for at in eligible if at > self.now]
        if not worker.held and later and all(at > self.now for at in eligible):
            self.now = min(later)
            note(f"[{self.now}] {worker.name} waits until the next workload is eligible")
            self._claim_next(writer, worker, 1000)
        if not worker.held:
            return
        key, fence = min(worker.held.items())
        for step in range(steps):
            if worker.held.get(key) != fence:
                return
            state = writer.get(key).state
            last = step == steps - 1
            if state == "CLAIMED":
                self._start(writer, worker, key, fence, "work: start")
            elif state == "CANCELLATION_REQUESTED":
                self._confirm_cancel(writer, worker, key, fence, "work: confirm_cancel")
            elif last and ending == "fail":
                self._fail_call(
                    writer, worker, key, fence, "transient_connection", None, "flaky", "work: fail"
                )
            elif state in ("RUNNING", "CHECKPOINTED") and not (last and ending == "complete"):
                self._checkpoint(writer, worker, key, fence, step, "work: checkpoint")
            else:
                self._complete(writer, worker, key, fence, 1, "work: complete")
        if ending == "crash":
            note(f"    {worker.name} crashes, forgetting {sorted(worker.held)}")
            for held in sorted(worker.held):
                worker.drop(held)

    @precondition(lambda self: self._holding())
    @rule(writer=writers, pick=st.integers(0, 15), taker=workers, wakes=st.booleans())
    def hand_on(self, writer: Authority, pick: int, taker: Worker, wakes: bool) -> None:
        """The work changes hands: a holder (of a current claim, when there is one) goes
        silent (a long pause; it still believes it holds the claim), the clock reaches its
        lease's expiry, the recovery sweeps of two writers find it at once (both decide; the
        second to commit must be WORKLOAD_CONFLICT), and `taker` claims it by id and starts
        it. When `wakes`, the silent holder then wakes up and completes under its old fence
        (the fencing token's whole reason to be: WORKLOAD_STALE_FENCE, nothing written);
        otherwise its later calls are stale."""
        live = self._live_claims()
        worker, key, old = live[pick % len(live)] if live else self._pick_held(pick)
        index = self._index.get(key)
        expiry = index.lease_expires_at if index is not None else None
        if expiry is None:
            note(f"[{self.now}] {key} has no lease to lapse")
            return
        note(f"[{self.now}] {worker.name} goes silent on {key}")
        self.now = max(self.now, expiry)
        other = self._writers[(self._writers.index(writer) + 1) % len(self._writers)]
        held = [self._hold(w, "recover_expired", key, None, None, 0) for w in (writer, other)]
        for one in held:
            if isinstance(one, Held):
                self._commit(one)
        self._claim(writer, taker, key, 1000)
        fence = taker.held.get(key)
        if fence is None or fence == old:
            return
        self._start(writer, taker, key, fence, "hand_on: start")
        if wakes:
            self._complete(writer, worker, key, old, 0, "hand_on: the silent holder completes")

    # -- workers that crash and come back ---------------------------------------------------------

    @precondition(lambda self: self._holding())
    @rule(worker=workers)
    def crash(self, worker: Worker) -> None:
        """A worker crashes and restarts: it forgets every claim it held."""
        note(f"[{self.now}] {worker.name} crashes, forgetting {sorted(worker.held)}")
        for key in sorted(worker.held):
            worker.drop(key)

    def _superseded(self) -> list[tuple[str, Fence]]:
        """Every fence a later claim of the same workload has replaced, by workload."""
        return [
            (key, fence) for key, fences in sorted(self._grants.items()) for fence in fences[:-1]
        ]

    def _stale_while_running(self) -> list[tuple[str, Fence]]:
        """Replaced fences of workloads whose newer attempt is running (last snapshot)."""
        return [
            (key, fence)
            for key, fence in self._superseded()
            if key in self._parsed and self._parsed[key][1].state in ("RUNNING", "CHECKPOINTED")
        ]

    @precondition(lambda self: bool(self._stale_while_running()))
    @rule(writer=writers, pick=st.integers(0, 15), output=st.integers(0, 2))
    def complete_as_a_stale_worker(self, writer: Authority, pick: int, output: int) -> None:
        """While a newer claim's attempt runs, the worker whose claim it replaced completes
        under its old fence: WORKLOAD_STALE_FENCE, and nothing written."""
        stale = self._stale_while_running()
        key, fence = stale[pick % len(stale)]
        worker = self._worker_named(fence.worker_id)
        self._complete(writer, worker, key, fence, output, "stale complete")

    @precondition(lambda self: any(w.old for w in self._workers))
    @rule(writer=writers, pick=st.integers(0, 15), call=st.sampled_from((*HOLDER_CALLS, "fail")))
    def resurrect(self, writer: Authority, pick: int, call: str) -> None:
        """A worker comes back with a fence it gave up or forgot, and makes a call with it."""
        old = self._old_claims()
        worker, key, fence = old[pick % len(old)]
        how = f"resurrected {call}"
        if call == "fail":
            self._fail_call(writer, worker, key, fence, "worker_failure", None, "late", how)
        else:
            self._holder(writer, worker, key, fence, call, 500, how)

    # -- operators --------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._admitted))
    @rule(
        writer=writers,
        pick=st.integers(0, 15),
        call=st.sampled_from(("cancel", "timeout", "retry")),
    )
    def operator(self, writer: Authority, pick: int, call: str) -> None:
        """An operator cancels (preferably work a worker holds, by asking the holder; queued
        work is cancelled at once), times any workload out (the operator-timeout policy
        decides), or re-arms dead-lettered work (one more attempt, at most max_attempts
        times). With no workload in a preferred state it picks any, to be refused."""
        workload = self._in_state(OPERATOR_TARGETS[call], pick)
        self._operator(writer, call, workload)

    def _operator(self, writer: Authority, op: str, key: str) -> None:
        calls: dict[str, Callable[[], str]] = {
            "cancel": lambda: writer.cancel(key, "operator-1", self.now),
            "timeout": lambda: writer.timeout(key, "operator-1", self.now),
            "retry": lambda: writer.retry(key, "operator-1", self.now, reason="re-arm"),
        }
        outcome = self._predict_operator(op, key)
        reply, error = self._call(op, f"{op} {key} (operator)", calls[op], outcome, ALLOWED[op])
        if error is None and outcome is not None:
            self._expect(
                reply == outcome.state,
                f"{op} answered {reply}, the shadow model decides {outcome.state}",
                "shadow_model",
            )
        self._settle(outcome, error)

    def _predict_operator(self, op: str, key: str) -> Outcome | None:
        if self.shadow is None:
            return None
        if op == "cancel":
            return self.shadow.cancel(key, self.now)
        if op == "timeout":
            return self.shadow.timeout(key, self.now)
        return self.shadow.retry(key, self.now)

    # -- sweeps -----------------------------------------------------------------------------------

    @precondition(lambda self: self._anything_due())
    @rule(writer=writers, sweep=st.sampled_from(SWEEPS))
    def sweep(self, writer: Authority, sweep: str) -> None:
        """When something is due, a sweep runs: `recover_expired` hands on every workload
        whose lease has expired (the recovery policy decides), `enforce_deadlines` times out
        every workload with a fallen deadline (the deadline policy decides); either may find
        nothing due of its own kind."""
        self._run_sweep(writer, sweep)

    def _run_sweep(self, writer: Authority, sweep: str) -> None:
        if sweep == "recover_expired":
            outcomes = self.shadow.recover_all(self.now) if self.shadow else None
            self._sweep(writer, sweep, writer.recover_expired, outcomes)
        else:
            outcomes = self.shadow.enforce_all(self.now) if self.shadow else None
            self._sweep(writer, sweep, writer.enforce_deadlines, outcomes)

    def _sweep(
        self,
        writer: Authority,
        op: str,
        sweep: Callable[[int], list[str]],
        outcomes: list[Outcome] | None,
    ) -> None:
        reply, _ = self._call(
            op,
            op,
            lambda: sweep(self.now),
            Outcome(None) if self.shadow else None,
            ALLOWED[op],
        )
        changed = sorted(reply or [])
        note(f"    changed {changed}")
        if outcomes is not None:
            wanted = sorted(o.key or "" for o in outcomes)
            if changed != wanted:
                self._fail(
                    "shadow_model", f"{op}: the shadow model changes {wanted}, the sweep {changed}"
                )
            for outcome in outcomes:
                self._settle(outcome, None)

    # -- time -------------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._scopes))
    @rule(ms=st.integers(1, 250) | st.sampled_from((1_000, 5_000, 30_000)))
    def advance(self, ms: int) -> None:
        """The clock moves on: a little, or far past leases and deadlines."""
        self.now += ms
        note(f"[{self.now}] clock +{ms}")

    def _upcoming(self) -> list[int]:
        instants: set[int] = set()
        for index in self._index.values():
            for value in (index.lease_expires_at, index.next_deadline_at, index.eligible_at):
                if value is not None and value > self.now:
                    instants.add(value)
        return sorted(instants)

    @precondition(lambda self: bool(self._upcoming()))
    @rule(pick=st.integers(0, 3), early=st.booleans())
    def jump_to_next_instant(self, pick: int, early: bool) -> None:
        """The clock jumps exactly to an upcoming lease expiry, deadline or eligibility (or 1 ms
        before it), so calls and sweeps race at the boundary instant."""
        upcoming = self._upcoming()
        target = upcoming[min(pick, len(upcoming) - 1)] - (1 if early else 0)
        if target > self.now:
            self.now = target
        note(f"[{self.now}] clock jumps to {'1 ms before ' if early else ''}an instant")

    # -- interleaving: a writer's prepare held while others commit --------------------------------

    def _can_hold(self) -> bool:
        return self._pending < MAX_HELD

    @precondition(lambda self: self._can_hold() and self._room())
    @rule(target=prepared, writer=writers, scope=st.integers(0, 7), plan=workload_plans())
    def prepare_admission(self, writer: Authority, scope: int, plan: WorkloadPlan) -> Any:
        """A writer reads and decides an admission of an unused scope, and waits."""
        free = [s for s in SCOPES if s not in self._scopes]
        agent, key = free[scope % len(free)]
        request = plan.request(agent, key, self.now)
        outcome = (
            self.shadow.admit((agent, key), shadow_plan(plan, request), self.now)
            if self.shadow
            else None
        )
        command = AdmitCommand(request=request)
        label = f"admit {agent}/{key}"
        extra = ((agent, key), plan, request)
        return self._prepare(writer, "admit", "", label, command, outcome, None, None, extra)

    @precondition(lambda self: self._can_hold() and bool(self._admitted))
    @rule(
        target=prepared,
        writer=writers,
        pick=st.integers(0, 15),
        worker=workers,
        call=st.sampled_from(("claim", "cancel", "timeout", "retry")),
        lease_ms=st.sampled_from(LEASES),
    )
    def prepare_on_workload(
        self, writer: Authority, pick: int, worker: Worker, call: str, lease_ms: int
    ) -> Any:
        """A writer reads and decides a claim (of READY work, when there is some) or an
        operator's cancel, timeout or re-arm (chosen as `operator` chooses), and waits."""
        key = self._in_state(OPERATOR_TARGETS.get(call, ("READY",)), pick)
        return self._hold(writer, call, key, worker, None, lease_ms)

    def _due(self, sweep: str) -> list[str]:
        """The keys the sweep's own query finds due now (from the last committed snapshot)."""
        field = "lease_expires_at" if sweep == "recover_expired" else "next_deadline_at"
        return sorted(
            key
            for key, index in self._index.items()
            if (value := getattr(index, field)) is not None and value <= self.now
        )

    def _anything_due(self) -> bool:
        return bool(self._due("recover_expired") or self._due("enforce_deadlines"))

    @precondition(lambda self: self._can_hold() and self._anything_due())
    @rule(target=prepared, writer=writers, pick=st.integers(0, 15), sweep=st.sampled_from(SWEEPS))
    def prepare_sweep_step(self, writer: Authority, pick: int, sweep: str) -> Any:
        """A sweep reads and decides one workload it found due (an expired lease, a fallen
        deadline), and waits before writing: the race of a sweep with the worker's own calls.
        (When `sweep` finds nothing due, the other sweep takes the step.)"""
        if not self._due(sweep):
            sweep = SWEEPS[1 - SWEEPS.index(sweep)]
        due = self._due(sweep)
        return self._hold(writer, sweep, due[pick % len(due)], None, None, 0)

    @precondition(lambda self: self._can_hold() and self._holding())
    @rule(
        target=prepared,
        writer=writers,
        pick=st.integers(0, 15),
        call=st.sampled_from(WORKER_CALLS),
        extend_ms=st.sampled_from(LEASES),
        kind=st.sampled_from(FAILURE_KINDS),
    )
    def prepare_worker_call(
        self, writer: Authority, pick: int, call: str, extend_ms: int, kind: str
    ) -> Any:
        """A writer reads and decides a holder's call, and waits."""
        worker, key, fence = self._pick_held(pick)
        return self._hold(writer, call, key, worker, fence, extend_ms, kind)

    def _boundaries(self, calls: tuple[str, str]) -> list[tuple[int, str]]:
        """Upcoming instants, (instant, key), soonest first: deadlines when the deadline sweep
        races, lease expiries when the recovery sweep does, else both; of held work, when a
        worker's call races and some work is held."""
        fields = [
            field
            for sweep, field in (
                ("enforce_deadlines", "next_deadline_at"),
                ("recover_expired", "lease_expires_at"),
            )
            if sweep in calls
        ] or ["lease_expires_at", "next_deadline_at"]
        upcoming = sorted(
            (value, key)
            for key, index in self._index.items()
            for field in fields
            if (value := getattr(index, field)) is not None and value > self.now
        )
        if not any(call in WORKER_CALLS for call in calls):
            return upcoming
        # A worker's call races: prefer work a worker holds.
        held = {key for _, key, _ in self._held_claims()}
        return [(at, key) for at, key in upcoming if key in held] or upcoming

    @precondition(lambda self: bool(self._admitted))
    @rule(
        first_writer=writers,
        second_writer=writers,
        pick=st.integers(0, 15),
        calls=st.sampled_from(RACES),
        worker=workers,
        lease_ms=st.sampled_from(LEASES),
        at_the_boundary=st.booleans(),
    )
    def race(
        self,
        first_writer: Authority,
        second_writer: Authority,
        pick: int,
        calls: tuple[str, str],
        worker: Worker,
        lease_ms: int,
        at_the_boundary: bool,
    ) -> None:
        """Two writers each read and decide a call on the same workload at the same instant,
        then commit in turn: when both write, the second is WORKLOAD_CONFLICT and writes
        nothing (a heartbeat against the recovery of its lease, a completion against the
        deadline sweep, two claims, a cancel against a failure, ...). When a sweep races
        `at_the_boundary`, the clock first jumps to the instant a deadline falls (for the
        deadline sweep) or a lease expires (for the recovery sweep), and the race is on that
        workload, at that instant; otherwise, when a sweep races, the workload is one it
        finds due. A worker call is made by the workload's latest known holder, or
        becomes a claim by `worker` if none."""
        first, second = calls
        sweeping = [call for call in calls if call in SWEEPS]
        boundaries = self._boundaries(calls) if at_the_boundary and sweeping else []
        if boundaries:
            self.now, key = boundaries[pick % len(boundaries)]
            note(f"[{self.now}] the clock reaches a lease expiry or deadline of {key}")
        else:
            due_now = [call for call in sweeping if self._due(call)]
            due = self._due(due_now[0]) if due_now else []
            wanted = OPERATOR_TARGETS.get(first) or RACED
            key = due[pick % len(due)] if due else self._in_state(wanted, pick)
        held = [
            self._hold(writer, *self._racer(call, key, worker), lease_ms)
            for writer, call in ((first_writer, first), (second_writer, second))
        ]
        for one in held:
            if isinstance(one, Held):
                self._commit(one)

    def _racer(
        self, call: str, key: str, worker: Worker
    ) -> tuple[str, str, Worker | None, Fence | None]:
        """(call, key, worker, fence) for `call` on `key` in a race."""
        if call not in WORKER_CALLS:
            return call, key, worker if call == "claim" else None, None
        grants = self._grants.get(key)
        if not grants:
            return "claim", key, worker, None
        fence = grants[-1]
        return call, key, self._worker_named(fence.worker_id), fence

    def _hold(
        self,
        writer: Authority,
        call: str,
        key: str,
        worker: Worker | None,
        fence: Fence | None,
        lease_ms: int,
        kind: str = "transient_connection",
    ) -> Any:
        """Prepare `call` on `key` (a claim by `worker`; a worker call under `fence`)."""
        now = self.now
        shadow = self.shadow
        command: Command
        outcome: Outcome | None = None
        extra: tuple[Any, ...] = ()
        label = f"{call} {key}"
        if call == "claim":
            assert worker is not None
            command = ClaimCommand(
                workload_id=key,
                worker_id=worker.name,
                capabilities=worker.capabilities,
                lease_ms=lease_ms,
            )
            if shadow:
                outcome = shadow.claim(key, worker.name, worker.capabilities, lease_ms, now)
            label = f"claim {key} by {worker.name} for {lease_ms} ms"
            extra = (lease_ms,)
        elif call in OPERATOR_TARGETS:
            if call == "cancel":
                command = CancelCommand(workload_id=key, actor="operator-1")
            elif call == "timeout":
                command = TimeoutCommand(workload_id=key, actor="operator-1")
            else:
                command = RetryCommand(workload_id=key, actor="operator-1", reason="re-arm")
            outcome = self._predict_operator(call, key)
        elif call == "recover_expired":
            command = RecoverCommand(workload_id=key)
            outcome = shadow.recover(key, now) if shadow else None
        elif call == "enforce_deadlines":
            command = EnforceDeadlineCommand(workload_id=key)
            outcome = shadow.enforce(key, now) if shadow else None
        else:
            assert worker is not None
            assert fence is not None
            command, outcome, extra = self._worker_command(call, key, fence, lease_ms, kind)
            label = f"{call} {key} by {worker.name} (token {fence.token})"
        return self._prepare(writer, call, key, label, command, outcome, worker, fence, extra)

    def _worker_command(
        self, call: str, key: str, fence: Fence, extend_ms: int, kind: str
    ) -> tuple[Command, Outcome | None, tuple[Any, ...]]:
        now = self.now
        shadow = self.shadow
        fenced = fence_tuple(fence)
        if call == "start":
            command: Command = StartCommand(workload_id=key, fence=fence)
            return command, shadow.start(key, fenced, now) if shadow else None, ()
        if call == "heartbeat":
            command = HeartbeatCommand(workload_id=key, fence=fence, extend_ms=extend_ms)
            return command, shadow.heartbeat(key, fenced, extend_ms, now) if shadow else None, ()
        if call == "checkpoint":
            command = CheckpointCommand(workload_id=key, fence=fence, state={"step": 5})
            return command, shadow.checkpoint(key, fenced, now) if shadow else None, ()
        if call == "complete":
            rid = self._result_id(key, fence)
            data = {"output": 7}
            command = CompleteCommand(workload_id=key, fence=fence, result_id=rid, output=data)
            outcome = shadow.complete(key, fenced, rid, data, now) if shadow else None
            return command, outcome, (rid, data)
        if call == "fail":
            command = FailCommand(workload_id=key, fence=fence, kind=kind, error="held failure")
            outcome = shadow.fail(key, fenced, kind, "held failure", None, now) if shadow else None
            return command, outcome, (kind, "held failure", None)
        command = ConfirmCancelCommand(workload_id=key, fence=fence)
        return command, shadow.confirm_cancel(key, fenced, now) if shadow else None, ()

    def _prepare(
        self,
        writer: Authority,
        op: str,
        key: str,
        label: str,
        command: Command,
        outcome: Outcome | None,
        worker: Worker | None,
        fence: Fence | None,
        extra: tuple[Any, ...],
    ) -> Any:
        if outcome is not None and outcome.code is not None and not self._records(outcome.code):
            at_prepare: Outcome | None = outcome
        else:
            at_prepare = Outcome(key) if outcome is not None else None
        allowed = ALLOWED[op]
        reply, error = self._call(
            op, f"prepare {label}", lambda: writer.prepare(command, self.now), at_prepare, allowed
        )
        if error is not None:
            if worker is not None:
                self._after_worker_call(worker, key, error)
            return multiple()
        assert isinstance(reply, Prepared)
        version = self.shadow.version(reply.key) if self.shadow else None
        self._pending += 1
        note(f"    held (decided on version {version})")
        return Held(
            op,
            f"{label} (prepared at {self.now})",
            reply.key,
            reply,
            outcome,
            version,
            worker,
            fence,
            extra,
        )

    @rule(target=workloads, held=consumes(prepared))
    def commit(self, held: Held) -> Any:
        """A held call commits: WORKLOAD_CONFLICT if its workload moved on since it was decided."""
        return self._commit(held)

    def _commit(self, held: Held) -> Any:
        self._pending -= 1
        outcome = held.outcome
        predicted: Outcome | None = None
        if self.shadow is not None and outcome is not None:
            moved = outcome.writes and self.shadow.version(held.key) != held.version
            predicted = Outcome(held.key, errors.CONFLICT) if moved else outcome
        allowed = frozenset({errors.CONFLICT}) | {
            code for code in ALLOWED[held.op] if self._records(code)
        }
        reply, error = self._call(
            held.op, f"commit {held.label}", held.prepared.commit, predicted, allowed
        )
        if error is not None and error.code == errors.CONFLICT:
            return multiple()
        return self._committed(held, predicted, reply, error)

    def _committed(
        self, held: Held, predicted: Outcome | None, reply: Any, error: errors.WorkloadError | None
    ) -> Any:
        worker = held.worker
        if held.op == "admit":
            if error is None and isinstance(reply, AdmitReply) and reply.created:
                scope, plan, request = held.extra
                return self._admitted_as(held.key, scope, plan, request, predicted)
            return multiple()
        if held.op == "claim":
            if isinstance(reply, Claim) and worker is not None:
                self._granted(worker, held.key, reply, held.extra[0], predicted)
            else:
                self._settle(predicted, error)
            return multiple()
        if isinstance(reply, StateReply) and predicted is not None:
            self._expect(
                reply.state == predicted.state,
                f"{held.label} answered {reply.state}, the shadow model decides {predicted.state}",
                "shadow_model",
            )
        self._settle(predicted, error)
        if worker is not None and held.fence is not None:
            finished = held.op in ("complete", "fail", "confirm_cancel")
            if error is None and held.op == "complete":
                self._results.append((held.key, held.fence, *held.extra))
            if error is None and held.op == "fail" and isinstance(reply, StateReply):
                self._failures.append((held.key, held.fence, *held.extra))
            if worker.held.get(held.key) == held.fence:
                self._after_worker_call(worker, held.key, error, finished=finished)
        if isinstance(reply, SweepReply):
            note(f"    changed={reply.changed} state={reply.state}")
        return multiple()

    # -- after every step -------------------------------------------------------------------------

    @invariant()
    def committed_store_keeps_every_invariant(self) -> None:
        """Every invariant of `statemachine.properties.invariants`, and the shadow model's view."""
        spec = type(self).spec
        documents = list(self.store.scan())
        audit = list(self.store.audit_log())
        violations = []
        workloads: list[Workload] = []
        coverage = type(self).coverage
        for doc in documents:
            cached = self._parsed.get(doc.key)
            if cached is not None and cached[0] == doc.version:
                workloads.append(cached[1])
                continue
            try:
                workload = Workload.model_validate_json(doc.document)
            except ValidationError as exc:
                self._fail("documents_parse", f"{doc.key} v{doc.version}: {exc}")
                raise
            violations.extend(check_workload(spec, workload))
            if coverage is not None:
                seen = len(cached[1].execution_history) if cached is not None else 0
                for event in workload.execution_history[seen:]:
                    coverage.edges[(event.from_state or "", event.to)] += 1
            self._parsed[doc.key] = (doc.version, workload)
            self._index[doc.key] = doc.index
            workloads.append(workload)
        violations.extend(check_scopes(workloads))
        violations.extend(check_audit(documents, audit))
        for record in audit[self._records_checked :]:
            text = self.store.versions.get((record.key, record.version))
            prior = self.store.versions.get((record.key, record.version - 1))
            if text is None:
                continue
            after = Workload.model_validate_json(text)
            before = Workload.model_validate_json(prior) if prior is not None else None
            violations.extend(check_write(spec, before, after, record, text))
        self._records_checked = len(audit)
        if violations:
            self._fail(violations[0].invariant, "\n".join(str(v) for v in violations))
        if self.shadow is not None:
            self._compare_with_shadow(documents, workloads)

    def _compare_with_shadow(
        self, documents: Sequence[StoredDocument], workloads: Sequence[Workload]
    ) -> None:
        shadow = self.shadow
        assert shadow is not None
        stored = {doc.key: (doc, w) for doc, w in zip(documents, workloads, strict=True)}
        if sorted(stored) != sorted(shadow.workloads):
            self._fail(
                "shadow_model",
                f"the store holds {sorted(stored)}, the shadow model {sorted(shadow.workloads)}",
            )
        for key, (doc, w) in sorted(stored.items()):
            s = shadow.workloads[key]
            lease = s.lease
            claim = w.current_claim
            held = s.state in ("CLAIMED", "RUNNING", "CHECKPOINTED", "CANCELLATION_REQUESTED")
            expected = {
                "version": s.version,
                "state": s.state,
                "fencing_token": s.token,
                "attempt_count": s.attempts,
                "next_attempt_at": s.eligible_at,
                "claim": None
                if lease is None
                else (
                    lease.worker,
                    lease.token,
                    lease.claimed_at,
                    lease.expires_at,
                    lease.last_heartbeat,
                ),
                "result": s.result.result_id if s.result is not None else None,
                "index.eligible_at": (s.eligible_at or 0) if s.state == "READY" else None,
                "index.lease_expires_at": lease.expires_at if lease is not None and held else None,
                "index.next_deadline_at": shadow.next_deadline(s),
            }
            actual = {
                "version": doc.version,
                "state": w.state,
                "fencing_token": w.fencing_token,
                "attempt_count": w.attempt_count,
                "next_attempt_at": w.next_attempt_at,
                "claim": None
                if claim is None
                else (
                    claim.worker_id,
                    claim.fencing_token,
                    claim.claimed_at,
                    claim.expires_at,
                    claim.last_heartbeat,
                ),
                "result": w.result.result_id if w.result is not None else None,
                "index.eligible_at": doc.index.eligible_at,
                "index.lease_expires_at": doc.index.lease_expires_at,
                "index.next_deadline_at": doc.index.next_deadline_at,
            }
            differ = {k: (expected[k], actual[k]) for k in expected if expected[k] != actual[k]}
            if differ:
                self._fail(
                    "shadow_model",
                    f"{key} differs from the shadow model (expected, stored): {differ}",
                )


def authority_machine(
    store_factory: StoreFactory,
    spec: Spec | None = None,
    *,
    writers: int = 2,
    workers: int = 3,
    remember: Sequence[int] = (0, 16),
    shadow: bool | None = None,
    authority_class: type[Authority] = Authority,
    coverage: Coverage | None = None,
) -> type[AuthorityMachine]:
    """A concrete `AuthorityMachine` over stores from `store_factory`, under `spec`.

    `spec` defaults to the shipped spec. `shadow` runs the shadow model, which
    states the shipped spec's rules; by default it runs exactly when `spec`
    has the shipped rules (states, table, policies, backoff, deadlines), and
    otherwise the suite checks the invariants and that each refusal is one
    the operation can give. `writers` authorities share the store; each is
    built by `authority_class` (a subclass of `Authority`) with the next
    `remember` value, cycled (by default the first writer reads before every
    decision, the second decides one-call methods on its own 16 latest writes
    too). `workers` workers hold claims. `coverage` collects the edges and
    outcomes the runs reach. The class's `TestCase` is a unittest case for
    pytest.
    """
    if not callable(store_factory):
        raise TypeError("store_factory must be a callable returning a fresh store")
    if writers < 1 or workers < 1:
        raise ValueError(f"need at least one writer and one worker (got {writers}, {workers})")
    if not remember or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in remember
    ):
        raise ValueError(f"remember must list whole numbers of writes, 0 or more (got {remember})")
    if not (isinstance(authority_class, type) and issubclass(authority_class, Authority)):
        raise TypeError("authority_class must be Authority or a subclass of it")
    chosen = spec if spec is not None else default_spec()
    use_shadow = same_rules(chosen, default_spec()) if shadow is None else shadow
    return type(
        "AuthorityMachine",
        (AuthorityMachine,),
        {
            "store_factory": staticmethod(store_factory),
            "spec": chosen,
            "writer_count": writers,
            "remember": tuple(remember),
            "worker_count": workers,
            "authority_class": authority_class,
            "shadow_enabled": use_shadow,
            "coverage": coverage,
            "__doc__": AuthorityMachine.__doc__,
            "__module__": __name__,
        },
    )


def run_authority_machine(
    store_factory: StoreFactory,
    spec: Spec | None = None,
    *,
    settings: settings | None = None,
    writers: int = 2,
    workers: int = 3,
    remember: Sequence[int] = (0, 16),
    shadow: bool | None = None,
    authority_class: type[Authority] = Authority,
    coverage: Coverage | None = None,
) -> None:
    """Run the stateful suite once against stores from `store_factory`; raise on a failure.

    `settings` defaults to the current Hypothesis profile's settings.
    """
    machine = authority_machine(
        store_factory,
        spec,
        writers=writers,
        workers=workers,
        remember=remember,
        shadow=shadow,
        authority_class=authority_class,
        coverage=coverage,
    )
    chosen = settings if settings is not None else _current()
    # Older Hypothesis releases leave this one function unannotated.
    run_state_machine_as_test(machine, settings=chosen)  # type: ignore[no-untyped-call, unused-ignore]


def _current() -> settings:
    return settings()
