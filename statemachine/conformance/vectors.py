"""Conformance vectors: scenarios run through the reference, recorded as expectations.

A scenario is data: a name, the documents the store starts with (often none)
and a list of steps, each a command and its instant `now`. Running it through
the reference implementation (an `Authority` over a `MemoryStore`, exactly
what `python -m workwarden.adapter` serves) records, for every step, the
response (the reply or the error), the committed state of the command's
workload, the events the step appended (with their evidence), and the
version and digest of every document in the store. One scenario is one line
of the vector file (JSON Lines, sorted keys, ASCII): regenerating gives the
same bytes, because every input is fixed and nothing reads a clock or draws a
random number. `docs/conformance.md` describes the format and the protocol.

The scenarios are the seed behaviours (`seed_scenarios()` in `scenarios.py`,
one or more per behaviour test of the suite) plus `extra_scenarios(spec)`,
the hook through which scenarios found by the model checker's exploration
join them. `coverage(spec, vectors)` says which edges of the table and which
rules of each policy the vectors take.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.authority import Authority, serialise
from workwarden.statemachine.commands import Command
from workwarden.statemachine.conformance.schemas import ClaimNextCommand
from workwarden.statemachine.grants import GrantVerifier
from workwarden.statemachine.index import index_fields
from workwarden.statemachine.models import CreateWorkload, Event, Workload
from workwarden.statemachine.safety import digest
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import AuditRecord
from workwarden.storage.memory import MemoryStore

__all__ = [
    "CONFORMANCE_KEY_ID",
    "CONFORMANCE_SECRET",
    "FORMAT",
    "Coverage",
    "DocumentState",
    "Expectation",
    "ReferenceImplementation",
    "Scenario",
    "StepCommand",
    "StoreEntry",
    "VectorScenario",
    "VectorStep",
    "all_scenarios",
    "command_json",
    "coverage",
    "document_digest",
    "extra_scenarios",
    "generate_vectors",
    "normalise_document",
    "observe",
    "read_vectors",
    "render_vectors",
    "run_scenario",
    "target_key",
]

#: The version of the vector format (a field of every line).
FORMAT = 1

#: The key the scenarios' grants are signed with, given to the implementation at reset.
CONFORMANCE_KEY_ID = "conformance"
CONFORMANCE_SECRET = bytes(range(32))

StepCommand = Command | ClaimNextCommand | Mapping[str, Any]
"""What a step sends: a command model, the scheduler's `claim_next`, or raw JSON.

