"""The scheduling universe: fair share across two tenants and a concurrency limit, checked.

`workwarden check --scheduling` explores every interleaving of a small world
in which the scheduler's declared guarantees can be broken:

- two tenants (`a` and `b` by default, application `app`) whose requesters
  admit up to a few workloads each, at any moment, in any order (a flood
  from one and a trickle from the other is one of the interleavings);
- workers, each serving both tenants through `Authority.claim_fair` with
  its own `FairShare` ledger (the spec's `[fairness]` policy and weights),
  each holding at most one claim, and finishing it (start, then complete);
- every workload of one concurrency key (`k`) whose limit is the universe's
  `limit` (the spec's `[concurrency]` limit for `k` is replaced by it);
- a clock that may jump past every lease, and a sweeper that recovers
  expired leases (a worker whose claim was recovered is fenced out).

Every step runs through a real `Authority` over a `MemoryStore` holding the
state's documents, so it is the real scheduler, the real core and the real
store check that are explored, not a model of them. Two properties are held:

- `claims_within_concurrency_limits` at every state: no more workloads of
  `k` hold a claim than `limit`;
- `fair_share_bound` at every claim: for each worker and each tenant with
  claimable work at that claim (a claim by the worker in that tenant would
  be granted), the worker's claims that went to the other tenant since its
  last claim of that tenant, while the tenant had work, stay within the
  ledger's `bound` (`workwarden.statemachine.fairness`).

A violation is reported with the path of actions that reaches it, which
`replay` runs again from the start and checks it breaks the same property.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.check.checker import refuse_max_states
from workwarden.statemachine.check.universe import (
    APPLICATION,
    CAPABILITY,
    CHECKER_KEY,
    CHECKER_KEY_ID,
)
from workwarden.statemachine.fairness import FairScope, FairShare
from workwarden.statemachine.grants import Grant, GrantSigner, GrantVerifier, Subject
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.inputs import parse_stored
from workwarden.statemachine.models import CreateWorkload, Fence, Workload
from workwarden.statemachine.properties.concurrency import check_concurrency
from workwarden.statemachine.properties.fairness import check_fair_share
from workwarden.statemachine.properties.registry import Violation
from workwarden.statemachine.spec import Spec
from workwarden.storage.base import AuditRecord, IndexFields
from workwarden.storage.memory import MemoryStore

__all__ = [
    "KEY",
    "SCHEDULING_MUTANTS",
    "SchedulingMutant",
    "SchedulingReport",
    "SchedulingUniverse",
    "check_scheduling",
    "replay",
]

#: The concurrency key every workload of the universe carries.
KEY = "k"
# Admissions are signed as the core's universe signs them, with the checker's key.
_SIGNER = GrantSigner(CHECKER_KEY_ID, CHECKER_KEY)
_VERIFIER = GrantVerifier({CHECKER_KEY_ID: CHECKER_KEY})
_REQUESTER = Subject(kind="service", id="requester")
_SEED = AuditRecord("seed", "-", 0, "checker", "seed", "-", APPLICATION, 0, "")


class _ListOrderShare(FairShare):
    """A ledger that always asks its scopes in the order listed: the first one's flood starves."""

    def order(self) -> list[FairScope]:
        return list(self.scopes)


class _UnlimitedStore(MemoryStore):
    """A memory store that writes a claim without counting its concurrency key's holders."""

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        unlimited = dataclasses.replace(index, concurrency_limit=None)
        return super().write(key, document, unlimited, expected_version, audit)


@dataclass(frozen=True)
class SchedulingMutant:
    """A deliberately broken scheduler part, to prove the scheduling check has teeth."""

    name: str
    breaks: str
    share_cls: type[FairShare] = FairShare
    store_cls: type[MemoryStore] = MemoryStore


#: The scheduling universe's mutants, by name (`workwarden check --scheduling --mutant NAME`).
SCHEDULING_MUTANTS: dict[str, SchedulingMutant] = {
    m.name: m
    for m in (
        SchedulingMutant(
            "ledger_in_list_order",
            "the claimer asks its scopes in list order, ignoring the ledger",
            share_cls=_ListOrderShare,
        ),
        SchedulingMutant(
            "store_ignores_concurrency_limits",
            "the store takes a claim without counting its key's holders",
            store_cls=_UnlimitedStore,
        ),
    )
}


