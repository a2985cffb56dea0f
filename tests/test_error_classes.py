"""Refusals a program can sort: every catalogue code has a class, and the error carries it."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import VERIFIER, request
from workwarden.statemachine import Authority, WorkloadError, default_spec, errors
from workwarden.statemachine.spec import check_spec_file, raised_codes, shipped_spec_text
from workwarden.statemachine.spec_model import ERROR_CLASSES
from workwarden.storage import MemoryStore


def test_every_code_the_core_raises_has_a_class_in_the_catalogue() -> None:
    catalogue = default_spec().errors
    for code in raised_codes():
        assert catalogue[code].error_class in ERROR_CLASSES
        assert WorkloadError(code, "m").error_class == catalogue[code].error_class


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errors.STALE_FENCE, "attempt_over"),
        (errors.LEASE_EXPIRED, "attempt_over"),
        (errors.TIMED_OUT, "attempt_over"),
        (errors.CONFLICT, "conflict_retry_now"),
        (errors.STORAGE_FAILURE, "retry_later"),
        (errors.INVALID, "fix_request"),
        (errors.TRANSITION_DENIED, "give_up"),
    ],
)
def test_a_worker_can_tell_an_attempt_that_is_over_from_one_to_retry(
    code: str, expected: str
) -> None:
    assert WorkloadError(code, "m").error_class == expected


def test_a_stale_worker_is_told_its_attempt_is_over() -> None:
    warden = Authority(MemoryStore(), grants=VERIFIER)
    workload_id = warden.admit(request(), 10_000).workload.workload_id
    first = warden.claim(workload_id, "w1", {"email:send"}, 11_000, lease_ms=1_000)
    warden.recover_expired(12_000)
    warden.claim(workload_id, "w2", {"email:send"}, 13_000, lease_ms=1_000)
    with pytest.raises(WorkloadError) as refused:
        warden.start(workload_id, first.fence, 13_500)
    assert refused.value.error_class == "attempt_over"


def test_an_unknown_code_has_no_class() -> None:
    assert WorkloadError("SOMETHING_ELSE", "m").error_class is None


def test_a_spec_may_not_give_a_shipped_code_another_class(tmp_path: Path) -> None:
    text = shipped_spec_text().replace(
        'action = "retry_later"\nclass = "conflict_retry_now"',
        'action = "retry_later"\nclass = "retry_later"',
    )
    path = tmp_path / "copy.toml"
    path.write_text(text, encoding="utf-8")
    problems = check_spec_file(path)
    assert [(p.field, p.message) for p in problems] == [
        (
            "errors.WORKLOAD_CONFLICT.class",
            "WORKLOAD_CONFLICT is of class 'conflict_retry_now' in every spec"
            " (programs sort by it)",
        )
    ]
