"""`HttpAuthority` against the library `Authority`: the same refusal, word for word.

A user swaps one for the other, so a refusal over HTTP must carry the code,
message and details the library gives for the same arguments, a batch item
the library refuses in its slot is refused in its slot, and a reply that is
not the service's (a proxy's page, a broken-off reply) is a `WorkloadError`
that says whether the call may have been decided, never a parser's traceback.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import reset, stored

from support import KEY_ID, SECRET, request
from workwarden.service.client import HttpAuthority
from workwarden.service.testing import RunningService, running_service
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine.errors import WorkloadError
from workwarden.storage import MemoryStore

CAPS = ["email:send"]


@pytest.fixture(scope="module")
def service() -> Iterator[RunningService]:
    with running_service(grant_keys={KEY_ID: SECRET}) as running:
        yield running


@pytest.fixture
def fresh(service: RunningService) -> RunningService:
    """The service with an empty store, verifying the fixture key's grants."""
    return reset(service)


def _answer(call: Callable[[], Any]) -> Any:
    """A call's reply as JSON data, or its refusal's code, message and details."""
    try:
        reply = call()
    except WorkloadError as exc:
        return (exc.code, exc.message, exc.details)
    if isinstance(reply, list):
        return [_data(r) for r in reply]
    return _data(reply)


def _data(reply: Any) -> Any:
    if isinstance(reply, WorkloadError):
        return (reply.code, reply.message, reply.details)
    return reply.model_dump(mode="json") if hasattr(reply, "model_dump") else repr(reply)


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _script(warden: Any) -> list[tuple[str, Any]]:
    """Calls the library refuses with its own words, and the batch items it refuses alone."""
    wid = warden.admit(request(), 10_000).workload.workload_id
    claim = warden.claim_next("t", "app", "w1", CAPS, 11_000, 60_000)
    fence = claim.fence
    start = {"op": "start", "workload_id": wid, "fence": fence.model_dump()}
    nan_state = {"op": "checkpoint", "workload_id": wid, "fence": fence.model_dump()}
    nan_state["state"] = {"x": float("nan")}
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("claim_next tenant empty", lambda: warden.claim_next("", "app", "w1", CAPS, 1, 1)),
        ("claim_next application None", lambda: warden.claim_next("t", None, "w1", CAPS, 1, 1)),
        ("claim_next now and worker bad", lambda: warden.claim_next("t", "app", "", CAPS, -1, 1)),
        ("admit input nan", lambda: warden.admit(request(input={"x": float("nan")}), 12_000)),
        ("admit input deep", lambda: warden.admit(request(input={"x": _deep(100)}), 12_000)),
        ("checkpoint nan", lambda: warden.checkpoint(wid, fence, {"x": float("inf")}, 12_000)),
        ("checkpoint deep", lambda: warden.checkpoint(wid, fence, _deep(100), 12_000)),
        ("complete nan", lambda: warden.complete(wid, fence, "r", float("-inf"), 12_000)),
        ("complete surrogate", lambda: warden.complete(wid, fence, "r", "\udc80", 12_000)),
        (
            "admit_many one item nan",
            lambda: warden.admit_many(
                [request(idempotency_key="a"), request(input={"x": float("nan")})], 12_000
            ),
        ),
        ("report_many one item nan", lambda: warden.report_many([start, nan_state], 12_100)),
        ("purge limit 0", lambda: warden.purge(13_000, limit=0)),
        ("purge older than -1", lambda: warden.purge(13_000, older_than_ms=-1)),
        ("purge dry run 1", lambda: warden.purge(13_000, dry_run=1)),
        ("get .", lambda: warden.get(".")),
        ("get ..", lambda: warden.get("..")),
        ("get . scoped", lambda: warden.get(".", tenant="t", application="app")),
        ("get ../x", lambda: warden.get("../x", tenant="t")),
        ("operate claim", lambda: warden.operate(wid, "claim", "alice", 13_000)),
        ("operate start", lambda: warden.operate(wid, "start", "alice", 13_000)),
        ("operate cancel", lambda: warden.operate(wid, "cancel", "alice", 13_000)),
    ]
    return [(name, _answer(call)) for name, call in calls]


