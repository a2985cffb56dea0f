"""Periodic work: each tick of a schedule is admitted once, however many schedulers run.

Three schedulers run the same schedules for a simulated day against one store,
each on its own clock, with outages; every tick ends admitted exactly once
(checked from the audit log), missed ticks follow the schedule's catch-up rule,
and the `workwarden scheduler` process admits and stops as documented.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from support import SIGNER, VERIFIER, grant_for, request
from workwarden.periodic import SCHEDULE_NAME_MAX, PeriodicScheduler, Schedule, tick_key
from workwarden.runtime import ManualClock
from workwarden.statemachine import Authority, WorkloadError, errors
from workwarden.storage import SQLiteStore, Store

MINUTE = 60_000
HOUR = 60 * MINUTE
# 2026-03-28 22:00 UTC: the simulated day spans the night Paris moves to summer time.
DAY_START = int(datetime(2026, 3, 28, 22, 0, tzinfo=UTC).timestamp() * 1000)
DAY = 24 * HOUR
# Valid through the simulated day (the fixture grant expires in 1970).
GRANT = SIGNER.sign(grant_for(expires_at=DAY_START + 400 * DAY))


def _template(**changes: Any) -> Any:
    return request(idempotency_key="template", authorization_snapshot=GRANT, **changes)


def _quarter_hourly(catch_up: str = "all", **changes: Any) -> Schedule:
    fields: dict[str, Any] = {
        "name": "reports",
        "request": _template(),
        "cron": "*/15 * * * *",
        "timezone": "Europe/Paris",
        "catch_up": catch_up,
        "start_at": DAY_START,
        "lookback": 200,
    }
    fields.update(changes)
    return Schedule(**fields)


def _every_7_minutes(**changes: Any) -> Schedule:
    fields: dict[str, Any] = {
        "name": "sync",
        "request": _template(),
        "every_ms": 7 * MINUTE,
        "start_at": DAY_START + 3 * MINUTE,
        "catch_up": "all",
        "lookback": 400,
        "tick_field": "tick",
    }
    fields.update(changes)
    return Schedule(**fields)


def _admitted_keys(store: Store) -> Counter[str]:
    """How many admissions the audit log records for each scheduled workload."""
    keys: Counter[str] = Counter()
    for record in store.audit_log():
        if record.operation == "admit":
            keys[record.key] += 1
    return keys


def test_three_schedulers_admit_each_tick_of_a_simulated_day_exactly_once(store: Store) -> None:
    schedules = [_quarter_hourly(), _every_7_minutes()]
    expected_ticks = {
        schedule.name: [
            tick
            for tick in reversed(schedule.ticks_back(DAY_START + DAY, 1_000))
            if tick >= DAY_START
        ]
        for schedule in schedules
    }
    # The quarter hours of Paris are real quarter hours, through the change of clocks:
    # 96 in the day and the one closing it.
    assert len(expected_ticks["reports"]) == 96 + 1
    rng = random.Random(7)
    failures: list[BaseException] = []

    def run(seed: int) -> None:
        own = random.Random(seed)
        clock = ManualClock(DAY_START)
        scheduler = PeriodicScheduler(
            Authority(store, grants=VERIFIER), schedules, clock=clock, poll_s=0.01
        )
        try:
            while clock.now() < DAY_START + DAY:
                clock.advance(own.randrange(1, 20) * MINUTE)
                if own.random() < 0.1:
                    clock.advance(own.randrange(1, 4) * HOUR)  # an outage: nothing runs
                scheduler.run_once(min(clock.now(), DAY_START + DAY))
            scheduler.run_once(DAY_START + DAY)
            assert scheduler.counts["refused"] == 0
        except BaseException as exc:  # noqa: BLE001  # asserted in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(rng.randrange(10**6),)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    admitted = _admitted_keys(store)
    assert set(admitted.values()) == {1}, "no workload admitted twice"
    for schedule in schedules:
        ids = schedule_ids = {
            schedule.workload_id_at(tick) for tick in expected_ticks[schedule.name]
        }
        assert ids <= set(admitted), f"every tick of {schedule.name} was admitted"
        assert len(schedule_ids) == len(expected_ticks[schedule.name])
    assert len(admitted) == sum(len(ticks) for ticks in expected_ticks.values())
    first = schedules[1].workload_id_at(expected_ticks["sync"][0])
    workload = Authority(store, grants=VERIFIER).get(first)
    assert workload.idempotency_key == tick_key("sync", expected_ticks["sync"][0])
    assert workload.input == {"id": 1, "tick": expected_ticks["sync"][0]}


def test_catch_up_one_admits_only_the_latest_missed_tick_and_skip_none(store: Store) -> None:
    authority = Authority(store, grants=VERIFIER)
    one = _quarter_hourly("one", name="one")
    skip = _quarter_hourly("skip", name="skip", grace_ms=2 * MINUTE)
    everything = _quarter_hourly("all", name="all")
    scheduler = PeriodicScheduler(authority, [one, skip, everything])
    first = scheduler.run_once(DAY_START + MINUTE)
    assert len(first) == 3, "the tick at DAY_START, once for each schedule"
    # Three hours pass with no scheduler running.
    later = DAY_START + 3 * HOUR + 5 * MINUTE
    answers = scheduler.run_once(later)
    keys = sorted(a.workload.idempotency_key for a in answers if not isinstance(a, WorkloadError))
    latest = one.latest_tick(later)
    assert latest is not None
    missed = [t for t in reversed(everything.ticks_back(later, 100)) if t > DAY_START]
    assert keys == sorted([tick_key("one", latest)] + [tick_key("all", tick) for tick in missed]), (
        "one: the latest only; skip: the latest fell 5 minutes ago, beyond its grace; all: each"
    )
    assert scheduler.run_once(later) == [], "nothing is due twice"
    # A skip schedule admits a tick seen within its grace.
    on_time = DAY_START + 3 * HOUR + 15 * MINUTE + MINUTE
    assert [a.workload.idempotency_key for a in scheduler.run_once(on_time)] == [
        tick_key("one", on_time - MINUTE),
        tick_key("skip", on_time - MINUTE),
        tick_key("all", on_time - MINUTE),
    ]


def test_no_tick_before_the_schedule_starts_is_admitted() -> None:
    from workwarden.storage import MemoryStore

    schedule = _every_7_minutes()
    scheduler = PeriodicScheduler(Authority(MemoryStore(), grants=VERIFIER), [schedule])
    assert scheduler.run_once(DAY_START) == []
    assert schedule.next_tick(DAY_START) == DAY_START + 3 * MINUTE
    (answer,) = scheduler.run_once(DAY_START + 3 * MINUTE)
    assert not isinstance(answer, WorkloadError)
    assert answer.created


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cron": "every day"}, "cron"),
        ({"cron": "* * * * *", "every_ms": 1000}, ""),
        ({"cron": None, "every_ms": None}, ""),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"catch_up": "some"}, "catch_up"),
        ({"every_ms": 0, "cron": None}, "every_ms"),
        ({"lookback": 0}, "lookback"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"name": "n" * (SCHEDULE_NAME_MAX + 1)}, "name"),
    ],
)
def test_a_bad_schedule_is_refused_naming_its_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkloadError) as refused:
        _quarter_hourly(**changes)
    assert refused.value.code == errors.INVALID
    fields = [error["field"] for error in refused.value.details["errors"]]
    assert field in fields


def test_the_longest_schedule_name_makes_keys_that_are_names_at_every_instant() -> None:
    from workwarden.statemachine import inputs
    from workwarden.storage import MemoryStore

    longest = "n" * SCHEDULE_NAME_MAX
    schedule = _every_7_minutes(name=longest, start_at=0, catch_up="one")
    inputs.as_name(tick_key(longest, 2**53 - 1), "idempotency_key")
    scheduler = PeriodicScheduler(Authority(MemoryStore(), grants=VERIFIER), [schedule])
    (answer,) = scheduler.run_once(DAY_START)
    assert not isinstance(answer, WorkloadError)
    assert answer.workload.idempotency_key == tick_key(longest, schedule.latest_tick(DAY_START))


@pytest.mark.parametrize("now", ["x", True, -1, 2**53, 1.5])
def test_a_bad_instant_is_refused_and_nothing_is_admitted(now: Any) -> None:
    from workwarden.storage import MemoryStore

    store = MemoryStore()
    scheduler = PeriodicScheduler(Authority(store, grants=VERIFIER), [_every_7_minutes()])
    with pytest.raises(WorkloadError) as refused:
        scheduler.run_once(now)
    assert refused.value.code == errors.INVALID
    assert refused.value.details["field"] == "now"
    assert store.audit_log() == []


def test_an_instant_past_the_cron_calendar_is_refused_not_a_bare_value_error() -> None:
    from workwarden.storage import MemoryStore

    store = MemoryStore()
    scheduler = PeriodicScheduler(Authority(store, grants=VERIFIER), [_quarter_hourly()])
    for ask in (scheduler.run_once, scheduler.next_instant):
        with pytest.raises(WorkloadError) as refused:
            ask(2**53 - 1)
        assert refused.value.code == errors.INVALID
    assert store.audit_log() == []


def test_a_scheduler_whose_ticks_cannot_be_told_keeps_running_until_stopped() -> None:
    from workwarden.storage import MemoryStore

    scheduler = PeriodicScheduler(
        Authority(MemoryStore(), grants=VERIFIER),
        [_quarter_hourly()],
        clock=ManualClock(2**53 - 1),
        poll_s=0.01,
    )
    runner = threading.Thread(target=scheduler.run)
    runner.start()
    time.sleep(0.1)
    assert runner.is_alive(), "run() logs the refusal and looks again after poll_s"
    scheduler.stop()
    runner.join(5)
    assert not runner.is_alive()


@pytest.mark.parametrize("poll_s", [float("nan"), float("inf"), 0, -1.0, "1", True])
def test_a_bad_poll_interval_is_refused(poll_s: Any) -> None:
    from workwarden.storage import MemoryStore

    with pytest.raises(WorkloadError) as refused:
        PeriodicScheduler(
            Authority(MemoryStore(), grants=VERIFIER), [_every_7_minutes()], poll_s=poll_s
        )
    assert refused.value.code == errors.INVALID
    assert refused.value.details["field"] == "poll_s"


def test_two_schedules_with_one_name_are_refused_and_nothing_is_admitted() -> None:
    from workwarden.storage import MemoryStore

    store = MemoryStore()
    with pytest.raises(WorkloadError) as refused:
        PeriodicScheduler(Authority(store, grants=VERIFIER), [_quarter_hourly()] * 2)
    assert refused.value.code == errors.INVALID
    assert store.audit_log() == []


SCHEDULES_MODULE = """
from workwarden.periodic import Schedule
from workwarden.statemachine import CreateWorkload, Grant, GrantSigner, Subject

