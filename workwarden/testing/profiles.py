"""The suite's Hypothesis profiles, `ci` and `thorough`, and how a run picks one.

`ci` is 100 examples of 50 steps each; `thorough` 2,000 examples of 100 steps,
for long runs. Neither has a per-example deadline (a store's latency varies);
both print the `@reproduce_failure` blob of a failure and report only the first
bug a run finds (one broken store method shows up as several failures
otherwise, each shrunk in turn). They are registered with Hypothesis as
`workwarden-ci` and `workwarden-thorough` (Hypothesis has a `ci` profile of
its own).

Pick one for `authority_machine(...).TestCase` and `run_authority_machine`
with the environment variable `WORKWARDEN_HYPOTHESIS_PROFILE` (`ci` or
`thorough`; any other value is refused when the machine is built). Unset,
the suite runs under the Hypothesis profile in force, as any Hypothesis test
does (`settings.load_profile(...)`, `--hypothesis-profile`); `settings=` of
`run_authority_machine` wins over both.
"""

from __future__ import annotations

import os

from hypothesis import settings

from workwarden.statemachine import errors

__all__ = ["PROFILES", "PROFILE_ENV", "chosen_profile", "profile"]

PROFILE_ENV = "WORKWARDEN_HYPOTHESIS_PROFILE"
"""The environment variable that names the profile a run takes (`ci` or `thorough`)."""

_CI = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    report_multiple_bugs=False,
)

PROFILES: dict[str, settings] = {
    "ci": _CI,
    "thorough": settings(_CI, max_examples=2_000, stateful_step_count=100),
}
"""The profiles by their short names."""

for _name, _settings in PROFILES.items():
    settings.register_profile(f"workwarden-{_name}", _settings)


def profile(name: str) -> settings:
    """The settings of profile `name` (`ci` or `thorough`), or `WORKLOAD_INVALID`."""
    found = PROFILES.get(name) if isinstance(name, str) else None
    if found is None:
        raise errors.bad_argument(
            PROFILE_ENV, f"no profile {name!r}: choose one of {', '.join(PROFILES)}"
        )
    return found


def chosen_profile() -> settings | None:
    """The profile `WORKWARDEN_HYPOTHESIS_PROFILE` names, or None when it is unset."""
    name = os.environ.get(PROFILE_ENV)
    return None if not name else profile(name)
