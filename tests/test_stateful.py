"""The stateful suite (`workwarden.testing`) against every backend, and against a user's store.

Each backend of `tests/backends.py` runs the full machine: several writers and
workers, every rule, the invariants after every step and the shadow model
before every call, a fresh store per example. The example counts follow the
loaded Hypothesis profile (`ci` by default, `thorough` for long runs; see
`hypothesis_profiles.py`): the memory store, being fast, gets twice the
profile's examples, the durable stores the profile's count.

That the suite has teeth (it catches broken stores, authorities, deadline
checks and policies) and reaches every reachable edge is shown in
`test_stateful_mutants.py`. Its batch rules take the batch path over a store
that is a `BatchStore` and the one-call path over one that is not: the
recording wrapper it puts around the store offers batches exactly when the
store does, which the last tests here pin down.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from backends import BACKENDS
from support import CAPS, VERIFIER, request
from workwarden.statemachine import Authority, WorkloadError, errors
from workwarden.statemachine.commands import StartCommand
from workwarden.storage import MemoryStore
from workwarden.storage.base import BatchStore
from workwarden.storage.forwarding import ForwardingBatchStore, ForwardingStore, forwarding_store
from workwarden.testing import (
    RecordingBatchStore,
    authority_machine,
    recording_store,
    run_authority_machine,
)

#: How many of the profile's examples each backend runs (the memory store is fast).
SHARE = {"memory": 2.0}
DEFAULT_SHARE = 1.0


def suite_settings(backend: str) -> settings:
    """The loaded profile's settings, scaled for `backend`."""
    base = settings.default
    examples = max(1, round(base.max_examples * SHARE.get(backend, DEFAULT_SHARE)))
    return settings(base, max_examples=examples, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_write_keeps_the_invariants_and_the_shadow_model_agrees(backend: str) -> None:
    run_authority_machine(BACKENDS[backend], settings=suite_settings(backend))


class TeamStore(MemoryStore):
    """Stands for a user's own backend: any class that keeps the `Store` protocol.

    Its factory is the class itself, called once per example (no context
    manager): the machine closes each store when its example ends.
    """


TestATeamsOwnStore = authority_machine(TeamStore).TestCase
TestATeamsOwnStore.settings = settings(suite_settings("team"), max_examples=50)


@pytest.mark.parametrize("made", [None, "store.db", MemoryStore])
def test_a_factory_that_gives_no_store_is_refused_naming_what_it_gave(made: object) -> None:
    with pytest.raises(WorkloadError) as caught:
        run_authority_machine(lambda: made, settings=settings(max_examples=1))  # type: ignore[arg-type, return-value]
    assert caught.value.code == errors.INVALID
    assert caught.value.details["field"] == "store_factory"
    what = "the class MemoryStore" if made is MemoryStore else type(made).__name__
    assert f"returned {what}, not a store" in caught.value.message


def test_a_store_a_factory_yields_is_closed_before_its_context_is_exited() -> None:
    events: list[str] = []

    class Noted(MemoryStore):
        def close(self) -> None:
            events.append("closed")
            super().close()

    @contextlib.contextmanager
    def fresh_store() -> Iterator[MemoryStore]:
        events.append("entered")
        yield Noted()
        events.append("exited")

    run_authority_machine(fresh_store, settings=settings(max_examples=3, database=None))
    assert events
    assert events == ["entered", "closed", "exited"] * (len(events) // 3)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"writers": 0}, "writers"),
        ({"writers": True}, "writers"),
        ({"writers": 10**9}, "writers"),
        ({"workers": "3"}, "workers"),
        ({"spec": "specs/workload.toml"}, "spec"),
        ({"shadow": "yes"}, "shadow"),
        ({"coverage": 5}, "coverage"),
    ],
)
def test_a_bad_option_is_refused_naming_it_when_the_machine_is_built(
    options: dict[str, object], field: str
) -> None:
    with pytest.raises(WorkloadError) as caught:
        authority_machine(MemoryStore, **options)  # type: ignore[arg-type]
    assert caught.value.code == errors.INVALID
    assert caught.value.details["field"] == field


def test_a_store_without_batches_runs_the_batch_rules_one_call_at_a_time() -> None:
    # A ForwardingStore offers no batch methods: the authority's batch calls
    # fall back to one call per workload, with the same answers.
    def factory() -> ForwardingStore:
        return ForwardingStore(MemoryStore())

    run_authority_machine(factory, settings=settings(suite_settings("memory"), max_examples=30))


def test_the_recording_wrapper_offers_batches_exactly_when_the_store_does() -> None:
    plain = ForwardingStore(MemoryStore())
    assert not isinstance(plain, BatchStore)
    assert not isinstance(recording_store(plain), BatchStore)
    assert not isinstance(forwarding_store(plain), BatchStore)
    assert isinstance(recording_store(MemoryStore()), BatchStore)
    assert isinstance(forwarding_store(MemoryStore()), ForwardingBatchStore)
    with pytest.raises(TypeError, match="not a BatchStore"):
        ForwardingBatchStore(plain)


def test_every_version_a_batch_commits_is_recorded() -> None:
    store = recording_store(MemoryStore())
    assert isinstance(store, RecordingBatchStore)
    authority = Authority(store, grants=VERIFIER)
    authority.admit_many([request(idempotency_key=f"k{i}") for i in range(3)], 10_000)
    claims = authority.claim_many("t", "app", "w", CAPS, 10_001, 60_000, 3)
    starts = [StartCommand(workload_id=c.workload_id, fence=c.fence) for c in claims]
    authority.report_many(starts, 10_002)
    audit = store.audit_log()
    assert len(audit) == 9
    assert sorted(store.versions) == sorted((r.key, r.version) for r in audit)
    for record in audit:
        doc_text = store.versions[(record.key, record.version)]
        assert record.digest == hashlib.sha256(doc_text.encode()).hexdigest()
    assert store.batch_conflicts == 0
