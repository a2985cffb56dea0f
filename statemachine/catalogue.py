"""The shipped error catalogue's classes, for `WorkloadError.error_class`.

A program sorts a refusal by its class rather than by lists of codes:
`attempt_over` (stop working on the attempt: its claim is gone),
`conflict_retry_now` (read again and call again at once), `retry_later` (call
again with the same arguments later), `fix_request` (the request is wrong),
`give_up` (the call cannot succeed). The classes are read from the
`[errors]` table of the shipped spec, the one place that owns them; a spec
file may not give a shipped code another class (`spec validate` says so).
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources

__all__ = ["error_class", "shipped_classes"]


@cache
def shipped_classes() -> dict[str, str]:
    """Code -> class, from the shipped spec's error catalogue."""
    text = resources.files("workwarden.specs").joinpath("workload.toml").read_text("utf-8")
    table = tomllib.loads(text)["errors"]
    return {code: str(entry["class"]) for code, entry in table.items()}


def error_class(code: str) -> str | None:
    """The class of a catalogue code (None for a code the shipped catalogue lacks)."""
    return shipped_classes().get(code)
