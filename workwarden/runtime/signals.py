"""Acting on a signal without taking a lock in its handler.

Python runs a signal handler on the main thread, between two of its
bytecodes: perhaps while that thread holds the very lock the handler would
take. `threading.Event.set`, a `Condition`'s notify and a logging call each
take one, and the main thread of a worker, a sweeper or a scheduler spends
its life waiting on such an event, so a handler that stopped the loop
directly could wait forever for a lock its own thread holds (seen: the
harness adapter, stopped by SIGTERM while it waited on its stop event,
hung). `from_handler` hands the action to a thread of its own, which takes
the lock once the main thread lets it go, a moment later.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["from_handler"]


def from_handler(action: Callable[[], object]) -> None:
    """Run `action` (a stop, an event's `set`) on a new daemon thread, from a signal handler."""
    threading.Thread(target=action, name="on-signal", daemon=True).start()
