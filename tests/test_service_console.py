"""The operator console of a running `workwarden serve`, in a real headless Chromium.

Playwright drives Debian's Chromium (`/usr/bin/chromium`; Playwright's own
browser download is never used). The overview counts what was admitted and
claimed; a workload page shows the history and the diagram; an operator signs
in and re-arms a dead letter from the console, which moves it back to READY
and lands in the audit log under the operator's name; an operator pauses a
scope from the Pauses page (no claim takes its work, the overview marks it)
and resumes it, both audited. Each page is saved as a
screenshot: into `docs/images/console-*.png` when `WORKWARDEN_SCREENSHOTS=1`,
else into the test's temporary folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlencode

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from support import CAPS, KEY_ID, SECRET, SIGNER, request
from workwarden.service.app import ServiceConfig, create_app
from workwarden.service.console import FORM_MAX_BYTES
from workwarden.service.state import wall_clock_ms
from workwarden.service.testing import RunningService, running_service
from workwarden.statemachine import Grant, Subject
from workwarden.storage import AuditRecord, ForwardingStore, MemoryStore, StoredDocument
from workwarden.storage.base import StoreFailure

CHROMIUM = "/usr/bin/chromium"
IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
_MESSAGE = re.compile(r"/console/pauses\?message=")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    if os.environ.get("WORKWARDEN_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        return IMAGES
    return tmp_path


def _request(key: str, tenant: str, application: str, **changes: object) -> object:
    grant = Grant(
        id="g",
        issuer=Subject(kind="human", id="h"),
        subject=Subject(kind="agent", id="a1"),
        tenant_id=tenant,
        application_id=application,
        capabilities=("workload:execute",),
        issued_at=0,
        expires_at=2**53 - 1,
    )
    return request(
        idempotency_key=key,
        tenant_id=tenant,
        application_id=application,
        authorization_snapshot=SIGNER.sign(grant),
        **changes,
    )


def small_check_report(report: Path) -> Path:
    """`report`, written by `workwarden check --json` over a one-worker, one-attempt universe."""
    subprocess.run(
        [
            sys.executable, "-m", "workwarden", "check", "--single", "--workers", "1",
            "--max-attempts", "1", "--rearms", "0", "--operator-actions", "0",
            "--json", str(report),
        ],
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    assert report.exists()
    return report


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[RunningService, dict[str, str]]]:
    report = small_check_report(tmp_path / "check.json")
    assert report.exists()
    with running_service(grant_keys={KEY_ID: SECRET}, check_report=str(report)) as service:
        now = wall_clock_ms()
        ids: dict[str, str] = {}
        with service.client(service.token("worker", "w1")) as client:
            for n in range(3):
                client.admit(_request(f"mail-{n}", "acme", "mail"), now)  # type: ignore[arg-type]
            for n in range(2):
                client.admit(_request(f"bill-{n}", "acme", "billing"), now)  # type: ignore[arg-type]
            running = client.claim_next(
                "acme", "mail", "w1", CAPS, now + 1, 600_000, request_id="r"
            )
            doomed = client.claim_next("acme", "mail", "w1", CAPS, now + 1, 600_000, request_id="d")
            assert running is not None
            assert doomed is not None
            client.start(running.workload_id, running.fence, now + 2)
            client.checkpoint(running.workload_id, running.fence, {"step": 1}, now + 3)
            client.start(doomed.workload_id, doomed.fence, now + 2)
            client.fail(doomed.workload_id, doomed.fence, "validation", "bad address", now + 4)
            ids = {"running": running.workload_id, "dead": doomed.workload_id}
        yield service, ids


def _cell(page: Page, tenant: str, application: str, state: str) -> str:
    row = page.locator(f'#counts tr[data-tenant="{tenant}"][data-application="{application}"]')
    return row.locator(f'td[data-state="{state}"]').inner_text().strip()


def test_the_console_shows_counts_history_and_diagram_and_rearms_a_dead_letter(
    browser: Browser, console: tuple[RunningService, dict[str, str]], shots: Path
) -> None:
    service, ids = console
    page = browser.new_page(viewport={"width": 1400, "height": 900})

    page.goto(service.url + "/console/")
    assert _cell(page, "acme", "mail", "READY") == "1"
    assert _cell(page, "acme", "mail", "CHECKPOINTED") == "1"
    assert _cell(page, "acme", "mail", "DEAD_LETTER") == "1"
    assert _cell(page, "acme", "billing", "READY") == "2"
    assert _cell(page, "acme", "billing", "CLAIMED") == "0"
    assert page.locator("#total").inner_text() == "5"
    assert page.locator("meta[http-equiv=refresh]").count() == 1
    page.screenshot(path=str(shots / "console-overview.png"), full_page=True)

    page.goto(service.url + "/console/workloads?tenant=acme&application=billing")
    assert page.locator("#workloads tbody tr").count() == 2
    page.screenshot(path=str(shots / "console-workloads.png"), full_page=True)

    page.goto(f"{service.url}/console/workloads/{quote(ids['running'], safe='')}")
    assert page.locator("#state").inner_text() == "CHECKPOINTED"
    history = page.locator("#history li")
    with service.client() as client:
        events = client.get(ids["running"]).execution_history
    assert history.count() == len(events) == 4  # admitted, claimed, started, checkpointed
    for item, event in zip(history.all(), events, strict=True):
        assert f"{event.sequence}. {event.from_state} → {event.to}" in item.inner_text()
    assert "READY → CLAIMED" in history.nth(1).inner_text()
    assert page.locator("#diagram svg").count() == 1
    assert page.locator("#diagram svg g.edge").count() > 10
    page.screenshot(path=str(shots / "console-workload.png"), full_page=True)

    page.goto(service.url + "/console/dead-letters")
    row = page.locator(f'#dead-letters tr[data-workload="{ids["dead"]}"]')
    assert row.count() == 1
    assert row.locator("button").count() == 0  # read-only until an operator signs in

    page.goto(service.url + "/console/login")
    page.fill("#token", service.token("worker", "w1"))
    page.click("#sign-in")
    assert "worker's" in page.locator("#message").inner_text()
    page.fill("#token", service.token("operator", "alice"))
    page.click("#sign-in")
    assert page.locator("#operator").inner_text() == "alice"

    page.goto(service.url + "/console/dead-letters")
    row = page.locator(f'#dead-letters tr[data-workload="{ids["dead"]}"]')
    page.screenshot(path=str(shots / "console-dead-letters.png"), full_page=True)
    row.locator("input[name=reason]").fill("address fixed")
    row.locator("button").click()
    page.wait_for_url("**/console/workloads/**")
    assert page.locator("#state").inner_text() == "READY"
    assert "re-armed by alice" in page.locator("#message").inner_text()

    with service.client() as client:
        assert client.get(ids["dead"]).state == "READY"
    page.goto(service.url + "/console/audit")
    rearm = page.locator('#audit tr[data-operation="retry"][data-actor="alice"]')
    assert rearm.count() == 1
    assert ids["dead"] in rearm.inner_text()
    page.screenshot(path=str(shots / "console-audit.png"), full_page=True)

    page.goto(service.url + "/console/check")
    assert page.locator("#verdict").inner_text() == "no violation"
    page.screenshot(path=str(shots / "console-check.png"), full_page=True)
    page.close()


def test_a_rearm_without_an_operators_token_is_refused_and_changes_nothing(
    browser: Browser, console: tuple[RunningService, dict[str, str]]
) -> None:
    service, ids = console
    page = browser.new_page()
    reply = page.request.post(
        f"{service.url}/console/workloads/{quote(ids['dead'], safe='')}/retry",
        form={"reason": "sneaky"},
    )
    assert reply.status == 403
    with service.client() as client:
        assert client.get(ids["dead"]).state == "DEAD_LETTER"
    page.close()


@pytest.fixture
def quiet_console() -> Iterator[RunningService]:
    """A service whose store holds READY work of two applications, and no pause."""
    with running_service(grant_keys={KEY_ID: SECRET}, startup_timeout_s=120) as service:
        now = wall_clock_ms()
        with service.client(service.token("worker", "w1")) as client:
            client.admit(_request("mail-0", "acme", "mail"), now)  # type: ignore[arg-type]
            client.admit(_request("bill-0", "acme", "billing"), now)  # type: ignore[arg-type]
        yield service


def test_an_operator_pauses_a_scope_from_the_console_and_resumes_it_audited(
    browser: Browser, quiet_console: RunningService, shots: Path
) -> None:
    service = quiet_console
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(service.url + "/console/pauses")
    assert page.locator("#pause-form").count() == 0  # read-only until an operator signs in
    assert "No pause in force" in page.locator("#pauses").inner_text()
    refused = page.request.post(
        service.url + "/console/pauses", form={"tenant": "acme", "reason": "sneaky"}
    )
    assert refused.status == 403
    with service.client() as client:
        assert client.pauses() == []

    page.goto(service.url + "/console/login?next=/console/pauses")
    page.fill("#token", service.token("operator", "alice"))
    page.click("#sign-in")
    page.wait_for_url("**/console/pauses")
    page.fill("#pause-tenant", "acme")
    page.fill("#pause-application", "mail")
    page.fill("#pause-reason", "mail relay down")
    page.click("#pause")
    page.wait_for_url(_MESSAGE)
    assert "paused pause/acme/mail/* by alice" in page.locator("#message").inner_text()
    row = page.locator('#pauses tr[data-scope="pause/acme/mail/*"]')
    assert row.count() == 1
    assert "alice" in row.inner_text()
    assert "mail relay down" in row.inner_text()
    page.screenshot(path=str(shots / "console-pauses.png"), full_page=True)

    with service.client() as client:
        [record] = client.pauses()
        assert (record.scope.key, record.actor) == ("pause/acme/mail/*", "alice")
        now = wall_clock_ms()
        assert client.claim_next("acme", "mail", "w1", CAPS, now, 60_000) is None

    page.goto(service.url + "/console/")
    assert page.locator("#pause-count").inner_text() == "1"
    mail = page.locator('#counts tr[data-tenant="acme"][data-application="mail"]')
    billing = page.locator('#counts tr[data-tenant="acme"][data-application="billing"]')
    assert mail.locator("td[data-claiming]").inner_text().strip() == "paused"
    assert billing.locator("td[data-claiming]").inner_text().strip() == "runs"

    page.goto(service.url + "/console/audit")
    paused = page.locator('#audit tr[data-operation="pause"][data-actor="alice"]')
    assert paused.count() == 1
    assert "pause/acme/mail/*" in paused.inner_text()

    page.goto(service.url + "/console/pauses")
    page.locator('#pauses tr[data-scope="pause/acme/mail/*"] button').click()
    page.wait_for_url(_MESSAGE)
    assert "resumed by alice" in page.locator("#message").inner_text()
    assert page.locator('#pauses tr[data-scope="pause/acme/mail/*"]').count() == 0
    with service.client() as client:
        assert client.pauses() == []
        assert client.claim_next("acme", "mail", "w1", CAPS, wall_clock_ms(), 60_000) is not None
    page.goto(service.url + "/console/audit")
    assert page.locator('#audit tr[data-operation="resume"][data-actor="alice"]').count() == 1
    page.close()


def test_an_operator_approves_work_from_the_console_under_the_approval_spec(
    browser: Browser,
) -> None:
    # The workload page offers the moves the spec gives an operator out of the state it
    # shows: approve and reject of AWAITING_APPROVAL, none of READY. A worker cannot.
    approval = Path(__file__).resolve().parents[1] / "specs" / "examples" / "approval.toml"
    extra = ["--spec", str(approval)]
    with running_service(grant_keys={KEY_ID: SECRET}, extra_args=extra) as service:
        with service.client(service.token("worker", "w1")) as client:
            admitted = client.admit(_request("gated", "acme", "mail"), wall_clock_ms())  # type: ignore[arg-type]
        wid = admitted.workload.workload_id
        assert admitted.workload.state == "AWAITING_APPROVAL"
        url = f"{service.url}/console/workloads/{quote(wid, safe='')}"
        page = browser.new_page()
        page.goto(url)
        forms = page.locator("form.move")
        assert [f.get_attribute("data-operation") for f in forms.all()] == ["approve", "reject"]
        assert forms.locator("button").count() == 0  # read-only until an operator signs in
        posted = page.request.post(url + "/operate", form={"operation": "approve"})
        assert posted.status == 403
        worker = page.request.post(
            url + "/operate",
            form={"operation": "approve"},
            headers={"Authorization": "Bearer " + service.token("worker", "w1")},
        )
        assert worker.status == 403
        with service.client() as client:
            assert client.get(wid).state == "AWAITING_APPROVAL"

        page.goto(service.url + "/console/login?next=" + quote(url.removeprefix(service.url)))
        page.fill("#token", service.token("operator", "alice"))
        page.click("#sign-in")
        page.wait_for_url("**/console/workloads/**")
        page.locator('form.move[data-operation="approve"] input[name=reason]').fill("ok")
        page.locator('form.move[data-operation="approve"] button').click()
        page.wait_for_url("**/console/workloads/**message=**")
        assert page.locator("#state").inner_text() == "READY"
        assert "approve by alice: now READY" in page.locator("#message").inner_text()
        assert page.locator("form.move").count() == 0
        with service.client() as client:
            claim = client.claim_next("acme", "mail", "w1", CAPS, wall_clock_ms(), 60_000)
            assert claim is not None
            assert claim.workload_id == wid
        page.goto(service.url + "/console/audit")
        approved = page.locator('#audit tr[data-actor="alice"]')
        assert approved.count() == 1
        assert wid in approved.inner_text()
        page.close()


def test_a_pause_form_that_is_not_utf8_is_refused_and_pauses_nothing(
    quiet_console: RunningService,
) -> None:
    service = quiet_console
    headers = {
        "Authorization": "Bearer " + service.token("operator", "alice"),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    for body in (
        b"tenant=acme\xff&reason=x",
        b"tenant=acme%FF&reason=x",
        b"tenant=acme&reason=%ED%A0%80",
    ):
        reply = httpx.post(service.url + "/console/pauses", content=body, headers=headers)
        assert reply.status_code == 400, body
        assert reply.headers["content-type"].startswith("application/problem+json")
        assert reply.json()["code"] == "WORKLOAD_INVALID"
        assert reply.json()["details"]["field"] == "body"
    with service.client() as client:
        assert client.pauses() == []
    good = httpx.post(
        service.url + "/console/pauses", content=b"tenant=acme&reason=caf%C3%A9", headers=headers
    )
    assert good.status_code == 303
    with service.client() as client:
        [record] = client.pauses()
    assert (record.scope.key, record.reason) == ("pause/acme/*/*", "café")


def test_a_page_shows_only_the_messages_the_console_itself_sealed(
    quiet_console: RunningService,
) -> None:
    service = quiet_console
    # A link crafted elsewhere, as an operator might be sent it: no such message is shown.
    forged = "Tenant acme is compromised: sign in again at evil.example"
    for path in ("/console/pauses", "/console/workloads/anything"):
        for query in ({"message": forged}, {"message": forged, "seal": "0" * 64}):
            page = httpx.get(service.url + path, params=query)
            assert "compromised" not in page.text, (path, query)
    # The console's own answer to a form is shown on the page it leads to.
    headers = {
        "Authorization": "Bearer " + service.token("operator", "alice"),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    answer = httpx.post(
        service.url + "/console/pauses", content=b"tenant=sealed&reason=x", headers=headers
    )
    assert answer.status_code == 303
    shown = httpx.get(service.url + answer.headers["location"])
    assert "paused pause/sealed/*/* by alice" in shown.text
    with service.client() as client:
        client.resume("alice", 30_000, tenant="sealed")


@contextlib.contextmanager
def other_origin(tmp_path: Path, html: str) -> Iterator[int]:
    """A page served as `index.html` by another server on this host: the port it listens on
    (the same site as the console, another origin)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(html, encoding="utf-8")
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0", "-d", str(site)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..."
        yield int(re.search(r"port (\d+)", line).group(1))  # type: ignore[union-attr]
    finally:
        server.terminate()
        server.wait(timeout=10)


