"""Fair share across tenants: the ledger's bound, and `Authority.claim_fair` on every store."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import CAPS, request
from support import authority as make_authority
from workwarden.statemachine import Authority, WorkloadError, errors
from workwarden.statemachine.fairness import FairScope, FairShare
from workwarden.statemachine.spec import Spec, load_spec_text, shipped_spec_text
from workwarden.storage import MemoryStore

LEASE = 10_000
LATER = 20_000


def admit(warden: Authority, tenant: str, key: str, now: int = 10_000, **changes: Any) -> str:
    req = request(idempotency_key=key, tenant_id=tenant, **changes)
    return warden.admit(req, now=now).workload.workload_id


def spec_with(table: str) -> Spec:
    """The shipped spec with a `[fairness]` table."""
    shipped = shipped_spec_text()
    assert '[fairness]\npolicy = "round_robin"\n' in shipped
    return load_spec_text(shipped.replace('policy = "round_robin"\n', table + "\n", 1))


def drive(share: FairShare, busy: list[set[FairScope]]) -> list[FairScope | None]:
    """What each claim serves, the scopes with work at claim i being `busy[i]`."""
    served: list[FairScope | None] = []
    for active in busy:
        empty = []
        winner = None
        for scope in share.order():
            if scope in active:
                winner = scope
                break
            empty.append(scope)
        share.record(winner, empty)
        served.append(winner)
    return served


@settings(max_examples=300, deadline=None)
@given(
    weights=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    target=st.integers(0, 3),
    warmup=st.lists(st.sets(st.integers(0, 3)), max_size=20),
    busy=st.lists(st.sets(st.integers(0, 3)), min_size=1, max_size=40),
    weighted=st.booleans(),
)
def test_while_a_scope_has_work_others_take_at_most_its_bound_before_it(
    weights: list[int],
    target: int,
    warmup: list[set[int]],
    busy: list[set[int]],
    weighted: bool,
) -> None:
    scopes = [FairScope(f"t{i}", "app") for i in range(len(weights))]
    share = FairShare(
        scopes, dict(zip(scopes, weights, strict=True)), "weighted" if weighted else "round_robin"
    )
    mine = scopes[target % len(scopes)]
    drive(share, [{scopes[i % len(scopes)] for i in s} for s in warmup])
    served = drive(share, [{scopes[i % len(scopes)] for i in s} | {mine} for s in busy])
    others = 0
    for scope in served:
        others = 0 if scope == mine else others + 1
        assert others <= share.bound(mine), (share.to_dict(), served)


def test_the_bound_is_one_claim_of_each_other_scope_under_round_robin() -> None:
    scopes = [FairScope(f"t{i}", "app") for i in range(4)]
    share = FairShare(scopes)
    assert [share.bound(s) for s in scopes] == [3, 3, 3, 3]
    assert drive(share, [set(scopes)] * 8) == scopes + scopes


def test_weighted_shares_follow_the_weights_and_the_light_scope_waits_at_most_its_bound() -> None:
    heavy, light = FairScope("heavy", "app"), FairScope("light", "app")
    share = FairShare([heavy, light], {heavy: 3, light: 1}, "weighted")
    served = drive(share, [{heavy, light}] * 40)
    assert (served.count(heavy), served.count(light)) == (30, 10)
    assert (share.bound(light), share.bound(heavy)) == (3, 1)
    gaps = [len(run) for run in "".join("h" if s == heavy else "l" for s in served).split("l")]
    assert max(gaps[1:-1]) == 3


def test_an_idle_scope_saves_no_turns_for_later() -> None:
    a, b = FairScope("a", "app"), FairScope("b", "app")
    share = FairShare([a, b])
    drive(share, [{a}] * 50)
    served = drive(share, [{a, b}] * 6)
    assert served in ([b, a] * 3, [a, b] * 3)


def test_a_ledger_survives_a_round_trip_through_json_data() -> None:
    a, b = FairScope("a", "app"), FairScope("b", "app")
    share = FairShare([a, b], {a: 2, b: 3}, "weighted")
    drive(share, [{a, b}] * 7)
    again = FairShare.from_dict(share.to_dict())
    assert again.to_dict() == share.to_dict()
    assert drive(again, [{a, b}] * 5) == drive(share.copy(), [{a, b}] * 5)


@pytest.mark.parametrize(
    "scopes",
    [[], "t/app", [("t", "app"), ("t", "app")], [("t",)], [("t", "")], [42]],
)
def test_a_bad_scope_list_is_refused(scopes: Any) -> None:
    with pytest.raises(WorkloadError) as caught:
        FairShare(scopes)
    assert caught.value.code == errors.INVALID


def test_a_bad_ledger_is_refused() -> None:
    for data in ({"scopes": ["a/app"], "passes": {"a/app": "x"}}, {"scopes": 7}, []):
        with pytest.raises(WorkloadError) as caught:
            FairShare.from_dict(data)  # type: ignore[arg-type]
        assert caught.value.code == errors.INVALID


def test_weights_keyed_by_a_scopes_name_or_pair_weigh_that_scope() -> None:
    a, b = FairScope("a", "app"), FairScope("b", "app")
    for key in ("a/app", ("a", "app"), a):
        share = FairShare([a, b], {key: 3}, "weighted")
        assert share.weights == {a: 3, b: 1}
    share = FairShare([a], {"a/app": 2}, "weighted")
    share.serve(["b/app"], {"b/app": 5})
    assert share.weights == {a: 2, b: 5}


@pytest.mark.parametrize(
    "weights",
    [{"c/app": 3}, {"nonsense": 3}, {FairScope("c", "app"): 2}, "a/app", [("a/app", 2)]],
)
def test_a_weight_of_a_scope_not_served_or_not_a_scope_is_refused(weights: Any) -> None:
    with pytest.raises(WorkloadError) as caught:
        FairShare(["a/app", "b/app"], weights, "weighted")
    assert caught.value.code == errors.INVALID
    assert caught.value.details["field"] == "weights"


@pytest.mark.parametrize("served", [FairScope("z", "app"), "a/app"])
def test_a_record_of_a_scope_the_ledger_does_not_serve_is_refused_and_changes_nothing(
    served: Any,
) -> None:
    a, b = FairScope("a", "app"), FairScope("b", "app")
    share = FairShare([a, b])
    drive(share, [{a, b}] * 3)
    before = share.to_dict()
    with pytest.raises(WorkloadError) as caught:
        share.record(served, [b])
    assert caught.value.code == errors.INVALID
    assert caught.value.details["field"] == "served"
    assert share.to_dict() == before


def test_claim_fair_alternates_between_tenants_under_a_flood(authority: Authority) -> None:
    flood = [admit(authority, "big", f"big-{i}", now=10_000 + i) for i in range(20)]
    small = [admit(authority, "small", f"small-{i}", now=10_100 + i) for i in range(3)]
    share = authority.fair_share([("big", "app"), ("small", "app")])
    taken = [
        authority.claim_fair(share, "w", CAPS, now=11_000 + i, lease_ms=LEASE)[0].workload_id
        for i in range(8)
    ]
    assert taken[:6] == [flood[0], small[0], flood[1], small[1], flood[2], small[2]]
    assert taken[6:] == flood[3:5]


def test_claim_fair_in_batches_keeps_the_shares_and_claims_each_workload_once(
    authority: Authority,
) -> None:
    for i in range(30):
        admit(authority, "big", f"big-{i}", now=10_000 + i)
    for i in range(4):
        admit(authority, "small", f"small-{i}", now=10_000 + i)
    share = authority.fair_share([("big", "app"), ("small", "app")])
    first = authority.claim_fair(share, "w", CAPS, now=11_000, lease_ms=LEASE, limit=6)
    tenants = [authority.get(c.workload_id).tenant_id for c in first]
    assert sorted(tenants) == ["big"] * 3 + ["small"] * 3
    rest = authority.claim_fair(share, "w", CAPS, now=11_001, lease_ms=LEASE, limit=100)
    ids = [c.workload_id for c in first + rest]
    assert len(ids) == len(set(ids)) == 34
    assert authority.claim_fair(share, "w", CAPS, now=11_002, lease_ms=LEASE, limit=5) == []


def test_claim_fair_passes_over_a_paused_tenant(authority: Authority) -> None:
    admit(authority, "a", "a-1")
    b = admit(authority, "b", "b-1")
    authority.pause("ops", 10_500, tenant="a")
    share = authority.fair_share([("a", "app"), ("b", "app")])
    claims = authority.claim_fair(share, "w", CAPS, now=11_000, lease_ms=LEASE, limit=2)
    assert [c.workload_id for c in claims] == [b]


def test_a_repeated_fair_claim_with_its_request_id_answers_the_same_claims() -> None:
    warden = make_authority(MemoryStore())
    for tenant in ("a", "b"):
        for i in range(3):
            admit(warden, tenant, f"{tenant}-{i}")
    share = warden.fair_share([("a", "app"), ("b", "app")])
    before = share.to_dict()
    first = warden.claim_fair(share, "w", CAPS, 11_000, LEASE, limit=4, request_id="r1")
    lost = FairShare.from_dict(before)  # the reply was lost: the ledger never learnt of it
    again = warden.claim_fair(lost, "w", CAPS, 11_001, LEASE, limit=4, request_id="r1")
    assert [c.workload_id for c in again] == [c.workload_id for c in first]
    assert [c.fence for c in again] == [c.fence for c in first]


def test_claim_fair_refuses_bad_arguments_and_claims_nothing() -> None:
    warden = make_authority(MemoryStore())
    admit(warden, "a", "a-1")
    share = warden.fair_share([("a", "app")])
    for kwargs in ({"limit": 0}, {"limit": 1001}, {"limit": True}, {"request_id": ""}):
        with pytest.raises(WorkloadError) as caught:
            warden.claim_fair(share, "w", CAPS, 11_000, LEASE, **kwargs)  # type: ignore[arg-type]
        assert caught.value.code == errors.INVALID
    with pytest.raises(WorkloadError):
        warden.claim_fair({"scopes": []}, "w", CAPS, 11_000, LEASE)  # type: ignore[arg-type]
    assert warden.list("a", "app")[0].state == "READY"


def test_the_spec_declares_weights_by_tenant_or_by_scope() -> None:
    spec = spec_with('policy = "weighted"\nweights = { gold = 4, "silver/app" = 2 }')
    share = FairShare.from_spec(spec, [("gold", "app"), ("silver", "app"), ("bronze", "app")])
    assert share.to_dict()["weights"] == {"gold/app": 4, "silver/app": 2, "bronze/app": 1}


@pytest.mark.parametrize(
    "table",
    [
        'policy = "round_robin"\nweights = { gold = 2 }',
        'policy = "fifo"',
        'policy = "weighted"\nweights = { gold = 0 }',
        'policy = "weighted"\nweights = { "a/b/c" = 2 }',
        "extra = 1",
    ],
)
def test_a_spec_with_a_bad_fairness_table_is_refused(table: str) -> None:
    with pytest.raises(WorkloadError) as refused:
        spec_with(table)
    assert refused.value.code == "WORKLOAD_SPEC_INVALID"
    assert "fairness" in refused.value.message


# -- the worker runtime serving several scopes ------------------------------------------------


def _flooded_worker(
    store: Any, flood: int, trickle: int, **options: Any
) -> tuple[Authority, Any, list[str]]:
    from workwarden import App, Job, Worker
    from workwarden.runtime import ManualClock
    from workwarden.runtime.testing import InlineExecutor

    warden = make_authority(store)
    for i in range(flood):
        admit(warden, "flood", f"f{i}", now=1_000 + i)
    for i in range(trickle):
        admit(warden, "calm", f"c{i}", now=5_000 + i)
    app = App()
    served: list[str] = []

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        served.append(warden.get(job.workload_id).tenant_id)

    worker = Worker(
        warden,
        app,
        tenant="flood",
        application="app",
        also_serve=["calm/app"],
        clock=ManualClock(LEASE),
        executor=InlineExecutor(),
        **options,
    )
    return warden, worker, served


@pytest.mark.parametrize("batch", [True, False])
def test_a_worker_serving_two_tenants_takes_the_trickle_between_the_flood(batch: bool) -> None:
    _, worker, served = _flooded_worker(MemoryStore(), flood=30, trickle=3, batch=batch)
    worker.run_until_idle()
    assert sorted(served) == ["calm"] * 3 + ["flood"] * 30
    # Round robin: the calm tenant's three are among the first six claims,
    # where oldest-first over both would leave them for the end.
    assert served[:6].count("calm") == 3
    assert worker.share is not None
    assert worker.share.bound(("calm", "app")) == 1


def test_a_worker_asked_to_serve_a_malformed_scope_is_refused() -> None:
    from workwarden import App, Worker

    app = App()
    app.handler("send", needs=CAPS)(lambda job: None)
    with pytest.raises(WorkloadError) as caught:
        Worker(make_authority(MemoryStore()), app, tenant="t", application="app", also_serve=["x"])
    assert caught.value.code == "WORKLOAD_INVALID"


def test_a_fair_claim_whose_reply_was_lost_is_answered_again_with_the_same_claims() -> None:
    from support import SwitchedStore

    store = SwitchedStore(MemoryStore())
    warden = make_authority(store)
    for n in range(3):
        admit(warden, "flood", f"f{n}")
        admit(warden, "calm", f"c{n}", now=10_001)
    share = warden.fair_share([("flood", "app"), ("calm", "app")])

    writes = len(store.audit_log())
    calls: list[str] = []
    real_claim_next = warden.claim_next

    def claim_next(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        if len(calls) == 2:
            # The second scope's claim commits, and its reply is lost.
            store.lose_next_reply = True
        return real_claim_next(*args, **kwargs)

    warden.claim_next = claim_next  # type: ignore[method-assign]
    with pytest.raises(WorkloadError) as lost:
        warden.claim_fair(share, "w", CAPS, LATER, LEASE, limit=2, request_id="r1")
    assert lost.value.code == "WORKLOAD_OUTCOME_UNKNOWN"
    assert calls == ["flood", "calm"]
    committed = len(store.audit_log())
    assert committed == writes + 2
    again = warden.claim_fair(share, "w", CAPS, LATER, LEASE, limit=2, request_id="r1")
    # The same two claims, one of each tenant, and nothing more written.
    assert sorted(warden.get(c.workload_id).tenant_id for c in again) == ["calm", "flood"]
    assert len(store.audit_log()) == committed
    # The ledger counts them once: the next claim goes to the flood again.
    [following] = warden.claim_fair(share, "w", CAPS, LATER, LEASE, request_id="r2")
    assert warden.get(following.workload_id).tenant_id == "flood"


def test_a_scope_served_later_joins_at_the_lowest_pass_and_saves_no_turns() -> None:
    a, b, c = (FairScope(t, "app") for t in "abc")
    share = FairShare([a, b])
    drive(share, [{a, b}] * 6)
    share.serve([b, c])
    assert share.scopes == (a, b, c)
    # c is served next in its turn, then takes its share: no burst of saved turns.
    served = drive(share, [{a, b, c}] * 6)
    assert served.count(c) == 2
    assert served[:3].count(c) == 1
    assert share.bound(c) == 2


def test_a_weighted_scope_served_later_keeps_the_others_proportions() -> None:
    a, b = FairScope("a", "app"), FairScope("b", "app")
    share = FairShare([a], {a: 1}, "weighted")
    drive(share, [{a}] * 3)
    share.serve([b], {b: 3})
    served = drive(share, [{a, b}] * 8)
    assert served.count(b) == 6
    assert served.count(a) == 2


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_worker_of_every_scope_finds_each_tenant_and_shares_its_claims(
    backend: str, tmp_path: Any
) -> None:
    from workwarden import App, Job, Worker
    from workwarden.runtime import ManualClock
    from workwarden.runtime.testing import InlineExecutor
    from workwarden.storage import SQLiteStore

    store = MemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "all.db")
    warden = make_authority(store)
    for i in range(20):
        admit(warden, "flood", f"f{i}", now=1_000 + i)
    for tenant in ("calm", "quiet"):
        for i in range(2):
            admit(warden, tenant, f"{tenant}{i}", now=5_000 + i)
    served: list[str] = []
    app = App()

    @app.handler("send", needs=CAPS)
    def send(job: Job) -> None:
        served.append(warden.get(job.workload_id).tenant_id)

    worker = Worker(
        warden,
        app,
        all_scopes=True,
        clock=ManualClock(LEASE),
        executor=InlineExecutor(),
        batch=False,
    )
    worker.run_until_idle()
    assert sorted(served) == ["calm"] * 2 + ["flood"] * 20 + ["quiet"] * 2
    # Three scopes in turn: the two small tenants are done within the first six claims.
    assert sorted(served[:6]) == ["calm", "calm", "flood", "flood", "quiet", "quiet"]
    assert worker.share is not None
    assert {s.tenant for s in worker.share.scopes} == {"flood", "calm", "quiet"}
    store.close()


def test_a_worker_of_every_scope_needs_a_store_that_lists_them() -> None:
    from workwarden import App, Worker
    from workwarden.storage import ForwardingStore

    app = App()
    app.handler("send", needs=CAPS)(lambda job: None)
    with pytest.raises(WorkloadError) as caught:
        Worker(make_authority(ForwardingStore(MemoryStore())), app, all_scopes=True)
    assert caught.value.code == "WORKLOAD_INVALID"
    with pytest.raises(WorkloadError) as unnamed:
        Worker(make_authority(MemoryStore()), app)
    assert unnamed.value.code == "WORKLOAD_INVALID"


def planned_fair_claims(share: FairShare, work: dict[FairScope, int], limit: int) -> list[str]:
    """What `claim_fair` claims as its docstring says it plans, step by step on the ledger's
    public calls (`copy`, `order`, `record`): the tenants of the claims, in order."""
    claims: list[str] = []
    empty: set[FairScope] = set()
    while len(claims) < limit and len(empty) < len(share.scopes):
        sim = share.copy()
        wanted: dict[FairScope, int] = {}
        for _ in range(limit - len(claims)):
            scope = next(s for s in sim.order() if s not in empty)
            sim.record(scope, ())
            wanted[scope] = wanted.get(scope, 0) + 1
        for scope, count in wanted.items():
            got = min(count, work[scope])
            work[scope] -= got
            for _ in range(got):
                share.record(scope, ())
                claims.append(scope.tenant)
            if got < count:
                share.record(None, (scope,))
                empty.add(scope)
                break
    return claims


@settings(max_examples=60, deadline=None)
@given(
    work=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    weights=st.lists(st.integers(1, 4), min_size=6, max_size=6),
    limits=st.lists(st.integers(1, 8), min_size=1, max_size=3),
    weighted=st.booleans(),
)
def test_claim_fair_claims_in_the_order_its_plan_on_the_ledger_gives(
    work: list[int], weights: list[int], limits: list[int], weighted: bool
) -> None:
    # The plan is kept on a heap beside the ledger; it must claim exactly what planning
    # on copies of the ledger, as documented, claims, with the same ledger after.
    warden = make_authority(MemoryStore())
    tenant_of: dict[str, str] = {}
    for i, count in enumerate(work):
        for j in range(count):
            tenant_of[admit(warden, f"t{i}", f"t{i}-{j}", now=10_000 + j)] = f"t{i}"
    scopes = [FairScope(f"t{i}", "app") for i in range(len(work))]
    policy = "weighted" if weighted else "round_robin"
    share = FairShare(scopes, dict(zip(scopes, weights, strict=False)), policy)
    model = share.copy()
    left = dict(zip(scopes, work, strict=True))
    for n, limit in enumerate(limits):
        claims = warden.claim_fair(share, "w", CAPS, now=11_000 + n, lease_ms=LEASE, limit=limit)
        assert [tenant_of[c.workload_id] for c in claims] == planned_fair_claims(model, left, limit)
        assert share.to_dict() == model.to_dict()


def test_a_fair_claim_over_thousands_of_idle_tenants_finds_every_busy_one() -> None:
    # 5,000 tenants, 25 of them with work: the claim walks past the idle ones, each found
    # empty once.
    warden = make_authority(MemoryStore())
    busy = {i * 200 for i in range(25)}
    for i in busy:
        admit(warden, f"t{i}", f"t{i}-0")
    share = warden.fair_share([(f"t{i}", "app") for i in range(5_000)])
    claims = warden.claim_fair(share, "w", CAPS, now=11_000, lease_ms=LEASE, limit=50)
    assert sorted(warden.get(c.workload_id).tenant_id for c in claims) == sorted(
        f"t{i}" for i in busy
    )
    assert warden.claim_fair(share, "w", CAPS, now=11_001, lease_ms=LEASE, limit=50) == []
