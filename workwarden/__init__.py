"""workwarden: a formally-checked state machine toolkit for durable work.

The library lives in `workwarden.statemachine` (spec, core, authority) and
`workwarden.storage` (the store protocol and its backends); the worker
runtime is `workwarden.runtime` (`App`, `Job`, `Retry`, `Fail`, `Worker`,
`Sweeper`, re-exported here); the command line is `workwarden`
(`workwarden.cli`).
"""

__version__ = "0.1.0"

from workwarden.runtime import App, Fail, Job, Retry, Sweeper, Worker

__all__ = ["App", "Fail", "Job", "Retry", "Sweeper", "Worker", "__version__"]