_ATTACK = """<!doctype html><html><body>
<form id="f" method="post" action="{target}">
<input name="tenant" value="victim"><input name="reason" value="cross-origin form">
</form><script>document.getElementById("f").submit()</script></body></html>"""


def test_a_form_posted_by_a_page_of_another_origin_acts_as_no_one(
    browser: Browser, quiet_console: RunningService, tmp_path: Path
) -> None:
    # The attacking page is on the same host, another port: the same site, so the
    # browser sends the SameSite=Strict sign-in cookie with its form.
    service = quiet_console
    html = _ATTACK.format(target=service.url + "/console/pauses")
    with other_origin(tmp_path, html) as port:
        page = browser.new_page()
        page.goto(service.url + "/console/login?next=/console/pauses")
        page.fill("#token", service.token("operator", "alice"))
        page.click("#sign-in")
        page.wait_for_url("**/console/pauses")
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_load_state("networkidle")
        assert "another origin" in page.content()
        with service.client() as client:
            assert client.pauses() == []
        # The console's own form still works for the operator signed in.
        page.goto(service.url + "/console/pauses")
        page.fill("#pause-tenant", "victim")
        page.click("#pause")
        page.wait_for_url(_MESSAGE)
        with service.client() as client:
            assert [p.scope.key for p in client.pauses()] == ["pause/victim/*/*"]
        page.close()


