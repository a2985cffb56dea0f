"""`python -m workwarden.service.adapter --url URL --token T`: the conformance protocol over HTTP.

It speaks the line protocol of `python -m workwarden.adapter`
(`docs/conformance.md`) on standard input and output, and forwards each
request to a running `workwarden serve --allow-reset --test-clock` over a
memory store: `reset` to `POST /v1/test/reset`, `store` to `GET
/v1/test/store`, and each command to its endpoint (`admit`, `claim`,
`claim_next`, `start`, ...; the operators' scope-wide `pause`, `resume` and
`purge` to `POST /v1/pause`, `/v1/resume` and `/v1/purge`, less their `op`;
a command with no known `op` to `/v1/execute`, which refuses it), at the
request's `now` (the `X-Workwarden-Now` header).
So `workwarden conform --cmd 'python -m workwarden.service.adapter --url URL
--token W --token O'` holds the running service to every vector. Give a
worker's and an operator's token, both with the subject `*` (the vectors act
as several workers and operators).

Before reading any request it refuses, with one coded line on standard error,
a `--url` that is not an `http://` or `https://` URL with a host
(`WORKWARDEN_USAGE`, exit status 2) and a `--token` that is not a token
(`WORKWARDEN_UNAUTHENTICATED`, exit status 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import urlsplit

from workwarden.service.client import HttpAuthority
from workwarden.statemachine import errors

__all__ = ["Forwarder", "main"]

_TYPED = frozenset(
    {
        "claim",
        "claim_next",
        "start",
        "heartbeat",
        "execution_context",
        "checkpoint",
        "complete",
        "fail",
        "cancel",
        "confirm_cancel",
        "timeout",
        "retry",
    }
)

# The operators' scope-wide calls: their bodies are the command less its `op`.
_SCOPE_WIDE = frozenset({"pause", "resume", "purge"})


class Forwarder:
    """Answers protocol requests by calling the service through `client`."""

    def __init__(self, client: HttpAuthority) -> None:
        self.client = client

    def handle(self, request: Any) -> dict[str, Any]:
        """The response to one request."""
        kind = request.get("type") if isinstance(request, Mapping) else None
        try:
            if kind == "reset":
                body = {k: v for k, v in request.items() if k != "type"}
                self.client.request(
                    "POST", "/v1/test/reset", "reset", body=body, actor_class="operator"
                )
                return {"ok": None}
            if kind == "store":
                return {
                    "ok": self.client.request(
                        "GET", "/v1/test/store", "store", actor_class="operator"
                    )
                }
            if kind == "command":
                return {"ok": self._command(request.get("command"), request.get("now"))}
        except errors.WorkloadError as exc:
            return {"error": json.loads(json.dumps(exc.to_dict(), default=str))}
        return {
            "error": {
                "code": errors.INVALID,
                "message": f"unknown request type {kind!r}: expected reset, command or store",
            }
        }

    def _command(self, command: Any, now: Any) -> Any:
        if not isinstance(command, Mapping):
            raise errors.WorkloadError(errors.INVALID, "command must be a JSON object")
        op = command.get("op")
        at = now if isinstance(now, int) and not isinstance(now, bool) else None
        if at is None:
            raise errors.invalid("now", "must be whole milliseconds")
        if op == "admit" and set(command) == {"op", "request"}:
            return self.client.request(
                "POST", "/v1/admit", "admit", body=command["request"], now=at
            )
        if op == "operator":
            operation = command.get("operation")
            name = operation if isinstance(operation, str) else "operate"
            return self.client.request("POST", "/v1/operate", name, body=dict(command), now=at)
        if isinstance(op, str) and op in _SCOPE_WIDE:
            body = {k: v for k, v in command.items() if k != "op"}
            return self.client.request(
                "POST", f"/v1/{op}", op, body=body, now=at, actor_class="operator"
            )
        if isinstance(op, str) and op in _TYPED:
            return self.client.request("POST", f"/v1/{op}", op, body=dict(command), now=at)
        name = op if isinstance(op, str) else "execute"
        return self.client.request("POST", "/v1/execute", name, body=dict(command), now=at)


def serve(forwarder: Forwarder, requests: TextIO, responses: TextIO) -> None:
    """Answer every request line of `requests` on `responses`, one line each."""
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            response = {"error": {"code": errors.INVALID, "message": f"not JSON: {exc}"}}
        else:
            response = forwarder.handle(request)
        responses.write(json.dumps(response, sort_keys=True, separators=(",", ":")) + "\n")
        responses.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the protocol on standard input and output through the service at `--url`."""
    parser = argparse.ArgumentParser(
        prog="python -m workwarden.service.adapter",
        description="The conformance protocol, forwarded to a running workwarden serve.",
    )
    parser.add_argument("--url", required=True, help="the service, e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "--token",
        action="append",
        required=True,
        help="a bearer token (give a worker's and an operator's; repeat the option)",
    )
    args = parser.parse_args(argv)
    try:
        parts = urlsplit(args.url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a port that is not a number is refused here too
    except ValueError:
        usable = False
    if not usable:
        print(
            f"WORKWARDEN_USAGE: {parser.prog}: --url {args.url!r} is not an http:// or "
            "https:// URL with a host (e.g. http://127.0.0.1:8080)",
            file=sys.stderr,
        )
        return 2
    try:
        client = HttpAuthority(args.url, args.token)
    except errors.WorkloadError as exc:
        print(f"{exc.code}: {parser.prog}: {exc.message}", file=sys.stderr)
        return 1
    with client:
        serve(Forwarder(client), sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
