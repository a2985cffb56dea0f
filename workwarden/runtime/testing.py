"""Executors for driving a worker step by step in tests, without threads.

`ManualExecutor` holds every handler call it is given until the test runs
it (`run(index)` or `run_all()`), so a test decides when each handler
ends, relative to a `ManualClock`: heartbeats, lost leases and
cancellations then happen at exact simulated instants.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["InlineExecutor", "ManualExecutor"]

_T = TypeVar("_T")


def _settle(future: Future[Any], fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 -- handed to the future's reader
        future.set_exception(exc)
    else:
        future.set_result(result)


class ManualExecutor(Executor):
    """Keeps submitted calls pending until the test runs them, in the thread that asks."""

    def __init__(self) -> None:
        self.pending: list[tuple[Future[Any], Callable[..., Any], Any, Any]] = []

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        """Hold `fn(*args, **kwargs)`; its future settles when the test runs it."""
        future: Future[_T] = Future()
        self.pending.append((future, fn, args, kwargs))
        return future

    def run(self, index: int = 0) -> None:
        """Run the pending call at `index` (oldest first) now."""
        future, fn, args, kwargs = self.pending.pop(index)
        _settle(future, fn, args, kwargs)

    def run_all(self) -> None:
        """Run every pending call, oldest first."""
        while self.pending:
            self.run(0)


class InlineExecutor(Executor):
    """Runs each submitted call at once, in the submitting thread."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        """Run `fn(*args, **kwargs)` now; its settled future."""
        future: Future[_T] = Future()
        _settle(future, fn, args, kwargs)
        return future