def test_the_overview_counts_a_deadline_found_at_a_worker_call_and_resume_names_a_spaced_scope(
    browser: Browser, quiet_console: RunningService
) -> None:
    service = quiet_console
    now = wall_clock_ms()
    timed = _request("timed", "acme", "mail", timeouts={"claim_ms": 1})
    with service.client(service.token("worker", "w1"), service.token("operator", "alice")) as c:
        wid = c.admit(timed, now).workload.workload_id  # type: ignore[arg-type]
        claim = c.claim(wid, "w1", CAPS, now, 60_000)
        # The claim deadline has passed by the start: the start writes the timeout.
        with pytest.raises(Exception, match="WORKLOAD_TIMED_OUT"):
            c.start(wid, claim.fence, now + 5)
        c.pause("alice", now, tenant=" spaced ")
    page = browser.new_page()
    page.goto(service.url + "/console/")
    assert page.locator("#timeouts").inner_text().strip() == "1"
    page.goto(service.url + "/console/login?next=/console/pauses")
    page.fill("#token", service.token("operator", "alice"))
    page.click("#sign-in")
    page.wait_for_url("**/console/pauses")
    page.locator('#pauses tr[data-scope="pause/%20spaced%20/*/*"] button').click()
    page.wait_for_url(_MESSAGE)
    assert "resumed by alice" in page.locator("#message").inner_text()
    with service.client() as client:
        assert client.pauses() == []
    page.close()


