"""`workwarden inspect` and `workwarden list`: read a store's workloads as tables.

- `inspect [--store URL] [--spec FILE] WORKLOAD_ID`: one workload: its state
  (and its kind in the spec), version, definition, budget and eligibility, its
  current claim, its result, its attempts and its history (each event with its
  actor and evidence).
- `list [--store URL] [--state STATE] [--spec FILE] TENANT APPLICATION`: the
  workloads of a tenant and application, highest priority first, then oldest;
  `--state` keeps those in one state of the spec (`--spec`, the shipped one by
  default: a copy's own states, `PAUSED` or `AWAITING_APPROVAL`, need it).

The store is `--store URL`, or the `WORKWARDEN_STORE` environment variable;
it is opened read-only and never created. Instants are printed as ISO-8601
UTC beside the milliseconds since the epoch and, in the history, as the
offset from the admission. A refusal prints as `CODE: message` with exit
status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from workwarden.cli import STORE_HELP, USAGE, instant, opened_store, plain_table, print_table, shown
from workwarden.statemachine import errors, inputs
from workwarden.statemachine.deadlines import next_deadline_at
from workwarden.statemachine.listing import MAX_PAGE, read_page
from workwarden.statemachine.models import Workload
from workwarden.statemachine.predicates import attempt_budget, operator_retries
from workwarden.statemachine.spec import Spec, default_spec, load_spec
from workwarden.storage import StoredDocument
from workwarden.storage.urls import STORE_VARIABLE

__all__ = [
    "STORE_VARIABLE",
    "Section",
    "register",
    "render_list",
    "render_workload",
    "spec_state",
    "workload_sections",
]


def spec_state(text: str, spec: Spec | None = None) -> str:
    """A state of `spec` (the shipped one by default), else a usage error naming its states."""
    states = (spec or default_spec()).states
    if text not in states:
        raise argparse.ArgumentTypeError(
            f"no state {text!r} in the spec; its states: {', '.join(states)}"
        )
    return text


def register(subparsers: Any) -> None:
    """Add the `inspect` and `list` commands."""
    inspect: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="one workload's state, claim, attempts and history",
        description="Show one workload's state, claim, attempts and history as tables.",
    )
    inspect.add_argument("--store", metavar="URL", help=STORE_HELP)
    inspect.add_argument(
        "--spec",
        metavar="FILE",
        help="the spec the workload was admitted under (the shipped spec by default)",
    )
    inspect.add_argument("workload_id", metavar="WORKLOAD_ID", help="the workload's id")
    inspect.set_defaults(handler=_inspect)

    listing: argparse.ArgumentParser = subparsers.add_parser(
        "list",
        help="the workloads of a tenant and application",
        description="List the workloads of a tenant and application, by priority then age.",
    )
    listing.add_argument("--store", metavar="URL", help=STORE_HELP)
    listing.add_argument(
        "--state",
        metavar="STATE",
        help="only workloads in this state (a state of the spec: READY, RUNNING, ...)",
    )
    listing.add_argument(
        "--spec",
        metavar="FILE",
        help="the spec whose states --state names (the shipped spec by default)",
    )
    listing.add_argument(
        "--limit",
        type=page_limit,
        metavar="N",
        help=f"list a page of N workloads (1 to {MAX_PAGE}), then the option for the next page",
    )
    listing.add_argument(
        "--after",
        metavar="CURSOR",
        help="start after the page that printed this cursor (with --limit)",
    )
    listing.add_argument("tenant", metavar="TENANT", help="the tenant id")
    listing.add_argument("application", metavar="APPLICATION", help="the application id")
    listing.set_defaults(handler=_list)


def page_limit(text: str) -> int:
    """An option type: a page size, a whole number from 1 to `MAX_PAGE`."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text[:8]) <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"a page is 1 to {MAX_PAGE} workloads, not {text!r}")
    return int(text)


def _parse(doc: StoredDocument) -> Workload:
    try:
        return Workload.model_validate_json(doc.document)
    except ValidationError:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"stored document {doc.key} is not a workload"
        ) from None


