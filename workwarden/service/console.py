"""The operator console: server-rendered pages over the service's store, under `/console`.

Pages (Jinja2 templates shipped in `workwarden/service/templates/`, no
JavaScript; each refreshes itself with `<meta http-equiv="refresh">`, but for
the sign-in form and a page showing a signed-in operator a form to fill, which
a refresh would wipe as it is typed):

- `/console/`: workloads by state per tenant and application, the age of the
  oldest queued workload, recoveries and timeouts in the last hour;
- `/console/workloads`: every workload, filtered by tenant, application and state;
- `/console/workloads/{id}`: one workload, its history as a timeline, its
  audit records, and the legal-transition diagram with its path drawn
  (`workwarden.statemachine.diagram`, as `workwarden diagram --history`; needs
  Graphviz's `dot`);
  The page offers a form for each operation of effect `move` the spec gives an
  operator out of the workload's state (`approve` and `reject` of
  `specs/examples/approval.toml`, `pause` and `resume` of `pause.toml`);
- `/console/dead-letters`: the workloads at rest in a state an operator's
  `retry` leaves (read from the table), each with a re-arm form;
- `/console/pauses`: the pauses of claiming in force, a form to pause a
  scope and a Resume button per pause (`Authority.pause`, `resume`);
- `/console/audit`: the latest audit records;
- `/console/check`: the checker's report given with `serve --check-report FILE`;
- `/console/login`: an operator signs in with their token (kept in an
  HTTP-only, same-site cookie); `/console/logout` forgets it.

Reading needs no credentials. A posted form over `FORM_MAX_BYTES` is refused
(`WORKLOAD_INVALID`, status 413) as it arrives, before anyone is signed in.
An operator action (a re-arm, a move, a pause, a resume) needs an operator's token,
in the cookie or an `Authorization` header; it goes through `Service.call`
like an API call, with the token's subject as the actor, so the authority's
audit log records who did it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import secrets
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import APIRouter, Request
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, RedirectResponse, Response

from workwarden.service.auth import ANY_SUBJECT, Caller
from workwarden.service.state import Service
from workwarden.statemachine import errors
from workwarden.statemachine.diagram import DiagramError, diagram_dot, render
from workwarden.statemachine.models import Name, Workload
from workwarden.storage.base import KeyedAudit, PauseRecord, RecentAudit, StoredDocument

__all__ = [
    "COOKIE",
    "FORM_MAX_BYTES",
    "PAGE_HEADERS",
    "REFRESH_S",
    "console_router",
    "move_operations",
    "rearmable_states",
]

#: The cookie the console keeps an operator's token in.
COOKIE = "workwarden_token"

#: How often the pages refresh themselves, in seconds.
REFRESH_S = 10

#: The most bytes a form posted to the console may have (more is refused with 413): its
#: largest, a reason of 4,096 characters and four names, each percent-encoded, fits 16 times.
FORM_MAX_BYTES = 1024 * 1024

#: What every page is sent with. No page may be framed by another (`frame-ancestors`,
#: and `X-Frame-Options` for older browsers): a page of another origin of the same site,
#: which the sign-in cookie still reaches, would frame the console and borrow an operator's
#: click on its own Resume or Re-arm button. The pages run no script and load nothing but
#: their inline style, and their forms post only to the console.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}

_HOUR_MS = 3_600_000
_AUDIT_PAGE = 200

#: The key that seals the messages a form's answer hands the page it leads to: a page
#: shows a `message` only with its seal, so a link crafted elsewhere cannot make the
#: console tell an operator something it did not say. One per process: a sealed link
#: of an earlier run shows no message.
_SEAL_KEY = secrets.token_bytes(32)


def _seal(message: str) -> str:
    return hmac.new(_SEAL_KEY, message.encode("utf-8"), hashlib.sha256).hexdigest()


def _told(path: str, message: str) -> str:
    """`path` with `message` for the page to show, and its seal."""
    return f"{path}?{urlencode({'message': message, 'seal': _seal(message)})}"


def _heard(request: Request) -> str | None:
    """The message of the request's query, when its seal is this console's; else None."""
    message = request.query_params.get("message")
    seal = request.query_params.get("seal", "")
    if message is None or not hmac.compare_digest(seal.encode(), _seal(message).encode()):
        return None
    return message


def rearmable_states(service: Service) -> list[str]:
    """The terminal states an operator's `retry` leaves (dead letters in the shipped spec)."""
    spec = service.spec
    return [
        name
        for name, state in spec.data.states.items()
        if state.kind == "terminal" and spec.edges_for(name, "retry")
    ]


