"""The one registry of properties: every invariant and every reachability goal, declared once.

In the manner of stateright's `Property::always` and `Property::sometimes`,
each property has a name, a kind and a one-line meaning, and says what it is
checked over (its subjects, `SUBJECTS`):

- **always** (safety): it holds of every committed document, every write,
  every audit log, every state the checker reaches; one counterexample
  breaks it;
- **sometimes** (reachability): some step reaches it (an edge taken, a rule
  deciding); it proves an exploration does not pass because nothing happens,
  and what no step reaches is reported by name;
- **eventually** (liveness within bounds): every run, or every state, can
  still reach it.

The model checker (`statemachine/check/checker.py`), the stateful suite
(`workwarden.testing`) and the chaos audit (`workwarden.chaos.audit`) report
every violation under one of these names, through the check functions of
this package: `invariants` (one document, the scopes, the whole store),
`writes` (one write), `audit_log` (the audit log), `coverage` (the
reachability goals and the policies' soundness) and `runs` (a run against a
store); the suite's checks of each call, and the checker's search of its
state graph, are their own. A `Violation` of a name not registered here
cannot be made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from workwarden.storage.base import AuditRecord

__all__ = [
    "KINDS",
    "PROPERTIES",
    "SUBJECTS",
    "Kind",
    "Property",
    "Subject",
    "SubjectInfo",
    "Violation",
    "markdown_table",
    "named",
    "properties",
]

Kind = Literal["always", "sometimes", "eventually"]
"""What kind of property: safety, reachability, or liveness within bounds."""

Subject = Literal[
    "workload",
    "reached",
    "write",
    "audit",
    "scopes",
    "store",
    "run",
    "call",
    "step",
    "spec",
    "coverage",
    "graph",
]
"""What a property is checked over (see `SUBJECTS`)."""

#: The kinds, in the order the documentation lists them.
KINDS: tuple[Kind, ...] = ("always", "sometimes", "eventually")


@dataclass(frozen=True, slots=True)
class SubjectInfo:
    """What a subject is, and which of the three tools check properties over it."""

    meaning: str
    checked_by: tuple[str, ...]


#: Every subject a property can be checked over, with who checks it.
SUBJECTS: dict[Subject, SubjectInfo] = {
    "workload": SubjectInfo(
        "one committed workload document on its own", ("checker", "suite", "audit")
    ),
    "reached": SubjectInfo(
        "a workload the core reached from its admission (not one imported from outside)",
        ("checker",),
    ),
    "write": SubjectInfo(
        "one committed write: the version it replaced, the version it wrote, its audit record",
        ("checker", "suite"),
    ),
    "audit": SubjectInfo(
        "the audit log against the documents it committed (across processes)", ("suite", "audit")
    ),
    "scopes": SubjectInfo("the set of committed workloads", ("suite", "audit")),
    "store": SubjectInfo(
        "a whole committed snapshot: every document and the audit log", ("suite", "audit")
    ),
    "run": SubjectInfo(
        "a chaos run: what it admitted and acknowledged, against the drained store", ("audit",)
    ),
    "call": SubjectInfo(
        "one call of the stateful suite: its reply or refusal and what it wrote", ("suite",)
    ),
    "step": SubjectInfo(
        "one step the checker explores: the core's answer and the document it wrote",
        ("checker",),
    ),
    "spec": SubjectInfo("the spec's policies", ("checker",)),
    "coverage": SubjectInfo(
        "what an exploration reached: the edges taken, the rules deciding, the states at rest",
        ("checker", "suite"),
    ),
    "graph": SubjectInfo("the checker's graph of reachable states", ("checker",)),
}


@dataclass(frozen=True, slots=True)
class Property:
    """One property: its name, its kind, what it is checked over, and what it asserts."""

    name: str
    kind: Kind
    over: tuple[Subject, ...]
    meaning: str

    @property
    def checked_by(self) -> tuple[str, ...]:
        """The tools that check it (over some subject of it), in a fixed order."""
        tools = {tool for subject in self.over for tool in SUBJECTS[subject].checked_by}
        return tuple(tool for tool in ("checker", "suite", "audit") if tool in tools)


def _always(name: str, over: tuple[Subject, ...], meaning: str) -> Property:
    return Property(name, "always", over, meaning)


def _sometimes(name: str, over: tuple[Subject, ...], meaning: str) -> Property:
    return Property(name, "sometimes", over, meaning)


def _eventually(name: str, over: tuple[Subject, ...], meaning: str) -> Property:
    return Property(name, "eventually", over, meaning)


def _table(*declared: Property) -> dict[str, Property]:
    table: dict[str, Property] = {}
    for prop in declared:
        assert prop.name not in table, f"property {prop.name} is declared twice"
        assert prop.over, f"property {prop.name} is checked over nothing"
        table[prop.name] = prop
    return table


#: Every property, by name, in the order the documentation lists them.
PROPERTIES: dict[str, Property] = _table(
    # -- always: one committed workload ------------------------------------------------
    _always("documents_parse", ("store",), "every committed document parses as a workload"),
    _always(
        "history_is_a_legal_path",
        ("workload",),
        "the history is a path of legal edges of the table, numbered 1, 2, 3, ... without a "
        "gap, each taken by an actor class the edge allows, never going back in time, ending "
        "at the workload's state, its claims under strictly increasing fencing tokens that "
        "the workload's fencing_token counts (from the admission's `fencing_floor`, for a "
        "key purged before and admitted again)",
    ),
    _always(
        "no_transient_state_at_rest",
        ("workload",),
        "no committed workload rests in a state of kind transient",
    ),
    _always(
        "claim_exactly_when_claimed",
        ("workload",),
        "a workload holds a claim exactly in the claimed (active) states, and that claim is "
        "its last attempt's, under its current fencing token",
    ),
    _always(
        "fencing_tokens_increase",
        ("workload", "write", "audit"),
        "attempts carry strictly increasing fencing tokens, each the token of its CLAIMED "
        "event; no write lowers the token, a write that claims raises it by exactly one, and "
        "the claims of the audit log issue increasing tokens, each its attempt's",
    ),
    _always(
        "one_attempt_per_claim",
        ("workload", "audit"),
        "one attempt record per counted attempt, one per CLAIMED event, one per claim the "
        "audit log records",
    ),
    _always(
        "attempts_within_budget",
        ("workload",),
        "attempt_count never exceeds the attempt budget (max_attempts plus operator re-arms)",
    ),
    _always(
        "at_most_one_success",
        ("workload", "audit"),
        "at most one attempt succeeded, the history enters a succeeded state at most once, "
        "and the audit log commits at most one worker's completion",
    ),
    _always(
        "result_exactly_when_succeeded",
        ("workload",),
        "a result is recorded exactly when the workload is SUCCEEDED, for the attempt that "
        "succeeded",
    ),
    _always(
        "decisions_follow_the_policy",
        ("workload",),
        "every decision recorded as evidence is the one the spec's policy gives, recomputed "
        "from the workload as it was before the decided step and the inputs the step recorded; "
        "a policy's via state is only ever left by a decision",
    ),
    _always(
        "recovered_only_after_lease_expiry",
        ("workload", "write"),
        "a recovery happens only once the lease it recovers has expired (expires_at <= at)",
    ),
    _always(
        "deadlines_enforced_only_when_due",
        ("workload", "write"),
        "a deadline is enforced only once it has fallen: the recorded deadline is the first "
        "fallen one, at its recorded instant, at or before the write",
    ),
    _always(
        "ready_work_has_an_attempt_left",
        ("reached",),
        "queued work the core reached has an attempt left (only a document imported from "
        "outside the core can be queued with its budget spent)",
    ),
    # -- always: writes, the audit log, the store ----------------------------------------
    _always(
        "one_workload_per_scope",
        ("scopes", "write", "store"),
        "one workload per idempotency scope (tenant, application, requester kind and id, "
        "key), stored and written under its own workload id",
    ),
    _always(
        "claims_within_concurrency_limits",
        ("scopes", "store"),
        "no more workloads of one concurrency key hold a claim than the spec's limit for "
        "that key (`[concurrency]`)",
    ),
    _always(
        "claims_within_rates",
        ("audit",),
        "over every span of time, the claims taken of one concurrency key number at most its "
        "rate's burst plus one per every_ms of the span (`[concurrency] rates`)",
    ),
    _always(
        "fair_share_bound",
        ("step",),
        "while a tenant has claimable work, a fair claimer's claims of other tenants before "
        "one of its own stay within its ledger's bound (`[fairness]`)",
    ),
    _always(
        "one_audit_record_per_version",
        ("audit",),
        "the audit log has one record per committed version: per key, versions 1..n in "
        "commit order with n the document's version, sequence numbers increasing",
    ),
    _always(
        "audit_matches_the_documents",
        ("audit", "write"),
        "an audit record carries the digest of the document it committed and its tenant and "
        "application, and the events a write adds carry the write's instant",
    ),
    _always(
        "writes_extend_the_committed_history",
        ("write",),
        "a write keeps every event of the version it replaced and appends after them",
    ),
    _always(
        "no_write_from_a_stale_fence",
        ("write", "audit"),
        "a worker's write is accepted only under the current claim's fencing token and worker",
    ),
    _always(
        "no_write_from_an_expired_lease",
        ("write",),
        "a worker's write is accepted only while the claim's lease is live (expires_at > at)",
    ),
    _always(
        "no_write_after_a_deadline",
        ("write",),
        "no claim and no deadline-guarded worker write is accepted once a deadline of the "
        "workload has fallen (only the timeout it causes is written)",
    ),
    # -- always: a chaos run ---------------------------------------------------------------
    _always(
        "admitted_work_is_stored",
        ("run",),
        "every workload a run admitted is in the store, and nothing else is",
    ),
    _always(
        "acknowledged_completions_are_stored",
        ("run",),
        "every completion a worker was told had succeeded is the stored result, under the "
        "token it was made with",
    ),
    # -- always: one call of the stateful suite ---------------------------------------------
    _always(
        "refusals_change_nothing",
        ("call",),
        "a refused call (but for the refusals the catalogue marks records = true) leaves the "
        "documents, index fields and audit log as they were; so does a commit refused with "
        "WORKLOAD_CONFLICT",
    ),
    _always(
        "refusal_is_in_the_catalogue", ("call",), "every refusal's code is in the error catalogue"
    ),
    _always(
        "refusal_is_one_the_operation_gives",
        ("call",),
        "without the shadow model, a refusal is one the operation can give (read from its row "
        "of the operations table: the fence check's, WORKLOAD_TIMED_OUT, its denied code, its "
        "gate's, its effect's)",
    ),
    _always(
        "replies_are_consistent",
        ("call",),
        "replies agree with the call (a new scope creates, a replay does not, a claim is the "
        "caller's for the asked lease, a conflict names its fields)",
    ),
    _always(
        "shadow_model",
        ("call",),
        "the authority agrees with the shadow model: the outcome of every call, and the "
        "committed documents after it",
    ),
    _always(
        "batch_slots_answer_as_single_calls",
        ("call",),
        "each slot of a batch (admit_many, claim_many, report_many) is answered as its one-call "
        "method would answer it in turn (its reply, replay or own refusal), and the batch "
        "writes exactly what those calls would",
    ),
    _always(
        "no_claim_is_granted_in_a_paused_scope",
        ("call",),
        "no claiming call (claim, claim_next, claim_many, execute) grants work of a paused scope",
    ),
    _always(
        "in_flight_work_of_a_paused_scope_reports_normally",
        ("call",),
        "a pause interrupts no held work: its starts, heartbeats, checkpoints, completions "
        "and failures are answered as they would be without it",
    ),
    _always(
        "kept_states_are_never_purged",
        ("call",),
        "a purge deletes only terminal documents old enough, in no state of the [retention] "
        "keep list, one audit record each, and reports exactly what it deleted and passed over",
    ),
    _always(
        "a_purged_workload_never_reappears_and_no_version_is_reused",
        ("call",),
        "a purged version is never written again, and a key admitted again after its purge "
        "is stored above the purge's tombstone version",
    ),
    _always(
        "spec_refinement",
        ("step",),
        "the core answers every explored step as the spec's own data says it must "
        "(`check/oracle.py`): the refusal or grant, whether it writes, and the written "
        "document's state, edges, decisions, counters, eligibility, lease, attempt and "
        "next deadline",
    ),
    # -- always: the spec ------------------------------------------------------------------------
    _always(
        "policies_are_total",
        ("spec",),
        "some rule of every policy matches each combination of the predicates it names",
    ),
    _always(
        "policies_are_deterministic",
        ("spec",),
        "every policy decides the same combination of its predicates the same way",
    ),
    # -- sometimes: reachability ------------------------------------------------------------------
    _sometimes(
        "every_edge_is_taken",
        ("coverage",),
        "every edge of the table is taken by some step (those none takes are named)",
    ),
    _sometimes(
        "every_rule_decides",
        ("coverage",),
        "every rule of every policy decides some step (those none decides are named)",
    ),
    _sometimes(
        "every_terminal_state_is_reached",
        ("coverage",),
        "every terminal state is at rest in some reachable state",
    ),
    _sometimes(
        "every_lasting_state_is_reached",
        ("coverage",),
        "every state that is not transient is at rest in some reachable state",
    ),
    # -- eventually: liveness within the bounds -------------------------------------------------
    _eventually(
        "work_can_always_finish",
        ("graph",),
        "from every reachable state some path leads to one where every workload is terminal "
        "(states the time horizon cuts off count as able to)",
    ),
    _eventually(
        "claimable_work_is_claimed",
        ("graph",),
        "under weak fairness of each worker's claim_next and the sweeper, no run keeps a "
        "claimable workload unclaimed forever while a worker keeps asking (a lasso otherwise)",
    ),
    _eventually(
        "expired_leases_are_recovered",
        ("graph",),
        "under weak fairness of each worker's claim_next and the sweeper, no run keeps a "
        "workload's expired lease unrecovered forever while the sweeper runs (a lasso otherwise)",
    ),
    _eventually(
        "work_finishes_after_draining",
        ("run",),
        "once a run has drained the store, every workload is in a terminal state",
    ),
)


def named(name: str) -> Property:
    """The property registered under `name`; `KeyError` naming the valid ones otherwise."""
    prop = PROPERTIES.get(name)
    if prop is None:
        raise KeyError(f"no property {name!r} is registered (valid: {', '.join(PROPERTIES)})")
    return prop


def properties(
    kind: Kind | None = None, over: Subject | Iterable[Subject] | None = None
) -> tuple[Property, ...]:
    """The registered properties of `kind`, checked over (one of) `over`, in table order."""
    subjects: frozenset[str] | None = None
    if over is not None:
        subjects = frozenset((over,) if isinstance(over, str) else over)
    return tuple(
        prop
        for prop in PROPERTIES.values()
        if (kind is None or prop.kind == kind)
        and (subjects is None or not subjects.isdisjoint(prop.over))
    )


def markdown_table() -> str:
    """Every property as a Markdown table (`docs/testing.md` holds exactly this table)."""
    lines = [
        "| property | kind | checked over | checked by | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for prop in PROPERTIES.values():
        lines.append(
            f"| `{prop.name}` | {prop.kind} | {', '.join(prop.over)} "
            f"| {', '.join(prop.checked_by)} | {prop.meaning} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken property: its registered name, the workload (key) it concerns, what was wrong.

    `record` is the audit record that shows it, when one does. Making one
    for a name the registry does not hold raises `KeyError`.
    """

    property: str
    key: str | None
    message: str
    record: AuditRecord | None = None

    def __post_init__(self) -> None:
        named(self.property)

    def __str__(self) -> str:
        where = f" [{self.key}]" if self.key is not None else ""
        return f"{self.property}{where}: {self.message}"