def _value(value: object) -> str:
    return "-" if value is None else str(value)


Section = tuple[str | None, Sequence[str], Sequence[Sequence[str]]]
"""A titled table: (title, headers, rows)."""


def workload_sections(workload: Workload, version: int, spec: Spec | None = None) -> list[Section]:
    """One workload as titled tables: a summary, its attempts and its history, read under
    `spec` (the shipped one by default): the kind of its state, its next deadline."""
    spec = spec or default_spec()
    w = workload
    policy = w.retry_policy
    timeouts = {k: v for k, v in w.timeouts.model_dump().items() if v is not None}
    claim = w.current_claim
    result = w.result
    summary: list[tuple[str, ...]] = [
        (
            "state",
            f"{w.state} ({spec.states[w.state].kind})" if w.state in spec.states else w.state,
        ),
        ("version", f"{version}, contract {w.contract_version}"),
        ("tenant", f"{w.tenant_id} / {w.application_id} ({w.environment})"),
        ("definition", f"{w.definition_id} {w.definition_revision}, trigger {w.trigger}"),
        ("requested by", f"{w.requested_by.kind} {w.requested_by.id}, key {w.idempotency_key}"),
        ("priority", str(w.priority)),
        ("created", instant(w.created_at)),
        ("updated", instant(w.updated_at)),
        (
            "attempts",
            f"{w.attempt_count} of {attempt_budget(w)} (max_attempts {policy.max_attempts}"
            f" + {operator_retries(w)} operator re-arms), retries {w.retry_count}",
        ),
        (
            "retry policy",
            f"{policy.backoff} backoff from {policy.initial_delay_ms} ms to"
            f" {policy.max_delay_ms} ms; retried on {', '.join(policy.retry_on) or 'nothing'}",
        ),
        ("eligible at", instant(w.next_attempt_at)),
        (
            "deadlines",
            ", ".join(f"{k.removesuffix('_ms')} {v} ms" for k, v in timeouts.items()) or "none",
        ),
        ("next deadline", instant(next_deadline_at(spec, w))),
        (
            "dependencies",
            ", ".join(f"{d.workload_id} {d.required_state}" for d in w.dependencies) or "none",
        ),
        ("last failure", _value(w.last_failure)),
        (
            "claim",
            "none"
            if claim is None
            else f"{claim.worker_id}, token {claim.fencing_token}, {claim.claim_id}",
        ),
    ]
    if claim is not None:
        summary += [
            ("lease until", instant(claim.expires_at)),
            ("claimed", instant(claim.claimed_at)),
            ("last heartbeat", instant(claim.last_heartbeat)),
        ]
    summary.append(
        (
            "result",
            "none"
            if result is None
            else f"{result.result_id} by {result.produced_by} at {instant(result.created_at)}",
        )
    )
    attempts: list[tuple[str, ...]] = [
        (
            str(n),
            a.attempt_id,
            a.worker_id,
            str(a.fencing_token),
            a.status,
            instant(a.started_at),
            instant(a.ended_at),
            _value(a.error),
        )
        for n, a in enumerate(w.attempts, start=1)
    ]
    history: list[tuple[str, ...]] = [
        (
            str(e.sequence),
            f"+{e.at - w.created_at}",
            _value(e.from_state),
            e.to,
            f"{e.actor} ({e.actor_class})",
            " ".join(f"{k}={v}" for k, v in sorted(e.evidence.items())),
        )
        for e in w.execution_history
    ]
    return [
        (f"workload {w.workload_id}", ("FIELD", "VALUE"), summary),
        (
            f"attempts ({len(w.attempts)})",
            ("#", "ATTEMPT", "WORKER", "TOKEN", "STATUS", "STARTED", "ENDED", "ERROR"),
            attempts,
        ),
        (
            f"history ({len(w.execution_history)} events; AT is ms since admission)",
            ("SEQ", "AT", "FROM", "TO", "ACTOR", "EVIDENCE"),
            history,
        ),
    ]