def move_operations(service: Service, state: str) -> list[str]:
    """The operations of effect `move` an operator may take out of `state` (those a copy of
    the spec adds: `approve`, `reject`, `pause`, `resume` in the examples), in spec order."""
    spec = service.spec
    return [
        name
        for name, operation in spec.operations.items()
        if operation.spec.effect == "move"
        and operation.actor == "operator"
        and spec.own_edge(state, name) is not None
    ]


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    at = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return f"{at.strftime('%Y-%m-%d %H:%M:%S')}.{ms % 1000:03d}Z"


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = max(ms, 0) // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


class _Pages:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.env = Environment(
            loader=PackageLoader("workwarden.service", "templates"),
            autoescape=select_autoescape(["html"]),
        )
        self.env.filters["when"] = _when
        self.env.filters["age"] = _age
        self.env.filters["url"] = lambda text: quote(str(text), safe="")
        # A fresh operator request id for each re-arm form rendered: the form sent again
        # (a second click, a reply that never arrived) is the same request, answered as the
        # first was, not a second re-arm refused because the first succeeded.
        self.env.globals["request_id"] = lambda: "console-" + secrets.token_hex(8)

    def operator(self, request: Request) -> Caller | None:
        """The operator signed in (cookie or header), or None when read-only.

        A form posted with the sign-in cookie counts only when it comes from the
        console's own pages (`same_origin`): another origin's page, even one of the
        same site (another port, a sibling subdomain) to which the browser still
        sends a `SameSite=Strict` cookie, acts as no one.
        """
        token = request.headers.get("authorization")
        if token is None and request.cookies.get(COOKIE):
            if request.method not in ("GET", "HEAD") and not same_origin(request):
                return None
            token = "Bearer " + request.cookies[COOKIE]
        if token is None:
            return None
        try:
            caller = self.service.caller(token)
        except errors.WorkloadError:
            return None
        return caller if caller.actor_class == "operator" else None

    def page(
        self,
        request: Request,
        name: str,
        status: int = 200,
        *,
        forms: bool = False,
        **values: Any,
    ) -> Response:
        """The page `name`, refreshing itself every `REFRESH_S` seconds unless it shows
        a form to fill: the sign-in form, or (`forms`) an operator's forms to a signed-in
        operator, which a refresh would wipe while they are typed."""
        template = self.env.get_template(name)
        operator = self.operator(request)
        still = name == "login.html" or (forms and operator is not None)
        html = template.render(
            operator=operator,
            refresh=None if still else REFRESH_S,
            spec_name=self.service.spec.data.spec.name,
            now=self.service.wall_now(),
            **values,
        )
        return HTMLResponse(html, status_code=status, headers=PAGE_HEADERS)

    def workloads(self) -> list[Workload]:
        return [Workload.model_validate_json(doc.document) for doc in self.service.store.scan()]

    def sign_in_first(self, request: Request, action: str, back: str) -> Response:
        """The sign-in form, refusing an action without an operator's token (403)."""
        message = f"{action} needs an operator's token: sign in first."
        if request.cookies.get(COOKIE) and not same_origin(request):
            message = (
                f"{action} was posted from a page of another origin, not from this console:"
                " refused, nothing changed."
            )
        return self.page(request, "login.html", status=403, message=message, next=back)


def _actor(caller: Caller) -> str:
    """Whom the audit log names for an operator's console action."""
    return caller.subject if caller.subject != ANY_SUBJECT else "console"


