"""`workwarden export` and `workwarden import`: move workloads between stores.

- `export --store URL [--out FILE]` writes every workload as JSON Lines,
  sorted by key, to FILE (replaced only once the export is complete) or to
  standard output. The same store always exports the same bytes.
- `import --store URL [--spec FILE] FILE` loads an export (`-` reads standard
  input). Workloads already present and identical are skipped; one present
  with different contents is `WORKLOAD_MIGRATION_CONFLICT` and then nothing
  is imported.

A store URL is what `workwarden.storage.open_store` reads: `memory:`,
`sqlite:///path`, a file path, or `postgresql://...`. The format and the
rules are those of `workwarden.migrate`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workwarden.migrate import export_workloads, import_workloads
from workwarden.statemachine import errors
from workwarden.statemachine.spec import load_spec
from workwarden.storage import Store, StoreError, open_store

__all__ = ["register"]

_URL_HELP = "the store: memory:, sqlite:///path, a file path, or postgresql://..."


def register(subparsers: Any) -> None:
    """Add the `export` and `import` commands."""
    export: argparse.ArgumentParser = subparsers.add_parser(
        "export",
        help="write every workload of a store as JSON Lines",
        description="Write every workload of a store as JSON Lines, sorted by key.",
    )
    export.add_argument("--store", required=True, metavar="URL", help=_URL_HELP)
    export.add_argument("--out", metavar="FILE", help="write to FILE, not standard output")
    export.set_defaults(handler=_export)

    load: argparse.ArgumentParser = subparsers.add_parser(
        "import",
        help="load an export into a store",
        description=(
            "Load an export into a store. Workloads already present and identical are "
            "skipped; if one is present with different contents, nothing is imported."
        ),
    )
    load.add_argument("--store", required=True, metavar="URL", help=_URL_HELP)
    load.add_argument(
        "--spec", metavar="FILE", help="the spec to index workloads by (the shipped one by default)"
    )
    load.add_argument("file", metavar="FILE", help="an export (JSON Lines); - for standard input")
    load.set_defaults(handler=_import)


@contextmanager
def _opened(url: str) -> Iterator[Store]:
    try:
        store = open_store(url)
    except StoreError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot open the store: {exc}"
        ) from None
    try:
        yield store
    finally:
        store.close()


def _usage_error(args: argparse.Namespace, message: str) -> int:
    print(f"workwarden {args.command}: error: {message}", file=sys.stderr)
    return 2


def _guarded(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except ValueError as exc:
        return _usage_error(args, str(exc))
    except OSError as exc:
        return _usage_error(args, f"{exc.filename or ''}: {exc.strerror or exc}")


def _export(args: argparse.Namespace) -> int:
    return _guarded(_run_export, args)


def _run_export(args: argparse.Namespace) -> int:
    with _opened(args.store) as store:
        if args.out is None:
            export_workloads(store, sys.stdout)
            sys.stdout.flush()
            return 0
        target = Path(args.out)
        # Written beside the target and moved over it whole, so a failed
        # export never leaves a truncated file under the target's name.
        handle, scratch = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
        try:
            with os.fdopen(handle, "w", encoding="ascii", newline="\n") as out:
                count = export_workloads(store, out)
            os.replace(scratch, target)
        except BaseException:
            Path(scratch).unlink(missing_ok=True)
            raise
    print(f"exported {count} workload(s) to {target}", file=sys.stderr)
    return 0


def _import(args: argparse.Namespace) -> int:
    return _guarded(_run_import, args)


def _run_import(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec) if args.spec is not None else None
    if args.file == "-":
        lines = sys.stdin.read().splitlines()
    else:
        lines = Path(args.file).read_text(encoding="utf-8").splitlines()
    now = time.time_ns() // 1_000_000
    with _opened(args.store) as store:
        report = import_workloads(store, lines, now=now, spec=spec)
    print(
        f"imported {len(report.imported)} workload(s),"
        f" skipped {len(report.skipped)} already present"
    )
    return 0
