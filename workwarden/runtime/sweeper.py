"""`Sweeper`: recovers expired leases and enforces fallen deadlines, at the instants they fall.

Each step sweeps (`recover_expired`, then `enforce_deadlines`) when
something is due, then asks the store for the next lease expiry or deadline
(`DueInstants.next_instants`) and sleeps until then, bounded by `poll_ms`
so that leases and deadlines written by other processes meanwhile are
seen; a store without the capability is swept every `poll_ms`. Several
sweepers over one store are safe: a workload two of them sweep at once is
decided once (the other loses the compare-and-swap, and the authority
skips it). A store failure is logged and the sweep tried again after a
backoff with jitter.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from workwarden.runtime import arguments
from workwarden.runtime.clock import MAX_WAIT_S, Backoff, Clock, WallClock, event
from workwarden.runtime.signals import from_handler
from workwarden.statemachine import inputs
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.errors import WorkloadError
from workwarden.storage.base import DueInstants, StoreError

if TYPE_CHECKING:
    from workwarden.service.client import HttpAuthority

__all__ = ["Sweeper"]


class Sweeper:
    """Sweeps one store (or one tenant and/or application of it) at the instants work falls due.

    Options: `clock` (default the wall clock, in ms); `poll_ms` (default
    1 s), the longest it sleeps; `idle_horizon_ms` (default 30 s): how far
    ahead `run_until_idle` looks for something due; `backoff_base_ms` and
    `backoff_cap_ms`, the backoff after a store failure. `authority` may be
    an `HttpAuthority`: it is then swept every `poll_ms`. Counts of what it
    did are in `counts` (`recovered`, `timed_out`, `store_error`, `sweeps`).

    Each argument is checked when the sweeper is built: `authority` must
    have `recover_expired` and `enforce_deadlines`, `tenant` and
    `application` are None or names, `clock` has `now()`, the durations
    are whole milliseconds (`poll_ms` and `backoff_base_ms` 1 or more,
    `idle_horizon_ms` 0 or more, `backoff_cap_ms` at least
    `backoff_base_ms`). A bad one is `WORKLOAD_INVALID` naming it.

    Thread-safety: `run()` and `step()` belong to one thread; `stop()` may
    be called from any thread.
    """

    def __init__(
        self,
        authority: Authority | HttpAuthority,
        *,
        tenant: str | None = None,
        application: str | None = None,
        clock: Clock | None = None,
        poll_ms: int = 1_000,
        idle_horizon_ms: int = 30_000,
        backoff_base_ms: int = 100,
        backoff_cap_ms: int = 5_000,
    ) -> None:
        arguments.calls(
            authority, "authority", ("recover_expired", "enforce_deadlines"), "an Authority"
        )
        tenant, application = inputs.as_scope(tenant, application)
        if clock is not None:
            arguments.calls(clock, "clock", ["now"], "a Clock")
        arguments.whole(poll_ms, "poll_ms", 1)
        arguments.whole(idle_horizon_ms, "idle_horizon_ms", 0)
        arguments.whole(backoff_base_ms, "backoff_base_ms", 1)
        arguments.whole(backoff_cap_ms, "backoff_cap_ms", backoff_base_ms)
        self.authority = authority
        self.tenant = tenant
        self.application = application
        self.clock: Clock = clock if clock is not None else WallClock()
        self.poll_ms = poll_ms
        self.idle_horizon_ms = idle_horizon_ms
        self._backoff = Backoff(backoff_base_ms, backoff_cap_ms)
        self._due_at = 0
        self._next: int | None = None
        self._swept = False
        self._stopping = False
        self._wake = threading.Event()
        self._signals = 0
        #: Counts of what happened, by event name.
        self.counts: dict[str, int] = {}

    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def step(self) -> int:
        """Sweep if something is due at the clock's instant; the instant to step again."""
        now = self.clock.now()
        if now < self._due_at:
            return self._due_at
        scope = {"tenant": self.tenant, "application": self.application}
        # Each sweep's changes are counted and logged as soon as it returns: a later call
        # that fails does not undo them, and the next try does not find them again.
        try:
            for name, sweep in (
                ("recovered", self.authority.recover_expired),
                ("timed_out", self.authority.enforce_deadlines),
            ):
                for key in sweep(now, **scope):
                    self._count(name)
                    event(name, workload=key)
            nxt = self._next_instant(now)
        except (WorkloadError, StoreError) as exc:
            delay = self._backoff.next_delay()
            code = exc.code if isinstance(exc, WorkloadError) else type(exc).__name__
            self._count("store_error")
            event("store_error", call="sweep", code=code, retry_in_ms=delay)
            self._due_at = now + delay
            return self._due_at
        self._backoff.reset()
        self._swept = True
        self._count("sweeps")
        self._next = nxt
        latest = now + self.poll_ms
        self._due_at = latest if nxt is None else min(nxt, latest)
        return self._due_at

    def _next_instant(self, now: int) -> int | None:
        store = self.authority.store if isinstance(self.authority, Authority) else None
        if not isinstance(store, DueInstants):
            return None
        found = store.next_instants(now, self.tenant, self.application)
        pending = [i for i in (found.lease_expires_at, found.deadline_at) if i is not None]
        return min(pending) if pending else None

    @property
    def idle(self) -> bool:
        """True once a sweep succeeded and nothing falls due within `idle_horizon_ms` of it."""
        if not self._swept:
            return False
        return self._next is None or self._next > self.clock.now() + self.idle_horizon_ms

    def stop(self) -> None:
        """Stop after the sweep under way (from any thread)."""
        if not self._stopping:
            self._stopping = True
            event("stopping", sweeper=True)
        self._wake.set()

    def run(self, *, handle_signals: bool = True) -> None:
        """Sweep until `stop()` (or, on the main thread, SIGTERM or SIGINT; a second one exits)."""
        self._loop(until_idle=False, handle_signals=handle_signals)

    def run_until_idle(self, *, handle_signals: bool = True) -> None:
        """Sweep until nothing falls due within `idle_horizon_ms` (signals as `run`)."""
        self._loop(until_idle=True, handle_signals=handle_signals)

    def _loop(self, *, until_idle: bool, handle_signals: bool) -> None:
        restore = _install_signals(self) if handle_signals else None
        event("started", sweeper=True, tenant=self.tenant, application=self.application)
        try:
            while not self._stopping:
                self._wake.clear()
                due = self.step()
                if until_idle and self.idle:
                    break
                timeout = min((due - self.clock.now()) / 1000, MAX_WAIT_S)
                if timeout > 0:
                    self._wake.wait(timeout)
        finally:
            if restore is not None:
                restore()
            event("stopped", sweeper=True)


def _install_signals(sweeper: Sweeper) -> Callable[[], None] | None:
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(number: int, frame: FrameType | None) -> None:
        sweeper._signals += 1
        if sweeper._signals > 1:
            os._exit(128 + number)
        from_handler(sweeper.stop)

    for sig in previous:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
