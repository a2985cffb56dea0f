"""Hypothesis profiles: `ci` (the default here) and `thorough` (for long runs).

Select one with the environment variable `WORKWARDEN_HYPOTHESIS_PROFILE`:

    WORKWARDEN_HYPOTHESIS_PROFILE=thorough python -m pytest tests/test_stateful.py

`ci` keeps the whole stateful suite (every backend, and the mutant runs) to
about a minute and a half on two cores; `thorough` runs twenty times the
examples, each twice as long. Neither has a per-example deadline (the
stores' latency varies). A failure prints the shortest program Hypothesis
found, step by step, and the `@reproduce_failure` blob to replay it; failing
examples are also kept in the local example database, `.hypothesis/`, which
is never committed (it is in `.gitignore`).
"""

from __future__ import annotations

import os

from hypothesis import settings

from workwarden.testing.profiles import PROFILE_ENV
from workwarden.testing.profiles import PROFILES as SHIPPED

__all__ = ["PROFILES", "PROFILE_ENV"]

# The package's profiles (`workwarden.testing.profiles`), under their short names here.
for _name, _settings in SHIPPED.items():
    settings.register_profile(_name, _settings)

PROFILES = tuple(SHIPPED)
"""The profiles this repository registers."""

_chosen = os.environ.get(PROFILE_ENV, "ci")
if _chosen not in PROFILES:
    raise ValueError(f"{PROFILE_ENV}={_chosen!r}: choose one of {', '.join(PROFILES)}")
settings.load_profile(_chosen)
