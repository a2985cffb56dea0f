"""Progress of a long command: a live bar on a terminal, periodic plain lines elsewhere.

    with Progress("importing", total=len(lines), unit="workloads") as progress:
        for line in lines:
            ...
            progress.advance()

On a terminal (the stream is a TTY) the progress is a `rich` bar that
redraws in place. Anywhere else (a pipe, a file, a CI log) it is one plain
line every `every_s` seconds, and a last one when the work ends, so a long
run is never silent and a log is never flooded:

    importing: 12,000 of 50,000 workloads (24%), 10 s, 1,200/s

Progress goes to standard error by default, so it never mixes with output a
program reads. A `Progress` that is given nothing to count prints nothing.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    """Counts work done and shows it (see the module docstring).

    `label` names the work, `total` is how much there is (None when not
    known), `unit` what is counted (empty: nothing is counted, the lines say
    only how long the work has run, and the note). `every_s` is the interval between plain
    lines. `update(done)` sets the count, `advance(n)` adds to it; `note`
    adds a short text (a phase, a depth) to the line.
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "items",
        stream: TextIO | None = None,
        every_s: float = 10.0,
        live: bool | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.done = 0
        self.note = ""
        self._started = time.monotonic()
        self._last_line = self._started
        self._printed: str | None = None
        self._closed = False
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty()) if callable(isatty) else False
        self._bar: Any = None
        self._task: Any = None
        if live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                TextColumn("{task.fields[note]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, note="")

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """Add `n` to the count done."""
        self.update(self.done + n, note)

    def update(self, done: int, note: str | None = None, total: int | None = None) -> None:
        """Set the count done (and the note, and the total when it becomes known)."""
        self.done = done
        if note is not None:
            self.note = note
        if total is not None:
            self.total = total
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=self.total, note=self.note)
            return
        now = time.monotonic()
        if now - self._last_line >= self.every_s:
            self._last_line = now
            self._line(now)

    def line(self) -> str:
        """The plain line for the progress so far (with no `unit`, only the time and note)."""
        elapsed = time.monotonic() - self._started
        parts = []
        if self.unit:
            of = f" of {self.total:,}" if self.total is not None else ""
            # No share of an unknown or zero total.
            share = f" ({100 * self.done // self.total}%)" if self.total else ""
            parts.append(f"{self.done:,}{of} {self.unit}{share}")
        parts.append(f"{elapsed:.0f} s")
        if self.unit and elapsed >= 1 and self.done:
            parts.append(f"{self.done / elapsed:,.0f}/s")
        if self.note:
            parts.append(self.note)
        return f"{self.label}: " + ", ".join(parts)

    def _line(self, now: float) -> None:
        self._printed = f"{self.done}/{self.total}/{self.note}"
        print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        """End the display: stop the bar, or print the last plain line (if any was printed
        or the work took longer than one interval)."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.stop()
            return
        if self._printed is not None and self._printed != f"{self.done}/{self.total}/{self.note}":
            self._line(time.monotonic())
