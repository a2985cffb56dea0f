"""`workwarden stats`: how many workloads a store holds in each state, and how long work waits.

`stats [--store URL] [--tenant T] [--application A] [--json] [--now MS]`
counts the workloads of every tenant and application (or of the one scope
asked for) by state, and names the READY workload that has waited longest:
its age is `now` minus the instant of its last change, the one that made it
READY. The store is opened read-only and never created.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workwarden.cli import STORE_HELP, instant, instant_ms, opened_store, print_table, shown
from workwarden.statemachine import inputs
from workwarden.statemachine.spec import default_spec
from workwarden.storage import StoredDocument

__all__ = ["ScopeStats", "collect", "duration", "register"]


@dataclass
class ScopeStats:
    """The counts of one tenant and application, and its longest-waiting READY workload."""

    tenant: str
    application: str
    by_state: Counter[str] = field(default_factory=Counter)
    oldest_ready: tuple[int, str] | None = None  # (since, workload id)

    @property
    def total(self) -> int:
        """Every workload of the scope."""
        return sum(self.by_state.values())

    def to_dict(self, now: int) -> dict[str, Any]:
        """JSON-ready: tenant, application, total, by_state, oldest_ready (or null)."""
        oldest = None
        if self.oldest_ready is not None:
            since, workload_id = self.oldest_ready
            oldest = {"workload_id": workload_id, "since": since, "age_ms": now - since}
        return {
            "tenant": self.tenant,
            "application": self.application,
            "total": self.total,
            "by_state": dict(sorted(self.by_state.items())),
            "oldest_ready": oldest,
        }


def _updated_at(doc: StoredDocument) -> int:
    try:
        value = json.loads(doc.document).get("updated_at")
    except (ValueError, AttributeError):
        value = None
    return value if isinstance(value, int) else doc.index.created_at


def collect(docs: Iterable[StoredDocument]) -> list[ScopeStats]:
    """The statistics of each (tenant, application) among `docs`, sorted by scope.

    The waiting work is in the spec's queued states (READY in the shipped spec).
    """
    queued = default_spec().roles.queued
    scopes: dict[tuple[str, str], ScopeStats] = {}
    for doc in docs:
        key = (doc.index.tenant, doc.index.application)
        scope = scopes.get(key)
        if scope is None:
            scope = scopes[key] = ScopeStats(*key)
        scope.by_state[doc.index.state] += 1
        if doc.index.state in queued:
            since = (_updated_at(doc), doc.key)
            if scope.oldest_ready is None or since < scope.oldest_ready:
                scope.oldest_ready = since
    return [scopes[key] for key in sorted(scopes)]


def duration(ms: int) -> str:
    """A duration in milliseconds as days, hours, minutes and seconds (`2h 05m 07s`)."""
    if ms < 0:
        return f"-{duration(-ms)}"
    if ms < 1_000:
        return f"{ms} ms"
    seconds, _ = divmod(ms, 1_000)
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    if days:
        return f"{days}d {h:02d}h {m:02d}m"
    if hours:
        return f"{h}h {m:02d}m {s:02d}s"
    if minutes:
        return f"{m}m {s:02d}s"
    return f"{s}.{ms % 1_000 // 100}s"


def register(subparsers: Any) -> None:
    """Add the `stats` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "stats",
        help="workloads by state for each tenant and application, and the oldest READY",
        description=(
            "Count a store's workloads by state, for each tenant and application (or the one "
            "asked for), and name the READY workload that has waited longest."
        ),
    )
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument("--tenant", metavar="T", help="only this tenant (default: every tenant)")
    parser.add_argument(
        "--application", metavar="A", help="only this application (default: every application)"
    )
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.add_argument(
        "--now",
        type=instant_ms,
        metavar="MS",
        help="the instant ages are measured at, in ms since the epoch (default: the clock)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    now = args.now if args.now is not None else time.time_ns() // 1_000_000
    inputs.as_scope(args.tenant, args.application)  # names, or WORKLOAD_INVALID
    with opened_store(args.store, "read") as store:
        if args.tenant is not None and args.application is not None:
            docs: Iterable[StoredDocument] = store.list(args.tenant, args.application)
        else:
            docs = store.scan()
        scopes = [
            s
            for s in collect(docs)
            if args.tenant in (None, s.tenant) and args.application in (None, s.application)
        ]
    totals: Counter[str] = Counter()
    for scope in scopes:
        totals.update(scope.by_state)
    if args.json:
        out = {
            "now": now,
            "total": sum(totals.values()),
            "by_state": dict(sorted(totals.items())),
            "scopes": [scope.to_dict(now) for scope in scopes],
        }
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if not scopes:
        print(shown("no workloads" + _scope_text(args)))
        return 0
    states = [name for name in default_spec().states if totals[name]]
    states += sorted(set(totals) - set(states))  # states of another spec's copy
    rows = []
    for scope in scopes:
        oldest = "-"
        if scope.oldest_ready is not None:
            since, workload_id = scope.oldest_ready
            oldest = f"{duration(now - since)} ({workload_id}, since {instant(since)})"
        rows.append(
            (
                scope.tenant,
                scope.application,
                str(scope.total),
                *(str(scope.by_state[name]) for name in states),
                oldest,
            )
        )
    headers = ("TENANT", "APPLICATION", "TOTAL", *states, "OLDEST READY")
    print_table(headers, rows, title=f"workloads by state at {instant(now)}")
    print(
        f"{sum(totals.values())} workload(s) in {len(scopes)} scope(s): "
        + ", ".join(f"{name} {totals[name]}" for name in states)
    )
    sys.stdout.flush()
    return 0


def _scope_text(args: argparse.Namespace) -> str:
    parts = []
    if args.tenant is not None:
        parts.append(f"tenant {args.tenant}")
    if args.application is not None:
        parts.append(f"application {args.application}")
    return f" for {', '.join(parts)}" if parts else ""