def _pause_marks(pauses: list[PauseRecord], tenant: str, application: str) -> list[str]:
    """What the overview says of a tenant and application's pauses (none: claiming runs)."""
    marks = []
    for record in pauses:
        scope = record.scope
        if scope.tenant != tenant or scope.application not in (None, application):
            continue
        narrowed = [part for part in (scope.definition, scope.concurrency_key) if part]
        marks.append(f"paused: {' '.join(narrowed)}" if narrowed else "paused")
    return marks


def _listed_order(doc: StoredDocument) -> tuple[str, str, int, int]:
    index = doc.index
    return (index.tenant, index.application, -index.priority, index.created_at)


#: How many workloads one page of `/console/workloads` lists.
LIST_PAGE_ROWS = 200


_NAME = TypeAdapter(Name)


def _is_name(text: str) -> bool:
    """Is `text` an identifier a workload may have (1 to 256 printable characters)?"""
    try:
        _NAME.validate_python(text)
    except ValidationError:
        return False
    return True


def _page_number(text: str, pages_in_all: int) -> int:
    """The page `text` asks for, or the nearest there is: 1 for what is not a number in
    ASCII digits (`str.isdigit` takes "²", which `int` does not), the last for one past it
    however many digits it has (`int` refuses more than 4,300)."""
    if not (text.isascii() and text.isdigit()):
        return 1
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(pages_in_all)):
        return pages_in_all
    return min(max(int(digits), 1), pages_in_all)


def same_origin(request: Request) -> bool:
    """Was this request sent by a page of this service: its `Origin` (or, without one, its
    `Referer`) names the host and port the request was sent to?

    Browsers send `Origin` with every form they post; a request with neither header,
    or with the opaque origin `null`, is not taken for one of the console's own.
    """
    origin = request.headers.get("origin")
    if origin is None:
        origin = request.headers.get("referer")
    if not origin or origin == "null":
        return False
    host = request.headers.get("host")
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()


class _Finding(BaseModel):
    """A violation of a check report, as far as the page shows it."""

    property: str
    message: str
    trace: list[Any]


class _CheckReport(BaseModel):
    """The fields of a `workwarden check --json` report the check page shows: a file of
    another shape (a trace, a scheduling report, the diagram's excerpt) is not drawn."""

    spec: str
    universe: dict[str, Any]
    states: int
    transitions: int
    depth: int
    seconds: float
    complete: bool
    violations: list[_Finding]
    policy_problems: list[Any] = []
    refinement: list[_Finding] = []
    cannot_finish: int = 0
    edges_never_taken: list[str]
    never_at_rest: list[str]
    rules_never_taken: dict[str, list[str]]


def _verdict(report: _CheckReport) -> str:
    """What the report found, in words, an incomplete check saying it proves nothing."""
    found = [
        (len(report.violations), "violation(s)"),
        (len(report.policy_problems), "policy problem(s)"),
        (report.cannot_finish, "state(s) that cannot finish"),
        (len(report.refinement), "refinement failure(s)"),
    ]
    named = [f"{count} {what}" for count, what in found if count]
    if named:
        return ", ".join(named)
    if not report.complete:
        return "no violation found, but the check stopped early: it proves nothing"
    return "no violation"


