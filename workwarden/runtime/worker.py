"""`Worker`: claims work, runs its handlers, heartbeats, and reports what became of each attempt.

The worker never decides: it calls the authority and does what the answer
says. Its whole logic is `step()`, which does what is due at the clock's
instant and returns the instant it next has something to do:

- each held attempt moves on: start it, read its execution context, hand
  the `Job` to the handler (on the executor), heartbeat every
  `heartbeat_fraction` of the lease while the handler runs, and report the
  outcome once it has returned or raised;
- while it holds fewer than `concurrency` attempts, it claims more with
  `claim_next`, until nothing is claimable; then it waits until the next
  eligible instant the store knows of (bounded by `poll_ms`), or until the
  store's wake-up signal says work may have become claimable.

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
import inspect
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from workwarden.runtime.clock import Backoff, Clock, WallClock, event
from workwarden.runtime.handlers import App, Fail, HandlerSpec, Job, Retry, result_id_for
from workwarden.runtime.scope import HandledOnly
from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.models import Checkpoint, ClaimReply, Fence
from workwarden.storage.base import DueInstants, StoreError, WakeUps, WorkSignal

if TYPE_CHECKING:
    from workwarden.service.client import HttpAuthority

__all__ = ["ThreadExecutor", "Worker", "default_worker_id"]

_T = TypeVar("_T")

#: Longest error text reported for a failure (the rest is cut).
ERROR_TEXT_LIMIT = 500

#: How many times in a row a call that lost a compare-and-swap is made again at once.
CONFLICT_TRIES = 8


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

    - `worker_id`: the id the authority records (default `host-pid-random`).
    - `concurrency`: how many handlers run at once (default 1).
    - `lease_ms`: the lease each claim and heartbeat asks for (default 30 s).
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

    Thread-safety: `run()` and `step()` belong to one thread; `stop()` may
    be called from any thread (or a signal handler).
    """

    def __init__(
        self,
        authority: Authority | HttpAuthority,
        app: App,
        *,
        tenant: str,
        application: str,
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
    ) -> None:
        if concurrency < 1:
            raise errors.bad_argument("concurrency", "concurrency must be at least 1")
        if lease_ms < 1:
            raise errors.bad_argument(
                "lease_ms", "lease_ms must be a positive number of milliseconds"
            )
        if not 0 < heartbeat_fraction < 1:
            raise errors.bad_argument(
                "heartbeat_fraction", "heartbeat_fraction must be between 0 and 1"
            )
        if not app.definitions:
            raise errors.bad_argument("handler", "the app has no handlers")
        self.app = app
        self.tenant = tenant
        self.application = application
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.capabilities = tuple(capabilities) if capabilities is not None else app.capabilities
        self.clock: Clock = clock if clock is not None else WallClock()
        self.executor: Executor = executor if executor is not None else ThreadExecutor()
        self.sleep = sleep
        self.heartbeat_ms = max(1, int(lease_ms * heartbeat_fraction))
        self.grace_s = grace_s
        self.backoff_base_ms = backoff_base_ms
        self.backoff_cap_ms = backoff_cap_ms
        #: The store's capabilities (wake-ups, due instants); None over HTTP.
        self.store = authority.store if isinstance(authority, Authority) else None
        self.wake_ups = isinstance(self.store, WakeUps)
        self.poll_ms = poll_ms if poll_ms is not None else (5_000 if self.wake_ups else 1_000)
        self.authority: Authority | HttpAuthority = authority
        if isinstance(authority, Authority):
            self.authority = Authority(
                HandledOnly(authority.store, app.definitions),
                grants=authority.grants,
                spec=authority.spec,
                remember=authority.remember,
            )
        self._spec = authority.spec
        self._held: list[_Held] = []
        self._claim_at = 0
        self._claim_backoff = Backoff(backoff_base_ms, backoff_cap_ms)
        self._claim_request: str | None = None
        self._idle = False
        self._next_eligible: int | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._stop_deadline: float | None = None
        self._signals = 0
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
        for held in list(self._held):
            self._advance(held, now)
        if not self._stopping:
            self._claim_more(now)
        return self._next_due(now)

    def _next_due(self, now: int) -> int:
        due: list[int] = []
        for held in self._held:
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
        return max(now, min(due)) if due else now + self.poll_ms

    def notify_work(self) -> None:
        """Work may have become claimable: look at once (from any thread)."""
        self._claim_at = 0
        self._wake.set()

    # -- claiming ----------------------------------------------------------------------

    def _claim_more(self, now: int) -> None:
        while len(self._held) < self.concurrency and now >= self._claim_at:
            # A claim whose reply was lost is asked for again under the same
            # request id, and answered with the claim it made (`own_claim`).
            if self._claim_request is None:
                self._claim_request = f"{self.worker_id}-{uuid.uuid4().hex[:12]}"
            try:
                claim = self.authority.claim_next(
                    self.tenant,
                    self.application,
                    self.worker_id,
                    self.capabilities,
                    now,
                    self.lease_ms,
                    request_id=self._claim_request,
                )
            except (WorkloadError, StoreError) as exc:
                self._claim_at = now + self._store_error("claim_next", exc, self._claim_backoff)
                return
            self._claim_request = None
            self._claim_backoff.reset()
            if claim is None:
                self._idle = True
                self._claim_at = self._when_to_look(now)
                return
            self._idle = False
            held = _Held(
                claim=claim,
                phase="start",
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
        """Read the claimed workload's definition and attempt number (left unset on a failure)."""
        try:
            workload = self.authority.get(held.workload_id)
        except (WorkloadError, StoreError):
            return
        held.definition_id = workload.definition_id
        held.attempt = workload.attempt_count

    def _when_to_look(self, now: int) -> int:
        """When to look for work again: the next eligible instant, or `poll_ms` from now."""
        latest = now + self.poll_ms
        self._next_eligible = None
        if isinstance(self.store, DueInstants):
            try:
                nxt = self.store.next_instants(now, self.tenant, self.application).eligible_at
            except StoreError as exc:
                self._store_error("next_instants", exc, None)
                return latest
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
        if held.phase != "report" and held.job is not None and held.job.lost:
            if held.future is None or held.future.done():
                self._drop(held)
            return
        if held.phase != "run" and now < held.retry_at:
            return
        if held.phase in ("start", "context") and now >= held.expires_at:
            self._lose(held, "lease_lapsed")
            return
        try:
            if held.phase == "start":
                self._start(held, now)
            if held.phase == "context":
                self._begin(held, now)
            if held.phase == "run":
                self._watch(held, now)
            if held.phase == "report":
                self._report(held, now)
        except (WorkloadError, StoreError) as exc:
            answer = self._answer(held, held.phase, exc, now)
            if answer == "refused":
                code = exc.code if isinstance(exc, WorkloadError) else type(exc).__name__
                self._count("refused", workload=held.workload_id, call=held.phase, code=code)
                if held.phase in ("start", "context") and self._cancelling(held):
                    held.report = _Report("confirm_cancel")
                    held.phase = "report"
                    held.retry_at = now
                elif held.future is None or held.future.done():
                    self._drop(held)

    def _start(self, held: _Held, now: int) -> None:
        self.authority.start(held.workload_id, held.fence, now)
        held.backoff.reset()
        held.conflicts = 0
        held.phase = "context"

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

    def _watch(self, held: _Held, now: int) -> None:
        """While the handler runs: heartbeat when due; once it ended, decide what to report."""
        assert held.job is not None
        assert held.future is not None
        if held.future.done():
            held.report = self._outcome(held, now)
            held.phase = "report"
            held.retry_at = 0
            held.conflicts = 0
            return
        if now >= held.expires_at:
            self._lose(held, "lease_lapsed")
            return
        if now < max(held.next_heartbeat, held.retry_at):
            return
        claim = self.authority.heartbeat(held.workload_id, held.fence, now, self.lease_ms)
        held.backoff.reset()
        held.conflicts = 0
        held.expires_at = claim.expires_at
        held.job._expires_at = claim.expires_at
        held.next_heartbeat = now + self.heartbeat_ms
        self.counts["heartbeats"] = self.counts.get("heartbeats", 0) + 1
        if not held.job.cancel_requested:
            state = self.authority.get(held.workload_id).state
            if state in self._spec.roles.cancelling:
                held.job._mark_cancel_requested()
                event("cancel_requested", workload=held.workload_id, token=held.fence.token)

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
            return _Report("fail", kind=exc.kind, error=text[:ERROR_TEXT_LIMIT], effect="none")
        if isinstance(exc, Fail):
            text = exc.message or f"{exc.kind}: the handler failed"
            return _Report("fail", kind=exc.kind, error=text[:ERROR_TEXT_LIMIT], effect=exc.effect)
        ran_ms = now - held.started_ms
        late = self.app.unknown_after_ms is not None and ran_ms >= self.app.unknown_after_ms
        effect = "unknown" if job._checkpointed or late else "none"
        text = f"{type(exc).__name__}: {exc}"
        return _Report(
            "fail", kind=self.app.failure_kind, error=text[:ERROR_TEXT_LIMIT], effect=effect
        )

    def _report(self, held: _Held, now: int) -> None:
        report = held.report
        assert report is not None
        wid, fence = held.workload_id, held.fence
        fields: dict[str, object] = {"workload": wid, "attempt": held.attempt, "token": fence.token}
        try:
            if report.operation == "complete":
                result = self.authority.complete(
                    wid, fence, result_id_for(fence), report.output, now
                )
                self._count("completed", **fields, result=result.result_id)
            elif report.operation == "confirm_cancel":
                self.authority.confirm_cancel(wid, fence, now)
                self._count("cancelled", **fields)
            else:
                state = self.authority.fail(
                    wid, fence, report.kind, report.error, now, effect=report.effect
                )
                name = "retried" if state in self._spec.roles.queued else "failed"
                self._count(
                    name,
                    **fields,
                    kind=report.kind,
                    effect=report.effect,
                    state=state,
                    error=report.error,
                )
        except WorkloadError as exc:
            if exc.error_class in ("give_up", "fix_request") and self._rethink(held, exc):
                held.retry_at = now
                return
            raise
        self._drop(held)

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
        unknown effect, since the handler did run.
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
        return False

    def _checkpoint(self, job: Job, state: Any, sequence: int) -> Checkpoint:
        """`Job.checkpoint`, from the handler's thread: repeated under the same sequence."""
        backoff = Backoff(self.backoff_base_ms, self.backoff_cap_ms)
        conflicts = 0
        while True:
            now = self.clock.now()
            try:
                return self.authority.checkpoint(
                    job.workload_id, job.fence, state, now, sequence=sequence
                )
            except WorkloadError as exc:
                if exc.error_class == "attempt_over":
                    job._mark_lost()
                    raise
                if exc.error_class == "conflict_retry_now" and conflicts < CONFLICT_TRIES:
                    conflicts += 1
                    continue
                # Past the lease it last knew of, the attempt is as good as lost.
                if exc.error_class != "retry_later" or job.lost or now >= job._expires_at:
                    raise
                delay = self._store_error("checkpoint", exc, backoff)
                self.sleep(delay / 1000)

    # -- running ---------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> None:
        """Stop claiming; let running handlers finish within `grace_s` (default `self.grace_s`).

        Safe from any thread. `run()` returns once nothing is held, or when
        the grace period is over (a handler still running is abandoned: its
        lease runs out and is recovered).
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

    def run_until_idle(self) -> None:
        """Run until nothing is claimable, held, or eligible within a lease from now."""
        self._loop(until_idle=True, handle_signals=False)

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
        work_signal: WorkSignal | None = None
        listener: threading.Thread | None = None
        halted = threading.Event()
        if isinstance(self.store, WakeUps):
            work_signal = self.store.work_signal(self.tenant, self.application)
            listener = threading.Thread(
                target=self._listen,
                args=(work_signal, halted),
                name="workwarden-wake-ups",
                daemon=True,
            )
            listener.start()
        event(
            "started",
            worker=self.worker_id,
            tenant=self.tenant,
            application=self.application,
            concurrency=self.concurrency,
            lease_ms=self.lease_ms,
        )
        try:
            while True:
                self._wake.clear()
                due = self.step()
                now = self.clock.now()
                if self._finished(until_idle, now):
                    break
                timeout = (due - now) / 1000
                if self._stopping and self._stop_deadline is not None:
                    timeout = min(timeout, max(0.0, self._stop_deadline - time.monotonic()))
                if timeout > 0:
                    self._wake.wait(timeout)
        finally:
            halted.set()
            if listener is not None:
                listener.join()
            if work_signal is not None:
                work_signal.close()
            if restore is not None:
                restore()
            event("stopped", worker=self.worker_id, abandoned=len(self._held))

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
                event("stopped", worker=self.worker_id, signal=number, abandoned=len(self._held))
                os._exit(128 + number)
            self.stop()

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
