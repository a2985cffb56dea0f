"""What a running service holds: the spec, the store, the authority, the clock and the metrics.

`Service.call` is the one way an API or console call reaches the authority:
it checks the caller's actor class against the spec's operations table
(`workwarden.service.auth.authorize`), runs the call, and counts what the
store was written with into the metrics; `Service.batch` does the same for a
batch call, authorizing every operation of the batch before any of it runs.
The store is wrapped to see each write (`ObservedStore`, and
`ObservedBatchStore` over a store that takes batches), so a replay, which
writes nothing, is never counted as a claim or a completion. The wrapper
keeps the wrapped store's pauses and purges (`Pauses`, `Purges`) exactly
when the wrapped store has them: the authority asks the store it holds, so a
wrapper that hid them would let a claim by id past a pause.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from workwarden.service import tracing
from workwarden.service.auth import Caller, TokenVerifier, authorize
from workwarden.service.metrics import Metrics, registry
from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.grants import GrantVerifier
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import (
    AuditRecord,
    BatchStore,
    IndexFields,
    Pauses,
    Purges,
    Store,
    Write,
    WriteOutcome,
)
from workwarden.storage.forwarding import (
    ForwardingBatchStore,
    ForwardingPauses,
    ForwardingPurges,
    ForwardingStore,
)

__all__ = [
    "MIN_BODY_BYTES",
    "NOW_HEADER",
    "ObservedBatchStore",
    "ObservedStore",
    "Service",
    "ServiceConfig",
    "observed",
    "wall_clock_ms",
]

#: The request header giving the call's instant, honoured only with a test clock.
NOW_HEADER = "X-Workwarden-Now"

#: The least limit on a request body (32 MiB); see `Service.max_body_bytes`.
MIN_BODY_BYTES = 32 * 1024 * 1024

# A body may hold this many JSON values of the spec's largest size (`[limits] max_json_bytes`).
_JSON_VALUES_PER_BODY = 32

_T = TypeVar("_T")


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, from this machine's clock."""
    return time.time_ns() // 1_000_000


