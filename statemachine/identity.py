"""A small memo of values worked out for objects, found by the object's identity.

For immutable objects a caller hands in again and again (a signed grant, a
spec's `[secrets]` table): what was worked out for one is kept with the object
itself, so an id reused by another object after the first was freed is never
taken for it. The latest `size` are kept, the oldest dropped first. Safe to
share between threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["ByIdentity"]

_K = TypeVar("_K")
_V = TypeVar("_V")


class ByIdentity(Generic[_K, _V]):
    """Values kept for objects by their identity; at most `size` of them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[int, tuple[_K, _V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, obj: _K) -> _V | None:
        """The value kept for this very object, or None."""
        with self._lock:
            kept = self._kept.get(id(obj))
        return kept[1] if kept is not None and kept[0] is obj else None

    def put(self, obj: _K, value: _V) -> None:
        """Keep `value` for `obj`, dropping the oldest beyond `size`."""
        with self._lock:
            self._kept[id(obj)] = (obj, value)
            self._kept.move_to_end(id(obj))
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
