"""`workwarden export` and `workwarden import`: move workloads between stores.

- `export [--store URL] [--out FILE]` writes every workload as JSON Lines,
  sorted by key, to FILE (replaced only once the export is complete) or to
  standard output. The same store always exports the same bytes. The store
  is opened read-only and never created.
- `import [--store URL] [--create] [--spec FILE] FILE` loads an export (`-`
  reads standard input). Workloads already present and identical, at the
  same version, are skipped; one present with different contents or at
  another version is `WORKLOAD_MIGRATION_CONFLICT` and then nothing is
  imported. The store must exist unless `--create` is given; a store this
  command created (a SQLite file, or the tables of a PostgreSQL database while
  nothing but the import wrote to them) is removed again when the import is
  refused or stopped (SIGINT, SIGTERM), so a refused import leaves nothing
  behind. An import
  into an existing store that is stopped part way is finished by running it
  again (`workwarden.migrate`).

A store URL is what `workwarden.storage.open_store` reads: `memory:`,
`sqlite:///path`, a file path, or `postgresql://...`; without `--store`, the
`WORKWARDEN_STORE` environment variable. The format and the rules are those
of `workwarden.migrate`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from workwarden.cli import (
    STORE_HELP,
    check_not_the_store,
    input_lines,
    opened_store,
    output_file,
    stopped_by_sigterm,
)
from workwarden.cli.progress import Progress
from workwarden.migrate import export_lines, import_workloads
from workwarden.statemachine.errors import STORAGE_FAILURE, WorkloadError
from workwarden.statemachine.spec import load_spec
from workwarden.storage import SQLiteStore, Store, StoreError
from workwarden.storage.urls import STORE_NOT_FOUND, open_store

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the `export` and `import` commands."""
    export: argparse.ArgumentParser = subparsers.add_parser(
        "export",
        help="write every workload of a store as JSON Lines",
        description="Write every workload of a store as JSON Lines, sorted by key.",
    )
    export.add_argument("--store", metavar="URL", help=STORE_HELP)
    export.add_argument("--out", metavar="FILE", help="write to FILE, not standard output")
    export.set_defaults(handler=_export)

    load: argparse.ArgumentParser = subparsers.add_parser(
        "import",
        help="load an export into a store",
        description=(
            "Load an export into a store. Workloads already present and identical (at the "
            "same version) are skipped; if one is present with different contents or at "
            "another version, nothing is imported. "
            "The store must exist unless --create is given."
        ),
    )
    load.add_argument("--store", metavar="URL", help=STORE_HELP)
    load.add_argument(
        "--create",
        action="store_true",
        help=(
            "create the store if it does not exist (removed again if the import is refused"
            " or stopped)"
        ),
    )
    load.add_argument(
        "--spec", metavar="FILE", help="the spec to index workloads by (the shipped one by default)"
    )
    load.add_argument("file", metavar="FILE", help="an export (JSON Lines); - for standard input")
    load.set_defaults(handler=_import)


def _write_export(store: Store, out: TextIO) -> int:
    count = 0
    with Progress("exporting", unit="workloads") as progress:
        for line in export_lines(store):
            out.write(line + "\n")
            count += 1
            progress.advance()
    return count


def _export(args: argparse.Namespace) -> int:
    # SIGTERM ends the export as Ctrl-C does (status 143): through the clean-up of
    # `output_file`, so no scratch file is left beside the target.
    with stopped_by_sigterm(), opened_store(args.store, "read") as store:
        if args.out is None:
            _write_export(store, sys.stdout)
            sys.stdout.flush()
            return 0
        # Written beside the target and moved over it whole, so a failed
        # export never leaves a truncated file under the target's name.
        check_not_the_store(store, args.out, "the export")
        with output_file(args.out, "the export") as out:
            count = _write_export(store, out)
    print(f"exported {count} workload(s) to {args.out}", file=sys.stderr)
    return 0


class _Counted:
    """`lines`, counting each line read on `progress`; read again as `lines` is."""

    def __init__(self, lines: Iterable[str], progress: Progress) -> None:
        self.lines = lines
        self.progress = progress

    def __iter__(self) -> Iterator[str]:
        for line in self.lines:
            yield line
            self.progress.advance()


def _counted(lines: Iterable[str], progress: Progress) -> Iterable[str]:
    """`lines` counted: one pass for one pass (an iterator), again and again otherwise."""
    counted = _Counted(lines, progress)
    return iter(counted) if isinstance(lines, Iterator) else counted


def _open_for_import(url: str | None, create: bool) -> tuple[Store, bool]:
    """The store to import into, and whether this call created it."""
    try:
        return open_store(url, mode="write"), False
    except WorkloadError as exc:
        if exc.code != STORE_NOT_FOUND or not create:
            raise
    return open_store(url, mode="create"), True


def _remove_store_file(path: str) -> None:
    for name in (path, path + "-wal", path + "-shm", path + "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _close_and_remove(store: Store) -> None:
    """Close the store this import created, and remove it: its file, or its tables.

    The tables of a PostgreSQL store go only while nothing but this import
    wrote to them (`drop_schema_written_only_by`): another writer's store is kept.
    """
    # Loaded only when a PostgreSQL store was opened (it needs the postgres extra).
    postgres = sys.modules.get("workwarden.storage.postgres")
    if postgres is not None and isinstance(store, postgres.PostgresStore):
        from workwarden.storage.pg_schema import drop_schema_written_only_by

        with contextlib.suppress(StoreError), store.connection() as conn:
            drop_schema_written_only_by(conn, "import")
    with contextlib.suppress(StoreError):
        store.close()
    if isinstance(store, SQLiteStore):
        _remove_store_file(store.path)


def _import(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec) if args.spec is not None else None
    # Read as the import goes, twice (every line is checked, then written): a file
    # from the disk both times, standard input or a pipe through a temporary copy.
    lines = input_lines(args.file, "the export")
    now = time.time_ns() // 1_000_000
    # SIGTERM ends the import as Ctrl-C does: through the clean-up below (status 143).
    with stopped_by_sigterm():
        store, created = _open_for_import(args.store, args.create)
        try:
            try:
                # Each line is counted as it is checked, then as it is written.
                with Progress(
                    "importing (each line checked, then written)", unit="lines"
                ) as progress:
                    report = import_workloads(store, _counted(lines, progress), now=now, spec=spec)
            except StoreError as exc:
                raise WorkloadError(STORAGE_FAILURE, f"the store failed: {exc}") from None
        except BaseException:
            if created:
                _close_and_remove(store)
            else:
                with contextlib.suppress(StoreError):
                    store.close()
            raise
    with contextlib.suppress(StoreError):
        store.close()
    print(
        f"imported {len(report.imported)} workload(s),"
        f" skipped {len(report.skipped)} already present"
    )
    return 0
