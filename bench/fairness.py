"""Fair share under a 100:1 flood: the claim share each tenant gets, read from the audit log.

Two tenants of one application on one store: `flood` admits `--flood` workloads
(10,000 by default) and then `calm` admits `--calm` (100): the flood is older, so
an oldest-first scheduler serves all of it before any of the calm tenant's work.
`--workers` claimers (threads, each with its own store connection and its own
fair-share ledger over both scopes) drain the store: `Authority.claim_fair(limit=
--batch)`, one `report_many` of the starts and one of the completions. Three
claim orders, each on a fresh store:

- `round_robin`: the shipped `[fairness]` policy;
- `weighted`: `policy = "weighted"`, `weights = { flood = 3 }` (calm weighs 1);
- `list_order`: the scopes asked in the order listed, flood first, ignoring the
  ledger: what a worker serving both tenants without a fairness policy does.

Every figure is computed from the store's own audit log (the `claim` records in
commit order, each workload's tenant from its document), not from what the
claimers believe:

- `calm_share`: the calm tenant's part of the claims made while it still had
  unclaimed work (0.5 is an even split of two scopes);
- `claims_until_calm_drained`: store-wide claims up to the calm tenant's last;
- `longest_flood_run`: the most flood claims in a row, store-wide, while the calm
  tenant had unclaimed work;
- `largest_wait` per tenant and claimer: the property `fair_share_bound`'s count
  (`statemachine/properties/fairness.py`) over each claimer's claims, a tenant
  counted as waiting while it had unclaimed work, beside `FairShare.bound` (a
  batch of n planned by the ledger can put up to n - 1 of its claims before a
  scope's first, so the figure to compare with `--batch 10` is bound + 9).

Every run also checks that each workload was claimed and completed exactly once.

    python -m bench.fairness --flood 10000 --calm 100 --workers 4 --batch 10
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    Fixture,
    base_parser,
    command_line,
    machine,
    need_matplotlib,
    save,
    save_figure,
)
from bench.pgserver import server
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine.check.scheduling import SCHEDULING_MUTANTS
from workwarden.statemachine.commands import CompleteCommand, StartCommand
from workwarden.statemachine.fairness import FairScope, FairShare
from workwarden.statemachine.inputs import parse_stored
from workwarden.statemachine.properties.fairness import check_fair_share
from workwarden.statemachine.spec import Spec, load_spec_text, shipped_spec_text
from workwarden.storage import SQLiteStore, Store
from workwarden.storage.postgres import PostgresStore

__all__ = ["main"]

APPLICATION = "jobs"
TENANTS = ("flood", "calm")
NOW = 1_700_000_000_000
LEASE_MS = 600_000
CHUNK = 1_000
CAPABILITIES = ("bench",)

#: The claim orders measured, with the `[fairness]` table each runs under.
POLICIES: dict[str, str] = {
    "round_robin": 'policy = "round_robin"',
    "weighted": 'policy = "weighted"\nweights = { flood = 3 }',
    "list_order": 'policy = "round_robin"',
}


def _spec(policy: str) -> Spec:
    shipped = shipped_spec_text()
    return load_spec_text(shipped.replace('policy = "round_robin"\n', POLICIES[policy] + "\n", 1))


def _share(policy: str, spec: Spec) -> FairShare:
    scopes = [FairScope(t, APPLICATION) for t in TENANTS]
    if policy == "list_order":
        return SCHEDULING_MUTANTS["ledger_in_list_order"].share_cls.from_spec(spec, scopes)
    return FairShare.from_spec(spec, scopes)


def _admit(store: Store, spec: Spec, flood: int, calm: int) -> dict[str, str]:
    """Admit the flood, then the calm tenant's work; each workload id's tenant."""
    tenant_of: dict[str, str] = {}
    for tenant, count, start in (("flood", flood, 0), ("calm", calm, flood)):
        fixture = Fixture(tenant, APPLICATION)
        warden = Authority(store, grants=fixture.verifier, spec=spec)
        for first in range(0, count, CHUNK):
            batch = [
                fixture.request(f"{tenant}-{i}") for i in range(first, min(count, first + CHUNK))
            ]
            for reply in warden.admit_many(batch, NOW + start + first):
                if not hasattr(reply, "workload"):
                    raise SystemExit(f"admission refused: {reply}")
                tenant_of[reply.workload.workload_id] = tenant
    return tenant_of


def _claimer(
    open_store: Callable[[], Store],
    spec: Spec,
    verifier: GrantVerifier,
    policy: str,
    name: str,
    batch: int,
    clock: list[int],
    lock: threading.Lock,
    failures: list[str],
) -> None:
    store = open_store()
    try:
        warden = Authority(store, grants=verifier, spec=spec)
        share = _share(policy, spec)
        while True:
            with lock:
                clock[0] += 1
                now = clock[0]
            claims = warden.claim_fair(share, name, CAPABILITIES, now, LEASE_MS, limit=batch)
            if not claims:
                return
            starts = [StartCommand(workload_id=c.workload_id, fence=c.fence) for c in claims]
            done = [
                CompleteCommand(
                    workload_id=c.workload_id,
                    fence=c.fence,
                    result_id=f"r-{c.workload_id}",
                    output={"ok": True},
                )
                for c in claims
            ]
            for reply in [*warden.report_many(starts, now), *warden.report_many(done, now)]:
                if isinstance(reply, Exception):
                    failures.append(f"{name}: {reply}")
    except Exception as exc:  # noqa: BLE001 - a claimer's crash is a failed run, recorded
        failures.append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        store.close()


def _measure(
    open_store: Callable[[], Store], policy: str, args: argparse.Namespace
) -> dict[str, Any]:
    spec = _spec(policy)
    store = open_store()
    try:
        tenant_of = _admit(store, spec, args.flood, args.calm)
        verifier = Fixture("flood", APPLICATION).verifier
        clock = [NOW + args.flood + args.calm + 1]
        lock = threading.Lock()
        failures: list[str] = []
        threads = [
            threading.Thread(
                target=_claimer,
                args=(open_store, spec, verifier, policy, f"w{i}", args.batch, clock, lock),
                kwargs={"failures": failures},
            )
            for i in range(args.workers)
        ]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        if failures:
            raise SystemExit(f"{policy}: {failures[:3]}")
        return _from_audit(store, spec, policy, tenant_of, args, seconds)
    finally:
        store.close()


def _from_audit(
    store: Store,
    spec: Spec,
    policy: str,
    tenant_of: dict[str, str],
    args: argparse.Namespace,
    seconds: float,
) -> dict[str, Any]:
    """The figures, from the audit log's claims in commit order."""
    records = list(store.audit_log())
    # A claim's audit record is its operation's (claim, claim_next, claim_many).
    claims = [r for r in records if r.operation.startswith("claim")]
    completes = [r for r in records if r.operation == "complete"]
    claimed_ids = [r.key for r in claims]
    states = {doc.key: parse_stored(doc).state for doc in store.scan()}
    exactly_once = (
        sorted(claimed_ids) == sorted(tenant_of)
        and sorted(r.key for r in completes) == sorted(tenant_of)
        and set(states.values()) == {"SUCCEEDED"}
    )
    left = {t: sum(1 for v in tenant_of.values() if v == t) for t in TENANTS}
    template = _share(policy, spec)
    bounds = {t: template.bound(FairScope(t, APPLICATION)) for t in TENANTS}
    waits: dict[str, tuple[int, ...]] = {}
    largest = dict.fromkeys(TENANTS, 0)
    calm_claims_while = 0
    claims_while = 0
    run = longest_run = 0
    until_drained = 0
    #: (store-wide claim number, calm claims so far) at each calm claim, for the plot.
    curve: list[tuple[int, int]] = [(0, 0)]
    for number, (record, wid) in enumerate(zip(claims, claimed_ids, strict=True), start=1):
        tenant = tenant_of[wid]
        waiting = [left[t] > 0 for t in TENANTS]
        if left["calm"] > 0:
            claims_while += 1
            calm_claims_while += tenant == "calm"
            run = run + 1 if tenant == "flood" else 0
            longest_run = max(longest_run, run)
            until_drained = number
        if tenant == "calm":
            curve.append((number, len(curve)))
        worker = record.worker or "?"
        mine, _ = check_fair_share(
            worker, TENANTS, waits.get(worker, (0,) * len(TENANTS)), waiting, tenant, bounds
        )
        waits[worker] = mine
        for t, waited in zip(TENANTS, mine, strict=True):
            largest[t] = max(largest[t], waited)
        left[tenant] -= 1
    return {
        "policy": policy,
        "jobs": len(tenant_of),
        "seconds": round(seconds, 3),
        "jobs_per_s": round(len(tenant_of) / seconds, 1),
        "claims": len(claims),
        "calm_share": round(calm_claims_while / claims_while, 4) if claims_while else None,
        "claims_until_calm_drained": until_drained,
        "longest_flood_run": longest_run,
        "largest_wait": largest,
        "bound": bounds,
        "exactly_once": exactly_once,
        "calm_curve": curve,
    }


