"""The worker runtime: handlers, workers that claim and heartbeat, and the sweeper.

    from workwarden import App, Retry, Fail, Worker, Sweeper

    app = App()

    @app.handler("send-invoice", needs=("billing",))
    def send_invoice(job):
        job.checkpoint({"rendered": True})
        return {"sent": True}

    Worker(authority, app, tenant="acme", application="billing").run()

The parts: `handlers` (`App`, `Job`, `Retry`, `Fail`), `worker` (`Worker`),
`sweeper` (`Sweeper`), `clock` (the clock, the backoff and the log lines),
`scope` (the claim view of the handled definitions). The guide is
`docs/worker.md`.
"""

from __future__ import annotations

from workwarden.runtime.clock import Backoff, Clock, ManualClock, WallClock
from workwarden.runtime.handlers import App, Fail, Job, Retry, result_id_for
from workwarden.runtime.sweeper import Sweeper
from workwarden.runtime.worker import ThreadExecutor, Worker

__all__ = [
    "App",
    "Backoff",
    "Clock",
    "Fail",
    "Job",
    "ManualClock",
    "Retry",
    "Sweeper",
    "ThreadExecutor",
    "WallClock",
    "Worker",
    "result_id_for",
]