def test_the_workload_list_comes_in_pages_of_200_keeping_its_filters(
    quiet_console: RunningService,
) -> None:
    service = quiet_console
    now = wall_clock_ms()
    with service.client(service.token("worker", "w1")) as client:
        for batch in range(3):
            requests = [_request(f"many-{batch}-{n}", "acme", "bulk") for n in range(150)]
            client.admit_many(requests, now)  # type: ignore[arg-type]

    def listed(query: str) -> str:
        reply = httpx.get(service.url + "/console/workloads?" + query, timeout=60)
        assert reply.status_code == 200
        return reply.text

    first = listed("application=bulk")
    assert "1&ndash;200 of 450 shown" in first
    assert (
        'id="next" href="/console/workloads?tenant=&amp;application=bulk&amp;state=&amp;page=2"'
        in first
    )
    assert 'id="previous"' not in first
    assert first.count('<tr data-state="READY">') == 200
    last = listed("application=bulk&page=3")
    assert "401&ndash;450 of 450 shown" in last
    assert last.count('<tr data-state="READY">') == 50
    assert 'id="next"' not in last
    # A page past the end, or not a number, shows the nearest page.
    assert "401&ndash;450 of 450 shown" in listed("application=bulk&page=99")
    assert "1&ndash;200 of 450 shown" in listed("application=bulk&page=x")
    assert "1&ndash;1 of 1 shown" in listed("tenant=acme&application=mail")
    assert "0 shown" in listed("tenant=nobody")