def render_workload(workload: Workload, version: int, spec: Spec | None = None) -> list[str]:
    """One workload as plain lines: a summary, its claim, its attempts and its history."""
    summary, *tables = workload_sections(workload, version, spec)
    lines = [str(summary[0]), *plain_table(summary[2], indent="  ")]
    for title, headers, rows in tables:
        lines += ["", str(title), *plain_table([tuple(headers), *rows], indent="  ")]
    return lines


_LIST_HEADERS = (
    "WORKLOAD",
    "STATE",
    "PRIORITY",
    "ATTEMPTS",
    "VERSION",
    "CREATED",
    "UPDATED",
    "DEF",
)


def _list_rows(docs: Sequence[StoredDocument]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for doc in docs:
        w = _parse(doc)
        rows.append(
            (
                w.workload_id,
                w.state,
                str(w.priority),
                f"{w.attempt_count}/{attempt_budget(w)}",
                str(doc.version),
                instant(w.created_at),
                instant(w.updated_at),
                f"{w.definition_id} {w.definition_revision}",
            )
        )
    return rows


def render_list(docs: Sequence[StoredDocument]) -> list[str]:
    """Workloads as plain lines: id, state, priority, attempts, version, instants, definition."""
    return plain_table([_LIST_HEADERS, *_list_rows(docs)])


def _inspect(args: argparse.Namespace) -> int:
    # A name, as `Authority.get` takes it (else WORKLOAD_INVALID): an empty id, one of
    # control characters or one longer than any id names no workload.
    workload_id = inputs.as_name(args.workload_id, "WORKLOAD_ID")
    spec = load_spec(args.spec)
    with opened_store(args.store, "read") as store:
        doc = store.read(workload_id)
    if doc is None:
        raise errors.WorkloadError(
            errors.NOT_FOUND, f"no workload {workload_id}", {"workload_id": workload_id}
        )
    workload = _parse(doc)
    if not sys.stdout.isatty():
        print("\n".join(render_workload(workload, doc.version, spec)))
        return 0
    for title, headers, rows in workload_sections(workload, doc.version, spec):
        print_table(headers, rows, title=title)
    return 0


def _list(args: argparse.Namespace) -> int:
    # Names, as `stats --tenant` takes them (else WORKLOAD_INVALID): an empty one, or one
    # holding a control character the "no workloads" line would send to the terminal,
    # names no scope.
    inputs.as_full_scope(args.tenant, args.application)
    if args.after is not None and args.limit is None:
        raise errors.WorkloadError(USAGE, "list: --after continues a page; give --limit with it")
    spec = load_spec(args.spec)  # before the store: a spec that cannot load is said first
    if args.state is not None:
        # Checked here, not as the option's type: the states are those of `--spec`.
        try:
            spec_state(args.state, spec)
        except argparse.ArgumentTypeError as exc:
            hint = "; a state of your own spec needs --spec FILE" if args.spec is None else ""
            raise errors.WorkloadError(
                USAGE,
                f"workwarden list: argument --state: {exc}{hint} (see workwarden list --help)",
            ) from None
    following = None
    with opened_store(args.store, "read") as store:
        if args.limit is None:
            docs = list(store.list(args.tenant, args.application))
        else:
            docs, following = read_page(
                store, args.tenant, args.application, args.limit, args.after
            )
    if args.state is not None:
        docs = [doc for doc in docs if doc.index.state == args.state]
    if not docs:
        state = f" in state {args.state}" if args.state is not None else ""
        where = "on this page " if args.limit is not None else ""
        print(
            shown(
                f"no workloads{state} {where}for tenant {args.tenant},"
                f" application {args.application}"
            )
        )
    else:
        print_table(_LIST_HEADERS, _list_rows(docs))
        print(f"{len(docs)} workload(s)")
    if following is not None:
        # `--state` keeps a page's workloads in that state: the next page may hold more.
        print(f"next page: --limit {args.limit} --after {following}")
    return 0
