"""The concurrency limits and rates as always-properties of the committed workloads.

`check_concurrency(spec, workloads)`: of the workloads of one concurrency key
(`Workload.concurrency_key`), no more hold a claim (`current_claim`) than the
spec's limit for that key (`Spec.concurrency_limit`, from `[concurrency]`).
The store enforces it at the write that takes a claim; this holds every
snapshot the stateful suite and the chaos audit look at to it. A snapshot is
judged under one spec: a store whose limits were lowered while claims were
held may show more holders than the new limit until those claims end.

`check_rates(spec, claims)`: the instants at which workloads of each key took
a claim, over every span of them, number at most the key's burst plus one per
`every_ms` of the span (`Spec.concurrency_rate`, from `[concurrency] rates`):
`claims_within_rates`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord

__all__ = ["check_concurrency", "check_rates", "claimed_instants"]


def check_concurrency(spec: Spec, workloads: Sequence[Workload]) -> list[Violation]:
    """Each concurrency key's holders, at most its limit (`claims_within_concurrency_limits`)."""
    holders: dict[str, list[str]] = {}
    for workload in workloads:
        key = workload.concurrency_key
        if key is not None and workload.current_claim is not None:
            holders.setdefault(key, []).append(workload.workload_id)
    out: list[Violation] = []
    for key, held in sorted(holders.items()):
        limit = spec.concurrency_limit(key)
        if limit is not None and len(held) > limit:
            out.append(
                Violation(
                    "claims_within_concurrency_limits",
                    min(held),
                    f"concurrency key {key!r} has {len(held)} workloads holding a claim"
                    f" ({', '.join(sorted(held))}); its limit is {limit}",
                )
            )
    return out


def check_rates(spec: Spec, claims: Mapping[str, Sequence[int]]) -> list[Violation]:
    """Each rated key's claims (instants by key), within its rate (`claims_within_rates`)."""
    out: list[Violation] = []
    for key, instants in sorted(claims.items()):
        rate = spec.concurrency_rate(key)
        if rate is None:
            continue
        ordered = sorted(instants)
        for first in range(len(ordered)):
            for last in range(first + rate.burst, len(ordered)):
                span = ordered[last] - ordered[first]
                allowed = rate.burst + span // rate.every_ms
                if last - first + 1 > allowed:
                    out.append(
                        Violation(
                            "claims_within_rates",
                            None,
                            f"concurrency key {key!r} was claimed {last - first + 1} times in"
                            f" {span} ms (from {ordered[first]}); its rate allows {allowed}"
                            f" (burst {rate.burst}, one per {rate.every_ms} ms)",
                        )
                    )
                    return out
    return out


def claimed_instants(
    audit: Sequence[AuditRecord], key_of: Mapping[str, str | None]
) -> dict[str, list[int]]:
    """When workloads of each concurrency key took a claim, read from the audit log.

    A write takes a claim when it raises its workload's fencing token (a claim
    raises it by one; no other write changes it). `key_of` maps a workload id
    to its concurrency key (None: it has none, and is left out).
    """
    tokens: dict[str, int] = {}
    out: dict[str, list[int]] = {}
    for record in audit:
        token = record.fencing_token
        if token is None or token <= tokens.get(record.key, 0):
            continue
        tokens[record.key] = token
        key = key_of.get(record.key)
        if key is not None:
            out.setdefault(key, []).append(record.at)
    return out