Raw JSON carries what a model would normalise away (an unsorted set) or
refuse (a malformed command), for scenarios about exactly that.
"""


@dataclass(frozen=True)
class Scenario:
    """A conformance scenario as data: steps of (command, now), from an optional initial store.

    `ends`, when given, is what the last step must end in (an error code, or
    else the state of the command's workload); generation refuses a scenario
    that does not, so a scenario cannot silently stop exercising what its name
    says.
    """

    name: str
    steps: tuple[tuple[StepCommand, int], ...]
    store: tuple[Workload, ...] = ()
    about: str = ""
    ends: str | None = None
    grant_keys: Mapping[str, bytes] = field(
        default_factory=lambda: {CONFORMANCE_KEY_ID: CONFORMANCE_SECRET}
    )


# -- the vector format ---------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoreEntry(_Strict):
    """A document the store holds before the first step (written at version 1)."""

    key: str
    document: dict[str, JsonValue]


class DocumentState(_Strict):
    """A committed document as the vectors compare it: its version and its digest."""

    version: int = Field(ge=1)
    digest: str = Field(pattern="^sha256:[0-9a-f]{64}$")


class Expectation(_Strict):
    """What one step must produce.

    - `response`: `{"ok": reply}` or `{"error": {"code", "details"}}` (errors
      compare by `code` only; `details` are informative);
    - `state`: the committed state of the command's workload after the step
      (`null` when the store has none);
    - `events`: the events the step appended, by workload id (only the
      workloads it changed);
    - `store`: every document after the step, by key: version and digest.
    """

    response: dict[str, JsonValue]
    state: str | None
    events: dict[str, list[dict[str, JsonValue]]]
    store: dict[str, DocumentState]


class VectorStep(_Strict):
    """One step: the command (JSON, with its `op`), its instant, and what it must produce."""

    command: dict[str, JsonValue]
    now: int = Field(ge=0)
    expect: Expectation


class VectorScenario(_Strict):
    """One line of the vector file: a scenario and everything it must produce.

    `documents` are the documents after the last step, in full, by key, so a
    difference in a digest can be shown field by field.
    """

    format: int = FORMAT
    name: str
    about: str = ""
    spec: str
    contract_version: int
    grant_keys: dict[str, str]
    store: list[StoreEntry]
    steps: list[VectorStep]
    documents: dict[str, dict[str, JsonValue]]


# -- what a step produced ----------------------------------------------------------------


def normalise_document(document: Any) -> dict[str, Any]:
    """A workload document with every field present, as the workload schema defines it.

    Raises `ValueError` when it is not a workload document.
    """
    try:
        workload = Workload.model_validate(document)
    except ValidationError as exc:
        raise ValueError(f"not a workload document: {exc.errors()[0]['msg']}") from None
    return workload.model_dump(mode="json", by_alias=True)


def document_digest(document: Mapping[str, Any]) -> str:
    """`sha256:` and the SHA-256 of the canonical JSON of a normalised document."""
    return "sha256:" + digest(document)


def command_json(command: StepCommand) -> dict[str, Any]:
    """A step's command as the JSON the protocol sends."""
    if isinstance(command, BaseModel):
        out: dict[str, Any] = command.model_dump(mode="json", by_alias=True)
        return out
    return json.loads(json.dumps(dict(command)))  # type: ignore[no-any-return]


def target_key(command: Mapping[str, Any], response: Mapping[str, Any]) -> str | None:
    """The workload a command is about: named, derived from the admission, or the one claimed."""
    op = command.get("op")
    if op == "admit":
        try:
            return workload_id_for(CreateWorkload.model_validate(command.get("request")))
        except ValidationError:
            return None
    if op == "claim_next":
        reply = response.get("ok")
        if isinstance(reply, Mapping) and isinstance(reply.get("workload_id"), str):
            return str(reply["workload_id"])
        return None
    key = command.get("workload_id")
    return key if isinstance(key, str) else None


Snapshot = dict[str, tuple[int, dict[str, Any]]]
"""A store read back: key -> (version, normalised document)."""


def observe(
    command: Mapping[str, Any],
    response: Mapping[str, Any],
    before: Snapshot,
    after: Snapshot,
) -> Expectation:
    """What a step produced, from its response and the store before and after it."""
    events: dict[str, list[dict[str, Any]]] = {}
    for key, (version, document) in after.items():
        old = before.get(key)
        if old is not None and old[0] == version:
            continue
        history = document.get("execution_history") or []
        known = len(old[1].get("execution_history") or []) if old is not None else 0
        events[key] = list(history[known:])
    target = target_key(command, response)
    state = after[target][1].get("state") if target is not None and target in after else None
    return Expectation(
        response=dict(response),
        state=state if isinstance(state, str) else None,
        events=events,
        store={
            key: DocumentState(version=version, digest=document_digest(document))
            for key, (version, document) in sorted(after.items())
        },
    )


# -- the reference implementation ----------------------------------------------------


def _error(exc: errors.WorkloadError) -> dict[str, Any]:
    return {"error": json.loads(json.dumps(exc.to_dict(), default=str))}


class ReferenceImplementation:
    """The conformance protocol served by an `Authority` over a `MemoryStore`.

    `handle(request)` takes one request (`reset`, `command` or `store`; see
    `docs/conformance.md`) and returns its response. `python -m
    workwarden.adapter` serves it on standard input and output; the vectors
    are generated with it.
    """

    def __init__(self, spec: Spec | None = None) -> None:
        self.spec = spec if spec is not None else default_spec()
        self.store = MemoryStore()
        self.authority = Authority(
            self.store, grants=GrantVerifier.without_signatures(), spec=self.spec
        )

    def handle(self, request: Any) -> dict[str, Any]:
        """The response to one request."""
        kind = request.get("type") if isinstance(request, Mapping) else None
        try:
            if kind == "reset":
                return self._reset(request)
            if kind == "command":
                return self._command(request.get("command"), request.get("now"))
            if kind == "store":
                return {"ok": self._documents()}
        except errors.WorkloadError as exc:
            return _error(exc)
        return _error(
            errors.WorkloadError(
                errors.INVALID,
                f"unknown request type {kind!r}: expected reset, command or store",
            )
        )

    def _reset(self, request: Mapping[str, Any]) -> dict[str, Any]:
        keys = request.get("grant_keys") or {}
        try:
            secrets = {str(k): bytes.fromhex(v) for k, v in dict(keys).items()}
            documents = [
                (str(entry["key"]), Workload.model_validate(entry["document"]))
                for entry in request.get("store") or []
            ]
        except (ValueError, TypeError, KeyError) as exc:
            raise errors.WorkloadError(errors.INVALID, f"reset: {exc}") from None
        self.store = MemoryStore()
        grants = GrantVerifier(secrets) if secrets else GrantVerifier.without_signatures()
        self.authority = Authority(self.store, grants=grants, spec=self.spec)
        for key, workload in documents:
            document = serialise(workload)
            audit = AuditRecord(
                transaction_id="tx_reset_" + digest(document)[:24],
                key=key,
                version=0,
                actor="conformance.reset",
                operation="reset",
                tenant=workload.tenant_id,
                application=workload.application_id,
                at=workload.updated_at,
                digest=digest(document),
            )
            self.store.write(key, document, index_fields(self.spec, workload), None, audit)
        return {"ok": None}

    def _command(self, command: Any, now: Any) -> dict[str, Any]:
        if isinstance(command, Mapping) and command.get("op") == "claim_next":
            try:
                claim_next = ClaimNextCommand.model_validate(command)
            except ValidationError as exc:
                from workwarden.statemachine.authority import invalid_from_validation

                raise invalid_from_validation(exc) from None
            claim = self.authority.claim_next(
                claim_next.tenant_id,
                claim_next.application_id,
                claim_next.worker_id,
                claim_next.capabilities,
                now,
                claim_next.lease_ms,
            )
            return {"ok": None if claim is None else claim.model_dump(mode="json")}
        if not isinstance(command, Mapping):
            raise errors.WorkloadError(errors.INVALID, "command must be a JSON object")
        reply = self.authority.execute(command, now)
        if isinstance(reply, BaseModel):
            return {"ok": reply.model_dump(mode="json", by_alias=True)}
        return {"ok": reply}

    def _documents(self) -> list[dict[str, Any]]:
        return [
            {"key": doc.key, "version": doc.version, "document": json.loads(doc.document)}
            for doc in self.store.scan()
        ]


def snapshot(entries: Iterable[Mapping[str, Any]]) -> Snapshot:
    """A store read back (`{"key", "version", "document"}` entries), normalised."""
    return {
        str(entry["key"]): (int(entry["version"]), normalise_document(entry["document"]))
        for entry in entries
    }


# -- generating the vectors ----------------------------------------------------------


def _recorded(response: dict[str, Any]) -> dict[str, Any]:
    """A response as the vectors keep it: an error by its code and structured details.

    The message is prose, and the details of `WORKLOAD_INVALID` are the
    validator's words; neither is compared, so neither is kept.
    """
    error = response.get("error")
    if not isinstance(error, Mapping):
        return response
    kept: dict[str, Any] = {"code": error.get("code")}
    if error.get("details") is not None and error.get("code") != errors.INVALID:
        kept["details"] = error["details"]
    return {"error": kept}


def _ending(expect: Expectation) -> str | None:
    error = expect.response.get("error")
    if isinstance(error, Mapping):
        return str(error.get("code"))
    return expect.state


def run_scenario(spec: Spec, scenario: Scenario, *, check_ends: bool = True) -> VectorScenario:
    """Run `scenario` through the reference and record what each step produced.

    With `check_ends`, a scenario whose last step does not end as its `ends`
    says is refused with `ValueError` (turn it off under a changed spec).
    """
    keys = scenario.grant_keys
    store = [
        StoreEntry(key=w.workload_id, document=json.loads(serialise(w))) for w in scenario.store
    ]
    reference = ReferenceImplementation(spec)
    reset = reference.handle(
        {
            "type": "reset",
            "store": [entry.model_dump(mode="json") for entry in store],
            "grant_keys": {k: v.hex() for k, v in keys.items()},
        }
    )
    if "ok" not in reset:
        raise ValueError(f"scenario {scenario.name}: the initial store is refused: {reset}")
    before = snapshot(reference.handle({"type": "store"})["ok"])
    steps: list[VectorStep] = []
    for command, now in scenario.steps:
        sent = command_json(command)
        response = _recorded(reference.handle({"type": "command", "command": sent, "now": now}))
        after = snapshot(reference.handle({"type": "store"})["ok"])
        steps.append(
            VectorStep(command=sent, now=now, expect=observe(sent, response, before, after))
        )
        before = after
    ending = _ending(steps[-1].expect) if steps else None
    if check_ends and scenario.ends is not None and ending != scenario.ends:
        raise ValueError(f"scenario {scenario.name} ends in {ending}, not {scenario.ends}")
    return VectorScenario(
        name=scenario.name,
        about=scenario.about,
        spec=spec.data.spec.name,
        contract_version=spec.contract_version,
        grant_keys={k: v.hex() for k, v in sorted(keys.items())},
        store=store,
        steps=steps,
        documents={key: document for key, (_, document) in sorted(before.items())},
    )


def extra_scenarios(spec: Spec) -> list[Scenario]:
    """Scenarios beyond the seed behaviours: the hook for traces of the model checker.

    Each is a `Scenario` whose steps are `(command, now)` pairs (commands of
    `workwarden.statemachine.commands`, or `ClaimNextCommand` for the
    scheduler; a sweep of one workload is its `RecoverCommand` or
    `EnforceDeadlineCommand`); its store may start empty or hold documents,
    and `grant_keys` names the keys its admissions are signed with. Names
    must not repeat another scenario's (`checker/...` keeps them apart).
    They are appended after the seed scenarios, in the order returned, so the
    vector file stays deterministic as long as this list is.

    These are the model checker's witnesses: in two small universes of one
    workload (one whose retry policy retries everything, one whose policy
    retries only transient connection failures and which has a queue
    deadline), the shortest step sequence that takes each edge of the table
    and the shortest that decides by each rule of each policy. Together they
    take every edge and every rule any step can reach.
    """
    from workwarden.statemachine.check.checker import check
    from workwarden.statemachine.check.replay import trace_commands
    from workwarden.statemachine.check.universe import CHECKER_KEY, CHECKER_KEY_ID, Universe

    universes = (
        ("a policy that retries", Universe.from_spec(spec, dependent=False)),
        (
            "a policy that retries only transient connection failures",
            Universe.from_spec(
                spec,
                dependent=False,
                first_retry_on=["transient_connection"],
                first_timeouts={"queue_ms": 8, "claim_ms": 4},
            ),
        ),
    )
    scenarios: list[Scenario] = []
    seen: set[str] = set()
    for label, universe in universes:
        report = check(spec, universe)
        for key in sorted(report.witnesses):
            if key in seen:
                continue
            seen.add(key)
            steps = trace_commands(spec, universe, list(report.witnesses[key]))
            what = key.split(":", 1)[1]
            scenarios.append(
                Scenario(
                    name=f"checker/{key.replace(' ', '')}",
                    steps=tuple(steps),
                    about=(
                        f"the shortest sequence the model checker found that "
                        f"{'takes' if key.startswith('edge:') else 'decides by'} {what}, "
                        f"under {label}"
                    ),
                    grant_keys={CHECKER_KEY_ID: CHECKER_KEY},
                )
            )
    return scenarios


def all_scenarios(spec: Spec | None = None) -> list[Scenario]:
    """The seed scenarios, then `extra_scenarios`; refuses a name used twice."""
    from workwarden.statemachine.conformance.scenarios import seed_scenarios

    spec = spec if spec is not None else default_spec()
    scenarios = [*seed_scenarios(), *extra_scenarios(spec)]
    seen: set[str] = set()
    for scenario in scenarios:
        if scenario.name in seen:
            raise ValueError(f"two scenarios are named {scenario.name!r}")
        seen.add(scenario.name)
    return scenarios


def generate_vectors(
    spec: Spec | None = None,
    scenarios: Sequence[Scenario] | None = None,
    *,
    check_ends: bool = True,
) -> list[VectorScenario]:
    """Run every scenario (all of them by default) and return its vector, in scenario order."""
    spec = spec if spec is not None else default_spec()
    chosen = all_scenarios(spec) if scenarios is None else scenarios
    return [run_scenario(spec, scenario, check_ends=check_ends) for scenario in chosen]


def render_vectors(vectors: Iterable[VectorScenario]) -> str:
    """The vector file: one scenario a line, sorted keys, no spaces, ASCII."""
    return "".join(
        json.dumps(v.model_dump(mode="json"), sort_keys=True, separators=(",", ":")) + "\n"
        for v in vectors
    )


def read_vectors(text: str) -> list[VectorScenario]:
    """Parse a vector file; `ValueError` names the first bad line."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(VectorScenario.model_validate_json(line))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"line {number}: {where}: {first['msg']}") from None
    return out


# -- coverage ---------------------------------------------------------------------------


@dataclass
class Coverage:
    """How often the vectors take each edge of the table and each rule of each policy."""

    edges: Counter[tuple[str, str]]
    rules: Counter[tuple[str, str]]
    missing_edges: list[tuple[str, str]]
    missing_rules: list[tuple[str, str]]
    scenarios: int = 0
    steps: int = 0

    def render(self, spec: Spec) -> list[str]:
        """The report as lines."""
        total_rules = sum(len(p.rules) for p in spec.policies.values())
        lines = [
            f"{self.scenarios} scenarios, {self.steps} steps",
            f"edges taken: {len(spec.edges) - len(self.missing_edges)} of {len(spec.edges)}",
        ]
        for edge in spec.data.transitions:
            pair = (edge.from_state, edge.to)
            lines.append(f"  {edge.from_state:>22} -> {edge.to:<22} {self.edges.get(pair, 0):>5}")
        lines.append(f"rules taken: {total_rules - len(self.missing_rules)} of {total_rules}")
        for name, policy in spec.policies.items():
            for rule in policy.rules:
                key = (name, rule.spec.decision)
                lines.append(f"  {name:>16}  {rule.spec.decision:<32} {self.rules.get(key, 0):>5}")
        for source, target in self.missing_edges:
            lines.append(f"missing edge: {source} -> {target}")
        for name, decision in self.missing_rules:
            lines.append(f"missing rule: {name} {decision}")
        return lines


def coverage(spec: Spec, vectors: Sequence[VectorScenario]) -> Coverage:
    """Which edges and policy rules the vectors' committed events take, and how often."""
    from workwarden.statemachine.properties.decisions import decisions_taken

    edges: Counter[tuple[str, str]] = Counter()
    rules: Counter[tuple[str, str]] = Counter()
    steps = 0
    for vector in vectors:
        histories: dict[str, list[Event]] = {}
        for step in vector.steps:
            steps += 1
            for key, new in step.expect.events.items():
                histories.setdefault(key, []).extend(Event.model_validate(e) for e in new)
        for history in histories.values():
            for event in history:
                if event.from_state is not None:
                    edges[(event.from_state, event.to)] += 1
            rules.update(decisions_taken(spec, history))
    return Coverage(
        edges=edges,
        rules=rules,
        missing_edges=[pair for pair in spec.edges if pair not in edges],
        missing_rules=[
            (name, rule.spec.decision)
            for name, policy in spec.policies.items()
            for rule in policy.rules
            if (name, rule.spec.decision) not in rules
        ],
        scenarios=len(vectors),
        steps=steps,
    )
