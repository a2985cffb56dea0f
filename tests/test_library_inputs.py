"""The library's calls refuse what they cannot take with `WORKLOAD_INVALID`, and write nothing.

Each test here holds one call of `Authority` (or of the grant and spec
helpers it is built with) to the rule of the README: bad input is a
`WorkloadError` with a catalogue code, never another exception, a hang or a
partial write.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from support import CAPS, SIGNER, VERIFIER, grant_for, request, store_snapshot
from workwarden.statemachine import (
    Authority,
    Grant,
    GrantVerifier,
    WorkloadError,
    check_spec_file,
    errors,
    load_spec,
)
from workwarden.statemachine.models import MAX_LIST
from workwarden.storage import MemoryStore


def _started() -> tuple[MemoryStore, Authority, str, Any]:
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    workload_id = warden.admit(request(), 1_000).workload.workload_id
    claim = warden.claim(workload_id, "w1", CAPS, 1_001, 30_000)
    warden.start(workload_id, claim.fence, 1_002)
    return store, warden, workload_id, claim.fence


def _invalid(call: Callable[[], Any], field: str) -> WorkloadError:
    with pytest.raises(WorkloadError) as refused:
        call()
    assert refused.value.code == errors.INVALID
    assert refused.value.details is not None
    assert field in {problem["field"] for problem in refused.value.details["errors"]}
    return refused.value


@pytest.mark.parametrize(
    ("field", "call"),
    [
        (
            "capabilities",
            lambda w, wid, fence, names: w.claim(wid, "w2", names, 1_003, 1_000),
        ),
        (
            "capabilities",
            lambda w, wid, fence, names: w.claim_next("t", "app", "w2", names, 1_003, 1_000),
        ),
        (
            "capabilities",
            lambda w, wid, fence, names: w.claim_many("t", "app", "w2", names, 1_003, 1_000, 2),
        ),
        (
            "capabilities",
            lambda w, wid, fence, names: w.claim_fair(
                w.fair_share([("t", "app")]), "w2", names, 1_003, 1_000
            ),
        ),
        (
            "secret_references",
            lambda w, wid, fence, names: w.execution_context(wid, fence, 1_003, names),
        ),
        (
            "artifacts",
            lambda w, wid, fence, names: w.complete(wid, fence, "r1", {}, 1_003, artifacts=names),
        ),
    ],
)
def test_an_endless_iterable_of_names_is_invalid_and_is_not_drawn_on_for_ever(
    field: str, call: Callable[..., Any]
) -> None:
    # `tuple(values)` of an endless generator never returned: the process ran
    # out of memory. Like a batch, a collection of names is read no further
    # than one past the most it takes.
    store, warden, workload_id, fence = _started()
    before = store_snapshot(store)
    drawn = itertools.count()
    endless = (f"n{next(drawn)}" for _ in itertools.repeat(None))
    _invalid(lambda: call(warden, workload_id, fence, endless), field)
    assert next(drawn) == MAX_LIST + 1
    assert store_snapshot(store) == before
    # The same name for ever is refused too (not taken as one name).
    _invalid(lambda: call(warden, workload_id, fence, itertools.repeat("secret://a")), field)
    assert store_snapshot(store) == before


def test_a_completion_naming_more_artifacts_than_the_limit_is_invalid_and_writes_nothing() -> None:
    # Each artifact id is copied into the stored document: 100,000 of them made
    # a 26 MB document where an output is held to 1 MiB.
    store, warden, workload_id, fence = _started()
    before = store_snapshot(store)
    names = [f"artifact-{i}" for i in range(MAX_LIST + 1)]
    _invalid(
        lambda: warden.complete(workload_id, fence, "r1", {}, 1_003, artifacts=names), "artifacts"
    )
    (slot,) = warden.report_many(
        [
            {
                "op": "complete",
                "workload_id": workload_id,
                "fence": fence.model_dump(),
                "result_id": "r1",
                "output": {},
                "artifacts": names,
            }
        ],
        1_003,
    )
    assert isinstance(slot, WorkloadError)
    assert slot.code == errors.INVALID
    assert store_snapshot(store) == before
    result = warden.complete(workload_id, fence, "r1", {}, 1_003, artifacts=names[:MAX_LIST])
    assert len(result.artifacts) == MAX_LIST


@pytest.mark.parametrize("field", ["contract_version", "revision"])
@pytest.mark.parametrize("value", [2**53, 10**5000], ids=["2**53", "10**5000"])
def test_a_grant_number_past_the_largest_exact_json_integer_is_invalid(
    field: str, value: int
) -> None:
    # Unbounded, 10**5000 was a bare ValueError out of `sign` (Python writes at
    # most 4,300 digits), and 2**200 was signed, admitted and stored.
    fields = grant_for().model_dump()
    fields[field] = value
    _invalid(lambda: Grant(**fields), field)
    store = MemoryStore()
    warden = Authority(store, grants=VERIFIER)
    before = store_snapshot(store)
    signed = SIGNER.sign(grant_for()).model_dump()
    signed["grant"][field] = value
    _invalid(
        lambda: warden.admit({**request().model_dump(), "authorization_snapshot": signed}, 1_000),
        f"request.authorization_snapshot.grant.{field}",
    )
    assert store_snapshot(store) == before


@pytest.mark.parametrize("signed", [None, {"grant": {}}, "grant", 1])
def test_verifying_what_is_not_a_signed_grant_is_invalid(signed: Any) -> None:
    _invalid(lambda: VERIFIER.verify(signed), "signed")
    _invalid(lambda: GrantVerifier.without_signatures().verify(signed), "signed")


class _BytesPath:
    def __fspath__(self) -> bytes:
        return b"spec.toml"


@pytest.mark.parametrize("path", ["spec\x00.toml", _BytesPath()], ids=["nul", "bytes-pathlike"])
def test_a_spec_path_no_file_can_have_is_a_spec_problem_not_a_value_error(path: Any) -> None:
    # A NUL in the path was a bare ValueError ("embedded null byte") out of both.
    with pytest.raises(WorkloadError) as refused:
        load_spec(path)
    assert refused.value.code == errors.SPEC_INVALID
    (problem,) = check_spec_file(path)
    assert problem.field == "(file)"