def test_the_client_refuses_with_the_library_s_code_message_and_details(
    fresh: RunningService,
) -> None:
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as client:
        over_http = _script(client)
    assert over_http == _script(library)
    answers = dict(over_http)
    assert answers["checkpoint nan"][2] == {"field": "state.x"}
    # One bad item is refused in its slot; the others are decided.
    admitted, refused = answers["admit_many one item nan"]
    assert admitted["created"] is True
    assert refused[0] == "WORKLOAD_INVALID"
    assert answers["report_many one item nan"][0]["status"] == "RUNNING"
    assert answers["get . scoped"][0] == "WORKLOAD_NOT_FOUND"


def _execute_script(warden: Any) -> list[tuple[str, Any]]:
    """A lifecycle and its refusals, every call a command given to `execute`."""
    admitted = warden.execute({"op": "admit", "request": request().model_dump(mode="json")}, 9_000)
    wid = admitted.workload.workload_id
    other = warden.execute(
        {"op": "admit", "request": request(idempotency_key="other").model_dump(mode="json")},
        9_001,
    ).workload.workload_id
    claim = {"op": "claim", "workload_id": wid, "worker_id": "w1", "capabilities": list(CAPS)}
    granted = warden.execute({**claim, "lease_ms": 60_000}, 10_000)
    fence = granted.fence.model_dump()
    mine = {"workload_id": wid, "fence": fence}
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("start", lambda: warden.execute({"op": "start", **mine}, 10_100)),
        ("heartbeat", lambda: warden.execute({"op": "heartbeat", **mine, "extend_ms": 1}, 10_200)),
        (
            "checkpoint",
            lambda: warden.execute({"op": "checkpoint", **mine, "state": {"n": 1}}, 10_300),
        ),
        (
            "complete",
            lambda: warden.execute(
                {"op": "complete", **mine, "result_id": "r1", "output": {"ok": True}}, 10_400
            ),
        ),
        (
            "complete again",
            lambda: warden.execute(
                {"op": "complete", **mine, "result_id": "r1", "output": {"ok": True}}, 10_500
            ),
        ),
        ("stale start", lambda: warden.execute({"op": "start", **mine}, 10_600)),
        (
            "operator cancel",
            lambda: warden.execute(
                {"op": "cancel", "workload_id": other, "actor": "alice", "request_id": "c1"},
                10_700,
            ),
        ),
        ("sweep", lambda: warden.execute({"op": "recover_expired", "workload_id": other}, 10_800)),
        ("not a command", lambda: warden.execute({"op": "claim_next", "workload_id": wid}, 11_000)),
        ("malformed", lambda: warden.execute({"op": "start", "workload_id": wid}, 11_000)),
        ("a list", lambda: warden.execute([1, 2], 11_000)),
        ("bad now", lambda: warden.execute({"op": "start", **mine}, -1)),
    ]
    return [("admit", _data(admitted)), ("claim", _data(granted))] + [
        (name, _answer(call)) for name, call in calls
    ]


def test_the_client_executes_commands_as_the_library_does(fresh: RunningService) -> None:
    library = Authority(MemoryStore(), grants=GrantVerifier({KEY_ID: SECRET}))
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as client:
        over_http = _execute_script(client)
    assert over_http == _execute_script(library)
    answers = dict(over_http)
    assert answers["complete"] == answers["complete again"]
    assert answers["stale start"][0] == "WORKLOAD_LEASE_EXPIRED"  # its claim ended
    assert answers["not a command"][0] == answers["malformed"][0] == "WORKLOAD_INVALID"


def test_an_operation_operate_does_not_take_is_invalid_for_either_token_and_writes_nothing(
    fresh: RunningService,
) -> None:
    with fresh.client(fresh.token("worker", "w1"), fresh.token("operator", "alice")) as both:
        wid = both.admit(request(), 10_000).workload.workload_id
    before = stored(fresh)
    for token in (fresh.token("operator", "alice"), fresh.token("worker", "w1")):
        with fresh.client(token) as client:
            for operation in ("claim", "start", "heartbeat", "cancel"):
                with pytest.raises(WorkloadError) as refused:
                    client.operate(wid, operation, "alice", 11_000)
                assert refused.value.code == "WORKLOAD_INVALID", refused.value
                assert refused.value.details is not None
                assert refused.value.details["operation"] == operation
            execute = httpx.post(
                fresh.url + "/v1/execute",
                json={"op": "operator", "operation": "claim", "workload_id": wid, "actor": "x"},
                headers={"Authorization": "Bearer " + token, "X-Workwarden-Now": "11000"},
            )
            assert (execute.status_code, execute.json()["code"]) == (400, "WORKLOAD_INVALID")
    assert stored(fresh) == before


