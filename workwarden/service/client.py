"""`HttpAuthority`: the authority's worker and operator calls, over the service's HTTP API.

It has `Authority`'s method names and signatures (`admit`, `claim`,
`claim_next`, `start`, `heartbeat`, `execution_context`, `checkpoint`,
`complete`, `fail`, `confirm_cancel`, `cancel`, `timeout`, `retry`,
`operate`, `recover_expired`, `enforce_deadlines`, `get`, `list`, the
batch calls `admit_many`, `claim_many`, `report_many`, and the operators'
`pause`, `resume`, `pauses` and `purge`) and returns the same models and
records (a batch slot's refusal as the `WorkloadError` in its slot), so
anything written against an `Authority` (the worker runtime's
`Worker(authority, app)`) runs over HTTP with a token instead of database
credentials. A refusal is raised as the `WorkloadError` the
service's problem document carries: the same code, message and details.
Arguments are checked here first, with the command models, so a malformed
call is `WORKLOAD_INVALID` without a round trip.

Where the service could not be reached (nothing was sent) the call raises
`WORKLOAD_STORAGE_FAILURE`; where the request was sent and no reply came
back (a timeout, a broken connection), or what came back is not the
service's answer (a 5xx without a problem document, a body that is not the
call's reply), `WORKLOAD_OUTCOME_UNKNOWN`: call again with the same
arguments, as with a store whose reply was lost. A read writes nothing: for
`get`, `list` and `pauses` each of these is `WORKLOAD_STORAGE_FAILURE`.

`now` is sent in the `X-Workwarden-Now` header; a service decides at its
own clock unless it runs with `--test-clock`. Give one token, or several
(a worker's and an operator's): each call sends the one whose actor class
the spec's operations table names for it. Called inside an OpenTelemetry
span, a call carries its `traceparent`, so the service's span is its child.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from workwarden.service import tracing
from workwarden.service.auth import peek_actor_class
from workwarden.service.operator_models import (
    PauseReply,
    PauseRequest,
    PurgeReply,
    PurgeRequest,
    ResumeReply,
    ResumeRequest,
    pause_record,
    purge_report,
)
from workwarden.service.state import MIN_BODY_BYTES, NOW_HEADER
from workwarden.statemachine import errors, fairness, inputs, listing, safety
from workwarden.statemachine.batches import MAX_BATCH, REPORT_COMMANDS, as_batch
from workwarden.statemachine.commands import (
    AdmitCommand,
    AdmitReply,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    ClaimNextCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    TimeoutCommand,
    WorkloadPage,
)
from workwarden.statemachine.conformance.schemas import REPLY_MODELS
from workwarden.statemachine.models import (
    Attempt,
    Checkpoint,
    Claim,
    ClaimReply,
    CreateWorkload,
    ExecutionContext,
    Fence,
    Result,
    Workload,
)
from workwarden.statemachine.retention import PurgeReport
from workwarden.statemachine.spec import Spec, default_spec
from workwarden.storage.base import PauseRecord, StoredDocument

__all__ = ["HttpAuthority", "problem_error", "raise_problem"]

_T = TypeVar("_T")
#: The transport failures raised before any of the request left: nothing was sent.
_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
    httpx.ProxyError,
)
# The reply model of each report, by its op (what the one-call method returns, as a model).
_REPORT_REPLIES: dict[str, type[BaseModel]] = {
    "start": Attempt,
    "heartbeat": Claim,
    "checkpoint": Checkpoint,
    "complete": Result,
    "fail": StateReply,
    "confirm_cancel": StateReply,
}


def problem_error(body: Any) -> errors.WorkloadError | None:
    """The `WorkloadError` a problem document carries (None: `body` is not one)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("code"), str):
        return None
    details = body.get("details")
    return errors.WorkloadError(
        body["code"],
        str(body.get("detail", "")),
        details if isinstance(details, Mapping) else None,
    )


