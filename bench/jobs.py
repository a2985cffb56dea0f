"""The worker processes of `bench.procrastinate`, one module apart so that they start clean.

Each is started (spawned) by the harness with its share of the jobs, a
barrier shared with the harness, and a queue for its report: it puts its jobs
in, waits at the barrier, works until nothing is left, waits again, reports.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import NOW, Fixture
from workwarden.statemachine import Authority
from workwarden.storage import (
    AuditRecord,
    ForwardingStore,
    IndexFields,
    Store,
    StoreConflict,
)

__all__ = ["prepare_database", "procrastinate_worker", "workwarden_worker"]

BARRIER_TIMEOUT_S = 3600.0


class _CountingStore(ForwardingStore):
    """A store that counts the compare-and-swaps of `claim_next` and those that lost."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.claim_writes = 0
        self.claim_conflicts = 0

    def write(
        self,
        key: str,
        document: str,
        index: IndexFields,
        expected_version: int | None,
        audit: AuditRecord,
    ) -> int:
        if audit.operation != "claim_next":
            return super().write(key, document, index, expected_version, audit)
        self.claim_writes += 1
        try:
            return super().write(key, document, index, expected_version, audit)
        except StoreConflict:
            self.claim_conflicts += 1
            raise


# -- the worker processes --------------------------------------------------------


def workwarden_worker(
    dsn: str, worker: int, keys: list[str], remember: int, barrier: Any, out: Any
) -> None:
    """Admit `keys`; wait for every worker; claim, start and complete until none is left."""
    from workwarden.storage.postgres import PostgresStore

    fixture = Fixture()
    store = _CountingStore(PostgresStore(dsn, pool_size=1))
    authority = Authority(store, grants=fixture.verifier, remember=remember)
    requests = [fixture.request(key) for key in keys]
    barrier.wait(BARRIER_TIMEOUT_S)
    cpu = time.process_time()
    for request in requests:
        authority.admit(request, NOW)
    barrier.wait(BARRIER_TIMEOUT_S)
    name = f"worker-{worker}"
    done = first_try = 0
    while True:
        before = store.claim_conflicts
        claim = authority.claim_next(
            fixture.tenant, fixture.application, name, ("bench",), NOW, 60_000
        )
        if claim is None:
            break
        if store.claim_conflicts == before:
            first_try += 1
        authority.start(claim.workload_id, claim.fence, NOW)
        authority.complete(claim.workload_id, claim.fence, f"result-{claim.workload_id}", None, NOW)
        done += 1
    cpu = time.process_time() - cpu
    barrier.wait(BARRIER_TIMEOUT_S)
    out.put(
        {
            "cpu_s": cpu,
            "done": done,
            "first_try": first_try,
            "claim_writes": store.claim_writes,
            "claim_conflicts": store.claim_conflicts,
        }
    )
    store.close()


def procrastinate_worker(
    dsn: str, worker: int, keys: list[str], remember: int, barrier: Any, out: Any
) -> None:
    """Defer a no-op job per key; wait for every worker; run a worker until the queue is empty."""
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=2)
    )

    @app.task(name="noop", queue="bench")
    async def noop(key: str) -> None:
        return None

    async def run() -> None:
        async with app.open_async():
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, barrier.wait, BARRIER_TIMEOUT_S)
            started = time.process_time()
            for key in keys:
                await noop.defer_async(key=key)
            await loop.run_in_executor(None, barrier.wait, BARRIER_TIMEOUT_S)
            await app.run_worker_async(
                queues=["bench"],
                name=f"worker-{worker}",
                concurrency=1,
                wait=False,
                listen_notify=False,
                install_signal_handlers=False,
            )
            cpu.append(time.process_time() - started)
            await loop.run_in_executor(None, barrier.wait, BARRIER_TIMEOUT_S)

    cpu: list[float] = []
    asyncio.run(run())
    out.put(
        {
            "cpu_s": sum(cpu),
            "done": len(keys),
            "first_try": 0,
            "claim_writes": 0,
            "claim_conflicts": 0,
        }
    )


def prepare_database(system: str, dsn: str) -> None:
    """Create the tables `system` needs in the empty database `dsn`."""
    if system == "procrastinate":
        import procrastinate

        app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))
        with app.open():
            app.schema_manager.apply_schema()
    else:
        from workwarden.storage.postgres import PostgresStore

        PostgresStore(dsn, pool_size=1).close()
