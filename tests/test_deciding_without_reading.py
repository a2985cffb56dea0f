"""Deciding on a version not read just now: the write confirms it; a refusal never comes of it.

An authority built with `remember=N` decides a command on the version it last
wrote itself, and `claim_next` on the candidate page it read. Each rule here
holds on every backend: the version another writer moved on is never
trusted, a refusal is decided on a fresh read, an answer that writes nothing
is never given from memory, and a lone worker's calls read nothing.
"""

from __future__ import annotations

import pytest

from support import CAPS, VERIFIER, request, store_snapshot
from workwarden.statemachine import Authority, WorkloadError
from workwarden.storage import ForwardingStore, Store, StoredDocument

LEASE = 1_000
T = 10_000  # the grant is active from 1,000


class CountingReads(ForwardingStore):
    """A store that counts the documents read one by one (`read` and `find_result`)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reads = 0

    def read(self, key: str) -> StoredDocument | None:
        self.reads += 1
        return super().read(key)

    def find_result(self, result_id: str) -> str | None:
        self.reads += 1
        return super().find_result(result_id)


def remembering(store: Store) -> Authority:
    return Authority(store, grants=VERIFIER, remember=8)


def test_a_lone_workers_lifecycle_reads_nothing_when_the_authority_remembers(
    store: Store,
) -> None:
    counted = CountingReads(store)
    warden = remembering(counted)
    admitted = warden.admit(request(), T)
    wid = admitted.workload.workload_id
    claim = warden.claim(wid, "w1", CAPS, T + 20, LEASE)
    warden.start(wid, claim.fence, T + 30)
    warden.heartbeat(wid, claim.fence, T + 40, LEASE)
    warden.complete(wid, claim.fence, "result-1", {"sent": True}, T + 50)
    assert counted.reads == 0
    assert warden.get(wid).state == "SUCCEEDED"


def test_claim_next_decides_on_the_candidate_page_without_reading_it_again(
    store: Store,
) -> None:
    counted = CountingReads(store)
    warden = Authority(counted, grants=VERIFIER)
    warden.admit(request(), T)
    before = counted.reads
    claim = warden.claim_next("t", "app", "w1", CAPS, T + 20, LEASE)
    assert claim is not None
    assert counted.reads == before


def test_a_version_another_writer_moved_on_is_decided_again_on_a_fresh_read(
    store: Store,
) -> None:
    # The first worker's authority remembers its claim; meanwhile the lease
    # lapses, another writer recovers the work and hands it to a second worker.
    first = remembering(store)
    other = Authority(store, grants=VERIFIER)
    wid = first.admit(request(), T).workload.workload_id
    lost = first.claim(wid, "w1", CAPS, T + 20, LEASE)
    other.recover_expired(T + 20 + LEASE)
    taken = other.claim(wid, "w2", CAPS, T + 30 + LEASE, LEASE)
    # Decided on the remembered version, the second worker's fence would be
    # refused as stale; on the committed one it is the current claim.
    attempt = first.start(wid, taken.fence, T + 40 + LEASE)
    assert attempt.worker_id == "w2"
    # And the first worker's fence, valid in the remembered version, is refused.
    with pytest.raises(WorkloadError) as refused:
        first.complete(wid, lost.fence, "result-1", {}, T + 50 + LEASE)
    assert refused.value.code == "WORKLOAD_STALE_FENCE"


def test_an_answer_that_writes_nothing_is_never_given_from_memory(store: Store) -> None:
    first = remembering(store)
    other = Authority(store, grants=VERIFIER)
    wid = first.admit(request(), T).workload.workload_id
    held = first.claim(wid, "w1", CAPS, T + 20, LEASE)
    other.timeout(wid, "operator-1", T + 30)
    # Read through a fence the remembered version still honours: the
    # committed version holds no claim, so the context is refused, not served.
    with pytest.raises(WorkloadError) as refused:
        first.execution_context(wid, held.fence, T + 40)
    assert refused.value.code == "WORKLOAD_CLAIM_INVALID"


def test_a_refusal_from_a_fresh_read_changes_nothing_after_a_stale_guess(store: Store) -> None:
    first = remembering(store)
    other = Authority(store, grants=VERIFIER)
    wid = first.admit(request(), T).workload.workload_id
    claim = first.claim(wid, "w1", CAPS, T + 20, LEASE)
    other.timeout(wid, "operator-1", T + 30)
    committed = store_snapshot(store)
    with pytest.raises(WorkloadError):
        first.start(wid, claim.fence, T + 40)
    assert store_snapshot(store) == committed


def test_remember_must_be_a_whole_number_of_writes(store: Store) -> None:
    for wrong in (-1, True, 2.5):
        with pytest.raises(ValueError, match="remember"):
            Authority(store, grants=VERIFIER, remember=wrong)  # type: ignore[arg-type]