def raise_problem(response: httpx.Response, *, writes: bool = False) -> None:
    """Raise the `WorkloadError` a problem response carries (nothing for a success).

    A refusal that is not the service's problem document (a proxy's page, a
    server that broke off) is `WORKLOAD_STORAGE_FAILURE`, unless the call
    `writes` and the status is a 5xx: the request may have reached the
    service and been decided before whatever answered failed, so it is
    `WORKLOAD_OUTCOME_UNKNOWN`, as a lost reply is.
    """
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    refusal = problem_error(body)
    if refusal is not None:
        raise refusal
    status = response.status_code
    if writes and status >= 500:
        raise errors.WorkloadError(
            errors.OUTCOME_UNKNOWN,
            f"the call was sent and HTTP {status} came back without a problem document: it may"
            " or may not have been decided; call again with the same arguments",
            {"status": status},
        )
    raise errors.WorkloadError(
        errors.STORAGE_FAILURE,
        f"the service answered HTTP {status} without a problem document",
        {"status": status},
    )


def _unreadable(writes: bool, what: str) -> errors.WorkloadError:
    """The refusal of a success reply that is not what the call answers (`what` says how)."""
    if writes:
        return errors.WorkloadError(
            errors.OUTCOME_UNKNOWN,
            f"the call was sent and its reply {what}: it may or may not have been decided;"
            " call again with the same arguments",
        )
    return errors.WorkloadError(errors.STORAGE_FAILURE, f"the service's reply {what}")


def _reply(data: Any, reply: Any, writes: bool = True) -> Any:
    """`data` validated as `reply` (a model or a type), or the refusal of an unreadable reply."""
    try:
        return TypeAdapter(reply).validate_python(data)
    except ValidationError:
        raise _unreadable(writes, "is not the reply this call answers") from None


