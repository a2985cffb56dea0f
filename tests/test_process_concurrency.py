"""Several OS processes claiming from one store: every workload done once, nothing lost.

`drain_with_processes(url, ...)` admits workloads into the store at `url`,
starts worker processes (spawned, so they share nothing but the store) that
each loop claim_next, start, complete until nothing is claimable, and checks
the result against what the processes report. Any backend several processes
can open by URL can reuse it.
"""

from __future__ import annotations

import importlib
import multiprocessing
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any, NamedTuple

from support import CAPS, request
from support import authority as make_authority
from workwarden.statemachine import Workload
from workwarden.storage import open_store

TENANT = "t"
APPLICATION = "app"
LEASE_MS = 3_600_000
ADMITTED = 10_000
WORKING = 20_000
RESULT_TIMEOUT_S = 240.0


class Claimed(NamedTuple):
    """One claim a worker process was granted, as it was told.

    A tuple, so that a claim reported by a process equals the one recorded
    in a history whichever copy of this module made it.
    """

    workload_id: str
    worker_id: str
    claim_id: str
    fencing_token: int


def claim_until_empty(url: str, worker_id: str, start: Any, results: Any) -> None:
    """A worker process: claim, start and complete until nothing is claimable; report claims."""
    try:
        with closing(open_store(url)) as store:
            authority = make_authority(store)
            start.wait()
            claims: list[Claimed] = []
            while True:
                claim = authority.claim_next(
                    TENANT, APPLICATION, worker_id, CAPS, WORKING, LEASE_MS
                )
                if claim is None:
                    break
                claims.append(
                    Claimed(claim.workload_id, worker_id, claim.claim_id, claim.fencing_token)
                )
                authority.start(claim.workload_id, claim.fence, WORKING)
                authority.complete(
                    claim.workload_id,
                    claim.fence,
                    f"result-{claim.workload_id}",
                    {"by": worker_id},
                    WORKING,
                )
        results.put((worker_id, claims, None))
    except BaseException:  # noqa: BLE001 - the parent fails the test with this traceback
        results.put((worker_id, [], traceback.format_exc()))


def _worker_entry() -> Callable[..., None]:
    # A spawned process finds its target by module name. This file is
    # collected under a package-qualified name the child cannot import, but
    # `tests/` is on the path (pyproject's `pythonpath`), so the child can
    # import it as a top-level module: hand it the function from there.
    module = importlib.import_module("test_process_concurrency")
    entry: Callable[..., None] = module.claim_until_empty
    return entry


def admit_workloads(url: str, count: int) -> list[str]:
    """Admit `count` workloads of one tenant and application; returns their ids."""
    with closing(open_store(url, mode="create")) as store:
        authority = make_authority(store)
        return [
            authority.admit(request(idempotency_key=f"key-{n}"), ADMITTED).workload.workload_id
            for n in range(count)
        ]


def run_workers(url: str, processes: int) -> list[Claimed]:
    """Start `processes` spawned workers on `url` together; returns every claim they report."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    results = context.Queue()
    target = _worker_entry()
    workers = [
        context.Process(target=target, args=(url, f"worker-{n}", start, results))
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    start.set()
    reports = [results.get(timeout=RESULT_TIMEOUT_S) for _ in workers]
    for worker in workers:
        worker.join(RESULT_TIMEOUT_S)
        assert worker.exitcode == 0, f"{worker.name} exited with {worker.exitcode}"
    failures = [f"{worker_id}:\n{error}" for worker_id, _, error in reports if error]
    assert not failures, "\n".join(failures)
    return [claim for _, claims, _ in reports for claim in claims]


def check_drained(url: str, ids: list[str], claims: list[Claimed], processes: int) -> None:
    """Every workload SUCCEEDED once under one claim per token, every write audited once."""
    with closing(open_store(url)) as store:
        documents = {doc.key: doc for doc in store.scan()}
        audit = list(store.audit_log())
    assert sorted(documents) == sorted(ids)

    # Every claim a worker was granted is in the workload's history, and
    # every claim in a history was granted to the worker it names.
    told = Counter((c.workload_id, c.fencing_token) for c in claims)
    assert [key for key, times in told.items() if times > 1] == []
    recorded: list[Claimed] = []
    for key, doc in documents.items():
        workload = Workload.model_validate_json(doc.document)
        assert workload.state == "SUCCEEDED", (key, workload.state)
        assert workload.result is not None
        assert workload.result.result_id == f"result-{key}"
        tokens = [attempt.fencing_token for attempt in workload.attempts]
        assert tokens == sorted(set(tokens)), (key, tokens)
        recorded += [
            Claimed(key, attempt.worker_id, attempt.claim_id, attempt.fencing_token)
            for attempt in workload.attempts
        ]
    assert sorted(recorded, key=repr) == sorted(claims, key=repr)
    assert len({claim.worker_id for claim in claims}) <= processes

    # The audit log: one record per committed version of each workload.
    versions: dict[str, list[int]] = defaultdict(list)
    for record in audit:
        versions[record.key].append(record.version)
    for key, doc in documents.items():
        assert versions[key] == list(range(1, doc.version + 1)), key
    sequences = [record.sequence for record in audit]
    assert sequences == sorted(set(sequences))


def drain_with_processes(url: str, *, workloads: int, processes: int = 4) -> list[Claimed]:
    """Admit `workloads`, drain them with `processes` worker processes, and check the outcome."""
    ids = admit_workloads(url, workloads)
    claims = run_workers(url, processes)
    check_drained(url, ids, claims, processes)
    return claims


def test_four_processes_drain_one_sqlite_file_each_workload_once(tmp_path: Path) -> None:
    # Locking, isolation and atomicity across processes are the same at every
    # `synchronous` level; only what a power cut can undo differs, and no test
    # here cuts the power. NORMAL keeps the disk's sync latency, about 8000
    # syncs for 2000 workloads, out of the run time.
    url = f"sqlite://{tmp_path / 'work.db'}?synchronous=NORMAL"
    claims = drain_with_processes(url, workloads=2_000)
    assert len(claims) == 2_000
    # The processes really did share the work.
    assert len({claim.worker_id for claim in claims}) >= 2
