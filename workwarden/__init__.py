"""workwarden: a formally-checked state machine toolkit for durable work.

The library lives in `workwarden.statemachine` (spec, core, authority) and
`workwarden.storage` (the store protocol and its backends); the worker
runtime is `workwarden.runtime` (`App`, `Job`, `Retry`, `Fail`, `Worker`,
`Sweeper`, re-exported here, imported when first asked for); the command
line is `workwarden` (`workwarden.cli`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from workwarden.runtime import App, Fail, Job, Retry, Sweeper, Worker

__all__ = ["App", "Fail", "Job", "Retry", "Sweeper", "Worker", "__version__"]

_RUNTIME = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    # The runtime is imported when one of its names is first asked for, not with the
    # package: `import workwarden.storage` and the command's entry point stay quick.
    if name in _RUNTIME:
        from workwarden import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'workwarden' has no attribute {name!r}")
