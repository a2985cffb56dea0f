from support import CAPS, request

from workwarden.statemachine import Authority


def test_a_workload_goes_from_admission_to_success(authority: Authority) -> None:
    admitted = authority.admit(request(), now=10_000)
    assert admitted.created
    claim = authority.claim(admitted.workload.workload_id, "w", CAPS, now=11_000, lease_ms=10_000)
    authority.start(claim.workload_id, claim.fence, now=12_000)
    authority.complete(claim.workload_id, claim.fence, "r1", {"ok": True}, now=13_000)
    assert authority.get(claim.workload_id).state == "SUCCEEDED"
