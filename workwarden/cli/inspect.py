"""`workwarden inspect` and `workwarden list`: read a store's workloads as tables.

- `inspect [--store URL] WORKLOAD_ID`: one workload: its state, version,
  definition, budget and eligibility, its current claim, its result, its
  attempts and its history (each event with its actor and evidence).
- `list [--store URL] TENANT APPLICATION`: the workloads of a tenant and
  application, highest priority first, then oldest.

The store is `--store URL`, or the `WORKWARDEN_STORE` environment variable.
Instants are printed as milliseconds since the epoch and, in the history, as
the offset from the admission. A refusal prints as `CODE: message` with exit
status 1.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.deadlines import next_deadline_at
from workwarden.statemachine.models import Workload
from workwarden.statemachine.predicates import attempt_budget, operator_retries
from workwarden.statemachine.spec import default_spec
from workwarden.storage import Store, StoredDocument, StoreError, open_store

__all__ = ["STORE_VARIABLE", "register", "render_list", "render_workload"]

#: The environment variable naming the store when `--store` is not given.
STORE_VARIABLE = "WORKWARDEN_STORE"

_STORE_HELP = (
    f"the store: memory:, sqlite:///path, or postgresql://... (default: ${STORE_VARIABLE})"
)


def register(subparsers: Any) -> None:
    """Add the `inspect` and `list` commands."""
    inspect: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="one workload's state, claim, attempts and history",
        description="Show one workload's state, claim, attempts and history as tables.",
    )
    inspect.add_argument("--store", metavar="URL", help=_STORE_HELP)
    inspect.add_argument("workload_id", metavar="WORKLOAD_ID")
    inspect.set_defaults(handler=_inspect)

    listing: argparse.ArgumentParser = subparsers.add_parser(
        "list",
        help="the workloads of a tenant and application",
        description="List the workloads of a tenant and application, by priority then age.",
    )
    listing.add_argument("--store", metavar="URL", help=_STORE_HELP)
    listing.add_argument("tenant", metavar="TENANT")
    listing.add_argument("application", metavar="APPLICATION")
    listing.set_defaults(handler=_list)


@contextmanager
def _opened(url: str | None) -> Iterator[Store]:
    url = url or os.environ.get(STORE_VARIABLE)
    if not url:
        raise errors.WorkloadError(
            errors.INVALID, f"no store: give --store URL or set {STORE_VARIABLE}"
        )
    try:
        store = open_store(url)
    except ValueError as exc:
        raise errors.WorkloadError(errors.INVALID, f"--store: {exc}") from None
    except StoreError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot open the store: {exc}"
        ) from None
    try:
        yield store
    except StoreError as exc:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"cannot read the store: {exc}"
        ) from None
    finally:
        store.close()


def _parse(doc: StoredDocument) -> Workload:
    try:
        return Workload.model_validate_json(doc.document)
    except ValidationError:
        raise errors.WorkloadError(
            errors.STORAGE_FAILURE, f"stored document {doc.key} is not a workload"
        ) from None


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows as left-aligned columns; the last column is not padded."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        (
            indent + "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        ).rstrip()
        for row in rows
    ]


def _value(value: object) -> str:
    return "-" if value is None else str(value)


def render_workload(workload: Workload, version: int) -> list[str]:
    """One workload as readable lines: a summary, its claim, its attempts and its history."""
    spec = default_spec()
    w = workload
    policy = w.retry_policy
    timeouts = {k: v for k, v in w.timeouts.model_dump().items() if v is not None}
    lines = [f"workload {w.workload_id}"]
    summary = [
        (
            "state",
            f"{w.state} ({spec.states[w.state].kind})" if w.state in spec.states else w.state,
        ),
        ("version", f"{version}, contract {w.contract_version}"),
        ("tenant", f"{w.tenant_id} / {w.application_id} ({w.environment})"),
        ("definition", f"{w.definition_id} {w.definition_revision}, trigger {w.trigger}"),
        ("requested by", f"{w.requested_by.kind} {w.requested_by.id}, key {w.idempotency_key}"),
        ("priority", str(w.priority)),
        ("created", f"{w.created_at}, updated {w.updated_at}"),
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
        ("eligible at", _value(w.next_attempt_at)),
        (
            "deadlines",
            ", ".join(f"{k.removesuffix('_ms')} {v} ms" for k, v in timeouts.items()) or "none",
        ),
        ("next deadline", _value(next_deadline_at(spec, w))),
        (
            "dependencies",
            ", ".join(f"{d.workload_id} {d.required_state}" for d in w.dependencies) or "none",
        ),
        ("last failure", _value(w.last_failure)),
    ]
    claim = w.current_claim
    summary.append(
        (
            "claim",
            "none"
            if claim is None
            else f"{claim.worker_id}, token {claim.fencing_token}, {claim.claim_id}, "
            f"lease until {claim.expires_at} (claimed {claim.claimed_at}, "
            f"last heartbeat {claim.last_heartbeat})",
        )
    )
    result = w.result
    summary.append(
        (
            "result",
            "none"
            if result is None
            else f"{result.result_id} by {result.produced_by} at {result.created_at}",
        )
    )
    lines += _table([(f"{k}", v) for k, v in summary])
    lines += ["", f"attempts ({len(w.attempts)})"]
    lines += _table(
        [("#", "ATTEMPT", "WORKER", "TOKEN", "STATUS", "STARTED", "ENDED", "ERROR")]
        + [
            (
                str(n),
                a.attempt_id,
                a.worker_id,
                str(a.fencing_token),
                a.status,
                _value(a.started_at),
                _value(a.ended_at),
                _value(a.error),
            )
            for n, a in enumerate(w.attempts, start=1)
        ]
    )
    lines += ["", f"history ({len(w.execution_history)} events; AT is ms since admission)"]
    lines += _table(
        [("SEQ", "AT", "FROM", "TO", "ACTOR", "EVIDENCE")]
        + [
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
    )
    return lines


def render_list(docs: Sequence[StoredDocument]) -> list[str]:
    """Workloads as a table: id, state, priority, attempts, version, instants, definition."""
    rows = [("WORKLOAD", "STATE", "PRIORITY", "ATTEMPTS", "VERSION", "CREATED", "UPDATED", "DEF")]
    for doc in docs:
        w = _parse(doc)
        rows.append(
            (
                w.workload_id,
                w.state,
                str(w.priority),
                f"{w.attempt_count}/{attempt_budget(w)}",
                str(doc.version),
                str(w.created_at),
                str(w.updated_at),
                f"{w.definition_id} {w.definition_revision}",
            )
        )
    return _table(rows, indent="")


def _inspect(args: argparse.Namespace) -> int:
    with _opened(args.store) as store:
        doc = store.read(args.workload_id)
    if doc is None:
        raise errors.WorkloadError(errors.NOT_FOUND, f"no workload {args.workload_id}")
    print("\n".join(render_workload(_parse(doc), doc.version)))
    return 0


def _list(args: argparse.Namespace) -> int:
    with _opened(args.store) as store:
        docs = list(store.list(args.tenant, args.application))
    if not docs:
        print(f"no workloads for tenant {args.tenant}, application {args.application}")
        return 0
    print("\n".join(render_list(docs)))
    print(f"{len(docs)} workload(s)")
    return 0
