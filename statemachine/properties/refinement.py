"""The property that holds the core to the spec's own data, step by step.

Its check is the checker's oracle (`statemachine/check/oracle.py`): every
step the checker explores is answered again from the spec file alone, and
the core's answer compared with it; a disagreement is reported under this
name with the shortest trace to it.
"""

from __future__ import annotations

__all__ = ["SPEC_REFINEMENT"]

SPEC_REFINEMENT = "spec_refinement"
"""The registered name of a step where the core and the spec's expected decision differ."""
