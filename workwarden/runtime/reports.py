"""The worker's fenced reports, sent one call each or many in one `report_many`.

A report is a mapping with its `op` (`start`, `heartbeat`, `checkpoint`,
`complete`, `fail`, `confirm_cancel`) and the one-call method's fields. Its
answer is what that method answers (the reply, or the `WorkloadError` or
`StoreError` it raises), whichever way it is sent, so the worker follows an
answer the same way in both modes:

- `send_one` makes the one-call method's call (`Authority.start`, ...);
- `ReportBuffer` gathers the reports of many attempts and sends them in one
  `report_many` (`workwarden.statemachine.batches`), each slot its own
  answer. A report waits at most `window_ms` for others to join it, a full
  buffer (`max_size`) is sent at once, and so is one the worker cannot add
  to (every attempt it holds is waiting on an answer) or has stopped adding
  to (stopping).

Checkpoints are made by handlers on their own threads: while the worker's
loop runs, `ReportBuffer.checkpoint` hands one to the loop, which sends it
with the next batch, and waits for its answer; when the loop is not
running (a test stepping the worker by hand) or has ended, the handler's
thread makes the one call itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.models import ClaimReply
from workwarden.storage.base import StoreError

if TYPE_CHECKING:
    from workwarden.service.client import HttpAuthority
    from workwarden.statemachine.authority import Authority

__all__ = [
    "DEFAULT_BATCH_MAX",
    "DEFAULT_WINDOW_MS",
    "BatchCalls",
    "ReportBuffer",
    "send_one",
]

DEFAULT_WINDOW_MS = 2
"""How long a report waits for others to join its batch, in ms (see `docs/worker.md`)."""

DEFAULT_BATCH_MAX = 100
"""The most reports one `report_many` of the worker carries."""

Report = dict[str, Any]
"""One report: the one-call method's fields and its `op`."""


@runtime_checkable
class BatchCalls(Protocol):
    """An authority with batch calls: `claim_many` and `report_many` (`Authority` has them)."""

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
    ) -> list[ClaimReply]:
        """Claim up to `limit` workloads at once."""
        ...

    def report_many(self, reports: Iterable[Any], now: int) -> list[Any]:
        """Decide and commit many reports; each slot its own answer."""
        ...


def send_one(authority: Authority | HttpAuthority, report: Mapping[str, Any], now: int) -> Any:
    """Make `report`'s one-call method's call; its reply (raises what that method raises)."""
    op, wid, fence = report["op"], report["workload_id"], report["fence"]
    if op == "start":
        return authority.start(wid, fence, now)
    if op == "heartbeat":
        return authority.heartbeat(wid, fence, now, report["extend_ms"])
    if op == "checkpoint":
        return authority.checkpoint(wid, fence, report["state"], now, sequence=report["sequence"])
    if op == "complete":
        return authority.complete(wid, fence, report["result_id"], report["output"], now)
    if op == "fail":
        return authority.fail(
            wid, fence, report["kind"], report["error"], now, effect=report["effect"]
        )
    if op == "confirm_cancel":
        return authority.confirm_cancel(wid, fence, now)
    raise ValueError(f"not a report: {op}")


def state_of(reply: Any) -> str:
    """The state a `fail` or `confirm_cancel` answered: a `StateReply`'s, or the one call's text."""
    return reply if isinstance(reply, str) else str(reply.state)


@dataclass
class _Waiter:
    """A handler's checkpoint handed to the loop, and its answer once it came."""

    report: Report
    done: threading.Event = field(default_factory=threading.Event)
    answer: Any = None
    sent: bool = False


@dataclass
class _Entry:
    owner: Any  # the worker's held attempt, or a `_Waiter`
    report: Report