def _table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| store | policy | calm share while it had work | claims until calm drained"
        " | longest flood run | largest per-claimer wait of calm (bound) | exactly once | jobs/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['store']} | {r['policy']} | {r['calm_share']:.3f} |"
            f" {r['claims_until_calm_drained']:,} | {r['longest_flood_run']:,} |"
            f" {r['largest_wait']['calm']:,} ({r['bound']['calm']}) |"
            f" {'yes' if r['exactly_once'] else 'NO'} | {r['jobs_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def _plot(rows: Sequence[dict[str, Any]], args: argparse.Namespace, name: str) -> Path:
    plt = need_matplotlib()
    stores = sorted({r["store"] for r in rows})
    fig, axes = plt.subplots(1, len(stores), figsize=(6 * len(stores), 4), squeeze=False)
    for ax, store in zip(axes[0], stores, strict=True):
        for row in (r for r in rows if r["store"] == store):
            xs, ys = zip(*row["calm_curve"], strict=True)
            ax.step(xs, ys, where="post", label=row["policy"])
        ax.set_xscale("symlog", linthresh=100)
        ax.set_xlabel("claims, store-wide, in commit order")
        ax.set_ylabel("calm tenant's claims so far")
        ax.set_title(f"{store}: {args.flood:,} flood vs {args.calm:,} calm jobs")
        ax.legend()
    path = args.out / "plots" / f"{name}.png"
    save_figure(plt, fig, path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Run the flood on each store under each claim order; print and save the figures."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "fairness")
    parser.add_argument("--flood", type=int, default=10_000, help="the flooding tenant's jobs")
    parser.add_argument("--calm", type=int, default=100, help="the calm tenant's jobs")
    parser.add_argument("--workers", type=int, default=4, help="claimers, each with a ledger")
    parser.add_argument("--batch", type=int, default=10, help="claims asked per claim_fair call")
    parser.add_argument(
        "--stores", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql"
    )
    parser.add_argument("--server-dsn", default=None, help="an existing PostgreSQL server")
    parser.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated claim orders"
    )
    args = parser.parse_args(argv)
    stores = args.stores.split(",")
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES] + [
        s for s in stores if s not in ("sqlite", "postgresql")
    ]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="workwarden-fairness-") as tmp:
        if "sqlite" in stores:
            for n, policy in enumerate(policies):
                path = Path(tmp) / f"fair-{n}.db"
                row = _measure(
                    lambda path=path: SQLiteStore(str(path), synchronous="NORMAL"), policy, args
                )
                rows.append({"store": "sqlite", **row})
                print(_table(rows[-1:]).splitlines()[-1], flush=True)
        if "postgresql" in stores:
            with server(args.server_dsn) as running:
                for policy in policies:
                    name, dsn = running.create_database()
                    row = _measure(lambda dsn=dsn: PostgresStore(dsn), policy, args)
                    running.drop_database(name)
                    rows.append({"store": "postgresql", **row})
                    print(_table(rows[-1:]).splitlines()[-1], flush=True)
    print(_table(rows))
    name = args.name or "fairness"
    path = save(
        args.out,
        name,
        {
            "command": command_line("bench.fairness", argv),
            "machine": machine(),
            "flood": args.flood,
            "calm": args.calm,
            "workers": args.workers,
            "batch": args.batch,
            "rows": rows,
        },
    )
    print(f"saved {path}")
    if not args.no_plot:
        print(f"plotted {_plot(rows, args, name)}")
    return 0 if all(r["exactly_once"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
