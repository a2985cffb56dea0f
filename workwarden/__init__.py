"""workwarden: a formally-checked state machine toolkit for durable work.

The library lives in `workwarden.statemachine` (spec, core, authority) and
`workwarden.storage` (the store protocol and its backends); the command line
is `workwarden` (`workwarden.cli`).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
