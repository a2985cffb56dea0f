"""The command line's handling of libraries' log records: one line each on standard error.

psycopg's connection pool logs its reconnections over several lines, with
tracebacks; every command writes them as `library_log` lines instead, in the
runtime's `name key=value` form, so standard error stays one event a line.
"""

from __future__ import annotations

import json
import logging
import sys

__all__ = ["LibraryLines", "library_logs_one_line"]


class LibraryLines(logging.Formatter):
    """A library's log record as one `library_log` line, in the runtime's `name key=value` form.

    The PostgreSQL pool logs its reconnections over several lines, with
    tracebacks: here each is one line (`logger=psycopg.pool level=WARNING
    message="..."`), so the process's standard error stays one event a line.
    """

    def format(self, record: logging.LogRecord) -> str:
        message = " | ".join(record.getMessage().split("\n"))
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message += f" ({type(exc).__name__}: {' '.join(str(exc).split())})"
        return " ".join(
            (
                "library_log",
                f"logger={record.name}",
                f"level={record.levelname}",
                f"message={json.dumps(message, ensure_ascii=False)}",
            )
        )


def library_logs_one_line() -> None:
    """Write psycopg's (and its pool's) warnings to standard error as `library_log` lines.

    Every command does this first: without a handler, Python would print a
    pool's reconnection warnings with their tracebacks, over many lines,
    before the command's own coded line.
    """
    library = logging.StreamHandler(sys.stderr)
    library.setFormatter(LibraryLines())
    pool = logging.getLogger("psycopg")
    pool.handlers[:] = [library]
    pool.setLevel(logging.WARNING)
    pool.propagate = False
