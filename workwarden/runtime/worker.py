"""`Worker`: claims work, runs its handlers, heartbeats, and reports what became of each attempt.

The worker never decides: it calls the authority and does what the answer
says. Its whole logic is `step()`, which does what is due at the clock's
instant and returns the instant it next has something to do:

- each held attempt moves on: start it, read its execution context, hand
  the `Job` to the handler (on the executor), heartbeat every
  `heartbeat_fraction` of the lease while the handler runs, and report the
  outcome once it has returned or raised;
- while it holds fewer than `concurrency` attempts, it claims more, all
  its free slots in one `claim_many` (one `claim_next` each when batching
  is off or the authority has no batch calls), until nothing is claimable;
  then it waits until the next eligible instant the store knows of
  (bounded by `poll_ms`), or until the store's wake-up signal says work may
  have become claimable.

With batching (the default) the fenced reports of every attempt (starts,
heartbeats, checkpoints, completions, failures, confirmed cancellations)
are gathered for at most `batch_window_ms` and sent in one `report_many`
(`workwarden.runtime.reports`); each report's answer is followed exactly as
the one call's would be. A claim that started its attempt in its own
commit (`ClaimReply.started_at`, a spec whose claim names `then`) is not
started again.

`run()` calls `step()` in a loop and sleeps in between (woken early by a
handler finishing, a wake-up, or `stop()`); a test calls `step()` itself on
a `ManualClock` with an executor it runs by hand, and nothing sleeps.

How the authority's answers are followed, by the error's class:
`attempt_over` ends the attempt (`job.lost`; nothing more is reported for
it); `conflict_retry_now` makes the same call again at once;
`retry_later` (the store could not be reached, or a write's outcome is
unknown) makes the same call again, with the same arguments, after a
backoff with jitter; `give_up` and `fix_request` end the report (logged as
`refused`). A store failure never ends the worker.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from workwarden.runtime import arguments
from workwarden.runtime.clock import MAX_WAIT_S, Backoff, Clock, WallClock, event
from workwarden.runtime.handlers import App, Fail, HandlerSpec, Job, Retry, result_id_for
from workwarden.runtime.reports import (
    DEFAULT_BATCH_MAX,
    DEFAULT_WINDOW_MS,
    BatchCalls,
    Report,
    ReportBuffer,
    send_one,
    state_of,
)
from workwarden.runtime.scope import HandledOnly, handled_only
from workwarden.runtime.signals import from_handler
from workwarden.statemachine import errors, inputs
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.batches import MAX_BATCH
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.fairness import FairScope, FairShare, claim_fair, spec_weight
from workwarden.statemachine.models import MAX_LIST, Checkpoint, ClaimReply, Fence
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import DueInstants, ScopeListing, StoreError, WakeUps, WorkSignal

if TYPE_CHECKING:
    from workwarden.service.client import HttpAuthority

__all__ = ["WORKER_ID_MAX", "ThreadExecutor", "Worker", "default_worker_id"]

_T = TypeVar("_T")

#: Longest error text reported for a failure (the rest is cut).
ERROR_TEXT_LIMIT = 500

#: What no store's text can hold: NUL and the surrogate code points.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

#: How many times in a row a call that lost a compare-and-swap is made again at once.
CONFLICT_TRIES = 8

#: The longest worker id: each claim's request id is `<worker_id>-<12 hex digits>`, a name
#: of at most 256 characters.
WORKER_ID_MAX = 256 - 13

#: The one-call methods of the authority a worker calls.
_WORKER_CALLS = (
    "claim_next",
    "start",
    "heartbeat",
    "checkpoint",
    "complete",
    "fail",
    "confirm_cancel",
    "get",
)


def _error_text(text: str) -> str:
    """`text` as a failure's error: cut to `ERROR_TEXT_LIMIT`, each NUL and surrogate U+FFFD.

    The authority refuses an error no store's text can hold; an exception's
    message is reported as near as it can be instead.
    """
    return _UNSTORABLE.sub("\ufffd", text[:ERROR_TEXT_LIMIT])


def _exception_text(exc: BaseException) -> str:
    """`str(exc)`, or a stand-in when the exception cannot say what it is."""
    try:
        return str(exc)
    except Exception as broken:  # noqa: BLE001 - a handler's exception may be anything
        return f"(its text could not be made: {type(broken).__name__})"


def default_worker_id() -> str:
    """`host-pid-random`: unique among the workers of a fleet."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ThreadExecutor(Executor):
    """Runs each submitted call on a daemon thread of its own.

    Daemon threads, so that a worker stopping after its grace period can
    exit with a handler still running (its lease is then recovered).
    """

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        """Start `fn(*args, **kwargs)` on a new thread; its future."""
        future: Future[_T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 -- handed to the future's reader
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="workwarden-handler", daemon=True).start()
        return future


#: How long a second stop signal waits for its log line before the process exits (s).
_LAST_LINE_S = 0.2

#: The shortest wait between looks for work while a rated key may be out of tokens (ms).
_RATE_LOOK_MS = 10


@dataclass
class _Report:
    """The outcome to report for an attempt: fixed once, so a repeat has the same arguments."""

    operation: str  # "complete", "fail" or "confirm_cancel"
    output: Any = None
    kind: str = ""
    error: str = ""
    effect: str | None = None


