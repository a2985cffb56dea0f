"""Completion and its replay rules.

A completion repeated by the attempt that made it (a lost response) replays the
recorded result and commits nothing. Anything else naming the recorded result
id did not produce it and is told so (`WORKLOAD_RESULT_CONFLICT`); a result id
recorded for another workload is `WORKLOAD_RESULT_DUPLICATE`.
"""

from __future__ import annotations

from typing import Any

import pytest

from support import CAPS, request, store_snapshot
from support import authority as authority_over
from workwarden.statemachine import Authority, Claim, Fence, WorkloadError
from workwarden.storage import Store

OUTPUT = {"sent": 1}


def _lost_then_completed(authority: Authority) -> tuple[str, Claim, Claim]:
    """Worker a loses its lease; worker b completes the work as `r1` with OUTPUT."""
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    lost = authority.claim(workload_id, "a", CAPS, now=11_000, lease_ms=1_000)
    authority.start(workload_id, lost.fence, now=11_000)
    authority.recover_expired(now=13_000)
    won = authority.claim(workload_id, "b", CAPS, now=13_000, lease_ms=10_000)
    authority.start(workload_id, won.fence, now=13_000)
    authority.complete(workload_id, won.fence, "r1", OUTPUT, now=14_000)
    return workload_id, lost, won


def _refused(call: Any) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        call()
    return caught.value


def test_a_completion_records_the_result_and_its_provenance(authority: Authority) -> None:
    workload_id = authority.admit(request(), now=10_000).workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, now=11_000, lease_ms=10_000)
    authority.start(workload_id, claim.fence, now=12_000)

    result = authority.complete(
        workload_id,
        claim.fence,
        "r1",
        {"sent": 1},
        now=13_000,
        artifacts=["artifact://report"],
        schema_version=2,
    )

    assert result.workload_id == workload_id
    assert result.attempt_id == authority.get(workload_id).attempts[0].attempt_id
    assert result.output == {"sent": 1}
    assert result.artifacts == ("artifact://report",)
    assert result.schema_version == 2
    assert result.produced_by == "w"
    assert result.created_at == 13_000
    assert result.provenance == {"claim_id": claim.claim_id, "fencing_token": "1"}
    assert authority_over(authority.store).get(workload_id).result == result


def test_the_same_report_repeated_replays_the_result_without_a_new_version(
    authority: Authority, store: Store
) -> None:
    workload_id, _, won = _lost_then_completed(authority)
    first = authority.get(workload_id).result
    before = store_snapshot(store)

    again = authority.complete(workload_id, won.fence, "r1", {"sent": 1}, now=15_000)
    # Long after the lease would have run out: the report is still the same report.
    later = authority.complete(workload_id, won.fence, "r1", OUTPUT, now=99_000)

    assert again == first
    assert later == first
    assert store_snapshot(store) == before


def test_the_same_result_id_with_a_different_output_is_a_conflict(
    authority: Authority, store: Store
) -> None:
    workload_id, _, won = _lost_then_completed(authority)
    before = store_snapshot(store)

    refused = _refused(
        lambda: authority.complete(workload_id, won.fence, "r1", {"sent": 2}, now=15_000)
    )

    assert refused.code == "WORKLOAD_RESULT_CONFLICT"
    assert store_snapshot(store) == before


def test_a_stale_worker_naming_the_winners_result_id_learns_nothing_landed_for_it(
    authority: Authority, store: Store
) -> None:
    workload_id, lost, _ = _lost_then_completed(authority)
    before = store_snapshot(store)

    refused = _refused(lambda: authority.complete(workload_id, lost.fence, "r1", OUTPUT, 15_000))

    assert refused.code == "WORKLOAD_RESULT_CONFLICT"
    assert store_snapshot(store) == before
    committed = authority.get(workload_id)
    assert committed.state == "SUCCEEDED"
    assert committed.result is not None
    assert committed.result.output == OUTPUT
    assert committed.result.produced_by == "b"


@pytest.mark.parametrize(
    "forge",
    [{"worker_id": "c"}, {"claim_id": "claim_other"}, {"token": 7}],
    ids=["other-worker", "other-claim", "other-token"],
)
def test_only_the_fence_that_produced_a_result_replays_it(
    authority: Authority, forge: dict[str, Any]
) -> None:
    workload_id, _, won = _lost_then_completed(authority)
    forged: Fence = won.fence.model_copy(update=forge)

    refused = _refused(lambda: authority.complete(workload_id, forged, "r1", OUTPUT, 15_000))

    assert refused.code == "WORKLOAD_RESULT_CONFLICT"


def test_a_second_result_id_for_finished_work_is_refused_on_the_fence(
    authority: Authority, store: Store
) -> None:
    workload_id, _, won = _lost_then_completed(authority)
    before = store_snapshot(store)

    refused = _refused(lambda: authority.complete(workload_id, won.fence, "r2", OUTPUT, 15_000))

    assert refused.code == "WORKLOAD_CLAIM_INVALID", "completion released the claim"
    assert store_snapshot(store) == before


def test_a_result_id_recorded_for_another_workload_is_a_duplicate(
    authority: Authority, store: Store
) -> None:
    first, _, _ = _lost_then_completed(authority)
    other = authority.admit(request(idempotency_key="two"), now=20_000).workload.workload_id
    claim = authority.claim(other, "c", CAPS, now=21_000, lease_ms=10_000)
    authority.start(other, claim.fence, now=21_000)
    before = store_snapshot(store)

    refused = _refused(lambda: authority.complete(other, claim.fence, "r1", OUTPUT, 22_000))

    assert refused.code == "WORKLOAD_RESULT_DUPLICATE"
    assert store_snapshot(store) == before
    assert authority.get(other).state == "RUNNING"
    # Under its own result id the other workload completes.
    assert authority.complete(other, claim.fence, "r2", OUTPUT, 22_000).result_id == "r2"
    finished = authority.get(first).result
    assert finished is not None
    assert finished.result_id == "r1"
