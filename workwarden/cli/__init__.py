"""The `workwarden` command line, and what its commands share.

Each group of subcommands lives in its own module (`workwarden/cli/*.py`) and registers
itself through a `register(subparsers)` function listed in `_MODULES`. A
command returns its exit status. Whatever the input, `main` prints no
traceback: an error is one line `CODE: message` on standard error (then its
`details` as indented JSON, when it has any), with a code from the catalogue
(`specs/workload.toml`, `[errors]`), and the exit status says what kind of
error it was (`docs/cli.md`):

- 0: done; 1: refused (a `WorkloadError`), or a check found problems;
- 2: the command line is malformed (`WORKWARDEN_USAGE`);
- 70: an unexpected error (`WORKWARDEN_INTERNAL`, a bug: please report it);
- 130: interrupted.

The helpers below give every command the same behaviour at the edges:
`opened_store` (the store of `--store` or `WORKWARDEN_STORE`, for reading,
writing or creating), `read_input` and `write_output` (files, with coded
errors and no partial output), `print_table` (a table on a terminal, plain
aligned columns elsewhere), `instant` (milliseconds as ISO-8601 UTC beside
the raw number), the option types `at_least(n)`, `between(least, most)`,
`positive_int`, `instant_ms`, `port_number`, `seconds(zero=, at_most=)` and
`positive_seconds`, and `stopped_by_sigterm()` (SIGTERM ends a command as
Ctrl-C does: through its clean-up).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import errno
import importlib
import io
import json
import math
import os
import re
import secrets
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TextIO

from workwarden import __version__
from workwarden.cli.logs import library_logs_one_line
from workwarden.statemachine.errors import STORAGE_FAILURE, WorkloadError
from workwarden.statemachine.models import MAX_INSTANT
from workwarden.storage.base import Store, StoreError
from workwarden.storage.urls import (
    STORE_NOT_FOUND,
    STORE_UNUSABLE,
    STORE_URL_INVALID,
    STORE_VARIABLE,
    Mode,
    open_store,
)

__all__ = [
    "COMMAND_LINE_CODES",
    "EXIT_INTERNAL",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "INPUT_UNREADABLE",
    "INTERNAL",
    "OUTPUT_UNWRITABLE",
    "STORE_HELP",
    "USAGE",
    "Parser",
    "at_least",
    "between",
    "build_parser",
    "check_not_the_store",
    "check_output",
    "input_lines",
    "instant",
    "instant_ms",
    "main",
    "opened_store",
    "output_directory",
    "output_file",
    "plain_table",
    "port_number",
    "positive_int",
    "positive_seconds",
    "print_table",
    "read_input",
    "seconds",
    "shown",
    "stopped_by_sigterm",
    "write_output",
]

USAGE = "WORKWARDEN_USAGE"
INPUT_UNREADABLE = "WORKWARDEN_INPUT_UNREADABLE"
OUTPUT_UNWRITABLE = "WORKWARDEN_OUTPUT_UNWRITABLE"
INTERNAL = "WORKWARDEN_INTERNAL"

#: The catalogue codes only the command line and `open_store` print (not the core).
COMMAND_LINE_CODES = frozenset(
    {
        USAGE,
        INPUT_UNREADABLE,
        OUTPUT_UNWRITABLE,
        INTERNAL,
        STORE_URL_INVALID,
        STORE_NOT_FOUND,
        STORE_UNUSABLE,
        "CONFORMANCE_PROGRAM_UNUSABLE",
        "DIAGRAM_INPUT_INVALID",
        "DIAGRAM_WRITE_FAILED",
        "GRAPHVIZ_NOT_FOUND",
        "GRAPHVIZ_FAILED",
        # `workwarden serve`'s refusals of a call's token (`workwarden.service.auth`).
        "WORKWARDEN_UNAUTHENTICATED",
        "WORKWARDEN_FORBIDDEN",
    }
)

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70

#: The help of every `--store` option.
STORE_HELP = (
    "the store: memory:, sqlite:///path, a file path, or postgresql://..."
    f" (default: ${STORE_VARIABLE})"
)

#: Modules that add subcommands, in the order they appear in `--help`.
_MODULES = (
    "workwarden.cli.check",
    "workwarden.cli.demo",
    "workwarden.cli.spec",
    "workwarden.cli.diagram",
    "workwarden.cli.store",
    "workwarden.cli.inspect",
    "workwarden.cli.stats",
    "workwarden.cli.audit",
    "workwarden.cli.reference",
    "workwarden.cli.chaos",
    "workwarden.cli.serve",
    "workwarden.cli.worker",
    "workwarden.cli.scheduler",
    "workwarden.cli.pauses",
    "workwarden.cli.retention",
)


# -- the parser ------------------------------------------------------------------------


class _Usage(Exception):
    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog
        self.message = message


class _Help(argparse.HelpFormatter):
    """Adds `(default: X)` to an option's help when it has a default and does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" not in text
            and action.option_strings
            and default not in (None, False, argparse.SUPPRESS)
            and action.nargs != 0
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are coded (`WORKWARDEN_USAGE`, exit status 2)
    and whose help shows each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise _Usage(self.prog, message)

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse drops a failed write of `--help` or `--version`; written here, a full
        # disk is `WORKWARDEN_OUTPUT_UNWRITABLE` and a reader gone away ends quietly.
        if message:
            (file or sys.stderr).write(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = Parser(
        prog="workwarden",
        description="A formally-checked state machine toolkit for durable work.",
    )
    parser.add_argument("--version", action="version", version=f"workwarden {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _MODULES:
        importlib.import_module(name).register(subparsers)
    _name_commands(parser)
    return parser


def _name_commands(parser: argparse.ArgumentParser) -> None:
    """Give each command's arguments its parser's name (`workwarden spec show`), so an
    argument it does not take is refused in its name, pointing to its own `--help`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(command_prog=sub.prog)
                _name_commands(sub)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but an argument no command takes is refused in the name of
    the command it was given to (`workwarden purge: unrecognized arguments: ...`)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        prog = getattr(args, "command_prog", parser.prog)
        raise _Usage(prog, f"unrecognized arguments: {' '.join(extra)}")
    return args


def at_least(minimum: int) -> Callable[[str], int]:
    """An option type: a whole number of at least `minimum` (else a usage error)."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not at least {minimum}")
        return value

    return whole


def between(least: int, most: int) -> Callable[[str], int]:
    """An option type: a whole number from `least` to `most` (else a usage error)."""
    whole = at_least(least)

    def bounded(text: str) -> int:
        value = whole(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{value} is more than {most:,}")
        return value

    return bounded


def positive_int(text: str) -> int:
    """An option type: a whole number of at least 1 (else a usage error)."""
    return at_least(1)(text)


def instant_ms(text: str) -> int:
    """An option type: an instant in ms since the epoch, 0 to 2**53 - 1 (else a usage error)."""
    value = at_least(0)(text)
    if value > MAX_INSTANT:
        raise argparse.ArgumentTypeError(f"{value} is past the latest instant, {MAX_INSTANT}")
    return value


def port_number(text: str) -> int:
    """An option type: a TCP port, a whole number from 1 to 65535 (else a usage error)."""
    value = positive_int(text)
    if value > 65_535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1 to 65535)")
    return value


def seconds(*, zero: bool = False, at_most: float = math.inf) -> Callable[[str], float]:
    """An option type: a finite number of seconds above 0 (0 or more with `zero`), at most
    `at_most` (else a usage error)."""
    wanted = "a finite number of seconds, 0 or more" if zero else "a positive number of seconds"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not (value >= 0 if zero else value > 0) or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not {wanted}")
        if value > at_most:
            raise argparse.ArgumentTypeError(f"{text} is more than {at_most:g} seconds")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An option type: a positive, finite number of seconds (else a usage error)."""
    return seconds()(text)


# -- signals ---------------------------------------------------------------------------


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM ends the command as Ctrl-C does, through its clean-up
    (`finally` blocks, context managers), with status 143."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread handles signals
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- errors ----------------------------------------------------------------------------


def _print_error(code: str, message: str, details: Any = None) -> None:
    # One line, whatever a library put in the message (libpq's hints come on lines of
    # their own, indented with a tab), and any other control character (one in an
    # argument the message repeats) written as its escape, never sent to the terminal.
    lines = re.split(r"[\r\n]+", message)
    message = _shown(" ".join(line.strip() for line in lines if line.strip()))
    print(f"{code}: {message}", file=sys.stderr)
    if details:
        print(json.dumps(details, indent=2, sort_keys=True, default=str), file=sys.stderr)


def _not_utf8(argv: Sequence[str]) -> int | None:
    for number, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return number
    return None


class _StdoutClosed(OSError):
    """A write to a standard output the command was started without (`>&-`)."""


class _ClosedStdout(io.TextIOBase):
    """What `sys.stdout` is when the process has none (Python makes it None): a write is
    `WORKWARDEN_OUTPUT_UNWRITABLE`, and a command that writes nothing there runs as ever."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise _StdoutClosed(errno.EBADF, "standard output is closed")


def _closed_streams() -> None:
    """Give a process started without standard output or error a stand-in for each: a
    refusal is not printed on standard output in place of a closed standard error."""
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - standard error, for good


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    _closed_streams()
    try:
        bad = _not_utf8(args_list)
        if bad is not None:
            raise _Usage("workwarden", f"argument {bad} is not UTF-8 text")
        try:
            args = _parse(build_parser(), args_list)
            library_logs_one_line()
            status: int = args.handler(args)
        finally:
            # What is still buffered is written now, where a full disk can be reported.
            sys.stdout.flush()
    except _Usage as exc:
        command = exc.prog
        _print_error(USAGE, f"{command}: {exc.message} (see {command} --help)")
        return EXIT_USAGE
    except WorkloadError as exc:
        _print_error(exc.code, exc.message, exc.details)
        return EXIT_USAGE if exc.code == USAGE else EXIT_REFUSED
    except SystemExit as exc:
        # --help and --version end here, as does a command that exits itself.
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_REFUSED)
    except KeyboardInterrupt:
        return 130
    except _StdoutClosed as exc:
        _print_error(OUTPUT_UNWRITABLE, f"cannot write the output: {exc.strerror}")
        return EXIT_REFUSED
    except BrokenPipeError:
        # The reader went away (`workwarden export ... | head`): nothing more to say.
        _stdout_to_devnull()
        return EXIT_REFUSED
    except OSError as exc:
        if exc.errno not in _OUTPUT_FULL:
            return _unexpected(exc)
        # Standard output (or a file) has no room left: the output is lost, not a bug.
        _stdout_to_devnull()
        _print_error(OUTPUT_UNWRITABLE, f"cannot write the output: {exc.strerror or exc}")
        return EXIT_REFUSED
    except Exception as exc:  # noqa: BLE001 - the last resort: one coded line, no traceback
        return _unexpected(exc)
    return status