def _whole(value: object) -> bool:
    """Is `value` an integer (and not a bool)?"""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SchedulingUniverse:
    """The bounds of the scheduling universe (`workwarden check --scheduling` options).

    `admissions` is how many workloads each tenant may admit, in tenant
    order (the first tenant is listed first in every ledger); `limit` is
    the concurrency limit of key `k` (None: the workloads carry no key);
    `ticks` bounds how often the clock jumps past every lease.
    """

    tenants: tuple[str, ...] = ("a", "b")
    admissions: tuple[int, ...] = (3, 1)
    workers: int = 2
    limit: int | None = 1
    ticks: int = 0
    lease_ms: int = 10

    def __post_init__(self) -> None:
        # The types first: a hand-edited trace is read into a universe, and a limit of
        # 1.5 or tenants spelled as one string must not be explored (or replayed) at all.
        if not isinstance(self.tenants, tuple) or not all(
            isinstance(tenant, str) and tenant for tenant in self.tenants
        ):
            raise errors.bad_argument("tenants", "tenants are a list of non-empty names")
        if not isinstance(self.admissions, tuple) or not all(_whole(n) for n in self.admissions):
            raise errors.bad_argument("admissions", "admissions are a list of whole numbers")
        for name in ("workers", "ticks", "lease_ms"):
            if not _whole(getattr(self, name)):
                raise errors.bad_argument(name, f"{name} is a whole number")
        if self.limit is not None and not _whole(self.limit):
            raise errors.bad_argument("limit", "a concurrency limit is a whole number (or none)")
        if len(self.tenants) != len(self.admissions) or not 1 <= len(self.tenants) <= 3:
            raise errors.bad_argument("tenants", "one to three tenants, each with its admissions")
        if len(set(self.tenants)) != len(self.tenants):
            raise errors.bad_argument("tenants", "tenants are named once each")
        if any(not 0 <= n <= 6 for n in self.admissions):
            raise errors.bad_argument("admissions", "each tenant admits 0 to 6 workloads")
        if not 1 <= self.workers <= 3:
            raise errors.bad_argument("workers", "the scheduling universe has 1 to 3 workers")
        if self.limit is not None and not 1 <= self.limit <= 6:
            raise errors.bad_argument("limit", "a concurrency limit of 1 to 6 (or none)")
        if not 0 <= self.ticks <= 3:
            raise errors.bad_argument("ticks", "0 to 3 clock jumps")

    def to_dict(self) -> dict[str, Any]:
        """The universe as JSON-ready data."""
        return {
            "tenants": list(self.tenants),
            "admissions": list(self.admissions),
            "workers": self.workers,
            "limit": self.limit,
            "ticks": self.ticks,
            "lease_ms": self.lease_ms,
        }


@dataclass(frozen=True, slots=True)
class _State:
    """One state: the instant, the documents by key, and what each worker and tenant holds."""

    now: int
    docs: tuple[tuple[str, str], ...]
    admitted: tuple[int, ...]
    #: Per worker: its claim (workload id, claim id, token) or None.
    holds: tuple[tuple[str, str, int] | None, ...]
    #: Per worker: its ledger's passes and touches, in scope order, and its record count.
    ledgers: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]
    #: Per worker, per tenant: the worker's claims of other tenants while this one waited.
    waits: tuple[tuple[int, ...], ...]
    ticks: int


