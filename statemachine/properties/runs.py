"""The properties of a run against a store: what it admitted and acknowledged, once drained.

A run (the chaos run of `workwarden.chaos`) admits workloads and tells
workers their completions succeeded; after it has drained the store, what it
admitted must be there (and nothing else), every completion it acknowledged
must be the stored result, and every workload must be at rest in a terminal
state. These are checked over the run's own records and the store, so they
hold across processes that were killed at any instant.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.spec import Spec

__all__ = ["check_acknowledged", "check_admitted", "check_drained"]


def check_admitted(admitted: Collection[str], stored: Collection[str]) -> list[Violation]:
    """Every admitted workload id is stored, and every stored one was admitted."""
    wanted = set(admitted)
    present = set(stored)
    return [
        Violation("admitted_work_is_stored", key, "admitted but not in the store")
        for key in sorted(wanted - present)
    ] + [
        Violation("admitted_work_is_stored", key, "in the store but never admitted")
        for key in sorted(present - wanted)
    ]


def check_acknowledged(
    workloads: Mapping[str, Workload], acknowledged: Iterable[tuple[str, int, str]]
) -> list[Violation]:
    """Each acknowledged (workload id, fencing token, result id) is the stored result."""
    out: list[Violation] = []
    for workload_id, token, result_id in acknowledged:
        workload = workloads.get(workload_id)
        result = workload.result if workload is not None else None
        if (
            result is None
            or result.result_id != result_id
            or result.provenance.get("fencing_token") != str(token)
        ):
            out.append(
                Violation(
                    "acknowledged_completions_are_stored",
                    workload_id,
                    f"completion {result_id} under token {token} was acknowledged but is not "
                    "stored",
                )
            )
    return out


def check_drained(spec: Spec, workloads: Iterable[Workload]) -> list[Violation]:
    """Every workload of a drained store is in a terminal state."""
    return [
        Violation(
            "work_finishes_after_draining",
            workload.workload_id,
            f"not terminal after draining: {workload.state}",
        )
        for workload in workloads
        if workload.state not in spec.terminal_states
    ]
