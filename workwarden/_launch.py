"""The `workwarden` command's entry point, and `python -m workwarden`'s.

Loading the command line (every subcommand and the library under it) takes most
of a second. A SIGINT or SIGTERM that comes meanwhile ends the command before
anything ran: quietly, never with a traceback, with status 0 for `worker` and
`sweeper` (as for a signal while they start: `docs/worker.md`) and 130 (SIGINT)
or 143 (SIGTERM) for any other command. For `worker` and `sweeper` the same
holds until the command puts in handlers of its own: building the parser loads
the subcommands' modules, nearly as long again.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

__all__ = ["main"]

#: The commands a signal while starting stops with status 0.
_STARTING_QUIETLY = frozenset({"worker", "sweeper"})


def main() -> int:
    """Run the command line, with SIGINT and SIGTERM noted while it loads."""
    caught: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    quietly = _command(sys.argv[1:]) in _STARTING_QUIETLY
    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        from workwarden.cli import main as command_line
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, _stop_starting if quietly else handler)
    try:
        if caught:
            return 0 if quietly else 128 + caught[0]
        return command_line()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _command(argv: list[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _stop_starting(signum: int, frame: FrameType | None) -> None:
    # A worker or sweeper not yet holding anything: its handlers, once in, replace this
    # one; until then a signal ends it as one while loading does. The command line
    # answers SystemExit with its code.
    raise SystemExit(0)