_SIGNER = GrantSigner("k", bytes(range(32)))
_GRANT = Grant(
    id="g", issuer=Subject(kind="human", id="h"), subject=Subject(kind="agent", id="cron"),
    tenant_id="t", application_id="app", capabilities=("workload:execute",),
    issued_at=0, expires_at=9_999_999_999_999,
)
schedules = [
    Schedule(
        name="every-second",
        every_ms=1000,
        catch_up="one",
        request=CreateWorkload(
            tenant_id="t", application_id="app", environment="production",
            definition_id="tick", definition_revision="r1", trigger="schedule", input={},
            requested_by=Subject(kind="agent", id="cron"),
            authorization_snapshot=_SIGNER.sign(_GRANT), idempotency_key="template",
        ),
    )
]
"""


def test_the_scheduler_process_admits_ticks_and_stops_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "cron_jobs.py").write_text(textwrap.dedent(SCHEDULES_MODULE), encoding="utf-8")
    keys = tmp_path / "keys.json"
    keys.write_text('{"k": "' + bytes(range(32)).hex() + '"}', encoding="utf-8")
    db = tmp_path / "work.db"
    SQLiteStore(db).close()
    command = [
        sys.executable,
        "-m",
        "workwarden",
        "scheduler",
        "--store",
        str(db),
        "--schedules",
        "cron_jobs:schedules",
        "--grant-keys",
        str(keys),
        "--poll-s",
        "0.2",
    ]
    once = subprocess.run(
        [*command, "--once"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert once.returncode == 0, once.stderr
    assert "scheduled schedule=every-second" in once.stderr
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stderr is not None
        # Running once its first tick is logged; then two more seconds of ticks.
        first = process.stderr.readline()
        assert "scheduled schedule=every-second" in first, first
        time.sleep(2.5)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    with SQLiteStore(db) as store:
        admitted = _admitted_keys(store)
    assert set(admitted.values()) == {1}
    assert len(admitted) >= 3, "a tick each second while it ran"