class ObservedStore(ForwardingStore):
    """A store that keeps the audit record and document of each write it passed on."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.writes: list[tuple[AuditRecord, str, IndexFields]] = []

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        """Write through to the wrapped store, then remember what was written."""
        version = super().write(key, document, index, expected_version, audit)
        self.writes.append((audit, document, index))
        return version


class ObservedBatchStore(ObservedStore, ForwardingBatchStore):
    """An `ObservedStore` over a `BatchStore`: the writes a batch committed are kept too."""

    def batch_written(self, results: Sequence[tuple[Write, WriteOutcome]]) -> None:
        """Remember each write of a batch that committed."""
        for write, outcome in results:
            if isinstance(outcome, int):
                self.writes.append((write.audit, write.document, write.index))


# `Pauses` and `Purges` are runtime protocols, as `BatchStore` is: each wrapper
# below has the methods of exactly the capabilities its wrapped store has.
class _ObservedP(ForwardingPauses, ObservedStore):
    pass


class _ObservedU(ForwardingPurges, ObservedStore):
    pass


class _ObservedPU(ForwardingPauses, ForwardingPurges, ObservedStore):
    pass


class _ObservedBP(ForwardingPauses, ObservedBatchStore):
    pass


class _ObservedBU(ForwardingPurges, ObservedBatchStore):
    pass


class _ObservedBPU(ForwardingPauses, ForwardingPurges, ObservedBatchStore):
    pass


# By (takes batches, keeps pauses, purges).
_WRAPPERS: dict[tuple[bool, bool, bool], type[ObservedStore]] = {
    (False, False, False): ObservedStore,
    (False, True, False): _ObservedP,
    (False, False, True): _ObservedU,
    (False, True, True): _ObservedPU,
    (True, False, False): ObservedBatchStore,
    (True, True, False): _ObservedBP,
    (True, False, True): _ObservedBU,
    (True, True, True): _ObservedBPU,
}


def observed(inner: Store) -> ObservedStore:
    """The observing wrapper of `inner`, with the batches, pauses and purges `inner` has."""
    kind = (isinstance(inner, BatchStore), isinstance(inner, Pauses), isinstance(inner, Purges))
    return _WRAPPERS[kind](inner)


@dataclass
class ServiceConfig:
    """How to build the service.

    `store`: the store it serves. `token_keys`: key id -> secret, the keys
    bearer tokens are signed with. `grant_keys`: the keys admissions' grants
    are verified with (None: signatures are not checked, said explicitly).
    `check_report`: a `workwarden check --json` report the console shows.
    `allow_reset`: serve `/v1/test/reset` and `/v1/test/store` (memory
    stores only). `test_clock`: take each call's instant from the
    `X-Workwarden-Now` header when it has one. `tracer_provider`: the
    OpenTelemetry tracer provider the API's spans go to (None: the global
    one; see `workwarden.service.tracing`).
    """

    store: Store
    token_keys: Mapping[str, bytes]
    grant_keys: Mapping[str, bytes] | None = None
    spec: Spec | None = None
    check_report: str | None = None
    allow_reset: bool = False
    test_clock: bool = False
    clock: Callable[[], int] = wall_clock_ms
    tracer_provider: Any = None


@dataclass
class Service:
    """The running service's state (see the module docstring)."""

    config: ServiceConfig
    spec: Spec = field(init=False)
    store: ObservedStore = field(init=False)
    authority: Authority = field(init=False)
    tokens: TokenVerifier = field(init=False)
    metrics: Metrics = field(init=False)
    #: The most bytes a request body may have (more is refused with 413): 32 times the
    #: spec's `[limits] max_json_bytes`, at least `MIN_BODY_BYTES`, so the largest JSON
    #: value the spec takes fits however it is spaced and escaped, and so does a batch.
    max_body_bytes: int = field(init=False)
    #: Calls run on the server's worker threads, so that a slow one (a store lock, a
    #: long page) never holds up `/healthz` or `/metrics`; they are still decided one at
    #: a time, each with its own record of what it wrote.
    _serial: threading.RLock = field(init=False, default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.spec = self.config.spec if self.config.spec is not None else default_spec()
        self.max_body_bytes = max(
            MIN_BODY_BYTES, _JSON_VALUES_PER_BODY * self.spec.limits.max_json_bytes
        )
        self.tokens = TokenVerifier(self.config.token_keys)
        self.metrics = registry(lambda: self.store, tuple(self.spec.states))
        self.use(self.config.store, self.config.grant_keys)

    def use(self, store: Store, grant_keys: Mapping[str, bytes] | None) -> None:
        """Serve `store` with a new authority verifying grants with `grant_keys`."""
        grants = GrantVerifier(grant_keys) if grant_keys else GrantVerifier.without_signatures()
        with self._serial:
            self.store = observed(store)
            self.authority = Authority(self.store, grants=grants, spec=self.spec)

    # -- time -----------------------------------------------------------------

    def wall_now(self) -> int:
        """The service's own clock (tokens are always checked against it)."""
        return self.config.clock()

    def now(self, headers: Mapping[str, str]) -> int:
        """The instant a call is decided at: the test clock's header if enabled, else the clock."""
        if self.config.test_clock:
            given = headers.get(NOW_HEADER)
            if given is not None:
                # ASCII digits only, an optional minus (which the core refuses as it refuses
                # any instant before the epoch): `int` would also take "1_000" or "+5".
                digits = given[1:] if given.startswith("-") else given
                if not (digits.isascii() and digits.isdigit()):
                    raise errors.invalid(NOW_HEADER, "must be whole milliseconds since the epoch")
                return int(given)
        return self.wall_now()

    def caller(self, authorization: str | None) -> Caller:
        """The caller an `Authorization` header names (`WORKWARDEN_UNAUTHENTICATED` otherwise)."""
        return self.tokens.verify(authorization, self.wall_now())

    # -- calls ------------------------------------------------------------------

    def call(
        self,
        operation: str,
        caller: Caller,
        run: Callable[[], _T],
        *,
        acting_as: str | None = None,
        kind: str | None = None,
        workload_id: str | None = None,
    ) -> _T:
        """Run `run` for `caller` if its class may call `operation`; count what it wrote.

        `kind` is a failure report's kind (the failures metric's label);
        `workload_id` the workload the call names, for its span.
        """
        tracing.rename(operation)
        tracing.annotate(actor_class=caller.actor_class, workload_id=workload_id)
        authorize(self.spec, operation, caller, acting_as)
        reply = self._counted(run, {workload_id: kind} if workload_id and kind else {})
        if operation == "recover_expired" and isinstance(reply, Sequence):
            self.metrics.recoveries.inc(len(reply))
        elif operation == "enforce_deadlines" and isinstance(reply, Sequence):
            self.metrics.deadline_timeouts.inc(len(reply))
        return reply

    def batch(
        self,
        operation: str,
        caller: Caller,
        steps: Iterable[tuple[str, str | None]],
        run: Callable[[], list[_T]],
        *,
        kinds: Mapping[str, str] | None = None,
    ) -> list[_T]:
        """Run the batch call `run` for `caller` if it may take every step; count what it wrote.

        `steps` are the batch's (operation, actor id) pairs: each is
        authorized as its one call would be, all of them before anything
        runs, so a batch with one step the caller may not take is refused
        whole and writes nothing. `kinds` maps a workload id to the kind of
        its failure report. A refused slot is counted as its one call's
        refusal would be.
        """
        tracing.rename(operation)
        tracing.annotate(actor_class=caller.actor_class)
        for step, acting_as in steps:
            authorize(self.spec, step, caller, acting_as)
        outcomes = self._counted(run, kinds or {})
        for outcome in outcomes:
            if isinstance(outcome, errors.WorkloadError):
                self._refused(outcome)
        return outcomes

    def _counted(self, run: Callable[[], _T], kinds: Mapping[str, str]) -> _T:
        """`run`, alone among the calls, with what it wrote counted (refused or not)."""
        with self._serial:
            self.store.writes.clear()
            try:
                return run()
            except errors.WorkloadError as exc:
                self._refused(exc)
                raise
            finally:
                self._count(self.store.writes, kinds)

    def _refused(self, exc: errors.WorkloadError) -> None:
        if exc.code == errors.CONFLICT:
            self.metrics.conflicts.inc()
        elif exc.code == errors.TIMED_OUT:
            self.metrics.deadline_timeouts.inc()

    def _count(
        self, writes: Sequence[tuple[AuditRecord, str, IndexFields]], kinds: Mapping[str, str]
    ) -> None:
        metrics = self.metrics
        for audit, document, _index in writes:
            operation = audit.operation
            # A granted claim carries the token it issued (a claim that dead-letters, none);
            # under a claim whose row names `then = "start"` it also started the attempt.
            granted = operation in ("claim", "claim_next") and audit.fencing_token is not None
            if granted:
                metrics.claims.inc()
            if operation == "start" or granted:
                doc = json.loads(document)
                attempts = doc.get("attempts") or []
                started = attempts[-1].get("started_at") if attempts else None
                if isinstance(started, int):
                    metrics.admission_to_start.observe((started - doc["created_at"]) / 1000)
            elif operation == "complete":
                doc = json.loads(document)
                if doc.get("result") is None:
                    continue
                metrics.completions.inc()
                claimed = self._claimed_at(doc)
                if claimed is not None:
                    elapsed = doc["result"]["created_at"] - claimed
                    metrics.claim_to_complete.observe(elapsed / 1000)
            elif operation == "fail" and audit.key in kinds:
                metrics.failures.labels(kind=kinds[audit.key]).inc()

    def _claimed_at(self, doc: Mapping[str, Any]) -> int | None:
        claimed = self.spec.roles.claimed
        for event in reversed(doc.get("execution_history") or []):
            if event.get("to") in claimed and event.get("from") not in claimed:
                at = event.get("at")
                return at if isinstance(at, int) else None
        return None
