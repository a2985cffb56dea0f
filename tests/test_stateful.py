"""The stateful suite (`workwarden.testing`) against every backend, and against a user's store.

Each backend of `tests/backends.py` runs the full machine: several writers and
workers, every rule, the invariants after every step and the shadow model
before every call, a fresh store per example. The example counts follow the
loaded Hypothesis profile (`ci` by default, `thorough` for long runs; see
`hypothesis_profiles.py`): the memory store, being fast, gets twice the
profile's examples, the durable stores the profile's count.

That the suite has teeth (it catches broken stores, authorities, deadline
checks and policies) and reaches every reachable edge is shown in
`test_stateful_mutants.py`.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from backends import BACKENDS
from workwarden.storage import MemoryStore
from workwarden.testing import authority_machine, run_authority_machine

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
