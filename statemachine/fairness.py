"""Fair share across tenants: in which order a claimer that serves many scopes asks them.

A worker may serve several tenants and applications at once. Which of them
its next claim is taken from is a declared policy (`[fairness]` in the spec):

- `round_robin`: every scope with claimable work in turn;
- `weighted`: each scope in proportion to its weight (`[fairness] weights`,
  by tenant or by `tenant/application`; `default_weight` for the rest).

Both are the same algorithm, stride scheduling (round robin is the case of
equal weights), over a small ledger the claimer keeps: for each scope its
*pass* and when it was last touched. A scope's *stride* is the least common
multiple of the weights divided by its weight. A claim tries the scopes in
order of pass, lowest first; a tie goes to the scope touched longest ago,
then to the one listed first. The first scope that yields a claim is served
and its pass moves on by its stride. A scope found empty on the way is moved
up to the lowest pass of the others plus its stride (never back), as if the
look had been its turn: idleness is never saved up to be spent later as a
burst, and an idle scope is looked at again within its share of the claims.

**The bound.** While scope A has claimable work (from the first claim that
finds it with work to the claim that serves it), at most
`bound(A) = sum over the other scopes B of ceil(w_B / w_A)` of a claimer's
claims go to other scopes before one goes to A: one claim of each other
scope under round robin (`n - 1`), and at most 3 claims of a weight-3 scope
before one of a weight-1 scope. The model checker holds the scheduler to
this bound in a universe of two tenants (`workwarden check --scheduling`,
property `fair_share_bound`), and `tests/test_fairness.py` holds the ledger
to it over random activity.

The order is deterministic given the store's contents, `now` and the
ledger: the same ledger asked of the same store at the same instant tries
the same scopes in the same order. The ledger is a claimer's, not the
store's: each worker keeps its own (`FairShare.to_dict` / `from_dict` to
keep it across restarts), so with W claimers each holding the bound, the
store-wide gap is at most W times it. A claim never reads or writes another
claimer's ledger, so fairness costs no extra write on the store.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workwarden.statemachine import errors, inputs

#: The most claims one call may ask for (as `batches.MAX_BATCH`).
_MAX_BATCH = 1000

__all__ = ["POLICIES", "FairScope", "FairShare", "Policy", "claim_fair", "spec_weight"]

Policy = Literal["round_robin", "weighted"]

#: The fairness policies a spec may declare.
POLICIES: tuple[Policy, ...] = ("round_robin", "weighted")


@dataclass(frozen=True, slots=True)
class FairScope:
    """A tenant and application a claimer serves."""

    tenant: str
    application: str

    @property
    def key(self) -> str:
        """`tenant/application`, as `[fairness] weights` and reports name it."""
        return f"{self.tenant}/{self.application}"

    @classmethod
    def of(cls, value: Any) -> FairScope:
        """A scope from a `FairScope`, a `(tenant, application)` pair or `"tenant/application"`.

        Anything else, or a name that is not a valid id, is `WORKLOAD_INVALID`.
        """
        if isinstance(value, FairScope):
            return value
        if isinstance(value, str) and value.count("/") == 1:
            value = tuple(value.split("/"))
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise errors.bad_argument(
                "scopes", "each scope is a (tenant, application) pair or 'tenant/application'"
            )
        tenant, application = inputs.as_full_scope(value[0], value[1])
        return cls(tenant, application)


class FairShare:
    """A claimer's fair-share ledger over the scopes it serves (see the module docstring).

    `scopes` break the last ties in the order given; `weights` maps a
    scope (a `FairScope`, a pair or `"tenant/application"`, as `scopes`
    are given) to its weight (an integer 1 or more; 1 when absent); a
    weight of a scope not served is refused. A ledger is
    used by one claimer at a time; `Authority.claim_fair` asks it for the
    order and tells it what was served.
    """

    def __init__(
        self,
        scopes: Iterable[Any],
        weights: Mapping[FairScope, int] | None = None,
        policy: Policy = "round_robin",
    ) -> None:
        if policy not in POLICIES:
            raise errors.bad_argument("policy", f"a fairness policy is one of {list(POLICIES)}")
        if isinstance(scopes, (str, bytes)) or not isinstance(scopes, Iterable):
            raise errors.bad_argument("scopes", "a list of (tenant, application) scopes")
        ordered: list[FairScope] = []
        named: set[FairScope] = set()
        for value in scopes:
            scope = FairScope.of(value)
            if scope in named:
                raise errors.bad_argument("scopes", f"{scope.key} is named twice")
            named.add(scope)
            ordered.append(scope)
        if not ordered:
            raise errors.bad_argument("scopes", "a fair claim serves at least one scope")
        self.policy: Policy = policy
        self.scopes: tuple[FairScope, ...] = tuple(ordered)
        given = _weights(weights, self.scopes)
        self.weights: dict[FairScope, int] = {}
        for scope in self.scopes:
            weight = given.get(scope, 1) if policy == "weighted" else 1
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise errors.bad_argument("weights", f"{scope.key}: a weight is an integer ≥ 1")
            self.weights[scope] = weight
        self.stride_unit = math.lcm(*self.weights.values())
        self.passes: dict[FairScope, int] = dict.fromkeys(self.scopes, 0)
        #: When each scope was last served or found empty (a count of `record` calls).
        self.touched: dict[FairScope, int] = dict.fromkeys(self.scopes, 0)
        self.records = 0

    @classmethod
    def from_spec(cls, spec: Any, scopes: Iterable[Any]) -> FairShare:
        """The ledger the spec's `[fairness]` table declares for `scopes`.

        A weight is looked up by `tenant/application`, then by `tenant`,
        then `default_weight`.
        """
        listed = [FairScope.of(value) for value in _as_list(scopes)]
        weights = {scope: spec_weight(spec, scope) for scope in listed}
        return cls(listed, weights, spec.data.fairness.policy)

    def serve(self, scopes: Iterable[Any], weights: Mapping[FairScope, int] | None = None) -> None:
        """Serve `scopes` too (those not served yet), after the ones served already.

        A new scope joins at the lowest pass of the others, so it is served
        next in its turn but brings no saved-up turns; `weights` gives the
        weights of new scopes (1 when absent; 1 always under round robin).
        The strides are kept in one unit: when a new weight changes their
        least common multiple, every pass is scaled with it.
        """
        added = [FairScope.of(value) for value in _as_list(scopes)]
        new = [scope for scope in dict.fromkeys(added) if scope not in self.passes]
        if not new:
            return
        given = _weights(weights, (*self.scopes, *new))
        floor = min(self.passes.values())
        for scope in new:
            weight = given.get(scope, 1) if self.policy == "weighted" else 1
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise errors.bad_argument("weights", f"{scope.key}: a weight is an integer ≥ 1")
            self.weights[scope] = weight
            self.passes[scope] = floor
            self.touched[scope] = 0
        unit = math.lcm(*self.weights.values())
        if unit != self.stride_unit:
            factor = unit // self.stride_unit
            self.passes = {scope: value * factor for scope, value in self.passes.items()}
            self.stride_unit = unit
        self.scopes = (*self.scopes, *new)

    def stride(self, scope: FairScope) -> int:
        """How far a claim of `scope` moves its pass: the same for all under round robin."""
        return self.stride_unit // self.weights[scope]

    def order(self) -> list[FairScope]:
        """The scopes in the order the next claim tries them: lowest pass first, ties as given."""
        position = {scope: i for i, scope in enumerate(self.scopes)}
        return sorted(self.scopes, key=lambda s: (self.passes[s], self.touched[s], position[s]))

    def record(self, served: FairScope | None, empty: Collection[FairScope]) -> None:
        """Note one claim: `served` yielded it (None: none did); `empty` were tried and had none.

        The served scope's pass moves on by its stride. A scope found empty
        is moved to the lowest pass of the others (never back) plus its
        stride, as if the look had been its turn: it is looked at again in
        its share of the claims, and cannot save up turns while it is idle.
        """
        if served is not None and served not in self.passes:
            raise errors.bad_argument("served", "a scope not served by this ledger")
        if served is not None and served in empty:
            raise errors.bad_argument("served", "a served scope was not empty")
        empty = set(empty)
        unknown = [scope for scope in empty if scope not in self.passes]
        if unknown:
            raise errors.bad_argument("empty", "a scope not served by this ledger")
        self.records += 1
        if empty:
            floor = self._lowest_pass_but(empty)
            for scope in empty:
                self.passes[scope] = max(self.passes[scope], floor + self.stride(scope))
                self.touched[scope] = self.records
        if served is not None:
            self.passes[served] += self.stride(served)
            self.touched[served] = self.records

    def _lowest_pass_but(self, empty: set[FairScope]) -> int:
        """The lowest pass of the scopes not in `empty` (when there are none, the highest of
        `empty`'s)."""
        passes = self.passes
        if len(empty) == 1:
            # A claim finds one scope empty at a time: every pass but one copy of its own,
            # with no look-up per scope.
            (only,) = empty
            others = list(passes.values())
            others.remove(passes[only])
            return min(others) if others else passes[only]
        others = [value for scope, value in passes.items() if scope not in empty]
        return min(others) if others else max(passes[scope] for scope in empty)

    def bound(self, scope: Any) -> int:
        """At most how many claims go to other scopes between two of `scope`'s while it has work."""
        target = FairScope.of(scope)
        if target not in self.weights:
            raise errors.bad_argument("scope", f"{target.key} is not served by this ledger")
        mine = self.weights[target]
        return sum(-(-w // mine) for s, w in self.weights.items() if s != target)

    def copy(self) -> FairShare:
        """An independent ledger with the same scopes, weights and passes."""
        # Made field by field: this ledger's scopes and weights were checked when it was.
        twin = object.__new__(type(self))
        twin.policy = self.policy
        twin.scopes = self.scopes
        twin.weights = dict(self.weights)
        twin.stride_unit = self.stride_unit
        twin.passes = dict(self.passes)
        twin.touched = dict(self.touched)
        twin.records = self.records
        return twin

    def to_dict(self) -> dict[str, Any]:
        """The ledger as JSON-ready data: policy, scopes in order, weights, passes, last touches."""
        return {
            "policy": self.policy,
            "scopes": [s.key for s in self.scopes],
            "weights": {s.key: self.weights[s] for s in self.scopes},
            "passes": {s.key: self.passes[s] for s in self.scopes},
            "touched": {s.key: self.touched[s] for s in self.scopes},
            "records": self.records,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FairShare:
        """A ledger from `to_dict` output (`WORKLOAD_INVALID` when it is not one)."""
        if not isinstance(data, Mapping):
            raise errors.bad_argument("ledger", "a fair-share ledger is a mapping")
        scopes = [FairScope.of(key) for key in _as_list(data.get("scopes"))]
        weights_in = data.get("weights", {})
        passes_in = data.get("passes", {})
        if not isinstance(weights_in, Mapping) or not isinstance(passes_in, Mapping):
            raise errors.bad_argument("ledger", "weights and passes are mappings by scope")
        ledger = cls(
            scopes, {s: weights_in.get(s.key, 1) for s in scopes}, data.get("policy", "round_robin")
        )
        for scope in scopes:
            value = passes_in.get(scope.key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise errors.bad_argument("ledger", f"{scope.key}: a pass is an integer ≥ 0")
            ledger.passes[scope] = value
        touched_in = data.get("touched", {})
        records = data.get("records", 0)
        if not isinstance(touched_in, Mapping) or type(records) is not int:
            raise errors.bad_argument("ledger", "touched is a mapping by scope, records an integer")
        for scope in scopes:
            value = touched_in.get(scope.key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= records:
                raise errors.bad_argument("ledger", f"{scope.key}: touched is a record count")
            ledger.touched[scope] = value
        ledger.records = records
        return ledger

    def __repr__(self) -> str:
        return f"FairShare({self.to_dict()!r})"


def claim_fair(
    authority: Any,
    share: FairShare,
    worker_id: Any,
    capabilities: Any,
    now: int,
    lease_ms: Any,
    limit: Any = 1,
    request_id: Any = None,
) -> list[Any]:
    """Claim up to `limit` workloads across the ledger's scopes; see `Authority.claim_fair`.

    The claims are planned on a copy of the ledger (as if every scope had
    work), grouped by scope, and asked of each scope in the plan's order (one
    `claim_many` per scope, `claim_next` for one); a scope that yields fewer
    than planned is empty, noted in the ledger, and the rest is planned
    again over the others.

    Without a request id, each claim the store grants is noted in the ledger
    as it is answered, so a refusal that ends the call (a storage failure)
    leaves the ledger true to what was claimed. With one, the call works on a
    copy of the ledger and keeps it only when the call ends: a call whose
    reply was lost (`WORKLOAD_OUTCOME_UNKNOWN`, a storage failure) leaves the
    ledger as it was, so the same call made again plans the same scopes in
    the same order under the same sub-request ids, and each is answered with
    the claims it made (`own_claim`): nothing is claimed twice, and the
    ledger counts each claim once.
    """
    if not isinstance(share, FairShare):
        raise errors.bad_argument("share", "a FairShare ledger (FairShare.from_spec)")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_BATCH:
        raise errors.bad_argument("limit", f"limit must be a whole number from 1 to {_MAX_BATCH}")
    if request_id is not None:
        inputs.as_name(request_id, "request_id")
    # Read once: every scope's call is made with the same names (a generator
    # handed to the first would leave the others none).
    capabilities = inputs.as_names(capabilities, "capabilities")
    kept = share
    if request_id is not None:
        share = share.copy()
    claims: list[Any] = []
    empty: set[FairScope] = set()
    turns = _Turns(share)
    calls = 0
    while len(claims) < limit and len(empty) < len(share.scopes):
        for scope, wanted in turns.plan(empty, limit - len(claims)):
            sub_id = None if request_id is None else f"{request_id}.{calls}"
            calls += 1
            if wanted == 1:
                one = authority.claim_next(
                    scope.tenant,
                    scope.application,
                    worker_id,
                    capabilities,
                    now,
                    lease_ms,
                    request_id=sub_id,
                )
                got = [] if one is None else [one]
            else:
                got = authority.claim_many(
                    scope.tenant,
                    scope.application,
                    worker_id,
                    capabilities,
                    now,
                    lease_ms,
                    wanted,
                    request_id=sub_id,
                )
            for claim in got:
                share.record(scope, ())
                turns.served(scope)
                claims.append(claim)
            if len(got) < wanted:
                share.record(None, (scope,))
                empty.add(scope)
                break
    if share is not kept:
        kept.passes, kept.touched, kept.records = share.passes, share.touched, share.records
    return claims


def spec_weight(spec: Any, scope: FairScope) -> int:
    """The weight `[fairness]` gives `scope`: by `tenant/application`, by tenant, or the default."""
    table = spec.data.fairness
    named = table.weights
    weight: int = named.get(scope.key, named.get(scope.tenant, table.default_weight))
    return weight


class _Turns:
    """The ledger's scopes on a heap by (pass, last touch, position): what `order()` sorts.

    Kept beside the ledger for one `claim_fair` call: `served` pushes a scope's new turn
    after the ledger records a claim of it; an entry whose pass and touch are no longer
    the scope's is stale and passed over, as is a scope found empty.
    """

    def __init__(self, share: FairShare) -> None:
        self.share = share
        self.position = {scope: i for i, scope in enumerate(share.scopes)}
        self.heap = [
            (share.passes[scope], share.touched[scope], i, scope)
            for i, scope in enumerate(share.scopes)
        ]
        heapq.heapify(self.heap)

    def served(self, scope: FairScope) -> None:
        """The ledger has recorded a claim of `scope`: its new turn."""
        share = self.share
        turn = (share.passes[scope], share.touched[scope], self.position[scope], scope)
        heapq.heappush(self.heap, turn)

    def plan(self, empty: set[FairScope], count: int) -> list[tuple[FairScope, int]]:
        """The next `count` claims by the ledger, as (scope, how many) in first-turn order.

        What `count` rounds of taking the first of `order()` not in `empty` and recording
        it served would give on a copy of the ledger: a round changes only the pass and
        touch of the scope at the top (ties go to the scope listed first, as in `order()`).
        A ledger whose class orders its scopes otherwise is planned by its own `order()`.
        """
        share = self.share
        if type(share).order is not FairShare.order:
            return _plan_by_order(share, empty, count)
        moved: dict[FairScope, tuple[int, int]] = {}

        def top(heap: list[tuple[int, int, int, FairScope]]) -> tuple[int, int, int, FairScope]:
            # The first turn still the scope's (in the ledger, or as `moved` in the plan) of
            # a scope not found empty; the stale and empty ones before it are dropped.
            while True:
                passed, touched, position, scope = heap[0]
                now = moved.get(scope) or (share.passes[scope], share.touched[scope])
                if scope not in empty and (passed, touched) == now:
                    return passed, touched, position, scope
                heapq.heappop(heap)

        # What is stale or empty at the ledger's top now stays so: dropped for good, not
        # once per plan (the caller plans only while a scope is not empty).
        top(self.heap)
        heap = list(self.heap)
        records = share.records
        wanted: dict[FairScope, int] = {}
        for _ in range(count):
            passed, _touched, position, scope = top(heap)
            records += 1
            turn = (passed + share.stride(scope), records)
            moved[scope] = turn
            heapq.heapreplace(heap, (*turn, position, scope))
            wanted[scope] = wanted.get(scope, 0) + 1
        return list(wanted.items())


def _plan_by_order(
    share: FairShare, empty: set[FairScope], count: int
) -> list[tuple[FairScope, int]]:
    """`_Turns.plan`, by `share.order()` on a copy of the ledger, one round at a time."""
    sim = share.copy()
    wanted: dict[FairScope, int] = {}
    for _ in range(count):
        scope = next(s for s in sim.order() if s not in empty)
        sim.record(scope, ())
        wanted[scope] = wanted.get(scope, 0) + 1
    return list(wanted.items())


def _weights(weights: Any, scopes: Sequence[FairScope]) -> dict[FairScope, Any]:
    """`weights` by scope: its keys read as scopes are (a `FairScope`, a pair or
    `"tenant/application"`), each one of `scopes`; anything else is `WORKLOAD_INVALID`.

    (A weight keyed by a scope's name was otherwise looked up by the scope and never
    found: the scope silently weighed 1.)
    """
    if weights is None:
        return {}
    if not isinstance(weights, Mapping):
        raise errors.bad_argument("weights", "weights map scopes to whole numbers ≥ 1")
    served = set(scopes)
    given: dict[FairScope, Any] = {}
    for key, weight in weights.items():
        try:
            scope = FairScope.of(key)
        except errors.WorkloadError:
            raise errors.bad_argument(
                "weights", f"{str(key)[:80]!r}: a weight's key is a scope"
            ) from None
        if scope not in served:
            raise errors.bad_argument("weights", f"{scope.key}: not a scope this ledger serves")
        given[scope] = weight
    return given


def _as_list(value: Any) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise errors.bad_argument("scopes", "a list of (tenant, application) scopes")
    return list(value)
