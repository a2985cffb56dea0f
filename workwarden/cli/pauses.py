"""`workwarden pause`, `resume` and `pauses`: stop and restart claiming for a scope.

`pause --store URL --tenant T [--application A [--definition D]]
[--concurrency-key K] --actor NAME [--reason TEXT]` pauses claiming for the
tenant (every application), one application, or one definition of it, or
only the work of one concurrency key there; in-flight work is not affected and
deadlines keep running. `resume` with the same scope restarts it. Each is
written with an audit record; pausing a paused scope or resuming one that is
not writes nothing and says so. `pauses [--tenant T] [--json]` lists the
pauses in force (the store opened read-only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from workwarden.cli import STORE_HELP, instant, instant_ms, opened_store, print_table
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine.pauses import pause_reply
from workwarden.storage.base import PauseRecord, PauseScope

__all__ = ["register"]


def _now(args: argparse.Namespace) -> int:
    return args.now if args.now is not None else time.time_ns() // 1_000_000


def _authority(store: Any) -> Authority:
    # Pauses admit nothing: no grant signature is checked.
    return Authority(store, grants=GrantVerifier.without_signatures())


def _pause(args: argparse.Namespace) -> int:
    with opened_store(args.store, "write") as store:
        warden = _authority(store)
        now = _now(args)
        # What was in force before says whether this call wrote (a repeat at the same
        # instant by the same operator returns the same record, and writes nothing).
        before = {p.scope.key for p in warden.pauses(args.tenant)} if args.tenant else set()
        record = warden.pause(
            args.actor,
            now,
            tenant=args.tenant,
            application=args.application,
            definition=args.definition,
            concurrency_key=args.concurrency_key,
            reason=args.reason,
            request_id=args.request_id,
        )
    if record.scope.key not in before:
        print(f"paused {record.scope.key} since {instant(record.since)}")
    else:
        print(
            f"already paused {record.scope.key} since {instant(record.since)}"
            f" by {record.actor}; nothing written"
        )
    return 0


def _resume(args: argparse.Namespace) -> int:
    with opened_store(args.store, "write") as store:
        warden = _authority(store)
        resumed = warden.resume(
            args.actor,
            _now(args),
            tenant=args.tenant,
            application=args.application,
            definition=args.definition,
            concurrency_key=args.concurrency_key,
            request_id=args.request_id,
        )
    key = PauseScope(args.tenant, args.application, args.definition, args.concurrency_key).key
    print(f"resumed {key}" if resumed else f"{key} was not paused; nothing written")
    return 0


def _as_dict(record: PauseRecord) -> dict[str, Any]:
    """A pause as the API's `GET /v1/pauses` lists it (`PauseReply`), request id included."""
    return pause_reply(record).model_dump(mode="json")


def _list(args: argparse.Namespace) -> int:
    with opened_store(args.store, "read") as store:
        records = _authority(store).pauses(args.tenant)
    if args.json:
        json.dump([_as_dict(r) for r in records], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not records:
        print("no pauses in force")
        return 0
    print_table(
        ["scope", "since", "by", "reason"],
        [[r.scope.key, instant(r.since), r.actor, r.reason or "-"] for r in records],
        title=f"{len(records)} pause(s) in force",
    )
    return 0


def _scope_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument("--tenant", required=True, metavar="T", help="the tenant")
    parser.add_argument(
        "--application", metavar="A", help="one application of it (default: every one)"
    )
    parser.add_argument(
        "--definition",
        metavar="D",
        help="one definition of the application (default: every one)",
    )
    parser.add_argument(
        "--concurrency-key",
        metavar="K",
        help="only the work of this concurrency key in the scope (default: every key)",
    )
    parser.add_argument("--actor", required=True, metavar="NAME", help="the operator")
    parser.add_argument(
        "--request-id",
        metavar="ID",
        help="the operator's request id, recorded with the audit record (default: none)",
    )
    parser.add_argument(
        "--now",
        type=instant_ms,
        metavar="MS",
        help="the instant, in ms since the epoch (default: the clock)",
    )


def register(subparsers: Any) -> None:
    """Add the `pause`, `resume` and `pauses` commands."""
    pause: argparse.ArgumentParser = subparsers.add_parser(
        "pause",
        help="pause claiming for a tenant, an application, a definition or a concurrency key",
        description=(
            "Stop every claim of the scope's work until it is resumed; in-flight work runs "
            "on and deadlines keep running. Written with an audit record."
        ),
    )
    _scope_options(pause)
    pause.add_argument("--reason", metavar="TEXT", help="why (recorded; default: none)")
    pause.set_defaults(handler=_pause)
    resume: argparse.ArgumentParser = subparsers.add_parser(
        "resume",
        help="resume claiming for a paused scope",
        description="Lift the pause of a scope; written with an audit record.",
    )
    _scope_options(resume)
    resume.set_defaults(handler=_resume)
    listing: argparse.ArgumentParser = subparsers.add_parser(
        "pauses",
        help="the pauses in force",
        description="List the pauses in force, of one tenant or of all.",
    )
    listing.add_argument("--store", metavar="URL", help=STORE_HELP)
    listing.add_argument("--tenant", metavar="T", help="only this tenant (default: every one)")
    listing.add_argument("--json", action="store_true", help="print the pauses as JSON")
    listing.set_defaults(handler=_list)
