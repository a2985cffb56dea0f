"""What an authority remembers of its own latest writes, to decide the next call on them.

An authority built with `remember=N` (`DEFAULT_REMEMBER` unless told
otherwise) keeps, for each of its N latest writes, the document it wrote
and, when nothing a caller received shares a part of it, the decoded
workload too. It decides the next one-call command on such a key on what it
kept, without reading first; the compare-and-swap of the write confirms the
version (see `workwarden.statemachine.authority`).

This module owns what is kept and for how long, and when a decoded workload
may be kept. It relies on what every store promises: a key's version is
never reused for another document (versions only grow), so the document
kept under a version is the document committed under it, whoever wrote
since. A store emptied and filled again under a running authority breaks
that promise (a re-admitted workload starts again at version 1).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from workwarden.statemachine.models import Attempt, Claim, ClaimReply, Workload
from workwarden.storage.base import StoredDocument

__all__ = ["DEFAULT_REMEMBER", "Remembered", "detached"]

DEFAULT_REMEMBER = 256
"""How many of its latest writes an `Authority` keeps unless told otherwise."""


def detached(reply: Any, workload: Workload) -> bool:
    """Is `reply` a claim or attempt of its own, sharing nothing with `workload`?

    Only then may the authority keep `workload` decoded to decide the next
    call on: every field of a claim or an attempt is immutable (text,
    numbers, tuples), so a copy of one shares nothing a caller could change;
    a claim's reply adds the input and checkpoints, copied for it.
    """
    if type(reply) is Claim:
        return reply is not workload.current_claim
    if type(reply) is ClaimReply:
        # Its input and checkpoints are deep copies made for the reply.
        return reply is not workload.current_claim
    if type(reply) is Attempt:
        return all(reply is not attempt for attempt in workload.attempts)
    return False


class Remembered:
    """The latest writes of one authority, at most `size` of them, the oldest dropped first.

    Per key: the document as written (key, version, text, index fields) and,
    or else None, the workload decoded, kept only when `wrote` is told that
    nothing the caller received shares a part of it. Safe to share between
    threads. It relies on a key's version never being reused for another
    document: a kept version is decided on as the committed one, and the
    compare-and-swap of the next write only confirms the version number.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        """How many writes are kept at most."""
        self._known: OrderedDict[str, tuple[StoredDocument, Workload | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[StoredDocument, Workload | None] | None:
        """The last write kept of `key` and its decoded workload (or None), or None."""
        with self._lock:
            return self._known.get(key)

    def wrote(self, doc: StoredDocument, workload: Workload, reply: Any, private: bool) -> None:
        """Keep `doc`, just committed, as the latest write of its key, dropping the oldest.

        `workload` (what `doc` encodes) is kept decoded too only when the
        decision was `private` (no caller saw it, only its `reply`) and
        `reply` shares nothing with it.
        """
        keep = private and detached(reply, workload)
        self._keep(doc, workload if keep else None)

    def forget(self, key: str) -> None:
        """Drop what is kept of `key`: its committed version is no longer known."""
        with self._lock:
            self._known.pop(key, None)

    def _keep(self, doc: StoredDocument, decoded: Workload | None) -> None:
        with self._lock:
            known = self._known
            known[doc.key] = (doc, decoded)
            known.move_to_end(doc.key)
            while len(known) > self.size:
                known.popitem(last=False)
