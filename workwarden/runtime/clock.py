"""The runtime's clock, its backoff, and its log lines.

Instants are the wall clock in integer milliseconds. The worker and the
sweeper read the time only through a `Clock`, so a test drives them on a
simulated one (`ManualClock`) and calls their `step()` itself, without
threads or sleeps.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Protocol

from workwarden.statemachine import errors

__all__ = ["MAX_WAIT_S", "Backoff", "Clock", "ManualClock", "WallClock", "event", "logger"]

#: The longest a worker's or sweeper's loop sleeps at once (s): it looks again after this
#: long even when nothing is due sooner (a lease of years), as no thread can wait past
#: `threading.TIMEOUT_MAX`.
MAX_WAIT_S = 3_600.0

#: The logger every runtime log line goes to.
logger = logging.getLogger("workwarden.runtime")


class Clock(Protocol):
    """Where the runtime reads the time."""

    def now(self) -> int:
        """The current instant, in milliseconds."""
        ...


class WallClock:
    """The wall clock, in integer milliseconds since the epoch."""

    def now(self) -> int:
        """The current instant, in milliseconds."""
        return time.time_ns() // 1_000_000


@dataclass
class ManualClock:
    """A clock that moves only when told: for driving a worker or a sweeper step by step."""

    instant: int = 0

    def now(self) -> int:
        """The current instant."""
        return self.instant

    def advance(self, ms: int) -> int:
        """Move the clock `ms` forward; returns the new instant."""
        if ms < 0:
            raise errors.bad_argument("now", "a clock does not go back")
        self.instant += ms
        return self.instant


@dataclass
class Backoff:
    """Exponential backoff with full jitter, for calls the store could not answer.

    The n-th consecutive failure waits a random time up to
    `min(cap_ms, base_ms * 2**(n-1))`, and at least `base_ms / 2`.
    """

    base_ms: int = 100
    cap_ms: int = 5_000
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay(self) -> int:
        """Count one more failure; the delay before the next try, in milliseconds."""
        self.failures += 1
        ceiling = min(self.cap_ms, self.base_ms * 2 ** min(self.failures - 1, 30))
        return max(self.base_ms // 2, int(self.rng.uniform(0, ceiling)))

    def reset(self) -> None:
        """A call succeeded: the next failure starts from `base_ms` again."""
        self.failures = 0


def _char(c: str) -> str:
    """One character of a quoted value: `\\`, `"` and every unprintable one escaped."""
    if c in '\\"':
        return "\\" + c
    if c.isprintable():
        return c
    return c.encode("unicode_escape").decode("ascii")  # \n, \t, \x1b, \u2028, ...


def _value(value: object) -> str:
    """A field's value: as is, or quoted when it holds a space, `"`, `=` or any unprintable
    character, which is escaped, so that every event stays one line."""
    text = str(value)
    if text == "" or any(c.isspace() or c in '"=' or not c.isprintable() for c in text):
        return '"' + "".join(map(_char, text)) + '"'
    return text


def event(name: str, /, **fields: object) -> None:
    """Log one event at INFO as `name key=value ...` (values with spaces or quotes quoted).

    A field whose value is None is left out.
    """
    if logger.isEnabledFor(logging.INFO):
        parts = [name] + [f"{k}={_value(v)}" for k, v in fields.items() if v is not None]
        logger.info(" ".join(parts))
