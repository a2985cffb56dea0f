"""Every conformance vector passes through a running `workwarden serve`.

The vectors are generated afresh from the reference (`workwarden vectors`),
which is what the shipped file is once fresh (`tests/test_vectors.py` holds
it so); then `workwarden conform` drives them through
`python -m workwarden.service.adapter`, which forwards each request over HTTP.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from workwarden.service.auth import issue_token
from workwarden.service.testing import free_port, running_service
from workwarden.statemachine.grants import GrantSigner

ADAPTER = [sys.executable, "-m", "workwarden.service.adapter"]


def _token() -> str:
    return issue_token(GrantSigner("k", bytes(32)), "*", "operator", 1_000, 10**12)


def test_every_vector_passes_through_the_running_service(tmp_path: Path) -> None:
    vectors = tmp_path / "vectors.jsonl"
    subprocess.run(
        [sys.executable, "-m", "workwarden", "vectors", "--out", str(vectors)],
        check=True,
        capture_output=True,
    )
    scenarios = sum(1 for line in vectors.read_text().splitlines() if line.strip())
    with running_service() as service:
        adapter = shlex.join(
            [
                sys.executable, "-m", "workwarden.service.adapter",
                "--url", service.url,
                "--token", service.token("worker"),
                "--token", service.token("operator"),
            ]
        )  # fmt: skip
        run = subprocess.run(
            [
                sys.executable, "-m", "workwarden", "conform",
                "--quiet", "--vectors", str(vectors), "--cmd", adapter,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(rf"^{scenarios} of {scenarios} scenarios passed$", run.stdout, re.M)


def _adapter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ADAPTER, *args],
        input='{"type": "store"}\n',
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("url", ["foo", "ftp://127.0.0.1:1", "http://", "http://h:port"])
def test_the_adapter_refuses_a_url_that_is_not_http_before_sending_anything(url: str) -> None:
    done = _adapter("--url", url, "--token", _token())
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(
        f"WORKWARDEN_USAGE: python -m workwarden.service.adapter: --url {url!r} is not an "
        "http:// or https:// URL"
    )
    assert "Traceback" not in done.stderr


def test_the_adapter_refuses_a_token_that_is_not_one_with_one_coded_line() -> None:
    done = _adapter("--url", "http://127.0.0.1:1", "--token", "garbage")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(
        "WORKWARDEN_UNAUTHENTICATED: python -m workwarden.service.adapter"
    )
    assert len(done.stderr.splitlines()) == 1


def test_conform_stops_at_once_when_the_service_cannot_be_reached() -> None:
    token = _token()
    adapter = shlex.join([*ADAPTER, "--url", f"http://127.0.0.1:{free_port()}", "--token", token])
    run = subprocess.run(
        [sys.executable, "-m", "workwarden", "conform", "--cmd", adapter],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert run.stdout == ""
    first = run.stderr.splitlines()[0]
    assert first.startswith("CONFORMANCE_PROGRAM_UNUSABLE: ")
    assert "refused its first request (reset)" in first
    assert "WORKLOAD_STORAGE_FAILURE" in first
    # The report lands in CI logs: the bearer token is never printed back.
    assert token not in run.stderr
    assert "--token '<redacted>'" in first or "--token <redacted>" in first