def test_a_move_of_the_service_s_spec_is_sent_with_the_operator_s_token() -> None:
    # The client is given both tokens and no spec: `approve` is no row of its shipped spec,
    # but `/v1/operate` is an operator's call, so the operator's token goes, not the first.
    approval = Path(__file__).resolve().parents[1] / "specs" / "examples" / "approval.toml"
    extra = ["--spec", str(approval)]
    with running_service(grant_keys={KEY_ID: SECRET}, extra_args=extra) as served:
        tokens = (served.token("worker", "w1"), served.token("operator", "alice"))
        with served.client(*tokens) as both:
            wid = both.admit(request(), 10_000).workload.workload_id
            assert both.operate(wid, "approve", "alice", 11_000) == "READY"
            assert both.get(wid).state == "READY"


class _Answering:
    """A loopback HTTP server that answers every request with `reply`, bytes as they are."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                seen = b""
                while b"\r\n\r\n" not in seen:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    seen += chunk
                conn.sendall(self.reply)

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=5)


def _http(status: int, body: bytes, content_type: str = "text/html") -> bytes:
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


@pytest.mark.parametrize(
    ("reply", "posted", "read"),
    [
        # A proxy's error page: a write may have been decided behind it.
        (
            _http(502, b"<h1>Bad Gateway</h1>"),
            "WORKLOAD_OUTCOME_UNKNOWN",
            "WORKLOAD_STORAGE_FAILURE",
        ),
        (_http(504, b""), "WORKLOAD_OUTCOME_UNKNOWN", "WORKLOAD_STORAGE_FAILURE"),
        # Refused before it reached anything that decides.
        (_http(404, b"not here"), "WORKLOAD_STORAGE_FAILURE", "WORKLOAD_STORAGE_FAILURE"),
        # A success that is not the call's reply.
        (
            _http(200, b"<html>portal</html>"),
            "WORKLOAD_OUTCOME_UNKNOWN",
            "WORKLOAD_STORAGE_FAILURE",
        ),
        (
            _http(200, b'{"a": 1}', "application/json"),
            "WORKLOAD_OUTCOME_UNKNOWN",
            "WORKLOAD_STORAGE_FAILURE",
        ),
        (
            _http(200, b"[1]", "application/json"),
            "WORKLOAD_OUTCOME_UNKNOWN",
            "WORKLOAD_STORAGE_FAILURE",
        ),
    ],
    ids=["502", "504", "404", "200 html", "200 wrong object", "200 wrong list"],
)
def test_a_reply_that_is_not_the_service_s_says_whether_the_call_may_have_been_decided(
    service: RunningService, reply: bytes, posted: str, read: str
) -> None:
    tokens = [service.token("worker", "w1"), service.token("operator", "alice")]
    answering = _Answering(reply)
    calls: list[tuple[str, Callable[[HttpAuthority], Any]]] = [
        (posted, lambda c: c.claim_next("t", "app", "w1", CAPS, 1_000, 1_000)),
        (posted, lambda c: c.admit(request(), 1_000)),
        (posted, lambda c: c.admit_many([request()], 1_000)),
        (posted, lambda c: c.cancel("w", "alice", 1_000)),
        (posted, lambda c: c.recover_expired(1_000)),
        (posted, lambda c: c.pause("alice", 1_000, tenant="t")),
        (read, lambda c: c.get("w")),
        (read, lambda c: c.list("t", "app")),
        (read, lambda c: c.pauses()),
    ]
    try:
        with HttpAuthority(answering.url, tokens, timeout_s=5) as client:
            for code, call in calls:
                with pytest.raises(WorkloadError) as refused:
                    call(client)
                assert refused.value.code == code, refused.value
                assert not any(token[5:] in str(refused.value) for token in tokens)
    finally:
        answering.close()


def test_a_url_nothing_can_be_sent_to_is_a_storage_failure_not_an_unknown_outcome(
    service: RunningService,
) -> None:
    token = service.token("worker", "w1")
    for url in ("ftp://127.0.0.1:1", "warden:8080"):
        with HttpAuthority(url, token) as client, pytest.raises(WorkloadError) as refused:
            client.claim_next("t", "app", "w1", CAPS, 1_000, 1_000)
        assert refused.value.code == "WORKLOAD_STORAGE_FAILURE", refused.value
        assert token[5:] not in str(refused.value)