class ReportBuffer:
    """Reports waiting to go in one `report_many`; owned by the worker's loop thread.

    `checkpoint` alone may be called from any thread.
    """

    def __init__(
        self, calls: BatchCalls, *, window_ms: int, max_size: int, wake: Callable[[], None]
    ) -> None:
        self.calls = calls
        self.window_ms = window_ms
        self.max_size = max_size
        self._wake = wake
        self._entries: list[_Entry] = []
        self._opened_at: int | None = None
        self._lock = threading.Lock()
        self._inbox: list[_Waiter] = []
        self._loop: int | None = None
        #: How many `report_many` calls were made, and how many reports they carried.
        self.flushes = 0
        self.sent = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, owner: Any, report: Report, now: int) -> None:
        """Buffer `report`; `owner` receives its answer from `flush`."""
        if not self._entries:
            self._opened_at = now
        self._entries.append(_Entry(owner, report))

    def waiting(self) -> set[str]:
        """The workloads with a report in the buffer."""
        return {entry.report["workload_id"] for entry in self._entries}

    def due(self) -> int | None:
        """The instant the buffer is due to be sent, or None when it is empty."""
        if self._opened_at is None or not self._entries:
            return None
        return self._opened_at + self.window_ms

    def is_due(self, now: int, *, at_once: bool) -> bool:
        """Should it be sent at `now`: full, its window over, or `at_once` (nothing can join)."""
        due = self.due()
        if due is None:
            return False
        return at_once or len(self._entries) >= self.max_size or now >= due

    def flush(self, now: int) -> list[tuple[Any, Any]]:
        """Send every buffered report; each owner with its answer, in the order added.

        Checkpoint waiters are answered here (their threads go on); the
        worker's own entries are returned. A failure of the batch call itself
        is every report's answer.
        """
        entries, self._entries, self._opened_at = self._entries, [], None
        answered: list[tuple[Any, Any]] = []
        for start in range(0, len(entries), self.max_size):
            chunk = entries[start : start + self.max_size]
            answers: Sequence[Any]
            try:
                answers = self.calls.report_many([entry.report for entry in chunk], now)
            except (WorkloadError, StoreError) as exc:
                answers = [exc] * len(chunk)
            self.flushes += 1
            self.sent += len(chunk)
            for entry, answer in zip(chunk, answers, strict=True):
                if isinstance(entry.owner, _Waiter):
                    entry.owner.answer = answer
                    entry.owner.sent = True
                    entry.owner.done.set()
                else:
                    answered.append((entry.owner, answer))
        return answered

    # -- checkpoints, from the handlers' threads -------------------------------------

    def open(self) -> None:
        """The loop runs on this thread from now on: checkpoints of other threads come to it."""
        with self._lock:
            self._loop = threading.get_ident()

    def close(self) -> None:
        """The loop has ended: every checkpoint still waiting is made by its own thread."""
        with self._lock:
            self._loop = None
            waiters, self._inbox = self._inbox, []
        for waiter in waiters:
            waiter.done.set()
        for entry in self._entries:
            if isinstance(entry.owner, _Waiter):
                entry.owner.done.set()
        self._entries = [e for e in self._entries if not isinstance(e.owner, _Waiter)]

    def take_checkpoints(self, now: int) -> None:
        """Buffer the checkpoints handed over since the last call (the loop's thread)."""
        with self._lock:
            waiters, self._inbox = self._inbox, []
        for waiter in waiters:
            self.add(waiter, waiter.report, now)

    def checkpoint(self, report: Report, direct: Callable[[], Any]) -> Any:
        """`report`'s answer: sent with the loop's next batch, or by `direct()` on this thread.

        Returns the reply, or the error the call raised (not raised here).
        """
        with self._lock:
            hand_over = self._loop is not None and self._loop != threading.get_ident()
            if hand_over:
                waiter = _Waiter(report)
                self._inbox.append(waiter)
        if hand_over:
            self._wake()
            waiter.done.wait()
            if waiter.sent:
                return waiter.answer
        try:
            return direct()
        except (WorkloadError, StoreError) as exc:
            return exc