#: The errors of a write that has no room (a full disk or quota, a file too large) or
#: whose device failed.
_OUTPUT_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _stdout_to_devnull() -> None:
    """Send what is left of standard output nowhere, so the exit's own flush cannot fail."""
    with contextlib.suppress(OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the failed stream


def _unexpected(exc: Exception) -> int:
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None)
    if isinstance(code, str) and code in COMMAND_LINE_CODES and isinstance(message, str):
        # A coded error of a part that has its own class (`DiagramError`).
        _print_error(code, message)
        return EXIT_REFUSED
    if isinstance(exc, UnicodeDecodeError):
        _print_error(INPUT_UNREADABLE, f"an input is not UTF-8 text ({exc.reason})")
        return EXIT_REFUSED
    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    _print_error(
        INTERNAL,
        f"unexpected {type(exc).__name__}{where}: {exc}; this is a bug in workwarden,"
        " please report it with the command line that led to it",
    )
    return EXIT_INTERNAL


# -- stores ----------------------------------------------------------------------------


@contextlib.contextmanager
def opened_store(url: str | None, mode: Mode) -> Iterator[Store]:
    """The store `url` names (None: `WORKWARDEN_STORE`) for `mode`, closed afterwards.

    A store error while it is used becomes `WORKLOAD_STORAGE_FAILURE`.
    """
    store = open_store(url, mode=mode)
    try:
        yield store
    except StoreError as exc:
        raise WorkloadError(STORAGE_FAILURE, f"the store failed: {exc}") from None
    finally:
        with contextlib.suppress(StoreError):
            store.close()


