"""A fleet of worker processes over the service's HTTP API, with no database credentials.

A real `workwarden serve` runs over a SQLite store file; two `workwarden
worker --warden URL --token TOKEN` processes and one sweeper (remote too)
drain the workloads admitted through the library on that store. The handler
module is the one of `test_runtime_processes`: it writes a row fenced by the
token (`workwarden.fence.guard`) into the test's own SQLite file, named by
an environment variable. One worker is killed with SIGKILL mid-drain and
started again; afterwards every workload ended where its mode leads
(`SUCCEEDED` for all but the few meant to dead-letter), each downstream row
was applied exactly once, and the processes' `--metrics-port` counters
scrape and parse.

The drain runs 200 workloads by default and 2,000 under the `thorough`
profile (`WORKWARDEN_HYPOTHESIS_PROFILE=thorough`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from hypothesis_profiles import PROFILE_ENV
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_runtime_processes import (
    HANDLER_MODULE,
    Downstream,
    Fleet,
    Proc,
    _sqlite_states,
    admit,
    check_drained,
    terminal_count,
    wait_until,
)

from support import authority as make_authority
from workwarden.service.metrics import RUNTIME_COUNTS, runtime_registry
from workwarden.service.testing import RunningService, free_port, running_service
from workwarden.storage import open_store

THOROUGH = os.environ.get(PROFILE_ENV) == "thorough"
DRAIN_WORKLOADS = 2_000 if THOROUGH else 200


@dataclass
class RemoteFleet(Fleet):
    """A `Fleet` whose processes run with `--warden URL --token TOKEN` instead of `--store`."""

    service: RunningService | None = None

    def _start(self, role: str, name: str, args: Sequence[str]) -> Proc:
        self._seq[name] += 1
        log = self.workdir / "logs" / f"{name}.{self._seq[name]}.log"
        log.parent.mkdir(exist_ok=True)
        # A worker's token names its worker id; the sweeper's acts for anyone.
        assert self.service is not None
        subject = args[args.index("--worker-id") + 1] if "--worker-id" in args else "*"
        env = {**self.env, "WORKWARDEN_TOKEN": self.service.token("worker", subject)}
        command = [sys.executable, "-m", "workwarden", role, "--warden", self.service.url, *args]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, role, popen, log)
        self.procs.append(proc)
        return proc


@contextlib.contextmanager
def remote_fleet(tmp_path: Path) -> Iterator[tuple[RemoteFleet, str, Downstream]]:
    """The service over a new SQLite store file, the fleet, and the test's own database."""
    path = tmp_path / "store.sqlite3"
    store_url = f"sqlite:///{path}"
    open_store(store_url, mode="create").close()
    down = Downstream(str(tmp_path / "downstream.sqlite3"))
    workdir = tmp_path / "fleet"
    workdir.mkdir()
    (workdir / "fenced_app.py").write_text(textwrap.dedent(HANDLER_MODULE))
    env = {
        **os.environ,
        "FENCED_APP_DOWNSTREAM": down.url,
        "FENCED_APP_CONTROL": str(workdir),
        "PYTHONUNBUFFERED": "1",
    }
    # The workers get no store: only the service's URL and a token.
    env.pop("WORKWARDEN_STORE", None)
    with running_service(store=store_url, allow_reset=False, test_clock=False) as service:
        f = RemoteFleet(workdir, "", env, service=service)
        try:
            yield f, store_url, down
        finally:
            f.kill_all()


def scrape(port: int) -> dict[str, float]:
    """The samples of the runtime counters served on `port`, by sample name."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("workwarden_runtime_")
    }


def test_runtime_registry_serves_every_count_as_a_counter() -> None:
    counts = {"claimed": 3, "completed": 2, "heartbeats": 9}
    families = {
        f.name: f
        for f in text_string_to_metric_families(
            generate_latest(runtime_registry(lambda: counts)).decode()
        )
    }
    assert set(families) == {f"workwarden_runtime_{name}" for name in RUNTIME_COUNTS}
    assert all(f.type == "counter" for f in families.values())
    values = {f.name: f.samples[0].value for f in families.values()}
    assert values["workwarden_runtime_claimed"] == 3
    assert values["workwarden_runtime_completed"] == 2
    assert values["workwarden_runtime_store_error"] == 0


def test_remote_workers_drain_every_workload_once_through_a_sigkill(tmp_path: Path) -> None:
    count = DRAIN_WORKLOADS
    modes = ["flaky" if i % 10 == 0 else "invalid" if i % 25 == 1 else "ok" for i in range(count)]
    with remote_fleet(tmp_path) as (f, store_url, down):
        count_states = _sqlite_states(tmp_path / "store.sqlite3")
        store = open_store(store_url)
        try:
            admitted = admit(make_authority(store), modes, sleep_ms=5)
            started = time.monotonic()
            ports = {name: free_port() for name in ("w0", "w1", "sweeper")}
            for name in ("w0", "w1"):
                f.worker(name, "--metrics-port", str(ports[name]), concurrency=4)
            f.sweeper("--metrics-port", str(ports["sweeper"]))

            # Once a third is done, kill w0 with its work in hand, and start it again.
            wait_until(lambda: terminal_count(count_states) >= count // 3, 300, "a third", f)
            (victim,) = f.alive("w0")
            before = scrape(ports["w0"])
            assert before["workwarden_runtime_claimed_total"] > 0
            victim.signal(signal.SIGKILL)
            victim.popen.wait()
            f.worker("w0", "--metrics-port", str(ports["w0"]), concurrency=4)

            wait_until(lambda: terminal_count(count_states) == count, 600, "the drain", f)
            elapsed = time.monotonic() - started

            after = {name: scrape(port) for name, port in ports.items()}
            for samples in after.values():
                assert {f"workwarden_runtime_{n}_total" for n in RUNTIME_COUNTS} <= set(samples)
            completed = sum(s["workwarden_runtime_completed_total"] for s in after.values())
            assert 0 < completed <= count
            statuses = f.stop()
            assert set(statuses.values()) == {0}, (statuses, f.logs())
            figures = check_drained(store, down, admitted)
        finally:
            store.close()
    recovered = after["sweeper"]["workwarden_runtime_recovered_total"]
    print(
        f"\nremote drain: {count} workloads, 2 workers x 4 over HTTP, 1 SIGKILL:"
        f" {elapsed:.1f} s ({count / elapsed:.0f}/s); recovered {recovered:.0f};"
        f" {figures}"
    )
