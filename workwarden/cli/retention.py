"""`workwarden purge`: delete finished work older than the spec's retention age, audited.

`purge --store URL [--older-than DURATION] [--tenant T] [--application A]
[--export FILE] [--dry-run] [--actor NAME] [--spec FILE]` deletes the
terminal workloads whose last change is older than `--older-than` (default:
the spec's `[retention] after_ms`), except those in a `[retention] keep`
state (dead letters, by default), each with an audit record. With
`--export FILE` each purged workload is appended to FILE as a JSON Lines
export line (as `workwarden export` writes them), written and flushed before
that workload is deleted; a write that fails stops the purge there
(`WORKWARDEN_OUTPUT_UNWRITABLE`), with the workloads already written purged
and the rest kept. FILE is refused before anything is purged when it is not
a regular file (a FIFO, a device, a directory) or cannot be written, and it
is created only when a first workload is exported: a refused purge, or one
that purges nothing, leaves no file. A line FILE holds already is not appended
again (a purge stopped between exporting a workload and deleting it, run
again), and a last line cut short is ended before the next is written.
`--dry-run` lists what would go and writes nothing (not even an empty
`--export` file).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import sys
import time
from typing import Any, TextIO

from workwarden.cli import STORE_HELP, check_not_the_store, check_output, instant_ms, opened_store
from workwarden.migrate import export_line
from workwarden.statemachine import Authority, GrantVerifier, errors, load_spec
from workwarden.statemachine.models import MAX_INSTANT
from workwarden.storage.base import StoredDocument

__all__ = ["parse_duration", "register"]

_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _unwritable(path: str, exc: OSError, more: str = "") -> errors.WorkloadError:
    return errors.WorkloadError(
        "WORKWARDEN_OUTPUT_UNWRITABLE",
        f"--export {path}: cannot write the file: {exc.strerror or exc}{more}",
        {"field": "--export"},
    )


def _digest(line: str) -> bytes:
    return hashlib.sha256(line.strip().encode("utf-8", "surrogateescape")).digest()


def _exported_lines(path: str) -> tuple[set[bytes], bool]:
    """The digests of the lines file `path` holds (none when it does not exist yet), and
    whether its last line is unfinished (no newline: a write cut short)."""
    digests: set[bytes] = set()
    last = "\n"
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as existing:
            for last in existing:
                digests.add(_digest(last))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _unwritable(path, exc) from None
    return digests, not last.endswith("\n")


def parse_duration(text: str) -> int:
    """`30d`, `12h`, `90m`, `45s`, `500ms` or a number of milliseconds, as milliseconds.

    ASCII digits only, and at most `MAX_INSTANT` ms (about 285,000 years).
    """
    match = re.fullmatch(r"\s*([0-9]{1,20})\s*(ms|s|m|h|d)?\s*", text, re.ASCII)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (write 30d, 12h, 90m, 45s, 500ms or milliseconds)"
        )
    value = int(match.group(1)) * _UNITS[match.group(2) or "ms"]
    if value > MAX_INSTANT:
        raise argparse.ArgumentTypeError(
            f"{text.strip()} is longer than any age a workload can have ({MAX_INSTANT:,} ms)"
        )
    return value


def _run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec) if args.spec is not None else None
    now = args.now if args.now is not None else time.time_ns() // 1_000_000
    out: TextIO | None = None
    exported: list[str] = []
    # A dry run writes nothing, not even an empty --export file.
    exporting = args.export is not None and not args.dry_run
    if exporting:
        # Refused before the store is opened: a FIFO, a device or a directory, a
        # missing or read-only directory, a read-only file.
        check_output(args.export, "--export")
        if os.path.exists(args.export) and not os.access(args.export, os.W_OK):
            raise _unwritable(args.export, PermissionError(13, "Permission denied"))
    # The lines the file holds already: a workload exported by a purge stopped before it
    # was deleted (a signal, a crash, a store failure) is not written a second time.
    present, unfinished = _exported_lines(args.export) if exporting else (set(), False)
    try:

        def export(doc: StoredDocument) -> None:
            nonlocal out
            line = export_line(doc)
            if _digest(line) in present:
                exported.append(doc.key)
                return
            try:
                if out is None:
                    # Opened at the first workload to export: a purge refused, or one
                    # that purges nothing, leaves no file behind.
                    out = open(args.export, "a", encoding="ascii")  # noqa: SIM115  # closed below
                    if unfinished:
                        # A line cut short stays a line of its own, not glued to this one.
                        out.write("\n")
                out.write(line + "\n")
                out.flush()
            except OSError as exc:
                raise _unwritable(
                    args.export,
                    exc,
                    f"; the purge stopped there: the {len(exported)} workload(s) written"
                    " before were purged, this one and the rest are kept",
                ) from None
            exported.append(doc.key)

        # A dry run only reads: opened read-only, as `stats` opens it, it needs no
        # more than read access and never brings an older store's tables up to date.
        with opened_store(args.store, "read" if args.dry_run else "write") as store:
            if exporting:
                check_not_the_store(store, args.export, "--export")
            warden = Authority(store, grants=GrantVerifier.without_signatures(), spec=spec)
            report = warden.purge(
                now,
                older_than_ms=args.older_than,
                tenant=args.tenant,
                application=args.application,
                actor=args.actor,
                export=export if exporting else None,
                dry_run=args.dry_run,
            )
    finally:
        if out is not None:
            # Every line was flushed as it was written: a failure to close
            # follows one already reported, and has nothing left to lose.
            with contextlib.suppress(OSError):
                out.close()
    verb = "would purge" if args.dry_run else "purged"
    for key in report.purged if args.dry_run else ():
        print(key)
    print(
        f"{verb} {len(report.purged)} workload(s); kept {report.kept} in a keep state, "
        f"{report.young} younger than the retention age, {report.changed} changed meanwhile",
        file=sys.stderr,
    )
    return 0


def register(subparsers: Any) -> None:
    """Add the `purge` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "purge",
        help="delete finished work older than the retention age, audited",
        description=(
            "Delete terminal workloads whose last change is older than the retention age "
            "(the spec's [retention] after_ms, or --older-than), but those in a [retention] "
            "keep state (dead letters by default), each with an audit record."
        ),
    )
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="DURATION",
        help="purge what finished at least this long ago: 30d, 12h, 90m, 45s, 500ms "
        "(default: the spec's [retention] after_ms)",
    )
    parser.add_argument("--tenant", metavar="T", help="only this tenant (default: every one)")
    parser.add_argument(
        "--application", metavar="A", help="only this application (default: every one)"
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        help="append each workload to FILE (JSON Lines, as `export`) before it goes",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be purged; write nothing"
    )
    parser.add_argument(
        "--actor", metavar="NAME", help="the operator recorded (default: system.retention)"
    )
    parser.add_argument("--spec", metavar="FILE", help="a spec file (the shipped spec by default)")
    parser.add_argument(
        "--now",
        type=instant_ms,
        metavar="MS",
        help="the instant, in ms since the epoch (default: the clock)",
    )
    parser.set_defaults(handler=_run)