@dataclass
class SchedulingReport:
    """What an exploration found: its size, its time, and each property's first violation."""

    universe: SchedulingUniverse
    policy: str
    states: int = 0
    transitions: int = 0
    depth: int = 0
    complete: bool = True
    seconds: float = 0.0
    claims: int = 0
    #: The largest wait seen per tenant (claims of others while it had work), and its bound.
    largest_wait: dict[str, int] = field(default_factory=dict)
    bounds: dict[str, int] = field(default_factory=dict)
    violations: list[tuple[Violation, list[str]]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (traces as lists of action labels)."""
        return {
            "universe": self.universe.to_dict(),
            "policy": self.policy,
            "states": self.states,
            "transitions": self.transitions,
            "depth": self.depth,
            "complete": self.complete,
            "seconds": round(self.seconds, 3),
            "claims": self.claims,
            "largest_wait": dict(self.largest_wait),
            "bounds": dict(self.bounds),
            "violations": [
                {
                    "property": v.property,
                    "key": v.key,
                    "message": v.message,
                    "trace": trace,
                }
                for v, trace in self.violations
            ],
        }


class _World:
    """The universe's steps: each action run on a real authority over the state's documents."""

    def __init__(
        self, spec: Spec, universe: SchedulingUniverse, mutant: SchedulingMutant | None = None
    ) -> None:
        self.universe = universe
        self.store_cls = MemoryStore if mutant is None else mutant.store_cls
        share_cls = FairShare if mutant is None else mutant.share_cls
        limits = dict(spec.data.concurrency.limits)
        if universe.limit is None:
            limits.pop(KEY, None)
        else:
            limits[KEY] = universe.limit
        concurrency = spec.data.concurrency.model_copy(update={"limits": limits})
        self.spec = Spec(spec.data.model_copy(update={"concurrency": concurrency}), spec.source)
        self.scopes = tuple(FairScope(t, APPLICATION) for t in universe.tenants)
        self.template = share_cls.from_spec(self.spec, self.scopes)
        self.bounds = {s.tenant: self.template.bound(s) for s in self.scopes}
        self._index: dict[str, Any] = {}

    def initial(self) -> _State:
        ledger = (tuple(0 for _ in self.scopes), tuple(0 for _ in self.scopes), 0)
        return _State(
            now=0,
            docs=(),
            admitted=tuple(0 for _ in self.scopes),
            holds=tuple(None for _ in range(self.universe.workers)),
            ledgers=tuple(ledger for _ in range(self.universe.workers)),
            waits=tuple(tuple(0 for _ in self.scopes) for _ in range(self.universe.workers)),
            ticks=0,
        )

    def actions(self, state: _State) -> Iterator[str]:
        for i, tenant in enumerate(self.universe.tenants):
            if state.admitted[i] < self.universe.admissions[i]:
                yield f"admit {tenant}"
        for w, hold in enumerate(state.holds):
            yield f"claim w{w}" if hold is None else f"finish w{w}"
        if state.ticks < self.universe.ticks and any(h is not None for h in state.holds):
            yield "tick"
        yield "recover"

    # -- the store of a state -------------------------------------------------

    def store(self, state: _State) -> MemoryStore:
        store = self.store_cls()
        for key, document in state.docs:
            index = self._index.get(document)
            if index is None:
                workload = Workload.model_validate_json(document)
                index = self._index[document] = index_fields(self.spec, workload)
            store.write(key, document, index, None, _SEED)
        return store

    def authority(self, store: MemoryStore) -> Authority:
        return Authority(store, grants=_VERIFIER, spec=self.spec)

    def request(self, tenant: str, number: int) -> CreateWorkload:
        grant = Grant(
            id="grant",
            issuer=Subject(kind="human", id="ops"),
            subject=_REQUESTER,
            tenant_id=tenant,
            application_id=APPLICATION,
            issued_at=0,
            expires_at=2**40,
        )
        return CreateWorkload(
            tenant_id=tenant,
            application_id=APPLICATION,
            environment="check",
            definition_id="job",
            definition_revision="r1",
            trigger="check",
            input={"n": number},
            requested_by=_REQUESTER,
            authorization_snapshot=_SIGNER.sign(grant),
            capability_snapshot=(CAPABILITY,),
            idempotency_key=f"{tenant}-{number}",
            concurrency_key=KEY if self.universe.limit is not None else None,
        )

    def ledger(self, state: _State, worker: int) -> FairShare:
        share = self.template.copy()
        passes, touched, records = state.ledgers[worker]
        share.passes = dict(zip(self.scopes, passes, strict=True))
        share.touched = dict(zip(self.scopes, touched, strict=True))
        share.records = records
        return share

    def has_work(self, state: _State, scope: FairScope) -> bool:
        """Would a claim in `scope` now be granted (tried on a copy of the state's store)?"""
        probe = self.authority(self.store(state))
        claim = probe.claim_next(
            scope.tenant, scope.application, "probe", (CAPABILITY,), state.now, 1
        )
        return claim is not None

    # -- one step ---------------------------------------------------------------

    def step(self, state: _State, action: str) -> tuple[_State, list[Violation], bool]:
        """The state `action` leads to, the step's violations, and whether it claimed."""
        store = self.store(state)
        authority = self.authority(store)
        verb, _, arg = action.partition(" ")
        holds = list(state.holds)
        ledgers = list(state.ledgers)
        waits = list(state.waits)
        admitted = list(state.admitted)
        now, ticks = state.now, state.ticks
        found: list[Violation] = []
        claimed = False
        if verb == "admit":
            i = self.universe.tenants.index(arg)
            authority.admit(self.request(arg, admitted[i]), now)
            admitted[i] += 1
        elif verb == "claim":
            w = int(arg[1:])
            waiting = [self.has_work(state, scope) for scope in self.scopes]
            share = self.ledger(state, w)
            got = authority.claim_fair(share, f"w{w}", (CAPABILITY,), now, self.universe.lease_ms)
            ledgers[w] = _canonical(share, self.scopes)
            if got:
                claimed = True
                claim = got[0]
                holds[w] = (claim.workload_id, claim.claim_id, claim.fencing_token)
                served = authority.get(claim.workload_id).tenant_id
                waits[w], unfair = check_fair_share(
                    f"worker w{w}", self.universe.tenants, waits[w], waiting, served, self.bounds
                )
                found.extend(unfair)
        elif verb == "finish":
            w = int(arg[1:])
            hold = holds[w]
            assert hold is not None
            fence = Fence(worker_id=f"w{w}", claim_id=hold[1], token=hold[2])
            try:
                authority.start(hold[0], fence, now)
                authority.complete(hold[0], fence, f"r-{hold[0]}-{hold[2]}", {"ok": True}, now)
            except errors.WorkloadError:
                pass  # fenced out: its lease was recovered while it ran
            holds[w] = None
        elif verb == "tick":
            now += self.universe.lease_ms + 1
            ticks += 1
        else:
            authority.recover_expired(now)
        docs = tuple(sorted((doc.key, doc.document) for doc in store.scan()))
        workloads = [parse_stored(doc) for doc in store.scan()]
        found.extend(check_concurrency(self.spec, workloads))
        following = _State(
            now, docs, tuple(admitted), tuple(holds), tuple(ledgers), tuple(waits), ticks
        )
        return following, found, claimed


def _canonical(
    share: FairShare, scopes: tuple[FairScope, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """A ledger as the state keeps it: passes less the lowest, touches as ranks.

    The ledger's order and its updates read passes only relative to each
    other and touches only by which is older, so two ledgers equal under
    this are the same ledger to every future claim; keeping them so keeps
    the universe finite.
    """
    low = min(share.passes.values())
    ranks = {t: r for r, t in enumerate(sorted(set(share.touched.values())))}
    touched = tuple(ranks[share.touched[s]] for s in scopes)
    return tuple(share.passes[s] - low for s in scopes), touched, max(touched)


def check_scheduling(
    spec: Spec,
    universe: SchedulingUniverse | None = None,
    *,
    max_states: int = 200_000,
    progress: Callable[[int, int, int], None] | None = None,
    mutant: SchedulingMutant | None = None,
) -> SchedulingReport:
    """Explore the scheduling universe breadth first; each property's first violation, traced.

    A `max_states` below 1 is `WORKLOAD_INVALID` (`checker.refuse_max_states`).
    """
    refuse_max_states(max_states)
    universe = universe or SchedulingUniverse()
    world = _World(spec, universe, mutant)
    report = SchedulingReport(universe, world.spec.data.fairness.policy)
    report.bounds = dict(world.bounds)
    report.largest_wait = dict.fromkeys(universe.tenants, 0)
    started = time.perf_counter()
    root = world.initial()
    parents: dict[_State, tuple[_State, str] | None] = {root: None}
    depth_of = {root: 0}
    frontier: deque[_State] = deque([root])
    broken: set[str] = set()
    while frontier:
        state = frontier.popleft()
        for action in world.actions(state):
            following, found, claimed = world.step(state, action)
            report.transitions += 1
            report.claims += claimed
            for waits in following.waits:
                for i, tenant in enumerate(universe.tenants):
                    report.largest_wait[tenant] = max(report.largest_wait[tenant], waits[i])
            for violation in found:
                if violation.property not in broken:
                    broken.add(violation.property)
                    trace = [*_trace(parents, state), action]
                    report.violations.append((violation, trace))
            if following in parents:
                continue
            parents[following] = (state, action)
            depth_of[following] = depth_of[state] + 1
            report.depth = max(report.depth, depth_of[following])
            if len(parents) >= max_states:
                report.complete = False
                frontier.clear()
                break
            frontier.append(following)
        if progress is not None and len(parents) % 1000 == 0:
            progress(len(parents), report.transitions, report.depth)
    report.states = len(parents)
    report.seconds = time.perf_counter() - started
    return report


def _trace(parents: dict[_State, tuple[_State, str] | None], state: _State) -> list[str]:
    path: list[str] = []
    link = parents[state]
    while link is not None:
        state, action = link
        path.append(action)
        link = parents[state]
    return path[::-1]


def replay(
    spec: Spec,
    universe: SchedulingUniverse,
    trace: list[str],
    mutant: SchedulingMutant | None = None,
) -> list[Violation]:
    """Run `trace` from the start of the universe; the violations its steps show.

    An action the state does not offer is `WORKLOAD_INVALID`.
    """
    world = _World(spec, universe, mutant)
    state = world.initial()
    found: list[Violation] = []
    for action in trace:
        if action not in set(world.actions(state)):
            raise errors.bad_argument("trace", f"{action!r} is not offered at this point")
        state, violations, _ = world.step(state, action)
        found.extend(violations)
    return found