def test_a_page_number_of_other_digits_or_thousands_of_them_shows_the_nearest_page(
    quiet_console: RunningService,
) -> None:
    # "²" is a digit to str.isdigit but no number to int(); 5,000 digits are past int()'s limit.
    for page in ("%C2%B2", "9" * 5_000, "0" * 5_000 + "1"):
        reply = httpx.get(f"{quiet_console.url}/console/workloads?page={page}", timeout=60)
        assert reply.status_code == 200, reply.text[:300]
        assert "1&ndash;2 of 2 shown" in reply.text


def test_a_console_form_over_the_limit_is_refused_before_it_is_read_whole(
    quiet_console: RunningService,
) -> None:
    service = quiet_console
    limit = FORM_MAX_BYTES
    headers = {
        "Authorization": "Bearer " + service.token("operator", "alice"),
        "Content-Type": "application/x-www-form-urlencoded",
        "Origin": service.url,
    }
    body = b"tenant=acme&reason=" + b"x" * limit

    def streamed() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield body

    for path in ("/console/pauses", "/console/login", "/console/pauses/resume"):
        for content in (body, streamed()):
            reply = httpx.post(service.url + path, content=content, headers=headers, timeout=60)
            assert reply.status_code == 413, (path, reply.text[:300])
            assert reply.headers["content-type"].startswith("application/problem+json")
            assert reply.json()["code"] == "WORKLOAD_INVALID"
            assert str(limit) in reply.json()["detail"]
    with service.client() as client:
        assert client.pauses() == []
    # The largest form the console's own fields make fits.
    largest = urlencode(
        {"tenant": "\U0001f600" * 256, "reason": "\U0001f600" * 4_096, "application": "a"}
    ).encode()
    assert len(largest) < limit
    fits = httpx.post(service.url + "/console/pauses", content=largest, headers=headers)
    assert fits.status_code == 303
    with service.client() as client:
        assert len(client.pauses()) == 1


