"""The fair-share bound as an always-property of a claimer's claims.

`check_fair_share(...)` follows one claimer across its claims: for each scope
it counts the claims that went to other scopes since the claimer last served
it, while it had claimable work at each of those claims. A scope without work
at a claim, or served by it, starts again from zero. The count never passes
the ledger's bound (`FairShare.bound`, from `[fairness]`): `fair_share_bound`.
The scheduling universe of the model checker (`workwarden check
--scheduling`) and the flood benchmark (`bench/fairness.py`) both count with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workwarden.statemachine.properties.registry import Violation

__all__ = ["check_fair_share"]


def check_fair_share(
    claimer: str,
    scopes: Sequence[str],
    waits: Sequence[int],
    waiting: Sequence[bool],
    served: str,
    bounds: Mapping[str, int],
) -> tuple[tuple[int, ...], list[Violation]]:
    """The waits after a claim of `served`, and a violation for each scope past its bound.

    `waits[i]` is how many claims went to other scopes while `scopes[i]` had
    work, before this claim; `waiting[i]` whether it had claimable work at
    this claim.
    """
    after: list[int] = []
    out: list[Violation] = []
    for scope, waited, has_work in zip(scopes, waits, waiting, strict=True):
        if scope == served or not has_work:
            after.append(0)
            continue
        after.append(waited + 1)
        if waited + 1 > bounds[scope]:
            out.append(
                Violation(
                    "fair_share_bound",
                    None,
                    f"{claimer} made {waited + 1} claims of other scopes while {scope!r}"
                    f" had claimable work; its bound is {bounds[scope]}",
                )
            )
    return tuple(after), out
