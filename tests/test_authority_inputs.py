"""What a caller hands the authority is checked before the store is asked anything about it.

The caller-input parsing lives in `workwarden.statemachine.inputs`; the names
callers import from `workwarden.statemachine.authority` still resolve there.
A completion's output is checked for secrets, depth and size before the
authority asks the store which workload owns its result id, as the seed
does: a completion carrying a secret under another workload's result id is
`WORKLOAD_SECRET_REJECTED`, not `WORKLOAD_RESULT_DUPLICATE`, and nothing is
written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from support import CAPS, VERIFIER, request, store_snapshot
from workwarden.statemachine import Authority, Claim, WorkloadError, errors, inputs
from workwarden.statemachine import authority as authority_module
from workwarden.statemachine.authority import invalid_from_validation
from workwarden.storage import Store, StoreError

OUTPUT = {"sent": 1}
SECRET_OUTPUT = {"token": 1}

#: How each test reaches the owner lookup: the default authority (which
#: first decides on its own last write), one that remembers nothing, and
#: `prepare` (always decided on a fresh read).
WAYS = ["remembering", "remember=0", "prepare"]


def _running_beside_a_completed_r1(authority: Authority) -> tuple[str, str, Claim]:
    """Workload one completed as `r1`; workload two running under the returned claim."""
    first = authority.admit(request(), now=10_000).workload.workload_id
    done = authority.claim(first, "a", CAPS, now=11_000, lease_ms=10_000)
    authority.start(first, done.fence, now=11_000)
    authority.complete(first, done.fence, "r1", OUTPUT, now=12_000)
    other = authority.admit(request(idempotency_key="two"), now=20_000).workload.workload_id
    claim = authority.claim(other, "b", CAPS, now=21_000, lease_ms=10_000)
    authority.start(other, claim.fence, now=21_000)
    return first, other, claim


def _completing(
    way: str, authority: Authority, store: Store, workload_id: str, claim: Claim, output: Any
) -> Callable[[], Any]:
    """The completion of `workload_id` as `r1` with `output`, made the `way` named."""
    if way == "remember=0":
        forgetful = Authority(store, grants=VERIFIER, remember=0)
        return lambda: forgetful.complete(workload_id, claim.fence, "r1", output, 22_000)
    if way == "prepare":
        command = {
            "op": "complete",
            "workload_id": workload_id,
            "fence": claim.fence.model_dump(),
            "result_id": "r1",
            "output": output,
        }
        return lambda: authority.prepare(command, 22_000).commit()
    return lambda: authority.complete(workload_id, claim.fence, "r1", output, 22_000)


def _refused(call: Callable[[], Any]) -> WorkloadError:
    with pytest.raises(WorkloadError) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("way", WAYS)
def test_a_secret_output_under_another_workloads_result_id_is_refused_for_the_secret(
    way: str, authority: Authority, store: Store
) -> None:
    _, other, claim = _running_beside_a_completed_r1(authority)
    before = store_snapshot(store)

    refused = _refused(_completing(way, authority, store, other, claim, SECRET_OUTPUT))

    assert refused.code == errors.SECRET_REJECTED
    assert refused.details == {"field": "output.token"}
    assert store_snapshot(store) == before
    assert authority.get(other).state == "RUNNING"


@pytest.mark.parametrize("way", WAYS)
def test_an_output_too_deep_under_another_workloads_result_id_is_refused_for_its_depth(
    way: str, authority: Authority, store: Store
) -> None:
    _, other, claim = _running_beside_a_completed_r1(authority)
    deep: Any = 1
    for _ in range(authority.spec.limits.max_json_depth):
        deep = [deep]
    before = store_snapshot(store)

    refused = _refused(_completing(way, authority, store, other, claim, deep))

    assert refused.code == errors.INVALID
    assert refused.details["max_depth"] == authority.spec.limits.max_json_depth
    assert store_snapshot(store) == before


@pytest.mark.parametrize("way", WAYS)
def test_a_clean_output_under_another_workloads_result_id_is_still_a_duplicate(
    way: str, authority: Authority, store: Store
) -> None:
    _, other, claim = _running_beside_a_completed_r1(authority)
    before = store_snapshot(store)

    refused = _refused(_completing(way, authority, store, other, claim, OUTPUT))

    assert refused.code == errors.RESULT_DUPLICATE
    assert store_snapshot(store) == before


@pytest.mark.parametrize("way", WAYS)
def test_a_secret_output_is_refused_without_asking_the_store_who_owns_the_result_id(
    way: str, authority: Authority, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, other, claim = _running_beside_a_completed_r1(authority)
    asked: list[str] = []

    def unreachable(result_id: str) -> str | None:
        asked.append(result_id)
        raise StoreError("the owner lookup is down")

    monkeypatch.setattr(store, "find_result", unreachable)
    before = store_snapshot(store)

    refused = _refused(_completing(way, authority, store, other, claim, SECRET_OUTPUT))

    assert refused.code == errors.SECRET_REJECTED
    assert asked == []
    assert store_snapshot(store) == before


def test_the_parsing_helpers_are_still_importable_from_the_authority() -> None:
    assert invalid_from_validation is inputs.invalid_from_validation
    assert sorted(authority_module.__all__) == sorted(
        ["DEFAULT_REMEMBER", "Authority", "Prepared", "invalid_from_validation", "serialise"]
    )
    assert all(hasattr(authority_module, name) for name in authority_module.__all__)


def test_an_unknown_op_is_refused_naming_every_operation_and_not_quoting_it_back(
    authority: Authority, store: Store
) -> None:
    before = store_snapshot(store)

    refused = _refused(lambda: authority.prepare({"op": "password-is-hunter2"}, 10_000))

    assert refused.code == errors.INVALID
    assert "hunter2" not in str(refused)
    assert refused.details["errors"][0]["field"] == "op"
    assert all(op in str(refused) for op in inputs.OPERATIONS)
    assert "complete" in inputs.OPERATIONS
    assert store_snapshot(store) == before