def _get(app: object, paths: list[str]) -> list[httpx.Response]:
    """GET each of `paths` from the application `app` in this process."""

    async def get_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            return [await client.get(path) for path in paths]

    # On a thread of its own: Playwright's sync API keeps an event loop running on this one.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, get_all()).result()


class _DownStore(ForwardingStore):
    """A store whose every read fails, as a PostgreSQL server that went away."""

    def read(self, key: str) -> StoredDocument | None:
        raise StoreFailure(f"cannot read {key}: the server could not be reached")

    def scan(self) -> Iterator[StoredDocument]:
        raise StoreFailure("cannot scan documents: the server could not be reached")

    def audit_log(self, after: int = 0, limit: int | None = None) -> Sequence[AuditRecord]:
        raise StoreFailure("cannot read the audit log: the server could not be reached")


def test_the_console_and_metrics_over_a_failing_store_answer_503_not_a_bug() -> None:
    app = create_app(ServiceConfig(store=_DownStore(MemoryStore()), token_keys={"k": SECRET}))
    paths = [
        "/console/",
        "/console/workloads",
        "/console/workloads/w-1",
        "/console/dead-letters",
        "/console/audit",
        "/metrics",
    ]
    for path, reply in zip(paths, _get(app, paths), strict=True):
        assert reply.status_code == 503, (path, reply.text[:300])
        assert reply.headers["content-type"].startswith("application/problem+json")
        assert reply.headers["retry-after"] == "1"
        problem = reply.json()
        assert (problem["code"], problem["class"]) == ("WORKLOAD_STORAGE_FAILURE", "retry_later")
        assert "could not be reached" in problem["detail"]


