"""`running_service`: a real `workwarden serve` process on a free loopback port, for tests.

    with running_service(grant_keys={"k": secret}) as service:
        client = service.client()  # a worker's and an operator's token
        client.admit(request, now=10_000)

The process is started with `--allow-reset --test-clock` over a memory store
by default (so each call's `now` is the caller's), with fresh token keys;
`service.token(actor_class, subject)` mints more tokens. On leaving the
block the process gets SIGTERM (and SIGKILL if it has not stopped within ten
seconds). A process that dies or does not answer `/healthz` in time raises
`RuntimeError` with its standard error.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from workwarden.service.auth import ANY_SUBJECT, ActorClass, issue_token
from workwarden.service.client import HttpAuthority
from workwarden.service.state import wall_clock_ms
from workwarden.statemachine.grants import GrantSigner

__all__ = ["RunningService", "free_port", "running_service"]

_TOKEN_KEY_ID = "serve-test"


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class RunningService:
    """A started `workwarden serve`: where it listens and how to call it."""

    url: str
    process: subprocess.Popen[bytes]
    token_secret: bytes
    log: Path

    def token(
        self, actor_class: ActorClass, subject: str = ANY_SUBJECT, ttl_ms: int = 3_600_000
    ) -> str:
        """A token for `subject` as `actor_class`, signed with the service's token key."""
        signer = GrantSigner(_TOKEN_KEY_ID, self.token_secret)
        return issue_token(signer, subject, actor_class, wall_clock_ms(), ttl_ms)

    def client(self, *tokens: str) -> HttpAuthority:
        """An `HttpAuthority` with `tokens` (by default a worker's and an operator's, as `*`)."""
        chosen = list(tokens) or [self.token("worker"), self.token("operator")]
        return HttpAuthority(self.url, chosen)

    def stderr(self) -> str:
        """What the process wrote on standard error so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")


def _wait_ready(service: RunningService, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(
                f"workwarden serve exited with status {service.process.returncode}:\n"
                + service.stderr()
            )
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(service.url + "/healthz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"workwarden serve did not answer within {timeout_s} s:\n{service.stderr()}")


@contextlib.contextmanager
def running_service(
    *,
    store: str = "memory:",
    grant_keys: Mapping[str, bytes] | None = None,
    allow_reset: bool = True,
    test_clock: bool = True,
    check_report: str | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 30.0,
) -> Iterator[RunningService]:
    """Start `workwarden serve` (see the module docstring), and stop it afterwards."""
    with tempfile.TemporaryDirectory(prefix="workwarden-serve-") as scratch:
        folder = Path(scratch)
        secret = secrets.token_bytes(32)
        (folder / "tokens.json").write_text(json.dumps({_TOKEN_KEY_ID: secret.hex()}))
        port = free_port()
        args = [
            sys.executable,
            "-m",
            "workwarden",
            "serve",
            "--store",
            store,
            "--port",
            str(port),
            "--token-keys",
            str(folder / "tokens.json"),
        ]
        if grant_keys:
            (folder / "grants.json").write_text(
                json.dumps({k: v.hex() for k, v in grant_keys.items()})
            )
            args += ["--grant-keys", str(folder / "grants.json")]
        else:
            args.append("--no-grant-signatures")
        if allow_reset:
            args.append("--allow-reset")
        if test_clock:
            args.append("--test-clock")
        if check_report is not None:
            args += ["--check-report", check_report]
        args += list(extra_args)
        log = folder / "serve.log"
        with log.open("wb") as err:
            process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=dict(os.environ)
            )
        service = RunningService(f"http://127.0.0.1:{port}", process, secret, log)
        try:
            _wait_ready(service, startup_timeout_s)
            yield service
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