class HttpAuthority:
    """The authority behind `base_url`, called with `token` (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        token: str | Sequence[str],
        *,
        spec: Spec | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        tokens = [token] if isinstance(token, str) else list(token)
        if not tokens:
            raise errors.bad_argument("tokens", "HttpAuthority needs at least one token")
        self.spec = spec if spec is not None else default_spec()
        self._tokens: dict[str, str] = {peek_actor_class(t): t for t in reversed(tokens)}
        self._default = tokens[0]
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> HttpAuthority:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the wire ------------------------------------------------------------

    def _token(self, operation: str, actor_class: str | None) -> str:
        if actor_class is None:
            row = self.spec.operations.get(operation)
            actor_class = row.spec.actor if row is not None else None
        return self._tokens.get(actor_class, self._default) if actor_class else self._default

    def request(
        self,
        method: str,
        path: str,
        operation: str,
        *,
        body: Any = None,
        now: int | None = None,
        params: Mapping[str, str] | None = None,
        actor_class: str | None = None,
        raw: bytes | None = None,
    ) -> Any:
        """Send one call; its reply as JSON data, or raise the refusal.

        The token sent is the one of `actor_class`, by default the class the
        spec names for `operation` (the first token when it names none). The
        body is `body` as JSON, or `raw`, JSON text already made.
        """
        headers = {"Authorization": f"Bearer {self._token(operation, actor_class)}"}
        if now is not None:
            inputs.check_now(now)
            headers[NOW_HEADER] = str(now)
        tracing.inject(headers)
        if raw is None and body is not None:
            raw = _json_body(body)
        sent: dict[str, Any] = {}
        if raw is not None:
            headers["Content-Type"] = "application/json"
            sent = {"content": raw}
        writes = method != "GET"
        try:
            response = self._http.request(method, path, headers=headers, params=params, **sent)
        except _NOT_SENT as exc:
            raise errors.WorkloadError(
                errors.STORAGE_FAILURE, f"the service could not be reached: {exc}"
            ) from None
        except httpx.TransportError as exc:
            # A read writes nothing: whatever became of it, nothing was decided.
            raise errors.WorkloadError(
                errors.OUTCOME_UNKNOWN if writes else errors.STORAGE_FAILURE,
                f"the call was sent and no reply came back ({type(exc).__name__}); call again"
                " with the same arguments",
            ) from None
        raise_problem(response, writes=writes)
        try:
            return response.json()
        except ValueError:
            raise _unreadable(writes, "is not JSON") from None

    def _batch(
        self, path: str, operation: str, key: str, texts: builtins.list[str], now: int
    ) -> builtins.list[Any]:
        """POST `{key: texts}` (each item's JSON text), in as many bodies as the service's size
        limit needs, in order.

        Every service takes a body of `MIN_BODY_BYTES`; a batch whose JSON is
        larger (large inputs or outputs) goes as consecutive batches, each
        under it, and the answers are joined. The batch calls answer each
        slot on its own, so this changes only the number of round trips.
        """
        budget = MIN_BODY_BYTES - len(key) - 16
        answers: builtins.list[Any] = []
        start = 0
        while True:
            size, end = 0, start
            while end < len(texts) and (end == start or size + len(texts[end]) + 1 <= budget):
                size += len(texts[end]) + 1
                end += 1
            body = f'{{"{key}":[{",".join(texts[start:end])}]}}'.encode()
            data = self.request("POST", path, operation, raw=body, now=now)
            answers.extend(_slots(data, end - start))
            if end >= len(texts):
                return answers
            start = end

    def _post(self, operation: str, command: BaseModel, now: int, reply: type[_T]) -> _T:
        inputs.check_now(now)
        data = self.request(
            "POST",
            f"/v1/{operation}",
            operation,
            body=command.model_dump(mode="json", by_alias=True),
            now=now,
        )
        return _reply(data, reply)  # type: ignore[no-any-return]

    # -- admission and the worker's calls -------------------------------------

    def admit(self, request: CreateWorkload | Mapping[str, Any], now: int) -> AdmitReply:
        """`Authority.admit` over HTTP."""
        parsed = inputs.as_request(request)
        _carried(self.spec, parsed.input, "input")
        return self._post("admit", parsed, now, AdmitReply)

    def claim(
        self,
        workload_id: str,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        *,
        request_id: str | None = None,
    ) -> ClaimReply:
        """`Authority.claim` over HTTP."""
        command = inputs.build(
            ClaimCommand,
            workload_id=workload_id,
            worker_id=worker_id,
            capabilities=inputs.as_names(capabilities, "capabilities"),
            lease_ms=lease_ms,
            request_id=request_id,
        )
        return self._post("claim", command, now, ClaimReply)

    def claim_next(
        self,
        tenant: str,
        application: str,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        *,
        request_id: str | None = None,
    ) -> ClaimReply | None:
        """`Authority.claim_next` over HTTP: the claim, or None when nothing is claimable.

        The arguments are checked here as the library checks them, in its order.
        """
        inputs.check_now(now)
        tenant, application = inputs.as_full_scope(tenant, application)
        command = inputs.build(
            ClaimNextCommand,
            tenant_id=tenant,
            application_id=application,
            worker_id=worker_id,
            capabilities=inputs.as_names(capabilities, "capabilities"),
            lease_ms=lease_ms,
            request_id=request_id,
        )
        return self._post("claim_next", command, now, ClaimReply | None)  # type: ignore[arg-type]

    def start(self, workload_id: str, fence: Fence, now: int) -> Attempt:
        """`Authority.start` over HTTP."""
        command = inputs.build(StartCommand, workload_id=workload_id, fence=fence)
        return self._post("start", command, now, Attempt)

    def heartbeat(self, workload_id: str, fence: Fence, now: int, extend_ms: int) -> Claim:
        """`Authority.heartbeat` over HTTP."""
        command = inputs.build(
            HeartbeatCommand, workload_id=workload_id, fence=fence, extend_ms=extend_ms
        )
        return self._post("heartbeat", command, now, Claim)

    def execution_context(
        self, workload_id: str, fence: Fence, now: int, secret_references: Iterable[str] = ()
    ) -> ExecutionContext:
        """`Authority.execution_context` over HTTP."""
        command = inputs.build(
            ExecutionContextCommand,
            workload_id=workload_id,
            fence=fence,
            secret_references=inputs.as_names(secret_references, "secret_references"),
        )
        return self._post("execution_context", command, now, ExecutionContext)

    def checkpoint(
        self,
        workload_id: str,
        fence: Fence,
        state: Any,
        now: int,
        *,
        sequence: int | None = None,
    ) -> Checkpoint:
        """`Authority.checkpoint` over HTTP."""
        command = inputs.build(
            CheckpointCommand, workload_id=workload_id, fence=fence, state=state, sequence=sequence
        )
        _carried(self.spec, command.state, "state")
        return self._post("checkpoint", command, now, Checkpoint)

    def complete(
        self,
        workload_id: str,
        fence: Fence,
        result_id: str,
        output: Any,
        now: int,
        *,
        artifacts: Iterable[str] = (),
        schema_version: int = 1,
    ) -> Result:
        """`Authority.complete` over HTTP."""
        command = inputs.build(
            CompleteCommand,
            workload_id=workload_id,
            fence=fence,
            result_id=result_id,
            output=output,
            artifacts=inputs.as_names(artifacts, "artifacts"),
            schema_version=schema_version,
        )
        _carried(self.spec, command.output, "output")
        return self._post("complete", command, now, Result)

    def fail(
        self,
        workload_id: str,
        fence: Fence,
        kind: str,
        error: str,
        now: int,
        *,
        effect: str | None = None,
    ) -> str:
        """`Authority.fail` over HTTP: the state the failure policy decided."""
        command = inputs.build(
            FailCommand,
            workload_id=workload_id,
            fence=fence,
            kind=kind,
            error=error,
            effect=effect,
        )
        return self._post("fail", command, now, StateReply).state

    def confirm_cancel(self, workload_id: str, fence: Fence, now: int) -> str:
        """`Authority.confirm_cancel` over HTTP."""
        command = inputs.build(ConfirmCancelCommand, workload_id=workload_id, fence=fence)
        return self._post("confirm_cancel", command, now, StateReply).state

    # -- batches --------------------------------------------------------------------

    def admit_many(
        self, requests: Iterable[CreateWorkload | Mapping[str, Any]], now: int
    ) -> builtins.list[AdmitReply | errors.WorkloadError]:
        """`Authority.admit_many` over HTTP: one round trip; each slot its reply or refusal.

        A request that does not parse is refused in its slot here, as the
        library refuses it, and is not sent.
        """
        inputs.check_now(now)
        slots: builtins.list[Any] = [None] * len(batch := as_batch(requests, "requests"))
        sent: builtins.list[tuple[int, CreateWorkload]] = []
        items: builtins.list[str] = []
        for index, request in enumerate(batch):
            try:
                parsed = inputs.as_request(request)
                _carried(self.spec, parsed.input, "input")
                items.append(_item(parsed))
            except errors.WorkloadError as exc:
                slots[index] = exc
                continue
            sent.append((index, parsed))
        data = self._batch("/v1/admit_many", "admit", "requests", items, now)
        for (index, _), answer in zip(sent, _slots(data, len(sent)), strict=True):
            slots[index] = _outcome(answer, AdmitReply)
        return slots

    def fair_share(self, scopes: Iterable[Any]) -> fairness.FairShare:
        """`Authority.fair_share`: a ledger over `scopes`, as the client's spec's `[fairness]` says.

        The ledger is the claimer's own, kept on this side; the service sees
        only the claims it asks for.
        """
        return fairness.FairShare.from_spec(self.spec, scopes)

    def claim_fair(
        self,
        share: fairness.FairShare,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        *,
        limit: int = 1,
        request_id: str | None = None,
    ) -> builtins.list[ClaimReply]:
        """`Authority.claim_fair` over HTTP: one `claim_next` or `claim_many` per scope tried."""
        return fairness.claim_fair(
            self, share, worker_id, capabilities, now, lease_ms, limit, request_id
        )

    def claim_many(
        self,
        tenant: str,
        application: str,
        worker_id: str,
        capabilities: Iterable[str],
        now: int,
        lease_ms: int,
        limit: int,
        *,
        request_id: str | None = None,
    ) -> builtins.list[ClaimReply]:
        """`Authority.claim_many` over HTTP: up to `limit` claims; [] when nothing is claimable.

        The arguments are checked here as the library checks them, in its order.
        """
        inputs.check_now(now)
        tenant, application = inputs.as_full_scope(tenant, application)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
            raise errors.bad_argument(
                "limit", f"limit must be a whole number from 1 to {MAX_BATCH}"
            )
        probe = inputs.build(
            ClaimCommand,
            workload_id="-",
            worker_id=worker_id,
            capabilities=inputs.as_names(capabilities, "capabilities"),
            lease_ms=lease_ms,
            request_id=request_id,
        )
        body = {
            "tenant_id": tenant,
            "application_id": application,
            **probe.model_dump(mode="json", exclude={"op", "workload_id"}),
            "limit": limit,
        }
        data = self.request("POST", "/v1/claim_many", "claim_next", body=body, now=now)
        return _reply(data, builtins.list[ClaimReply])  # type: ignore[no-any-return]

    def report_many(
        self, reports: Iterable[Command | Mapping[str, Any]], now: int
    ) -> builtins.list[Any]:
        """`Authority.report_many` over HTTP: one round trip; each slot its reply or refusal.

        A report that does not parse, or is not one of the worker's fenced
        reports, is refused in its slot here, as the library refuses it, and
        is not sent.
        """
        inputs.check_now(now)
        slots: builtins.list[Any] = [None] * len(batch := as_batch(reports, "reports"))
        sent: builtins.list[tuple[int, Command]] = []
        items: builtins.list[str] = []
        for index, report in enumerate(batch):
            try:
                command = inputs.as_command(report)
            except errors.WorkloadError as exc:
                slots[index] = exc
                continue
            if not isinstance(command, REPORT_COMMANDS):
                slots[index] = errors.bad_argument(
                    f"reports[{index}]",
                    "a report is one of: "
                    + ", ".join(model.model_fields["op"].default for model in REPORT_COMMANDS),
                )
                continue
            try:
                if isinstance(command, CheckpointCommand):
                    _carried(self.spec, command.state, "state")
                elif isinstance(command, CompleteCommand):
                    _carried(self.spec, command.output, "output")
                items.append(_item(command))
            except errors.WorkloadError as exc:
                slots[index] = exc
                continue
            sent.append((index, command))
        operation = sent[0][1].op if sent else "start"
        data = self._batch("/v1/report_many", operation, "reports", items, now)
        for (index, command), answer in zip(sent, _slots(data, len(sent)), strict=True):
            slots[index] = _outcome(answer, _REPORT_REPLIES[command.op])
        return slots

    # -- operators ------------------------------------------------------------------

    def cancel(
        self, workload_id: str, actor: str, now: int, *, request_id: str | None = None
    ) -> str:
        """`Authority.cancel` over HTTP (`actor` must be the operator token's subject)."""
        command = inputs.build(
            CancelCommand, workload_id=workload_id, actor=actor, request_id=request_id
        )
        return self._post("cancel", command, now, StateReply).state

    def timeout(
        self, workload_id: str, actor: str, now: int, *, request_id: str | None = None
    ) -> str:
        """`Authority.timeout` over HTTP."""
        command = inputs.build(
            TimeoutCommand, workload_id=workload_id, actor=actor, request_id=request_id
        )
        return self._post("timeout", command, now, StateReply).state

    def retry(
        self,
        workload_id: str,
        actor: str,
        now: int,
        reason: str | None = None,
        *,
        request_id: str | None = None,
    ) -> str:
        """`Authority.retry` over HTTP."""
        command = inputs.build(
            RetryCommand,
            workload_id=workload_id,
            actor=actor,
            reason=reason,
            request_id=request_id,
        )
        return self._post("retry", command, now, StateReply).state

    def operate(
        self,
        workload_id: str,
        operation: str,
        actor: str,
        now: int,
        reason: str | None = None,
        *,
        request_id: str | None = None,
    ) -> str:
        """`Authority.operate` over HTTP."""
        command = inputs.build(
            OperatorCommand,
            operation=operation,
            workload_id=workload_id,
            actor=actor,
            reason=reason,
            request_id=request_id,
        )
        # A move the client's spec lacks (the service's copy adds it) is an operator's, as
        # `/v1/operate` is: sent with the operator's token, not with the first one given.
        row = self.spec.operations.get(operation)
        data = self.request(
            "POST",
            "/v1/operate",
            operation,
            body=command.model_dump(mode="json", by_alias=True),
            now=now,
            actor_class=row.spec.actor if row is not None else "operator",
        )
        return _reply(data, StateReply).state  # type: ignore[no-any-return]

    def execute(self, command: Command | Mapping[str, Any], now: int) -> Any:
        """`Authority.execute` over HTTP (`/v1/execute`): a command of the core, by its `op`.

        The command is checked here as the library checks it (a malformed one,
        or an `op` that is no command of the core, is `WORKLOAD_INVALID` and
        nothing is sent); the reply is the model the library's `execute`
        returns for that `op`, and a refusal the library's `WorkloadError`.
        """
        inputs.check_now(now)
        parsed = inputs.as_command(command)
        if isinstance(parsed, AdmitCommand):
            _carried(self.spec, parsed.request.input, "input")
        operation = parsed.operation if isinstance(parsed, OperatorCommand) else parsed.op
        data = self.request(
            "POST",
            "/v1/execute",
            operation,
            body=parsed.model_dump(mode="json", by_alias=True),
            now=now,
        )
        return _reply(data, REPLY_MODELS[parsed.op])

    # -- pauses and retention ---------------------------------------------------------

    def pause(
        self,
        actor: str,
        now: int,
        *,
        tenant: str,
        application: str | None = None,
        definition: str | None = None,
        concurrency_key: str | None = None,
        reason: str | None = None,
        request_id: str | None = None,
    ) -> PauseRecord:
        """`Authority.pause` over HTTP: the pause in force (`actor` is the token's subject)."""
        inputs.check_now(now)
        body = inputs.build(
            PauseRequest,
            tenant=tenant,
            application=application,
            definition=definition,
            concurrency_key=concurrency_key,
            actor=actor,
            reason=reason,
            request_id=request_id,
        )
        data = self._operator("POST", "pause", body.model_dump(mode="json"), now)
        return pause_record(_reply(data, PauseReply))

    def resume(
        self,
        actor: str,
        now: int,
        *,
        tenant: str,
        application: str | None = None,
        definition: str | None = None,
        concurrency_key: str | None = None,
        request_id: str | None = None,
    ) -> bool:
        """`Authority.resume` over HTTP: True if the scope was paused."""
        inputs.check_now(now)
        body = inputs.build(
            ResumeRequest,
            tenant=tenant,
            application=application,
            definition=definition,
            concurrency_key=concurrency_key,
            actor=actor,
            request_id=request_id,
        )
        data = self._operator("POST", "resume", body.model_dump(mode="json"), now)
        return _reply(data, ResumeReply).resumed  # type: ignore[no-any-return]

    def pauses(self, tenant: str | None = None) -> builtins.list[PauseRecord]:
        """`Authority.pauses` over HTTP: the pauses in force, by scope key."""
        params = None if tenant is None else {"tenant": inputs.as_name(tenant, "tenant")}
        data = self.request("GET", "/v1/pauses", "pauses", params=params, actor_class="operator")
        return [pause_record(reply) for reply in _reply(data, builtins.list[PauseReply], False)]

    def purge(
        self,
        now: int,
        *,
        older_than_ms: int | None = None,
        tenant: str | None = None,
        application: str | None = None,
        actor: str | None = None,
        export: Callable[[StoredDocument], None] | None = None,
        dry_run: bool = False,
        limit: int | None = None,
    ) -> PurgeReport:
        """`Authority.purge` over HTTP, less `export`, which runs only where the store is.

        An `export` is refused (`WORKLOAD_INVALID`) without a round trip:
        exporting each document before it goes cannot be done from here
        (use `workwarden purge --export FILE` beside the store). Without
        `actor`, the service records the operator token's subject.
        """
        # Checked as the library checks them, in its order, with its words.
        inputs.check_now(now)
        if older_than_ms is not None and (
            isinstance(older_than_ms, bool)
            or not isinstance(older_than_ms, int)
            or not 0 <= older_than_ms <= 2**53 - 1
        ):
            raise errors.bad_argument(
                "older_than_ms", "older_than_ms must be a whole number of ms, 0 to 2**53 - 1"
            )
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise errors.bad_argument("limit", "limit must be a whole number above 0")
        if not isinstance(dry_run, bool):
            raise errors.bad_argument("dry_run", "dry_run must be True or False")
        if export is not None:
            raise errors.bad_argument(
                "export",
                "a purge over HTTP cannot export; run `workwarden purge --export FILE`"
                " where the store is",
            )
        body = inputs.build(
            PurgeRequest,
            older_than_ms=older_than_ms,
            tenant=tenant,
            application=application,
            actor=actor,
            dry_run=dry_run,
            limit=limit,
        )
        data = self._operator("POST", "purge", body.model_dump(mode="json"), now)
        return purge_report(_reply(data, PurgeReply))

    def _operator(self, method: str, operation: str, body: Any, now: int) -> Any:
        inputs.check_now(now)
        return self.request(
            method, f"/v1/{operation}", operation, body=body, now=now, actor_class="operator"
        )

    # -- sweeps and reads ---------------------------------------------------------------

    def _sweep(
        self, operation: str, now: int, tenant: str | None, application: str | None
    ) -> builtins.list[str]:
        inputs.check_now(now)
        tenant, application = inputs.as_scope(tenant, application)
        body = {"tenant": tenant, "application": application}
        data = self.request("POST", f"/v1/{operation}", operation, body=body, now=now)
        return _reply(data, builtins.list[str])  # type: ignore[no-any-return]

    def recover_expired(
        self, now: int, *, tenant: str | None = None, application: str | None = None
    ) -> builtins.list[str]:
        """`Authority.recover_expired` over HTTP: the ids recovered."""
        return self._sweep("recover_expired", now, tenant, application)

    def enforce_deadlines(
        self, now: int, *, tenant: str | None = None, application: str | None = None
    ) -> builtins.list[str]:
        """`Authority.enforce_deadlines` over HTTP: the ids timed out."""
        return self._sweep("enforce_deadlines", now, tenant, application)

    def get(
        self, workload_id: str, *, tenant: str | None = None, application: str | None = None
    ) -> Workload:
        """`Authority.get` over HTTP."""
        key = inputs.as_name(workload_id, "workload_id")
        tenant, application = inputs.as_scope(tenant, application)
        params = {
            k: v for k, v in (("tenant", tenant), ("application", application)) if v is not None
        }
        # Dots encoded too: a path segment `.` or `..` would be resolved away before sending.
        path = "/v1/workloads/" + quote(key, safe="").replace(".", "%2E")
        data = self.request("GET", path, "get", params=params)
        return _reply(data, Workload, False)  # type: ignore[no-any-return]

    def list(self, tenant: str, application: str) -> builtins.list[Workload]:
        """`Authority.list` over HTTP."""
        tenant, application = inputs.as_full_scope(tenant, application)
        data = self.request(
            "GET", "/v1/workloads", "list", params={"tenant": tenant, "application": application}
        )
        return _reply(data, builtins.list[Workload], False)  # type: ignore[no-any-return]

    def list_page(
        self, tenant: str, application: str, limit: int, after: str | None = None
    ) -> WorkloadPage:
        """`Authority.list_page` over HTTP."""
        tenant, application = inputs.as_full_scope(tenant, application)
        limit = listing.check_limit(limit)
        listing.parse_cursor(after)
        params = {"tenant": tenant, "application": application, "limit": str(limit)}
        if after is not None:
            params["after"] = after
        data = self.request("GET", "/v1/list_page", "list_page", params=params)
        return _reply(data, WorkloadPage, False)  # type: ignore[no-any-return]


def _json_body(value: Any) -> bytes:
    """`value` as the UTF-8 JSON text of a call's body, or `WORKLOAD_INVALID`, as `Authority`
    refuses the same arguments: a number that is not finite, text that is not Unicode
    (a lone surrogate), bytes or another object JSON does not hold, nesting too deep."""
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError, RecursionError) as exc:
        raise errors.WorkloadError(
            errors.INVALID,
            f"the call's arguments are not JSON the service can take ({type(exc).__name__})",
        ) from None


def _item(model: BaseModel) -> str:
    """A batch item's JSON text, or `WORKLOAD_INVALID` (refused in its slot)."""
    return _json_body(model.model_dump(mode="json", by_alias=True)).decode("utf-8")


def _carried(spec: Spec, value: Any, what: str) -> None:
    """Refuse, as the library does, a JSON value (an input, a state, an output) no body can
    carry: a number that is not finite, a value JSON does not hold, text that is not
    Unicode, nesting deeper than the spec's `[limits] max_json_depth`.

    `safety.check_json` is the core's own check of the value, with its message and
    `details.field`; a value a body can carry is left to the service, which checks it
    with its spec.
    """
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError, RecursionError):
        safety.check_json(spec, value, what)
        return
    if safety.json_depth(value) > spec.limits.max_json_depth:
        safety.check_json(spec, value, what)


def _slots(data: Any, count: int) -> builtins.list[Any]:
    if not isinstance(data, builtins.list) or len(data) != count:
        raise _unreadable(True, f"to a batch of {count} does not hold one slot per item")
    return data


def _outcome(answer: Any, reply: type[_T]) -> _T | errors.WorkloadError:
    """One batch slot: its reply as `reply`, or the `WorkloadError` its problem document carries."""
    if isinstance(answer, Mapping) and "problem" in answer:
        refusal = problem_error(answer["problem"])
        if refusal is not None:
            return refusal
    if isinstance(answer, Mapping) and "ok" in answer:
        return _reply(answer["ok"], reply)  # type: ignore[no-any-return]
    raise _unreadable(True, "holds a batch slot that is neither ok nor a problem")