class _NoNulStore(ForwardingStore):
    """A store that cannot be asked for a key holding NUL, as PostgreSQL's text columns."""

    def read(self, key: str) -> StoredDocument | None:
        if "\x00" in key:
            raise StoreFailure(f"cannot read {key!r}: text fields cannot contain NUL")
        return super().read(key)


def test_a_workload_page_for_an_id_no_workload_can_have_is_not_found() -> None:
    app = create_app(ServiceConfig(store=_NoNulStore(MemoryStore()), token_keys={"k": SECRET}))
    ids = ["%00", "a%01b", "x" * 300]
    for wid, reply in zip(
        ids, _get(app, [f"/console/workloads/{wid}" for wid in ids]), strict=True
    ):
        assert reply.status_code == 404, (wid, reply.text[:300])
        assert "No workload" in reply.text


def test_every_console_page_loads_in_a_fresh_browser_without_a_console_error(
    browser: Browser, console: tuple[RunningService, dict[str, str]]
) -> None:
    service, ids = console
    paths = [
        "/console/",
        "/console/workloads",
        f"/console/workloads/{quote(ids['dead'], safe='')}",
        "/console/dead-letters",
        "/console/pauses",
        "/console/audit",
        "/console/check",
        "/console/login",
    ]
    errors: list[str] = []
    for path in paths:
        # A fresh context each time: nothing (an icon) is cached from an earlier page.
        context = browser.new_context()
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        reply = page.goto(service.url + path)
        assert reply is not None
        assert reply.status == 200, path
        page.wait_for_load_state("networkidle")
        assert errors == [], path
        context.close()


def test_a_page_with_an_operators_form_does_not_refresh_away_what_is_typed(
    browser: Browser, console: tuple[RunningService, dict[str, str]]
) -> None:
    service, ids = console
    with_forms = ["/console/pauses", "/console/dead-letters"]
    with_forms.append(f"/console/workloads/{quote(ids['dead'], safe='')}")
    without = [
        "/console/",
        "/console/audit",
        f"/console/workloads/{quote(ids['running'], safe='')}",
    ]
    page = browser.new_page()
    for path in with_forms + without:  # read-only: nothing to type, every page refreshes
        page.goto(service.url + path)
        assert page.locator("meta[http-equiv=refresh]").count() == 1, path
    page.goto(service.url + "/console/login")
    assert page.locator("meta[http-equiv=refresh]").count() == 0
    page.fill("#token", service.token("operator", "alice"))
    page.click("#sign-in")
    assert page.locator("#operator").inner_text() == "alice"
    for path in with_forms:
        page.goto(service.url + path)
        assert page.locator("meta[http-equiv=refresh]").count() == 0, path
        assert page.locator("form input[name=reason]").count() >= 1, path
        assert "reload" in page.locator("main > p.muted").last.inner_text(), path
    for path in without:
        page.goto(service.url + path)
        assert page.locator("meta[http-equiv=refresh]").count() == 1, path
    page.close()


