"""The index fields a store keeps beside each workload document, computed from the document.

The store never looks inside a document; what the scheduler and the sweeps
query ("claimable now", "lease expired", "deadline due") is computed here, by
the core, on every write.
"""

from __future__ import annotations

from workwarden.statemachine.deadlines import next_deadline_at
from workwarden.statemachine.models import Workload
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import IndexFields

__all__ = ["index_fields"]


def index_fields(spec: Spec, workload: Workload) -> IndexFields:
    """The index fields of `workload` under `spec`."""
    claimable = spec.available(workload.state, "claim")
    recoverable = spec.available(workload.state, "recover_expired")
    claim = workload.current_claim
    rate = spec.concurrency_rate(workload.concurrency_key)
    return IndexFields(
        tenant=workload.tenant_id,
        application=workload.application_id,
        state=workload.state,
        priority=workload.priority,
        created_at=workload.created_at,
        eligible_at=(workload.next_attempt_at or 0) if claimable else None,
        lease_expires_at=claim.expires_at if claim is not None and recoverable else None,
        next_deadline_at=next_deadline_at(spec, workload),
        result_id=workload.result.result_id if workload.result is not None else None,
        claim_worker=claim.worker_id if claim is not None else None,
        definition=workload.definition_id,
        concurrency_key=workload.concurrency_key,
        concurrency_limit=spec.concurrency_limit(workload.concurrency_key),
        rate_every_ms=rate.every_ms if rate is not None else None,
        rate_burst=rate.burst if rate is not None else None,
    )