def _read_report(path: str) -> tuple[_CheckReport | None, str | None]:
    """The report at `path`, or None and why it cannot be shown."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"The report {path} cannot be read: {exc}"
    try:
        return _CheckReport.model_validate(data), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        return None, (
            f"The report {path} is not a report of `workwarden check --json`:"
            f" {where}: {first['msg']}"
        )


def _optional(form: Mapping[str, str], name: str) -> str | None:
    # As typed: a name may begin or end with a space (the API takes it), and the
    # Resume button of such a pause must name that very scope.
    value = form.get(name, "")
    return value or None


def console_router(service: Service) -> APIRouter:
    """The `/console` routes over `service`."""
    router = APIRouter(prefix="/console", include_in_schema=False)
    pages = _Pages(service)
    states = list(service.spec.data.states)

    @router.get("/")
    def overview(request: Request) -> Response:
        now = service.wall_now()
        counts: Counter[tuple[str, str, str]] = Counter()
        oldest: dict[tuple[str, str], int] = {}
        queued = service.spec.roles.queued
        for doc in service.store.scan():
            index = doc.index
            counts[(index.tenant, index.application, index.state)] += 1
            if index.state in queued:
                scope = (index.tenant, index.application)
                oldest[scope] = min(oldest.get(scope, index.created_at), index.created_at)
        scopes = sorted({(t, a) for t, a, _ in counts})
        pauses = service.authority.pauses()
        rows = [
            {
                "tenant": t,
                "application": a,
                "counts": [counts[(t, a, s)] for s in states],
                "total": sum(counts[(t, a, s)] for s in states),
                "oldest_queued": now - oldest[(t, a)] if (t, a) in oldest else None,
                "paused": _pause_marks(pauses, t, a),
            }
            for t, a in scopes
        ]
        since = now - _HOUR_MS
        if isinstance(service.store, RecentAudit):
            recent = list(service.store.audit_since(max(since, 0)))
        else:
            recent = [record for record in service.store.audit_log() if record.at >= since]
        hour = Counter(record.operation for record in recent)
        # A deadline's timeout is written by the sweep or at the worker call that found it
        # (audited as that call: a start, a heartbeat...), always by the deadline's actor.
        enforce = service.spec.operations.get("enforce_deadlines")
        deadline_actor = enforce.spec.acting_as if enforce is not None else None
        by_deadline = sum(1 for record in recent if record.actor == deadline_actor)
        return pages.page(
            request,
            "overview.html",
            states=states,
            rows=rows,
            totals=[sum(counts[(t, a, s)] for t, a in scopes) for s in states],
            recoveries=hour["recover_expired"],
            timeouts=by_deadline + hour["timeout"],
            pause_count=len(pauses),
        )

    @router.get("/workloads")
    def workloads(
        request: Request,
        tenant: str = "",
        application: str = "",
        state: str = "",
        page: str = "1",
    ) -> Response:
        # Chosen and ordered by the index fields; only the page's documents are decoded.
        chosen = [
            doc
            for doc in service.store.scan()
            if (not tenant or doc.index.tenant == tenant)
            and (not application or doc.index.application == application)
            and (not state or doc.index.state == state)
        ]
        chosen.sort(key=_listed_order)
        pages_in_all = max(1, -(-len(chosen) // LIST_PAGE_ROWS))
        number = _page_number(page, pages_in_all)
        start = (number - 1) * LIST_PAGE_ROWS
        shown = chosen[start : start + LIST_PAGE_ROWS]
        filters = {"tenant": tenant, "application": application, "state": state}
        return pages.page(
            request,
            "workloads.html",
            workloads=[Workload.model_validate_json(doc.document) for doc in shown],
            states=states,
            filters=filters,
            total=len(chosen),
            first=start + 1 if shown else 0,
            last=start + len(shown),
            page=number,
            pages_in_all=pages_in_all,
            query=urlencode(filters),
        )

    @router.get("/workloads/{workload_id:path}")
    def workload(request: Request, workload_id: str) -> Response:
        # An id no workload can have is not asked of the store (PostgreSQL cannot hold NUL).
        doc = service.store.read(workload_id) if _is_name(workload_id) else None
        if doc is None:
            return pages.page(request, "missing.html", status=404, workload_id=workload_id)
        w = Workload.model_validate_json(doc.document)
        moves = move_operations(service, w.state)
        history = list(w.execution_history)
        try:
            dot = diagram_dot(service.spec, history=history, name=w.workload_id)
            svg = render(dot, "svg").decode("utf-8")
            diagram_error = None
        except DiagramError as exc:
            svg, diagram_error = None, f"{exc.code}: {exc.message}"
        if isinstance(service.store, KeyedAudit):
            audit = list(service.store.audit_of(w.workload_id))
        else:
            audit = [r for r in service.store.audit_log() if r.key == w.workload_id]
        return pages.page(
            request,
            "workload.html",
            w=w,
            version=doc.version,
            history=history,
            svg=svg[svg.find("<svg") :] if svg else None,
            diagram_error=diagram_error,
            audit=audit,
            rearmable=w.state in rearmable_states(service),
            moves=moves,
            document=json.dumps(json.loads(doc.document), indent=2, sort_keys=True),
            message=_heard(request),
            forms=w.state in rearmable_states(service) or bool(moves),
        )

    @router.get("/dead-letters")
    def dead_letters(request: Request) -> Response:
        held = set(rearmable_states(service))
        chosen = sorted(
            (w for w in pages.workloads() if w.state in held),
            key=lambda w: (w.updated_at, w.workload_id),
        )
        return pages.page(
            request,
            "dead_letters.html",
            workloads=chosen,
            rearm_states=sorted(held),
            forms=bool(chosen),
        )

    @router.post("/workloads/{workload_id:path}/retry")
    async def rearm(request: Request, workload_id: str) -> Response:
        form = await _read_form(request)
        caller = pages.operator(request)
        if caller is None:
            back = f"/console/workloads/{quote(workload_id, safe='')}"
            return pages.sign_in_first(request, "Re-arming", back)
        actor = _actor(caller)
        reason = form.get("reason") or None
        request_id = form.get("request_id") or None

        def run() -> str:
            at = service.wall_now()
            return service.authority.retry(workload_id, actor, at, reason, request_id=request_id)

        try:
            state = await run_in_threadpool(service.call, "retry", caller, run, acting_as=actor)
            message = f"re-armed by {actor}: now {state}"
        except errors.WorkloadError as exc:
            message = f"refused: {exc.code}: {exc.message}"
        target = _told(f"/console/workloads/{quote(workload_id, safe='')}", message)
        return RedirectResponse(target, status_code=303)

    @router.post("/workloads/{workload_id:path}/operate")
    async def move(request: Request, workload_id: str) -> Response:
        form = await _read_form(request)
        caller = pages.operator(request)
        back = f"/console/workloads/{quote(workload_id, safe='')}"
        if caller is None:
            return pages.sign_in_first(request, "Moving a workload", back)
        actor = _actor(caller)
        operation = form.get("operation", "")
        reason = form.get("reason") or None
        request_id = form.get("request_id") or None

        def run() -> str:
            at = service.wall_now()
            return service.authority.operate(
                workload_id, operation, actor, at, reason, request_id=request_id
            )

        # Authorized as the move it names; anything else as `operate`, which no row names,
        # so the authority refuses it (`WORKLOAD_INVALID`), as on `/v1/operate`.
        row = service.spec.operations.get(operation)
        named = operation if row is not None and row.spec.effect == "move" else "operate"
        try:
            state = await run_in_threadpool(service.call, named, caller, run, acting_as=actor)
            message = f"{operation} by {actor}: now {state}"
        except errors.WorkloadError as exc:
            message = f"refused: {exc.code}: {exc.message}"
        return RedirectResponse(_told(back, message), status_code=303)

    @router.get("/pauses")
    def pauses(request: Request) -> Response:
        return pages.page(
            request,
            "pauses.html",
            pauses=service.authority.pauses(),
            message=_heard(request),
            forms=True,
        )

    @router.post("/pauses")
    async def pause(request: Request) -> Response:
        form = await _read_form(request)
        caller = pages.operator(request)
        if caller is None:
            return pages.sign_in_first(request, "Pausing", "/console/pauses")
        actor = _actor(caller)
        at = service.wall_now()

        def run() -> PauseRecord:
            return service.authority.pause(
                actor,
                at,
                tenant=form.get("tenant", ""),
                application=_optional(form, "application"),
                definition=_optional(form, "definition"),
                concurrency_key=_optional(form, "concurrency_key"),
                reason=_optional(form, "reason"),
            )

        try:
            record = await run_in_threadpool(service.call, "pause", caller, run, acting_as=actor)
            # The library answers with the pause in force, new or not.
            if record.actor == actor and record.since == at:
                message = f"paused {record.scope.key} by {actor}"
            else:
                message = f"{record.scope.key} already paused by {record.actor}; nothing written"
        except errors.WorkloadError as exc:
            message = f"refused: {exc.code}: {exc.message}"
        return RedirectResponse(_told("/console/pauses", message), status_code=303)

    @router.post("/pauses/resume")
    async def resume(request: Request) -> Response:
        form = await _read_form(request)
        caller = pages.operator(request)
        if caller is None:
            return pages.sign_in_first(request, "Resuming", "/console/pauses")
        actor = _actor(caller)

        def run() -> bool:
            return service.authority.resume(
                actor,
                service.wall_now(),
                tenant=form.get("tenant", ""),
                application=_optional(form, "application"),
                definition=_optional(form, "definition"),
                concurrency_key=_optional(form, "concurrency_key"),
            )

        try:
            resumed = await run_in_threadpool(service.call, "resume", caller, run, acting_as=actor)
            message = f"resumed by {actor}" if resumed else "it was not paused; nothing written"
        except errors.WorkloadError as exc:
            message = f"refused: {exc.code}: {exc.message}"
        return RedirectResponse(_told("/console/pauses", message), status_code=303)

    @router.get("/audit")
    def audit(request: Request) -> Response:
        if isinstance(service.store, RecentAudit):
            records = list(service.store.audit_tail(_AUDIT_PAGE))
        else:
            records = list(service.store.audit_log())[-_AUDIT_PAGE:]
            records.reverse()
        return pages.page(request, "audit.html", records=records)

    @router.get("/check")
    def check(request: Request) -> Response:
        path = service.config.check_report
        report: _CheckReport | None = None
        if path is None:
            problem: str | None = "No report: start the service with --check-report FILE."
        else:
            report, problem = _read_report(path)
        return pages.page(
            request,
            "check.html",
            report=report,
            verdict=_verdict(report) if report is not None else None,
            problem=problem,
            path=path,
        )

    @router.get("/login")
    def login_form(request: Request) -> Response:
        target = request.query_params.get("next", "/console/")
        if not target.startswith("/console/"):
            target = "/console/"
        return pages.page(request, "login.html", message=None, next=target)

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await _read_form(request)
        token = form.get("token", "").strip()
        target = form.get("next") or "/console/"
        if not target.startswith("/console/"):
            target = "/console/"
        if not same_origin(request):
            # A page elsewhere must not sign the browser in under a token of its choosing.
            message = "The sign-in form was posted from a page of another origin: refused."
            return pages.page(request, "login.html", status=403, message=message, next=target)
        try:
            caller = service.caller("Bearer " + token)
        except errors.WorkloadError as exc:
            return pages.page(request, "login.html", status=403, message=exc.message, next=target)
        if caller.actor_class != "operator":
            return pages.page(
                request,
                "login.html",
                status=403,
                message="That token is a worker's; the console takes an operator's.",
                next=target,
            )
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        if not same_origin(request):
            return pages.page(
                request,
                "login.html",
                status=403,
                message="Signing out was posted from a page of another origin: refused.",
                next="/console/",
            )
        response = RedirectResponse("/console/", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    return router


async def _read_form(request: Request) -> dict[str, str]:
    """The form posted, read as it arrives and refused (413) once over `FORM_MAX_BYTES`:
    every posted form is read before anyone is signed in, so a body is never held whole."""
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length[:16]) > FORM_MAX_BYTES:
        raise _form_too_large()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX_BYTES:
            raise _form_too_large()
    return _form(bytes(body))


def _form_too_large() -> HTTPException:
    # The app answers it as every request over its limit: WORKLOAD_INVALID, status 413.
    return HTTPException(413, f"the form is over the limit of {FORM_MAX_BYTES} bytes")


def _form(body: bytes) -> dict[str, str]:
    """An `application/x-www-form-urlencoded` body: the first value of each field.

    Text that is not UTF-8, raw or percent-encoded, is `WORKLOAD_INVALID` (400),
    as in a JSON body: replaced, it would become a pause of another scope.
    """
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise errors.invalid("body", "the form is not UTF-8 text") from None
    return {name: values[0] for name, values in fields.items()}
