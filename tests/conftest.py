"""Fixtures shared by every suite: a fresh store of each backend, and an authority over it."""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis_profiles  # noqa: F401  (registers the profiles, loads `ci` or the chosen one)
import pytest

from backends import BACKENDS
from support import authority as make_authority
from workwarden.statemachine import Authority
from workwarden.storage import Store


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh, empty store of each backend in turn."""
    with BACKENDS[request.param]() as fresh:
        yield fresh


@pytest.fixture
def authority(store: Store) -> Authority:
    """An authority over the fresh store, verifying the fixture key's signatures."""
    return make_authority(store)


@pytest.fixture
def second_authority(store: Store) -> Authority:
    """A second, independent writer over the same store."""
    return make_authority(store)
