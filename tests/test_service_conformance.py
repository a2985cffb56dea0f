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

from workwarden.service.testing import running_service


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
