"""The `workwarden` command's entry point, and `python -m workwarden`'s.

Loading the command line (every subcommand and the library under it) takes most
of a second. A SIGINT or SIGTERM that comes meanwhile ends the command before
anything ran: quietly, never with a traceback, with status 0 for `worker` and
`sweeper` (as for a signal while they start: `docs/worker.md`) and 130 (SIGINT)
or 143 (SIGTERM) for any other command.
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

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        from workwarden.cli import main as command_line
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        return _stopped_while_loading(caught[0], sys.argv[1:])
    return command_line()


def _stopped_while_loading(signum: int, argv: list[str]) -> int:
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    return 0 if command in _STARTING_QUIETLY else 128 + signum