def test_the_check_page_refuses_a_file_that_is_no_report_and_says_what_a_report_found(
    tmp_path: Path,
) -> None:
    report = small_check_report(tmp_path / "check.json")
    clean = json.loads(report.read_text(encoding="utf-8"))
    excerpt = Path(__file__).resolve().parents[1] / "diagrams" / "workload-check.json"
    found = {
        **clean,
        "ok": False,
        "cannot_finish": 2,
        "violations": [{"property": "no_<b>double</b>", "message": "m", "trace": [{}, {}]}],
    }
    shown = tmp_path / "shown.json"
    with running_service(check_report=str(shown)) as service:

        def page(content: str) -> httpx.Response:
            # The page reads the report at each request.
            shown.write_text(content, encoding="utf-8")
            return httpx.get(service.url + "/console/check")

        for content in (excerpt.read_text(), "[]", "null", '{"violations": 5}', "{}"):
            reply = page(content)
            assert reply.status_code == 200, (content, reply.text[:300])
            assert "is not a report of `workwarden check --json`" in reply.text, content
        verdict = re.compile(r'<td id="verdict">(.*?)</td>')
        assert verdict.findall(page(json.dumps(clean)).text) == ["no violation"]
        stopped = page(json.dumps({**clean, "complete": False})).text
        assert verdict.findall(stopped) == [
            "no violation found, but the check stopped early: it proves nothing"
        ]
        failed = page(json.dumps(found)).text
        assert verdict.findall(failed) == ["1 violation(s), 2 state(s) that cannot finish"]
        assert "<b>no_&lt;b&gt;double&lt;/b&gt;</b>: m (2 steps)" in failed


def test_a_page_of_another_origin_cannot_frame_the_console_to_borrow_a_click(
    browser: Browser, quiet_console: RunningService, tmp_path: Path
) -> None:
    # Same host, another port: the same site, so the framed console would get the
    # SameSite=Strict cookie, and a click on its Resume button would be the console's own form.
    service = quiet_console
    html = f'<iframe src="{service.url}/console/pauses" width="1200" height="800"></iframe>'
    with other_origin(tmp_path, html) as port:
        with service.client() as client:
            client.pause("*", wall_clock_ms(), tenant="acme", reason="incident")
        page = browser.new_page()
        page.goto(service.url + "/console/login?next=/console/pauses")
        page.fill("#token", service.token("operator", "alice"))
        page.click("#sign-in")
        page.wait_for_url("**/console/pauses")
        assert page.locator("#pauses button").count() == 1  # its own page shows Resume
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_load_state("networkidle")
        framed = [f for f in page.frames if f is not page.main_frame]
        assert len(framed) == 1
        resume = framed[0].locator("#pauses button")
        clicked = resume.count() > 0
        if clicked:
            resume.click()
            page.wait_for_load_state("networkidle")
        with service.client() as client:
            assert [p.scope.key for p in client.pauses()] == ["pause/acme/*/*"]
        assert not clicked
        page.close()


def test_a_rearm_form_sent_twice_is_answered_as_the_first_and_rearms_once(
    browser: Browser, console: tuple[RunningService, dict[str, str]]
) -> None:
    # A second click, or the form sent again after its reply never came: the same request.
    service, ids = console
    page = browser.new_page()
    page.goto(service.url + "/console/login?next=/console/dead-letters")
    page.fill("#token", service.token("operator", "alice"))
    page.click("#sign-in")
    page.wait_for_url("**/console/dead-letters")
    form = page.locator(f'#dead-letters tr[data-workload="{ids["dead"]}"] form')
    # Every field the form sends, as the browser would send it.
    fields = {
        name: form.locator(f"input[name={name}]").input_value()
        for name in form.locator("input").evaluate_all("els => els.map(e => e.name)")
    }
    fields["reason"] = "address fixed"
    target = service.url + (form.get_attribute("action") or "")
    messages = []
    for _ in range(2):
        reply = page.request.post(
            target, form=fields, headers={"Origin": service.url}, max_redirects=0
        )
        assert reply.status == 303
        page.goto(service.url + reply.headers["location"])
        messages.append(page.locator("#message").inner_text())
    assert messages == ["re-armed by alice: now READY"] * 2
    with service.client() as client:
        assert client.get(ids["dead"]).state == "READY"
    page.goto(service.url + "/console/audit")
    assert page.locator('#audit tr[data-operation="retry"][data-actor="alice"]').count() == 1
    page.close()