# -- files -----------------------------------------------------------------------------


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    return exc.strerror or str(exc)


def read_input(path: str, what: str = "input") -> str:
    """The UTF-8 text of file `path` (`-`: standard input).

    `WORKWARDEN_INPUT_UNREADABLE` (naming `what` and the path) when it is
    missing, a directory, unreadable or not UTF-8.
    """
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(
            INPUT_UNREADABLE,
            f"{what} {path} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})",
            {"path": path},
        ) from None


class InputLines:
    """The lines of a UTF-8 file, read as they are iterated, without their newlines.

    Only a newline ends a line: U+2028, U+0085 and the like may stand
    unescaped in a JSON string, and a CR before the newline stays on the
    line. Iterating again reads the file again. A byte that is not UTF-8 is
    `WORKWARDEN_INPUT_UNREADABLE`, naming its offset in the file, as
    `read_input` names it.
    """

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what

    def __iter__(self) -> Iterator[str]:
        try:
            stream = open(self.path, "rb")  # noqa: SIM115 - closed by the generator
        except OSError as exc:
            raise _unreadable(self.path, self.what, exc) from None
        return _decoded(stream, self.path, self.what)


def _unreadable(path: str, what: str, exc: OSError) -> WorkloadError:
    if isinstance(exc, IsADirectoryError):
        return WorkloadError(
            INPUT_UNREADABLE, f"{what} {path} is a directory, not a file", {"path": path}
        )
    return WorkloadError(
        INPUT_UNREADABLE, f"cannot read {what} {path}: {_reason(exc)}", {"path": path}
    )


