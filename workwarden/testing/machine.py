"""The base of the stateful suite: setup, the checks after every step, and shared plumbing.

`MachineBase` opens the store (and a `RecordingStore` around it), the
writers and the workers, and closes them when the example ends; holds every
call to its prediction (`_call`: the shadow model's outcome, or the refusals
its operation may give; a refusal must change nothing); and checks the
committed store after every step against every registered property of
committed data (`statemachine.properties.registry`), through the registry's
check functions, reporting a failure under the property's name. The Bundles are
defined here, once, and every rule group of `workwarden.testing` takes them
from here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any, ClassVar

from hypothesis import note
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple
from pydantic import ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import CreateWorkload, Fence, Workload
from workwarden.statemachine.properties.concurrency import (
    check_concurrency,
    check_rates,
    claimed_instants,
)
from workwarden.statemachine.properties.coverage import proceeding_rules
from workwarden.statemachine.properties.invariants import (
    check_audit,
    check_audit_fences,
    check_scopes,
    check_store,
    check_workload,
    check_write,
)
from workwarden.statemachine.properties.operations import operation_roles
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord, IndexFields, StoredDocument
from workwarden.testing.shadow import Outcome, ShadowModel
from workwarden.testing.support import (
    CAPABILITY_SETS,
    GIVE_UP,
    MAX_HELD,
    MAX_LIVE,
    SCOPES,
    START,
    VERIFIER,
    CheckFailed,
    Coverage,
    Held,
    StoreFactory,
    Worker,
    WorkloadPlan,
    open_store,
    recording_store,
)

__all__ = ["PREPARED", "WORKERS", "WORKLOADS", "WRITERS", "MachineBase"]

WRITERS: Bundle[Authority] = Bundle("writers")
"""The authorities over the one store (opened once per run, by `open_writers`)."""
WORKERS: Bundle[Worker] = Bundle("workers")
"""The workers holding claims (started once per run, by `start_workers`)."""
WORKLOADS: Bundle[str] = Bundle("workloads")
"""The ids of the admitted workloads."""
PREPARED: Bundle[Held] = Bundle("prepared")
"""The calls a writer prepared and holds, not yet committed."""


class MachineBase(RuleBasedStateMachine):
    """What every rule of the stateful suite shares: the store, the writers and workers, the
    checks after every step, and the plumbing each call goes through.

    The rules are mixed in by the rule groups of `workwarden.testing` (each a subclass of
    this one); `AuthorityMachine` mixes them all. The class attributes below are what
    `authority_machine(...)` sets.
    """

    store_factory: ClassVar[StoreFactory]
    spec: ClassVar[Spec]
    writer_count: ClassVar[int] = 2
    remember: ClassVar[tuple[int, ...]] = (0,)
    worker_count: ClassVar[int] = 3
    authority_class: ClassVar[type[Authority]] = Authority
    shadow_enabled: ClassVar[bool] = True
    coverage: ClassVar[Coverage | None] = None

    writers = WRITERS
    workers = WORKERS
    workloads = WORKLOADS
    prepared = PREPARED

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        self._resources = ExitStack()
        try:
            inner = open_store(cls.store_factory, self._resources)
        except BaseException:
            self._resources.close()
            raise
        self.store = recording_store(inner)
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
                    self._fail(found[0].property, "\n".join(str(v) for v in found))
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

    # -- what the last committed snapshot shows ---------------------------------------------------

    def _room(self) -> bool:
        """Is there an unused scope, and fewer than MAX_LIVE workloads not yet at rest?"""
        terminal = type(self).spec.terminal_states
        live = sum(1 for _, w in self._parsed.values() if w.state not in terminal)
        return len(self._scopes) < len(SCOPES) and live < MAX_LIVE

    def _held_claims(self) -> list[tuple[Worker, str, Fence]]:
        return [(w, key, fence) for w in self._workers for key, fence in sorted(w.held.items())]

    def _old_claims(self) -> list[tuple[Worker, str, Fence]]:
        return [(w, key, fence) for w in self._workers for key, fence in w.old]

    def _in_state(self, states: tuple[str, ...], pick: int) -> str:
        """A workload in one of `states` (by the last committed snapshot), else any workload."""
        keys = sorted(self._admitted)
        fitting = [k for k in keys if k in self._parsed and self._parsed[k][1].state in states]
        chosen = fitting or keys
        return chosen[pick % len(chosen)]

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

    def _worker_named(self, name: str) -> Worker:
        for worker in self._workers:
            if worker.name == name:
                return worker
        raise AssertionError(f"no worker {name}")

    def _result_id(self, key: str, fence: Fence) -> str:
        return f"result-{key[-8:]}-{fence.token}"

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

    def _can_hold(self) -> bool:
        return self._pending < MAX_HELD

    # -- who takes part ---------------------------------------------------------------------------

    @initialize(target=WRITERS)
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

    @initialize(target=WORKERS)
    def start_workers(self) -> Any:
        """Workers with different capabilities (all, email only, none)."""
        self._workers = [
            Worker(f"worker-{i}", CAPABILITY_SETS[i % len(CAPABILITY_SETS)])
            for i in range(type(self).worker_count)
        ]
        return multiple(*self._workers)

    # -- after every step -------------------------------------------------------------------------

    @invariant()
    def committed_store_keeps_every_invariant(self) -> None:
        """Every registered property of committed data (`statemachine.properties.registry`),
        through the registry's check functions, and the shadow model's view.

        Each document a step changed is checked on its own (`check_workload`) and its fences
        from its audit records (`check_audit_fences`); every step, the scopes and the audit
        log (`check_scopes`, `check_audit`); every write committed since the last step, with
        the version it replaced (`check_write`).
        """
        spec = type(self).spec
        documents = list(self.store.scan())
        audit = list(self.store.audit_log())
        violations: list[Violation] = []
        workloads: list[Workload] = []
        changed: list[Workload] = []
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
            changed.append(workload)
            if coverage is not None:
                self._cover(coverage, workload, cached[1] if cached is not None else None)
            self._parsed[doc.key] = (doc.version, workload)
            self._index[doc.key] = doc.index
            workloads.append(workload)
        violations.extend(check_scopes(workloads))
        violations.extend(check_concurrency(spec, workloads))
        violations.extend(check_audit(documents, audit))
        if spec.concurrency_rates or spec.concurrency_default_rate is not None:
            key_of = {w.workload_id: w.concurrency_key for w in workloads}
            violations.extend(check_rates(spec, claimed_instants(audit, key_of)))
        for record in audit[self._records_checked :]:
            text = self.store.versions.get((record.key, record.version))
            prior = self.store.versions.get((record.key, record.version - 1))
            if text is None:
                continue
            after = Workload.model_validate_json(text)
            before = Workload.model_validate_json(prior) if prior is not None else None
            violations.extend(check_write(spec, before, after, record, text))
        self._records_checked = len(audit)
        if changed:
            keys = {w.workload_id for w in changed}
            records: dict[str, list[AuditRecord]] = {key: [] for key in keys}
            for record in audit:
                if record.key in keys:
                    records[record.key].append(record)
            for workload in changed:
                in_order = sorted(records[workload.workload_id], key=lambda r: r.version)
                violations.extend(check_audit_fences(spec, workload, in_order))
        if violations:
            self._fail(violations[0].property, "\n".join(str(v) for v in violations))
        if self.shadow is not None:
            self._compare_with_shadow(documents, workloads)

    def _cover(self, coverage: Coverage, workload: Workload, before: Workload | None) -> None:
        """Count what a committed version reached: its new events' edges, the rules that
        decided them (a claim, the rule of its gate that lets it proceed), its state."""
        spec = type(self).spec
        roles = operation_roles(spec)
        proceed = {proceeding_rules(spec).get(name) for name in roles.claiming} - {None}
        seen = len(before.execution_history) if before is not None else 0
        for event in workload.execution_history[seen:]:
            coverage.edges[(event.from_state or "", event.to)] += 1
            decision = event.evidence.get("decision")
            policy = roles.policy_of_actor.get(event.actor)
            if decision is not None and policy is not None:
                coverage.rules[(policy, decision)] += 1
            if event.to in spec.roles.claimed:
                for rule in proceed:
                    assert rule is not None
                    coverage.rules[rule] += 1
        coverage.at_rest[workload.state] += 1

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
