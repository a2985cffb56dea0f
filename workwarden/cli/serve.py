"""`workwarden serve`: the authority as an HTTP service, with its console and metrics.

`workwarden serve --store URL --token-keys FILE [--host 127.0.0.1] [--port 8080]
(--grant-keys FILE | --no-grant-signatures) [--check-report FILE]
[--allow-reset] [--test-clock] [--create] [--spec FILE]` runs
`workwarden.service.create_app` on uvicorn until interrupted (SIGINT or
SIGTERM end it gracefully). `--issue-token CLASS:SUBJECT [--token-ttl S]`
prints a bearer token signed with the first key of `--token-keys` and exits.

A keys file is a JSON object of key id -> secret in hex (at least 16 bytes):
`--token-keys` signs and verifies bearer tokens, `--grant-keys` verifies the
grants admissions carry. `--allow-reset` serves the test routes
(`/v1/test/reset`, `/v1/test/store`) and needs a memory store;
`--test-clock` takes a call's instant from its `X-Workwarden-Now` header.
`docs/service.md` documents the service.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from typing import Any

from workwarden.cli import STORE_HELP, port_number, positive_seconds, read_input
from workwarden.statemachine import errors
from workwarden.statemachine.models import MAX_INSTANT
from workwarden.statemachine.spec import load_spec
from workwarden.storage.memory import MemoryStore
from workwarden.storage.urls import STORE_VARIABLE, open_store

__all__ = ["read_keys", "register"]

_EXTRA = "pip install 'workwarden[service]'"


def register(subparsers: Any) -> None:
    """Add the `serve` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="serve the authority over HTTP: the JSON API, the operator console, metrics",
        description=(
            "Serve the authority over HTTP: a JSON API for every operation (OpenAPI at "
            "/openapi.json), the operator console at /console/, Prometheus metrics at "
            "/metrics. Callers present bearer tokens signed with --token-keys."
        ),
    )
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument(
        "--port", type=port_number, default=8080, help="the port to listen on (1 to 65535)"
    )
    parser.add_argument(
        "--token-keys",
        metavar="FILE",
        required=True,
        help="JSON {key id: hex secret}: the keys bearer tokens are signed with",
    )
    grants = parser.add_mutually_exclusive_group()
    grants.add_argument(
        "--grant-keys",
        metavar="FILE",
        help="JSON {key id: hex secret}: the keys admissions' grants are verified with",
    )
    grants.add_argument(
        "--no-grant-signatures",
        action="store_true",
        help="do not verify the signatures of admissions' grants (say so explicitly)",
    )
    parser.add_argument(
        "--check-report", metavar="FILE", help="a `workwarden check --json` report to show"
    )
    parser.add_argument(
        "--allow-reset",
        action="store_true",
        help="serve the test routes that empty the store (a memory store only)",
    )
    parser.add_argument(
        "--test-clock",
        action="store_true",
        help="take each call's instant from its X-Workwarden-Now header (tests only)",
    )
    parser.add_argument("--create", action="store_true", help="create the store if absent")
    parser.add_argument("--spec", metavar="FILE", help="a spec file (the shipped spec by default)")
    parser.add_argument(
        "--issue-token",
        metavar="CLASS:SUBJECT",
        help="print a token for SUBJECT of actor class worker or operator, and exit",
    )
    parser.add_argument(
        "--token-ttl",
        type=positive_seconds,
        default=86_400.0,
        metavar="SECONDS",
        help="how long an issued token is valid",
    )
    parser.set_defaults(handler=_run)


def read_keys(path: str, option: str) -> dict[str, bytes]:
    """The keys of a keys file (JSON {key id: hex secret}); `WORKLOAD_INVALID` when malformed."""
    text = read_input(path, option)
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not data:
            raise ValueError("it must be a JSON object with at least one key")
        keys = {str(k): bytes.fromhex(str(v)) for k, v in data.items()}
    except ValueError as exc:
        raise errors.invalid(option, f"{path} is not a keys file: {exc}") from None
    short = sorted(k for k, v in keys.items() if len(v) < 16)
    if short:
        raise errors.invalid(option, f"secrets shorter than 16 bytes: {', '.join(short)}")
    return keys


def _issue(args: argparse.Namespace, keys: dict[str, bytes]) -> int:
    from workwarden.service.auth import ACTOR_CLASSES, issue_token
    from workwarden.service.state import wall_clock_ms
    from workwarden.statemachine.grants import GrantSigner

    actor_class, _, subject = str(args.issue_token).partition(":")
    if actor_class not in ACTOR_CLASSES or not subject:
        raise errors.invalid("--issue-token", "give CLASS:SUBJECT, CLASS worker or operator")
    now, ttl_ms = wall_clock_ms(), int(args.token_ttl * 1000)
    if ttl_ms < 1 or now + ttl_ms > MAX_INSTANT:
        # Under a millisecond the token expires as it is issued; past the last instant
        # (2**53 - 1 ms) its expiry is no instant at all.
        raise errors.WorkloadError(
            "WORKWARDEN_USAGE",
            f"serve: --token-ttl {args.token_ttl:g}: a token is valid from 0.001 seconds to"
            f" {(MAX_INSTANT - now) // 1000} seconds",
        )
    key_id = next(iter(keys))
    token = issue_token(GrantSigner(key_id, keys[key_id]), subject, actor_class, now, ttl_ms)
    print(token)
    return 0


def _run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from workwarden.service.app import ServiceConfig, create_app
    except ImportError as exc:
        raise errors.WorkloadError(
            errors.EXTRA_MISSING, f"serve needs the service extra ({exc.name}): {_EXTRA}"
        ) from None
    token_keys = read_keys(args.token_keys, "--token-keys")
    if args.issue_token:
        return _issue(args, token_keys)
    if not args.grant_keys and not args.no_grant_signatures:
        raise errors.WorkloadError(
            "WORKWARDEN_USAGE",
            "serve: give --grant-keys FILE, or --no-grant-signatures to accept unsigned grants",
        )
    grant_keys = read_keys(args.grant_keys, "--grant-keys") if args.grant_keys else None
    url = args.store if args.store is not None else os.environ.get(STORE_VARIABLE, "")
    if args.allow_reset and not url.startswith("memory:"):
        raise errors.WorkloadError(
            "WORKWARDEN_USAGE", "serve: --allow-reset needs a memory store (--store memory:)"
        )
    spec = load_spec(args.spec)
    listener = _listen(args.host, args.port)
    try:
        store = open_store(args.store, mode="create" if args.create else "write")
    except BaseException:
        listener.close()
        raise
    if args.allow_reset and not isinstance(store, MemoryStore):
        store.close()
        listener.close()
        raise errors.WorkloadError(
            "WORKWARDEN_USAGE", "serve: --allow-reset needs a memory store (--store memory:)"
        )
    app = create_app(
        ServiceConfig(
            store=store,
            token_keys=token_keys,
            grant_keys=grant_keys,
            spec=spec,
            check_report=args.check_report,
            allow_reset=args.allow_reset,
            test_clock=args.test_clock,
        )
    )
    print(f"workwarden serving on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again
    # under the handler it found: this one turns it into exit status 0, as the
    # worker's clean shutdown is (and ends at once a SIGTERM before uvicorn
    # has started listening for signals).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
        store.close()
    return 0


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port`, or `WORKWARDEN_USAGE` saying why it cannot."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        raise errors.WorkloadError(
            "WORKWARDEN_USAGE", f"serve: --host {host}: {exc.strerror or exc}"
        ) from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise errors.WorkloadError(
            "WORKWARDEN_USAGE", f"serve: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    return listener
