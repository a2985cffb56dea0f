"""`workwarden audit`: a store's audit records, in commit order.

`audit [--store URL] [--workload ID] [--after SEQ] [--limit N] [--json]`
prints the audit records of every committed write (admissions, claims,
reports, operator calls, pauses, resumes, purges, imports) with a sequence
number above `--after` (0: from the first), at most `--limit` of them,
oldest first; `--workload` keeps those of one workload (or pause scope key).
Each row: the sequence, the instant, the key and the version written, the
operation, the actor, and the worker, fencing token and request id when the
write had them. `--json` prints one JSON object a line, every field of the
record. The store is opened read-only and never created.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from workwarden.cli import STORE_HELP, at_least, between, instant, opened_store, print_table, shown
from workwarden.statemachine import inputs
from workwarden.storage.base import AuditRecord, KeyedAudit, Store

__all__ = ["register"]

#: How many records one read of the store asks for.
_PAGE = 1_000


def register(subparsers: Any) -> None:
    """Add the `audit` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "audit",
        help="the store's audit records: who wrote what, when, in commit order",
        description=(
            "Print a store's audit records in commit order: every admission, claim, report, "
            "operator call, pause, resume, purge and import, with its actor and instant."
        ),
    )
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument(
        "--workload", metavar="ID", help="only the records of this workload (or pause scope key)"
    )
    parser.add_argument(
        "--after",
        # A sequence number is stored as a signed 64-bit integer.
        type=between(0, 2**63 - 1),
        default=0,
        metavar="SEQ",
        help="only records with a sequence number above SEQ",
    )
    parser.add_argument(
        "--limit", type=at_least(1), metavar="N", help="at most N records (default: every one)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.set_defaults(handler=_run)


def _records(store: Store, after: int, workload: str | None) -> Iterator[AuditRecord]:
    if workload is not None and isinstance(store, KeyedAudit):
        # The store picks the workload's records; the log is not read here.
        yield from (record for record in store.audit_of(workload) if record.sequence > after)
        return
    while True:
        page = store.audit_log(after=after, limit=_PAGE)
        for record in page:
            if workload is None or record.key == workload:
                yield record
        if len(page) < _PAGE:
            return
        after = page[-1].sequence


def _chosen(store: Store, args: argparse.Namespace, workload: str | None) -> Iterator[AuditRecord]:
    """The records asked for, read a page at a time."""
    for count, record in enumerate(_records(store, args.after, workload), start=1):
        yield record
        if args.limit is not None and count == args.limit:
            return


def _run(args: argparse.Namespace) -> int:
    workload = None if args.workload is None else inputs.as_name(args.workload, "--workload")
    with opened_store(args.store, "read") as store:
        if args.json:
            # Each record printed as it is read: a whole store's log (the archive
            # `docs/operations.md` asks to keep) is never held in memory.
            for record in _chosen(store, args, workload):
                print(json.dumps(asdict(record), sort_keys=True, ensure_ascii=False))
            return 0
        chosen = list(_chosen(store, args, workload))
    if not chosen:
        print(shown("no audit records" + (f" of {workload}" if workload is not None else "")))
        return 0
    rows = [
        (
            str(r.sequence),
            instant(r.at),
            r.key,
            str(r.version),
            r.operation,
            r.actor,
            r.worker or "-",
            "-" if r.fencing_token is None else str(r.fencing_token),
            r.request_id or "-",
        )
        for r in chosen
    ]
    headers = ("SEQ", "AT", "KEY", "VERSION", "OPERATION", "ACTOR", "WORKER", "TOKEN", "REQUEST")
    print_table(headers, rows, title="audit records, oldest first")
    return 0