def _decoded(stream: Any, path: str, what: str) -> Iterator[str]:
    """Each line of binary `stream` as text (closing it at the end, unless it is stdin's)."""
    offset = 0
    try:
        for raw in stream:
            line = raw[:-1] if raw.endswith(b"\n") else raw
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise WorkloadError(
                    INPUT_UNREADABLE,
                    f"{what} {path} is not UTF-8 text (byte {offset + exc.start} is"
                    f" {line[exc.start]:#04x})",
                    {"path": path},
                ) from None
            offset += len(raw)
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def input_lines(path: str, what: str = "input") -> Iterable[str]:
    """The lines of UTF-8 file `path` (`-`: standard input), read as they are needed.

    A regular file is an `InputLines`, read again each time it is iterated;
    standard input, a pipe or a device is read once (an iterator). A missing
    file or a directory is `WORKWARDEN_INPUT_UNREADABLE` here, before any line
    is read.
    """
    if path == "-":
        return _decoded(sys.stdin.buffer, "-", what)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise _unreadable(path, what, exc) from None
    if stat.S_ISDIR(mode):
        raise _unreadable(path, what, IsADirectoryError(errno.EISDIR, "a directory"))
    if stat.S_ISREG(mode):
        try:
            open(path, "rb").close()  # refused now if it cannot be read
        except OSError as exc:
            raise _unreadable(path, what, exc) from None
        return InputLines(path, what)
    return iter(InputLines(path, what))


def _unwritable(path: str, what: str, reason: str) -> WorkloadError:
    return WorkloadError(OUTPUT_UNWRITABLE, f"cannot write {what} {path}: {reason}", {"path": path})


_KINDS = (
    (stat.S_ISDIR, "it is a directory"),
    (stat.S_ISFIFO, "it is a FIFO, not a regular file"),
    (stat.S_ISCHR, "it is a device, not a regular file"),
    (stat.S_ISBLK, "it is a device, not a regular file"),
    (stat.S_ISSOCK, "it is a socket, not a regular file"),
)


def _output_target(path: str, what: str) -> tuple[Path, os.stat_result | None]:
    """The file `path` names once its symlinks are followed, and its status (None: absent).

    `WORKWARDEN_OUTPUT_UNWRITABLE` unless that is a regular file or nothing
    yet in a directory that exists: a FIFO, a device, a socket or a
    directory is never written, nor replaced.
    """
    target = Path(os.path.realpath(path))
    try:
        status = target.stat()
    except FileNotFoundError:
        status = None
    except OSError as exc:
        raise _unwritable(path, what, _reason(exc)) from None
    if status is not None and not stat.S_ISREG(status.st_mode):
        reason = next((text for kind, text in _KINDS if kind(status.st_mode)), "not a file")
        raise _unwritable(path, what, reason)
    if not target.parent.is_dir():
        raise _unwritable(path, what, "its directory does not exist or is not a directory")
    return target, status


def check_not_the_store(store: Store, path: str, what: str = "output") -> None:
    """Refuse (`WORKWARDEN_OUTPUT_UNWRITABLE`) an output `path` that is the SQLite file of
    `store` (or one of its side files), which writing would replace or corrupt."""
    own = getattr(store, "path", None)
    if not isinstance(own, str):
        return
    for name in (own, own + "-wal", own + "-shm", own + "-journal"):
        with contextlib.suppress(OSError):
            if os.path.samefile(path, name):
                raise _unwritable(path, what, f"it is the store's own file {name}")


def check_output(path: str, what: str = "output") -> None:
    """Refuse, before any work and without creating anything, an output `output_file` refuses.

    `WORKWARDEN_OUTPUT_UNWRITABLE` when `path` is not a regular file (after
    its symlinks), or its directory is missing or not writable.
    """
    target, _ = _output_target(path, what)
    if not os.access(target.parent, os.W_OK):
        raise _unwritable(path, what, "permission denied")


def _scratch(target: Path) -> tuple[int, Path]:
    """A new file beside `target`, created as `open` creates files (mode 0666 less the umask)."""
    while True:
        scratch = target.parent / f".{target.name}.{secrets.token_hex(4)}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
            return os.open(scratch, flags, 0o666), scratch
        except FileExistsError:
            continue


