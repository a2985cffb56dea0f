"""What the runtime's constructors accept: each argument checked when the object is built.

A bad argument of `App`, `Worker`, `Sweeper`, `Retry` or `Fail` is
`WORKLOAD_INVALID` naming it (`errors.bad_argument`), raised before the
object exists, so that nothing is accepted that would fail every claim or
report later. Whole numbers are ints (a bool is not one), names are the
project's `Name` (1 to 256 printable characters).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from workwarden.statemachine import errors, inputs
from workwarden.statemachine.models import MAX_INSTANT

__all__ = ["MAX_LEASE_MS", "calls", "flag", "name", "names", "seconds", "whole"]


#: The longest lease a worker asks for, a year: far below the latest instant the core takes
#: (2**53 - 1 ms since the epoch), so that every claim's lease ends within it, and below the
#: longest wait a thread can make (`threading.TIMEOUT_MAX`).
MAX_LEASE_MS = 365 * 24 * 3_600_000


def whole(value: Any, field: str, low: int, high: int = MAX_INSTANT) -> int:
    """`value` as a whole number from `low` to `high`, or `WORKLOAD_INVALID` naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise errors.bad_argument(field, f"{field} must be a whole number from {low} to {high}")
    return value


def seconds(value: Any, field: str) -> float:
    """`value` as a finite number of seconds, 0 or more."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise errors.bad_argument(field, f"{field} must be a finite number of seconds, 0 or more")
    return float(value)


def flag(value: Any, field: str) -> bool:
    """`value` as a bool (True or False, nothing merely truthy)."""
    if not isinstance(value, bool):
        raise errors.bad_argument(field, f"{field} must be True or False")
    return value


def name(value: Any, field: str) -> str:
    """`value` as a name (1 to 256 printable characters).

    Refused as an `InvalidArgument` (also a `ValueError`), as every other
    bad argument here is.
    """
    try:
        return inputs.as_name(value, field)
    except errors.WorkloadError as exc:
        raise errors.InvalidArgument(exc.code, exc.message, exc.details) from None


def names(value: Any, field: str) -> tuple[str, ...]:
    """A collection of names, in order; a bare string is refused, not split into characters."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise errors.bad_argument(
            field, f"{field} must be a collection of names, such as a tuple of strings"
        )
    return tuple(name(item, f"{field}[{index}]") for index, item in enumerate(value))


def calls(value: Any, field: str, methods: Iterable[str], what: str) -> None:
    """Refuse `value` unless each of `methods` is a callable of it (`what` says what is wanted)."""
    missing = [method for method in methods if not callable(getattr(value, method, None))]
    if missing:
        raise errors.bad_argument(field, f"{field} must be {what} (it has no {', '.join(missing)})")
