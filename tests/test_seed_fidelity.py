"""Where the seed's behaviour is the contract: ids and checks reproduced byte for byte.

The expected values are the seed's recipes worked by hand (docs/design.md,
"Ids and hashes"), so another implementation can check itself against them.
"""

from __future__ import annotations

import hashlib

import pytest

from support import VERIFIER, request
from workwarden.statemachine import (
    DEFAULT_RETRY_ON,
    Authority,
    CheckpointCommand,
    Fence,
    RetryPolicy,
    WorkloadError,
    default_retry_policy,
    default_spec,
    errors,
)
from workwarden.statemachine.ids import claim_id_for
from workwarden.statemachine.safety import check_json
from workwarden.storage import Store

WORKLOAD = "workload_a905c442ee731da96617b295"


def test_the_claim_id_is_the_seeds_hash_of_workload_token_and_worker() -> None:
    expected = hashlib.sha256(f"{WORKLOAD}:1:worker-a".encode()).hexdigest()[:20]
    assert claim_id_for(WORKLOAD, 1, "worker-a") == "claim_" + expected
    assert claim_id_for(WORKLOAD, 1, "worker-a") == "claim_1c853f1693a49050f5fd"


def test_a_claim_carries_the_seeds_claim_id(authority: Authority) -> None:
    admitted = authority.admit(request(), 10_000).workload
    assert admitted.workload_id == WORKLOAD
    claim = authority.claim(WORKLOAD, "worker-a", {"email:send"}, 11_000, lease_ms=10_000)
    assert claim.claim_id == "claim_1c853f1693a49050f5fd"


def test_secret_keys_are_matched_ignoring_ascii_case_only() -> None:
    spec = default_spec()
    with pytest.raises(WorkloadError) as refused:
        check_json(spec, {"ToKeN": 1}, "input")
    assert refused.value.code == errors.SECRET_REJECTED
    # KELVIN SIGN lowers to "k" in Unicode but not in ASCII: the seed accepts it.
    check_json(spec, {"to\u212aen": 1}, "input")


def test_a_key_with_a_non_ascii_look_alike_is_admitted(store: Store) -> None:
    warden = Authority(store, grants=VERIFIER)
    admitted = warden.admit(request(input={"to\u212aen": "x"}), 10_000)
    assert admitted.created


def test_floats_are_hashed_as_serde_json_writes_them() -> None:
    # serde_json writes 1e-5 as 0.00001 and 1.5e-7 without padding; so do we.
    spec = default_spec()
    assert check_json(spec, {"b": 1e-5, "a": [1.5e-7, 2, 1.0]}, "input") == (
        '{"a":[1.5e-7,2,1.0],"b":0.00001}'
    )
    assert check_json(spec, {"x": 1}, "input") == '{"x":1}'


def test_a_checkpoint_carrying_a_secret_is_refused_for_it_before_the_lookup(
    authority: Authority,
) -> None:
    command = CheckpointCommand(
        workload_id="workload_missing",
        fence=Fence(claim_id="c", worker_id="w", token=1),
        state={"password": "x"},
    )
    with pytest.raises(WorkloadError) as refused:
        authority.execute(command, 10_000)
    assert refused.value.code == errors.SECRET_REJECTED


def test_a_retry_policy_given_without_retry_on_retries_nothing(authority: Authority) -> None:
    policy = RetryPolicy(max_attempts=5)
    assert policy.retry_on == ()
    workload_id = authority.admit(request(retry_policy=policy), 10_000).workload.workload_id
    claim = authority.claim(workload_id, "w", {"email:send"}, 11_000, lease_ms=10_000)
    assert authority.fail(workload_id, claim.fence, "timeout", "slow", 12_000) == "DEAD_LETTER"
    decided = authority.get(workload_id).execution_history[-1].evidence["decision"]
    assert decided == "failure_kind_not_retryable"


def test_a_request_without_a_retry_policy_retries_the_default_kinds() -> None:
    assert request().retry_policy == default_retry_policy()
    assert default_retry_policy().retry_on == DEFAULT_RETRY_ON
    assert DEFAULT_RETRY_ON == ("timeout", "transient_connection", "worker_failure")
