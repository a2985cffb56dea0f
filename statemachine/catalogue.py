"""What the shipped spec declares that is needed before any spec is loaded.

The error classes, for `WorkloadError.error_class`: a program sorts a refusal
by its class rather than by lists of codes: `attempt_over` (stop working on
the attempt: its claim is gone), `conflict_retry_now` (read again and call
again at once), `retry_later` (call again with the same arguments later),
`fix_request` (the request is wrong), `give_up` (the call cannot succeed).
A spec file may not give a shipped code another class (`spec validate` says so).

The failure kinds the default retry policy retries (`[failures.kinds]`, those
with `retry_by_default = true`): a request's retry policy is built when the
request is, before a spec is chosen, so every spec keeps the shipped default.

Both are read from the shipped spec (`specs/workload.toml`), the one place that
owns them, with `tomllib` alone, so the models can use them without loading the
whole spec.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["error_class", "shipped_classes", "shipped_default_retry_on"]


@cache
def _shipped() -> dict[str, Any]:
    text = resources.files("workwarden.specs").joinpath("workload.toml").read_text("utf-8")
    return tomllib.loads(text)


@cache
def shipped_classes() -> dict[str, str]:
    """Code -> class, from the shipped spec's error catalogue."""
    table = _shipped()["errors"]
    return {code: str(entry["class"]) for code, entry in table.items()}


def error_class(code: str) -> str | None:
    """The class of a catalogue code (None for a code the shipped catalogue lacks)."""
    return shipped_classes().get(code)


@cache
def shipped_default_retry_on() -> tuple[str, ...]:
    """The failure kinds the shipped spec's default retry policy retries, sorted."""
    kinds = _shipped()["failures"]["kinds"]
    return tuple(sorted(name for name, entry in kinds.items() if entry.get("retry_by_default")))