@contextlib.contextmanager
def output_file(path: str, what: str = "output") -> Iterator[TextIO]:
    """A text file to write `path` through: a new file beside it, moved over it when done.

    A symlink is followed: the file it points to is replaced, the link kept.
    A file replaced keeps its mode (and, written by root, its owner); a new
    one gets the mode `open` gives (0666 less the umask).
    `WORKWARDEN_OUTPUT_UNWRITABLE` when it cannot be written, or when `path`
    is a FIFO, a device, a socket or a directory (nothing is written to it).
    If the block raises, or the file cannot be written, nothing is left
    under its name or beside it (an earlier file of that name is untouched).
    """
    target, status = _output_target(path, what)
    try:
        handle, scratch = _scratch(target)
    except OSError as exc:
        raise _unwritable(path, what, _reason(exc)) from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            if status is not None:
                if os.geteuid() == 0:
                    os.fchown(out.fileno(), status.st_uid, status.st_gid)
                os.fchmod(out.fileno(), stat.S_IMODE(status.st_mode))
            yield out
        os.replace(scratch, target)
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        raise _unwritable(path, what, _reason(exc)) from None
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def write_output(path: str, text: str, what: str = "output") -> None:
    """Write `text` to file `path` whole (see `output_file`)."""
    with output_file(path, what) as out:
        out.write(text)


def output_directory(path: str, what: str = "output directory") -> Path:
    """Directory `path`, created with its parents when absent.

    `WORKWARDEN_OUTPUT_UNWRITABLE` when it cannot be created or is not a
    directory.
    """
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WorkloadError(
            OUTPUT_UNWRITABLE, f"{what} {path} is a file, not a directory", {"path": path}
        ) from None
    except OSError as exc:
        raise WorkloadError(
            OUTPUT_UNWRITABLE, f"cannot create {what} {path}: {_reason(exc)}", {"path": path}
        ) from None
    if not os.access(directory, os.W_OK):
        raise WorkloadError(
            OUTPUT_UNWRITABLE, f"cannot write into {what} {path}: permission denied", {"path": path}
        )
    return directory


# -- output ----------------------------------------------------------------------------


def instant(ms: int | None) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC beside the raw number; `-` for None."""
    if ms is None:
        return "-"
    try:
        at = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    except (OverflowError, ValueError, OSError):
        return str(ms)
    return f"{at.strftime('%Y-%m-%dT%H:%M:%S')}.{ms % 1000:03d}Z ({ms})"


#: What a table cell never holds as it is: control characters (C0, DEL, C1) and the
#: Unicode line and paragraph separators.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def shown(text: str) -> str:
    """`text` on one line, each control character written as its escape (`\\n`, `\\x1b`):
    what a command prints of an argument or a stored text, never sent to the terminal."""
    return _UNPRINTABLE.sub(lambda found: repr(found.group())[1:-1], text)


_shown = shown


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    indent: str = "",
) -> None:
    """Print a table: drawn by `rich` on a terminal it fits, plain aligned columns otherwise.

    Plain output (in pipes, files and CI logs) is stable for scripts: the
    title line, then the header and one line a row, columns separated by two
    spaces and the last column unpadded. Either way a cell is shown as text:
    a control character (a line break, an escape sequence) as its escape
    (`\\n`, `\\x1b`), and square brackets as they are, never as rich markup.
    """
    if sys.stdout.isatty():
        from rich import box
        from rich.console import Console
        from rich.measure import Measurement
        from rich.table import Table
        from rich.text import Text

        console = Console(highlight=False)
        table = Table(
            title=None if title is None else Text(_shown(title)),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            highlight=False,
        )
        for header in headers:
            table.add_column(Text(_shown(header)), no_wrap=True)
        for row in rows:
            table.add_row(*(Text(_shown(cell)) for cell in row))
        # A table wider than the terminal would fold its ids and instants:
        # plain lines, which the terminal wraps whole, read better then.
        wide = console.options.update(max_width=1_000_000)
        if Measurement.get(console, wide, table).maximum <= console.width:
            console.print(table)
            return
    if title is not None:
        print(_shown(title))
    for line in plain_table([headers, *rows], indent=indent):
        print(line)


def plain_table(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Rows as lines of left-aligned columns; the last column is not padded.

    A control character in a cell is written as its escape, so a row is one line.
    """
    if not rows:
        return []
    rows = [[_shown(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        (
            indent + "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        ).rstrip()
        for row in rows
    ]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
