"""The concurrency limits as an always-property of the committed workloads.

`check_concurrency(spec, workloads)`: of the workloads of one concurrency key
(`Workload.concurrency_key`), no more hold a claim (`current_claim`) than the
spec's limit for that key (`Spec.concurrency_limit`, from `[concurrency]`).
The store enforces it at the write that takes a claim; this holds every
snapshot the stateful suite and the chaos audit look at to it. A snapshot is
judged under one spec: a store whose limits were lowered while claims were
held may show more holders than the new limit until those claims end.
"""

from __future__ import annotations

from collections.abc import Sequence

from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.spec import Spec

__all__ = ["check_concurrency"]


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