@dataclass
class _Held:
    """One claimed attempt and where it is."""

    claim: ClaimReply
    phase: str  # "start", "context", "run", "report"
    backoff: Backoff
    expires_at: int
    next_heartbeat: int
    definition_id: str = ""
    attempt: int = 0
    handler: HandlerSpec | None = None
    job: Job | None = None
    future: Future[Any] | None = None
    started_ms: int = 0
    retry_at: int = 0
    conflicts: int = 0
    report: _Report | None = None
    pending: bool = False  # a report of it waits in the batch buffer

    @property
    def workload_id(self) -> str:
        return self.claim.workload_id

    @property
    def fence(self) -> Fence:
        return self.claim.fence


class Worker:
    """Claims work of one tenant and application, and runs `app`'s handlers on it.

    `authority` is an `Authority` over a store, or an `HttpAuthority` (the
    service's HTTP API, with a worker's token): over HTTP there is no store
    to ask for wake-ups or the next eligible instant, so an idle worker looks
    again every `poll_ms`, and candidates are not narrowed to the app's
    definitions (a claim of one it has no handler for is reported failed).

    Options:

    - `worker_id`: the id the authority records (default `host-pid-random`);
      a name of at most `WORKER_ID_MAX` (243) characters, so that each
      claim's request id (`<worker_id>-<12 hex digits>`) is a name too.
    - `concurrency`: how many handlers run at once (default 1).
    - `lease_ms`: the lease each claim and heartbeat asks for (default 30 s),
      whole ms from 1 to `runtime.arguments.MAX_LEASE_MS` (a year).
    - `heartbeat_fraction`: heartbeat after this fraction of the lease
      (default 1/3: a lease survives two lost heartbeats).
    - `capabilities`: what the worker offers (default: the union of what the
      app's definitions need). It never claims a definition the app has no
      handler for, whatever its capabilities.
    - `clock`: where the time is read (default the wall clock, in ms).
    - `executor`: where handlers run (default a daemon thread per handler).
    - `sleep`: how `Job.checkpoint` waits between tries (default `time.sleep`).
    - `poll_ms`: the longest an idle worker waits before looking for work
      again (default 1 s without a wake-up signal, 5 s with one).
    - `grace_s`: how long `stop()` lets running handlers finish (default 30).
    - `backoff_base_ms`, `backoff_cap_ms`: the backoff after a store failure.
    - `batch`: claim with `claim_many` and send reports with `report_many`
      (default True; used only when the authority has them, see
      `reports.BatchCalls`: an `HttpAuthority` without them is called one
      call at a time).
    - `batch_window_ms`: the longest a report waits for others to join its
      batch (default `reports.DEFAULT_WINDOW_MS`; 0 sends at once); shorter
      than what a heartbeat has left of its lease (`lease_ms` less the
      heartbeat interval), so a heartbeat held for it still lands in time.
    - `batch_max`: the most reports in one batch (default 100, at most 1,000).
    - `also_serve`: more scopes to claim from besides `tenant`/`application`
      (`(tenant, application)` pairs or `"tenant/application"`). Their work
      is taken in the order the spec's `[fairness]` declares, from a
      ledger the worker keeps (`self.share`, `Authority.claim_fair`): while
      one scope has claimable work, at most `share.bound(scope)` of this
      worker's claims go to the others before one goes to it.
    - `all_scopes`: serve every tenant and application the store has
      claimable work in (`ScopeListing.claimable_scopes`, looked up once per
      `poll_ms`, 1 s by default), fairly as `also_serve` does, beside any
      named; `tenant` and `application` may then be left out. It needs the
      store itself (not an `HttpAuthority`), and it looks for work every
      `poll_ms` rather than waiting for a scope's wake-up.

    Each argument is checked when the worker is built, and a bad one is
    `WORKLOAD_INVALID` naming it: `authority` must have the one-call
    methods a worker calls and a `Spec`, `app` must be an `App` with a
    handler and a `failure_kind` the spec declares, names (`tenant`,
    `application`, `worker_id`, `capabilities`) follow the `Name` rules,
    counts and durations in ms are whole numbers (a bool is not one) in
    range, `grace_s` is finite and 0 or more, `batch` and `all_scopes` are
    bools.

    Thread-safety: `run()` and `step()` belong to one thread; `stop()` may
    be called from any thread (or a signal handler).
    """

    def __init__(
        self,
        authority: Authority | HttpAuthority,
        app: App,
        *,
        tenant: str | None = None,
        application: str | None = None,
        worker_id: str | None = None,
        concurrency: int = 1,
        lease_ms: int = 30_000,
        capabilities: Iterable[str] | None = None,
        clock: Clock | None = None,
        executor: Executor | None = None,
        sleep: Callable[[float], None] = time.sleep,
        heartbeat_fraction: float = 1 / 3,
        poll_ms: int | None = None,
        grace_s: float = 30.0,
        backoff_base_ms: int = 100,
        backoff_cap_ms: int = 5_000,
        batch: bool = True,
        batch_window_ms: int = DEFAULT_WINDOW_MS,
        batch_max: int = DEFAULT_BATCH_MAX,
        also_serve: Iterable[Any] = (),
        all_scopes: bool = False,
    ) -> None:
        arguments.calls(authority, "authority", _WORKER_CALLS, "an Authority or HttpAuthority")
        if not isinstance(getattr(authority, "spec", None), Spec):
            raise errors.bad_argument("authority", "authority must have the Spec it decides by")
        if not isinstance(app, App):
            raise errors.bad_argument("app", "app must be an App")
        if not app.definitions:
            raise errors.bad_argument("handler", "the app has no handlers")
        # Every exception a handler raises is reported under this kind: refuse it now.
        authority.spec.check_failure_kind(app.failure_kind, "failure_kind")
        tenant, application = inputs.as_scope(tenant, application)
        if worker_id is not None:
            worker_id = arguments.name(worker_id, "worker_id")
            if len(worker_id) > WORKER_ID_MAX:
                raise errors.bad_argument(
                    "worker_id", f"worker_id must be at most {WORKER_ID_MAX} characters"
                )
        arguments.whole(concurrency, "concurrency", 1)
        arguments.whole(lease_ms, "lease_ms", 1, arguments.MAX_LEASE_MS)
        if capabilities is not None:
            capabilities = arguments.names(capabilities, "capabilities")
        if clock is not None:
            arguments.calls(clock, "clock", ["now"], "a Clock")
        if executor is not None and not isinstance(executor, Executor):
            raise errors.bad_argument("executor", "executor must be a concurrent.futures.Executor")
        if not callable(sleep):
            raise errors.bad_argument("sleep", "sleep must be callable, as time.sleep is")
        if (
            isinstance(heartbeat_fraction, bool)
            or not isinstance(heartbeat_fraction, (int, float))
            or not 0 < heartbeat_fraction < 1
        ):
            raise errors.bad_argument(
                "heartbeat_fraction", "heartbeat_fraction must be between 0 and 1"
            )
        if poll_ms is not None:
            arguments.whole(poll_ms, "poll_ms", 1)
        grace_s = arguments.seconds(grace_s, "grace_s")
        arguments.whole(backoff_base_ms, "backoff_base_ms", 1)
        arguments.whole(backoff_cap_ms, "backoff_cap_ms", backoff_base_ms)
        arguments.flag(batch, "batch")
        arguments.whole(batch_window_ms, "batch_window_ms", 0)
        arguments.whole(batch_max, "batch_max", 1, MAX_BATCH)
        if isinstance(also_serve, Mapping) or not isinstance(also_serve, Iterable):
            raise errors.bad_argument(
                "also_serve", "also_serve must be a collection of scopes (or one 'tenant/app')"
            )
        arguments.flag(all_scopes, "all_scopes")
        self._wake = threading.Event()
        self.app = app
        self.tenant = tenant
        self.application = application
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.capabilities = tuple(capabilities) if capabilities is not None else app.capabilities
        if len(set(self.capabilities)) > MAX_LIST:
            # Every claim would be refused for offering more than a claim takes.
            raise errors.bad_argument(
                "capabilities", f"a worker offers at most {MAX_LIST} capabilities"
            )
        self.clock: Clock = clock if clock is not None else WallClock()
        self.executor: Executor = executor if executor is not None else ThreadExecutor()
        self.sleep = sleep
        self.heartbeat_ms = max(1, int(lease_ms * heartbeat_fraction))
        if batch and batch_window_ms >= lease_ms - self.heartbeat_ms:
            # A heartbeat sent on time and then held for the whole window would reach
            # the store after the lease it extends had ended.
            raise errors.bad_argument(
                "batch_window_ms",
                f"batch_window_ms must be shorter than the {lease_ms - self.heartbeat_ms} ms"
                f" a heartbeat has left of its lease (lease_ms {lease_ms} less the heartbeat"
                f" interval {self.heartbeat_ms} ms), not {batch_window_ms}",
            )
        self.grace_s = grace_s
        self.backoff_base_ms = backoff_base_ms
        self.backoff_cap_ms = backoff_cap_ms
        #: The store's capabilities (wake-ups, due instants); None over HTTP.
        self.store = authority.store if isinstance(authority, Authority) else None
        self.wake_ups = isinstance(self.store, WakeUps)
        # A worker of every scope hears no wake-up of a scope it has not found yet.
        listens = self.wake_ups and not all_scopes
        self.poll_ms = poll_ms if poll_ms is not None else (5_000 if listens else 1_000)
        self.authority: Authority | HttpAuthority = authority
        self._view: HandledOnly | None = None
        if isinstance(authority, Authority):
            self._view = handled_only(authority.store, app.definitions)
            self.authority = Authority(
                self._view,
                grants=authority.grants,
                spec=authority.spec,
                remember=authority.remember,
            )
        #: The batch calls the worker makes, None when it calls one at a time.
        self.batches: BatchCalls | None = (
            self.authority if batch and isinstance(self.authority, BatchCalls) else None
        )
        self.batch_window_ms = batch_window_ms
        self.batch_max = batch_max
        self._buffer: ReportBuffer | None = None
        if self.batches is not None:
            self._buffer = ReportBuffer(
                self.batches, window_ms=batch_window_ms, max_size=batch_max, wake=self._wake.set
            )
        self._spec = authority.spec
        intervals = [rate.every_ms for rate in self._spec.concurrency_rates.values()]
        if self._spec.concurrency_default_rate is not None:
            intervals.append(self._spec.concurrency_default_rate.every_ms)
        self._rate_look_ms = max(_RATE_LOOK_MS, min(intervals, default=self.poll_ms))
        extra = list(also_serve) if not isinstance(also_serve, (str, bytes)) else [also_serve]
        named = [] if tenant is None and application is None else [(tenant, application)]
        if not named and not all_scopes:
            raise errors.bad_argument("tenant", "a worker serves a tenant and an application")
        self.all_scopes = all_scopes
        if all_scopes and not isinstance(self.store, ScopeListing):
            raise errors.bad_argument(
                "all_scopes",
                "serving every scope needs a store that lists them (memory, SQLite,"
                " PostgreSQL), not a remote authority",
            )
        #: Every scope served: (tenant, application) first, then `also_serve` (and, with
        #: `all_scopes`, every scope the store has claimable work in, as it is found).
        self.scopes: tuple[FairScope, ...] = tuple(
            FairScope.of(scope) for scope in [*named, *extra]
        )
        #: The fair-share ledger across `scopes` (None while one scope is served).
        self.share: FairShare | None = None
        if len(self.scopes) > 1 or (all_scopes and self.scopes):
            self.share = FairShare.from_spec(self._spec, self.scopes)
            self.scopes = self.share.scopes
        self._scopes_listed_at: int | None = None
        self._held: list[_Held] = []
        self._claim_at = 0
        self._claim_backoff = Backoff(backoff_base_ms, backoff_cap_ms)
        self._claim_request: str | None = None
        self._idle = False
        self._next_eligible: int | None = None
        self._stopping = False
        self._stop_deadline: float | None = None
        self._signals = 0
        # Store calls handlers' threads are making; once `run()` has ended (`_ended`) none
        # starts, and `run()` returns only when none is under way, so that whoever owns the
        # store may close it (SQLite closes each thread's connection, in use or not).
        self._calls = threading.Condition()
        self._in_flight = 0
        self._ended = False
        #: Counts of what happened, by event name (claimed, completed, ...).
        self.counts: dict[str, int] = {}

    # -- what the worker holds ------------------------------------------------------

    @property
    def held(self) -> list[Job]:
        """The jobs of the attempts the worker holds now."""
        return [h.job for h in self._held if h.job is not None]

    @property
    def idle(self) -> bool:
        """True when it holds nothing and its last look found nothing claimable."""
        return self._idle and not self._held

    def _count(self, name: str, **fields: object) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        event(name, **fields)

    # -- one step --------------------------------------------------------------------

    def step(self) -> int:
        """Do everything due at the clock's instant; the instant something is next due."""
        now = self.clock.now()
        if self._buffer is not None:
            self._buffer.take_checkpoints(now)
        for held in list(self._held):
            self._advance(held, now)
        while True:
            if not self._stopping:
                self._claim_more(now)
            # A flush that ends attempts frees slots to claim into at once.
            if not self._flush_due(now):
                return self._next_due(now)

    def _next_due(self, now: int) -> int:
        due: list[int] = []
        for held in self._held:
            if held.pending:
                continue  # its answer comes with the buffer's flush
            if held.phase == "run":
                assert held.job is not None
                if held.future is not None and held.future.done():
                    due.append(now)
                elif not held.job.lost:
                    due.append(max(held.next_heartbeat, held.retry_at))
                # A lost attempt's handler is waited for: its end wakes the loop.
            else:
                due.append(held.retry_at)
        if not self._stopping and len(self._held) < self.concurrency:
            due.append(self._claim_at)
        flush_at = self._buffer.due() if self._buffer is not None else None
        if flush_at is not None:
            due.append(flush_at)
        return max(now, min(due)) if due else now + self.poll_ms

    def notify_work(self) -> None:
        """Work may have become claimable: look at once (from any thread)."""
        self._claim_at = 0
        self._wake.set()

    # -- claiming ----------------------------------------------------------------------

    def _claim_more(self, now: int) -> None:
        while len(self._held) < self.concurrency and now >= self._claim_at:
            # A claim whose reply was lost is asked for again under the same
            # request id, and answered with the claims it made (`own_claim`).
            if self._claim_request is None:
                self._claim_request = f"{self.worker_id}-{uuid.uuid4().hex[:12]}"
            free = self.concurrency - len(self._held)
            call = "claim_many" if self.batches is not None else "claim_next"
            try:
                claims = self._claim(now, min(free, MAX_BATCH))
            except (WorkloadError, StoreError) as exc:
                self._claim_at = now + self._store_error(call, exc, self._claim_backoff)
                return
            self._claim_request = None
            self._claim_backoff.reset()
            if not claims:
                self._idle = True
                self._claim_at = self._when_to_look(now)
                return
            self._idle = False
            for claim in claims:
                self._take(claim, now)

    def _claim(self, now: int, limit: int) -> list[ClaimReply]:
        """Up to `limit` claims: one `claim_many`, or one `claim_next` (at most one claim).

        Serving several scopes, the claims are asked of them in the ledger's
        order (`claim_fair`), one call per scope tried.
        """
        if self.all_scopes:
            self._list_scopes(now)
            if self.share is None:
                return []
        if self.share is not None:
            return claim_fair(
                self.authority,
                self.share,
                self.worker_id,
                self.capabilities,
                now,
                self.lease_ms,
                limit if self.batches is not None else 1,
                self._claim_request,
            )
        assert self.tenant is not None
        assert self.application is not None
        if self.batches is not None:
            return self.batches.claim_many(
                self.tenant,
                self.application,
                self.worker_id,
                self.capabilities,
                now,
                self.lease_ms,
                limit,
                request_id=self._claim_request,
            )
        claim = self.authority.claim_next(
            self.tenant,
            self.application,
            self.worker_id,
            self.capabilities,
            now,
            self.lease_ms,
            request_id=self._claim_request,
        )
        return [] if claim is None else [claim]

    def _list_scopes(self, now: int) -> None:
        """Serve the scopes the store has claimable work in, looked up once per `poll_ms`."""
        if self._scopes_listed_at is not None and now < self._scopes_listed_at + self.poll_ms:
            return
        assert isinstance(self.store, ScopeListing)
        listed = [FairScope(t, a) for t, a in self.store.claimable_scopes(now)]
        self._scopes_listed_at = now
        if not listed:
            return
        if self.share is None:
            self.share = FairShare.from_spec(self._spec, listed)
        else:
            self.share.serve(listed, {s: spec_weight(self._spec, s) for s in listed})
        self.scopes = self.share.scopes

    def _take(self, claim: ClaimReply, now: int) -> None:
        """Hold a new claim and move it on; a claim that started its attempt needs no start."""
        held = _Held(
            claim=claim,
            phase="start" if claim.started_at is None else "context",
            backoff=Backoff(self.backoff_base_ms, self.backoff_cap_ms),
            expires_at=claim.expires_at,
            next_heartbeat=now + self.heartbeat_ms,
        )
        self._held.append(held)
        self._describe(held)
        self._count(
            "claimed",
            workload=claim.workload_id,
            attempt=held.attempt or None,
            token=claim.fencing_token,
            definition=held.definition_id or None,
            worker=self.worker_id,
        )
        self._advance(held, now)

    def _describe(self, held: _Held) -> None:
        """The claimed workload's definition and attempt number (left unset on a failure).

        Known from the claim's own write when the worker claims through a
        store (`HandledOnly.claimed`); read otherwise.
        """
        known = self._view.claimed(held.workload_id, held.fence.token) if self._view else None
        if known is not None:
            held.definition_id, held.attempt = known
            return
        try:
            workload = self.authority.get(held.workload_id)
        except (WorkloadError, StoreError):
            return
        held.definition_id = workload.definition_id
        held.attempt = workload.attempt_count

    def _when_to_look(self, now: int) -> int:
        """When to look for work again: the next eligible instant, or `poll_ms` from now.

        Under a spec that rates concurrency keys, no later than the shortest
        interval in which a key gains a token (at least `_RATE_LOOK_MS`): the
        store does not wake a worker when a token comes back.
        """
        latest = now + min(self.poll_ms, self._rate_look_ms)
        self._next_eligible = None
        if isinstance(self.store, DueInstants):
            due = self.store
            # Serving every scope, the next instant of any; a new scope is found by listing.
            wanted = (
                [(None, None)]
                if self.all_scopes
                else [(s.tenant, s.application) for s in self.scopes]
            )
            try:
                instants = [due.next_instants(now, t, a).eligible_at for t, a in wanted]
            except StoreError as exc:
                self._store_error("next_instants", exc, None)
                return latest
            nxt = min((i for i in instants if i is not None), default=None)
            self._next_eligible = nxt
            if nxt is not None:
                return min(nxt, latest)
        return latest

    # -- the attempts ------------------------------------------------------------------

    def _store_error(self, call: str, exc: Exception, backoff: Backoff | None) -> int:
        delay = backoff.next_delay() if backoff is not None else self.poll_ms
        code = exc.code if isinstance(exc, WorkloadError) else type(exc).__name__
        self._count("store_error", call=call, code=code, retry_in_ms=delay)
        return delay

    def _lose(self, held: _Held, reason: str) -> None:
        if held.job is not None:
            held.job._mark_lost()
        self._count("lost", workload=held.workload_id, token=held.fence.token, reason=reason)
        if held.future is None or held.future.done():
            self._drop(held)

    def _drop(self, held: _Held) -> None:
        if held in self._held:
            self._held.remove(held)
            self._claim_at = 0  # room for another claim

    def _answer(self, held: _Held, call: str, exc: Exception, now: int) -> str:
        """What to do after a refused call: "over", "again", "later" or "refused"."""
        cls = exc.error_class if isinstance(exc, WorkloadError) else "retry_later"
        if cls == "attempt_over":
            self._lose(held, exc.code if isinstance(exc, WorkloadError) else call)
            return "over"
        if cls == "conflict_retry_now" and held.conflicts < CONFLICT_TRIES:
            held.conflicts += 1
            held.retry_at = now
            return "again"
        if cls in ("retry_later", "conflict_retry_now"):
            held.retry_at = now + self._store_error(call, exc, held.backoff)
            return "later"
        return "refused"

    def _advance(self, held: _Held, now: int) -> None:
        """Move the attempt on as far as it goes at `now` without waiting on the authority."""
        while held in self._held and not held.pending:
            if held.phase != "report" and held.job is not None and held.job.lost:
                if held.future is None or held.future.done():
                    self._drop(held)
                return
            if held.phase != "run" and now < held.retry_at:
                return
            if held.phase in ("start", "context") and now >= held.expires_at:
                self._lose(held, "lease_lapsed")
                return
            phase = held.phase
            try:
                report = self._due_report(held, now)
            except (WorkloadError, StoreError) as exc:
                self._refused(held, phase, exc, now)
                return
            if report is None:
                return
            if self._buffer is not None:
                held.pending = True
                self._buffer.add(held, report, now)
                return
            try:
                reply = send_one(self.authority, report, now)
            except (WorkloadError, StoreError) as exc:
                self._refused(held, held.phase, exc, now)
                return
            if not self._answered(held, reply, now):
                return

    def _due_report(self, held: _Held, now: int) -> Report | None:
        """The report the attempt is waiting to make now, after its local steps; None if none."""
        wid, fence = held.workload_id, held.fence
        if held.phase == "start":
            return {"op": "start", "workload_id": wid, "fence": fence}
        if held.phase == "context":
            self._begin(held, now)
        if held.phase == "run":
            assert held.job is not None
            assert held.future is not None
            if held.future.done():
                held.report = self._outcome(held, now)
                held.phase = "report"
                held.retry_at = 0
                held.conflicts = 0
            elif now >= held.expires_at:
                self._lose(held, "lease_lapsed")
                return None
            elif now < max(held.next_heartbeat, held.retry_at):
                return None
            else:
                return {
                    "op": "heartbeat",
                    "workload_id": wid,
                    "fence": fence,
                    "extend_ms": self.lease_ms,
                }
        if held.phase == "report":
            report = held.report
            assert report is not None
            if report.operation == "complete":
                return {
                    "op": "complete",
                    "workload_id": wid,
                    "fence": fence,
                    "result_id": result_id_for(fence),
                    "output": report.output,
                }
            if report.operation == "confirm_cancel":
                return {"op": "confirm_cancel", "workload_id": wid, "fence": fence}
            return {
                "op": "fail",
                "workload_id": wid,
                "fence": fence,
                "kind": report.kind,
                "error": report.error,
                "effect": report.effect,
            }
        return None

    def _flush_due(self, now: int) -> bool:
        """Send the buffered reports when due, follow each answer, and send what follows.

        True when it sent anything.
        """
        buffer = self._buffer
        sent = False
        if buffer is None:
            return sent
        while True:
            # Nothing can join when every attempt held is waiting on an answer.
            waiting = buffer.waiting()
            at_once = self._stopping or all(h.workload_id in waiting for h in self._held)
            if not buffer.is_due(now, at_once=at_once):
                return sent
            sent = True
            for held, answer in buffer.flush(now):
                held.pending = False
                if held not in self._held:
                    continue
                if isinstance(answer, (WorkloadError, StoreError)):
                    self._refused(held, held.phase, answer, now)
                elif self._answered(held, answer, now):
                    self._advance(held, now)

    def _answered(self, held: _Held, reply: Any, now: int) -> bool:
        """Follow the authority's reply to the attempt's report; True when it moves on at once."""
        held.backoff.reset()
        held.conflicts = 0
        if held.phase == "start":
            held.phase = "context"
            return True
        if held.phase == "run":
            self._heartbeat_answered(held, reply, now)
            return False
        report = held.report
        assert report is not None
        fields: dict[str, object] = {
            "workload": held.workload_id,
            "attempt": held.attempt,
            "token": held.fence.token,
        }
        if report.operation == "complete":
            self._count("completed", **fields, result=reply.result_id)
        elif report.operation == "confirm_cancel":
            self._count("cancelled", **fields)
        else:
            state = state_of(reply)
            name = "retried" if state in self._spec.roles.queued else "failed"
            self._count(
                name,
                **fields,
                kind=report.kind,
                effect=report.effect,
                state=state,
                error=report.error,
            )
        self._drop(held)
        return False

    def _heartbeat_answered(self, held: _Held, claim: Any, now: int) -> None:
        job = held.job
        assert job is not None
        held.expires_at = claim.expires_at
        job._expires_at = claim.expires_at
        held.next_heartbeat = now + self.heartbeat_ms
        self.counts["heartbeats"] = self.counts.get("heartbeats", 0) + 1
        if job.cancel_requested:
            return
        # The heartbeat's reply is the lease, which does not say: read the state.
        try:
            state = self.authority.get(held.workload_id).state
        except (WorkloadError, StoreError) as exc:
            self._refused(held, "run", exc, now)
            return
        if state in self._spec.roles.cancelling:
            job._mark_cancel_requested()
            event("cancel_requested", workload=held.workload_id, token=held.fence.token)

    def _refused(self, held: _Held, call: str, exc: Exception, now: int) -> None:
        """Follow a refusal (or a store failure) of the attempt's call by its class."""
        if (
            call == "report"
            and isinstance(exc, WorkloadError)
            and exc.error_class in ("give_up", "fix_request")
            and self._rethink(held, exc)
        ):
            held.retry_at = now
            return
        answer = self._answer(held, call, exc, now)
        if answer != "refused":
            return
        code = exc.code if isinstance(exc, WorkloadError) else type(exc).__name__
        self._count("refused", workload=held.workload_id, call=call, code=code)
        if call in ("start", "context") and self._cancelling(held):
            held.report = _Report("confirm_cancel")
            held.phase = "report"
            held.retry_at = now
        elif held.future is None or held.future.done():
            self._drop(held)

    def _begin(self, held: _Held, now: int) -> None:
        """Read what the handler needs, build its job and hand it to the executor."""
        if not held.definition_id:
            workload = self.authority.get(held.workload_id)
            held.definition_id = workload.definition_id
            held.attempt = workload.attempt_count
        # The claim's reply carries the input and the checkpoints so far.
        context = held.claim
        held.backoff.reset()
        held.conflicts = 0
        handler = self.app.get(held.definition_id)
        job = Job(
            workload_id=held.workload_id,
            definition_id=held.definition_id,
            attempt=held.attempt,
            fence=held.fence,
            input=context.input,
            checkpoints=context.checkpoints,
            record=self._checkpoint,
        )
        job._expires_at = held.expires_at
        held.job = job
        held.handler = handler
        held.started_ms = now
        held.phase = "run"
        if handler is None:
            # Only when the handler set changed under a claim: report it, do not run.
            held.report = _Report(
                "fail",
                kind=self.app.failure_kind,
                error=f"no handler for definition {held.definition_id}",
                effect="none",
            )
            held.phase = "report"
            return
        held.future = self.executor.submit(_call_handler, handler, job)
        held.future.add_done_callback(lambda _: self._wake.set())

    def _outcome(self, held: _Held, now: int) -> _Report:
        """What the ended handler's return or exception reports (fixed from now on)."""
        job, future = held.job, held.future
        assert job is not None
        assert future is not None
        if job.cancel_requested:
            return _Report("confirm_cancel")
        exc = future.exception()
        if exc is None:
            return _Report("complete", output=future.result())
        if isinstance(exc, Retry):
            text = exc.message or f"{exc.kind}: the handler asked for a retry"
            if exc.after_ms is not None:
                text += f" (after {exc.after_ms} ms)"
            return _Report("fail", kind=exc.kind, error=_error_text(text), effect="none")
        if isinstance(exc, Fail):
            text = exc.message or f"{exc.kind}: the handler failed"
            return _Report("fail", kind=exc.kind, error=_error_text(text), effect=exc.effect)
        ran_ms = now - held.started_ms
        late = self.app.unknown_after_ms is not None and ran_ms >= self.app.unknown_after_ms
        effect = "unknown" if job._checkpointed or late else "none"
        text = f"{type(exc).__name__}: {_exception_text(exc)}"
        return _Report("fail", kind=self.app.failure_kind, error=_error_text(text), effect=effect)

    def _cancelling(self, held: _Held) -> bool:
        try:
            state = self.authority.get(held.workload_id).state
        except (WorkloadError, StoreError):
            return False
        return state in self._spec.roles.cancelling

    def _rethink(self, held: _Held, exc: WorkloadError) -> bool:
        """A report refused for good: report something else instead, when that fits.

        The workload was asked to cancel meanwhile: confirm that. The output
        was refused (a secret in it, a result id clash): report a failure of
        unknown effect, since the handler did run. A failure of a kind the
        spec does not declare (a handler's `Retry` or `Fail`): report it
        under the app's `failure_kind`, with the same effect.
        """
        report = held.report
        assert report is not None
        if report.operation == "confirm_cancel":
            return False
        if self._cancelling(held):
            held.report = _Report("confirm_cancel")
            return True
        if report.operation == "complete" and exc.error_class == "fix_request":
            held.report = _Report(
                "fail",
                kind=self.app.failure_kind,
                error=f"the authority refused the output: {exc.code}",
                effect="unknown",
            )
            return True
        if report.operation == "fail" and exc.code == errors.SECRET_REJECTED:
            # The text is never sent again, in any form: only that it was refused.
            text = f"{report.kind}: the failure's text was refused as secret material; not kept"
            held.report = _Report("fail", kind=report.kind, error=text, effect=report.effect)
            return True
        if (
            report.operation == "fail"
            and exc.error_class == "fix_request"
            and report.kind != self.app.failure_kind
        ):
            text = f"{report.kind}: refused ({exc.code}): {report.error}"
            held.report = _Report(
                "fail", kind=self.app.failure_kind, error=_error_text(text), effect=report.effect
            )
            return True
        return False

    def _checkpoint(self, job: Job, state: Any, sequence: int) -> Checkpoint:
        """`Job.checkpoint`, from the handler's thread: repeated under the same sequence.

        With batching, while the loop runs on another thread, each try goes
        with the loop's next batch and this thread waits for its answer.
        """
        backoff = Backoff(self.backoff_base_ms, self.backoff_cap_ms)
        conflicts = 0
        while True:
            now = self.clock.now()
            report: Report = {
                "op": "checkpoint",
                "workload_id": job.workload_id,
                "fence": job.fence,
                "state": state,
                "sequence": sequence,
            }
            answer: Any
            if self._buffer is None:
                answer = self._checkpoint_once(report, now)
            else:
                answer = self._buffer.checkpoint(
                    report, functools.partial(self._checkpoint_once, report, now)
                )
            if isinstance(answer, Checkpoint):
                return answer
            if not isinstance(answer, WorkloadError):
                raise answer
            exc = answer
            if exc.error_class == "attempt_over":
                job._mark_lost()
                raise exc
            if exc.error_class == "conflict_retry_now" and conflicts < CONFLICT_TRIES:
                conflicts += 1
                continue
            # Past the lease it last knew of, the attempt is as good as lost.
            if exc.error_class != "retry_later" or job.lost or now >= job._expires_at:
                raise exc
            delay = self._store_error("checkpoint", exc, backoff)
            self.sleep(delay / 1000)

    def _checkpoint_once(self, report: Report, now: int) -> Any:
        """One checkpoint call: its reply, or the `WorkloadError` it raised.

        Once `run()` has ended the attempt is abandoned: the call is not made.
        """
        with self._calls:
            if self._ended:
                return WorkloadError(
                    errors.STORAGE_FAILURE,
                    "the worker has stopped: this attempt was abandoned, its lease runs out"
                    " and is recovered",
                )
            self._in_flight += 1
        try:
            return send_one(self.authority, report, now)
        except WorkloadError as exc:
            return exc
        finally:
            with self._calls:
                self._in_flight -= 1
                self._calls.notify_all()

    def _end_calls(self) -> None:
        """`run()` is ending: no handler's call starts from now on, and those under way end.

        Every attempt still held is abandoned, and its job marked lost.
        """
        with self._calls:
            self._ended = True
        for held in self._held:
            if held.job is not None:
                held.job._mark_lost()
        if self._buffer is not None:
            self._buffer.close()  # checkpoints waiting on the loop: refused, as above
        with self._calls:
            while self._in_flight:
                self._calls.wait()

    # -- running ---------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; let running handlers finish within `grace_s` (default `self.grace_s`).

        Safe from any thread. `run()` returns once nothing is held, or when
        the grace period is over (a handler still running is abandoned: its
        lease runs out and is recovered; its `job.lost` is set and its
        `job.checkpoint` no longer reaches the store).
        """
        if not self._stopping:
            self._stopping = True
            grace = self.grace_s if grace_s is None else grace_s
            self._stop_deadline = time.monotonic() + grace
            event("stopping", worker=self.worker_id, held=len(self._held), grace_s=grace)
        self._wake.set()

    def run(self, *, handle_signals: bool = True) -> None:
        """Claim and run work until `stop()` (or, on the main thread, SIGTERM or SIGINT).

        With `handle_signals` on the main thread: the first SIGTERM or SIGINT
        stops gracefully, a second exits the process at once (status 143 or
        130).
        """
        self._loop(until_idle=False, handle_signals=handle_signals)

    def run_until_idle(self, *, handle_signals: bool = True) -> None:
        """Run until nothing is claimable, held, or eligible within a lease from now.

        Signals as `run`: on the main thread, the first SIGTERM or SIGINT
        stops gracefully (what is held finishes within `grace_s`), a second
        exits at once.
        """
        self._loop(until_idle=True, handle_signals=handle_signals)

    def _finished(self, until_idle: bool, now: int) -> bool:
        if self._stopping:
            if not self._held:
                return True
            return self._stop_deadline is not None and time.monotonic() >= self._stop_deadline
        if until_idle and self.idle:
            nxt = self._next_eligible
            return nxt is None or nxt > now + self.lease_ms
        return False

    def _loop(self, *, until_idle: bool, handle_signals: bool) -> None:
        restore = self._install_signals() if handle_signals else None
        signals: list[WorkSignal] = []
        listeners: list[threading.Thread] = []
        halted = threading.Event()
        if isinstance(self.store, WakeUps):
            for scope in self.scopes:
                work_signal = self.store.work_signal(scope.tenant, scope.application)
                signals.append(work_signal)
                listener = threading.Thread(
                    target=self._listen,
                    args=(work_signal, halted),
                    name="workwarden-wake-ups",
                    daemon=True,
                )
                listeners.append(listener)
                listener.start()
        event(
            "started",
            worker=self.worker_id,
            tenant=self.tenant,
            application=self.application,
            also_serve=[scope.key for scope in self.scopes[1:]] or None,
            all_scopes=self.all_scopes or None,
            concurrency=self.concurrency,
            lease_ms=self.lease_ms,
            batch="on" if self._buffer is not None else "off",
            batch_window_ms=self.batch_window_ms if self._buffer is not None else None,
        )
        with self._calls:
            self._ended = False
        if self._buffer is not None:
            self._buffer.open()
        try:
            while True:
                self._wake.clear()
                due = self.step()
                now = self.clock.now()
                if self._finished(until_idle, now):
                    self._flush_all(now)
                    break
                timeout = min((due - now) / 1000, MAX_WAIT_S)
                if self._stopping and self._stop_deadline is not None:
                    timeout = min(timeout, max(0.0, self._stop_deadline - time.monotonic()))
                if timeout > 0:
                    self._wake.wait(timeout)
        finally:
            self._end_calls()
            halted.set()
            for listener in listeners:
                listener.join()
            for work_signal in signals:
                work_signal.close()
            if restore is not None:
                restore()
            event("stopped", worker=self.worker_id, abandoned=len(self._held))

    def _flush_all(self, now: int) -> None:
        """Send whatever is still buffered (the grace period ended with reports waiting)."""
        buffer = self._buffer
        while buffer is not None and len(buffer):
            for held, answer in buffer.flush(now):
                held.pending = False
                if held not in self._held:
                    continue
                if isinstance(answer, (WorkloadError, StoreError)):
                    self._refused(held, held.phase, answer, now)
                else:
                    self._answered(held, answer, now)

    def _listen(self, work_signal: WorkSignal, halted: threading.Event) -> None:
        while not halted.is_set():
            if work_signal.wait(0.5) and not halted.is_set():
                self.notify_work()

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(number: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals > 1:
                # The line is written on a thread of its own, waited for a moment only: this
                # thread may be the one blocked writing to a full standard error (a log
                # reader that stopped reading), and a second signal must end the process.
                last = threading.Thread(
                    target=event,
                    args=("stopped",),
                    kwargs={
                        "worker": self.worker_id,
                        "signal": number,
                        "abandoned": len(self._held),
                    },
                    daemon=True,
                )
                last.start()
                last.join(_LAST_LINE_S)
                os._exit(128 + number)
            from_handler(self.stop)

        for sig in previous:
            signal.signal(sig, on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


def _call_handler(handler: HandlerSpec, job: Job) -> Any:
    """Run the handler; an `async def` (or returned awaitable) runs on an event loop of its own."""
    result = handler.function(job)
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
