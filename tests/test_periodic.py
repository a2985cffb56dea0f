"""Periodic work: each tick of a schedule is admitted once, however many schedulers run.

Three schedulers run the same schedules for a simulated day against one store,
each on its own clock, with outages; every tick ends admitted exactly once
(checked from the audit log), missed ticks follow the schedule's catch-up rule,
and the `workwarden scheduler` process admits and stops as documented.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from support import CAPS, SIGNER, VERIFIER, grant_for, request
from workwarden.periodic import SCHEDULE_NAME_MAX, PeriodicScheduler, Schedule, tick_key
from workwarden.runtime import ManualClock
from workwarden.statemachine import Authority, GrantVerifier, WorkloadError, errors
from workwarden.storage import MemoryStore, SQLiteStore, Store, StoreError

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


def test_a_clock_set_back_never_admits_a_tick_its_catch_up_passed_over(store: Store) -> None:
    authority = Authority(store, grants=VERIFIER)
    one = _quarter_hourly("one", name="one")
    skip = _quarter_hourly("skip", name="skip", grace_ms=30 * MINUTE)
    scheduler = PeriodicScheduler(authority, [one, skip])
    scheduler.run_once(DAY_START + MINUTE)
    # An hour with no scheduler; it comes back on a clock ten minutes fast.
    fast = DAY_START + HOUR + 5 * MINUTE
    assert len(scheduler.run_once(fast)) == 2, "the tick at DAY_START + 1 h, once for each"
    # The clock is set right (or another scheduler's clock is ten minutes behind): the
    # latest tick it sees, DAY_START + 45 min, was passed over for a later one.
    behind = fast - 10 * MINUTE
    assert scheduler.run_once(behind) == []
    assert PeriodicScheduler(Authority(store, grants=VERIFIER), [one, skip]).run_once(behind) == []
    assert sorted(_admitted_keys(store).values()) == [1] * 4


class _Reckoning(Schedule):
    """A schedule that notes each cron tick it reckons."""

    def _cron_from(self, instant: int, *, backwards: bool) -> Iterator[int]:
        for tick in super()._cron_from(instant, backwards=backwards):
            _RECKONED.append(tick)
            yield tick


_RECKONED: list[int] = []


def test_a_catch_up_all_pass_with_nothing_due_reckons_no_tick_before_the_latest() -> None:
    # A pass every second with lookback = 10,000 must not reckon 10,000 cron ticks each time.
    schedule = _Reckoning(
        name="minutely",
        request=_template(),
        cron="* * * * *",
        catch_up="all",
        lookback=10_000,
        start_at=DAY_START,
    )
    scheduler = PeriodicScheduler(Authority(MemoryStore(), grants=VERIFIER), [schedule])
    assert len(scheduler.run_once(DAY_START + 30 * MINUTE)) == 31
    _RECKONED.clear()
    assert scheduler.run_once(DAY_START + 30 * MINUTE + 10) == []
    assert _RECKONED == [DAY_START + 30 * MINUTE], "the latest tick only: it is admitted"


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
        ({"cron": "* * * * *", "every_ms": 1000}, "every_ms"),
        ({"cron": None, "every_ms": None}, "every_ms"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"catch_up": "some"}, "catch_up"),
        ({"every_ms": 0, "cron": None}, "every_ms"),
        ({"lookback": 0}, "lookback"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        # croniter draws a random field again at every read: ticks no two schedulers share.
        ({"cron": "R * * * *"}, "cron"),
        ({"cron": "0 r(1-5) * * *"}, "cron"),
        ({"cron": "R/15 * * * *"}, "cron"),
        ({"name": "n" * (SCHEDULE_NAME_MAX + 1)}, "name"),
        # The tick needs an object to go in, and a key of its own there.
        ({"tick_field": "tick", "request": _template(input=None)}, "tick_field"),
        ({"tick_field": "tick", "request": _template(input=[1, 2])}, "tick_field"),
        ({"tick_field": "id"}, "tick_field"),
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


def _admitted_line(line: str) -> bool:
    return "scheduled schedule=every-second" in line and "created=True" in line


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
        # Stopped once it has admitted three ticks of its own, however slowly they come
        # (a line that is not a tick, a slow pass on a busy machine, are waited out).
        lines: list[str] = []
        while sum(_admitted_line(line) for line in lines) < 3:
            line = process.stderr.readline()
            assert line, "the scheduler stopped early:\n" + "".join(lines)
            lines.append(line)
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


# -- catch-ups larger than a batch, purged ticks, the night clocks go back ---------------


def test_a_catch_up_of_more_ticks_than_one_batch_takes_admits_every_one() -> None:
    from workwarden.statemachine.batches import MAX_BATCH

    store = MemoryStore()
    ticks = MAX_BATCH + 500
    schedule = Schedule(
        name="dense",
        request=_template(),
        every_ms=1,
        start_at=DAY_START,
        catch_up="all",
        lookback=ticks,
    )
    scheduler = PeriodicScheduler(Authority(store, grants=VERIFIER), [schedule])
    answers = scheduler.run_once(DAY_START + ticks - 1)
    assert len(answers) == ticks
    assert all(not isinstance(a, WorkloadError) and a.created for a in answers)
    assert len(_admitted_keys(store)) == ticks
    assert scheduler.run_once(DAY_START + ticks - 1) == []


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_tick_whose_workload_was_purged_is_not_admitted_again(kind: str, tmp_path: Path) -> None:
    store: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.db")
    authority = Authority(store, grants=VERIFIER)
    monthly = Schedule(name="monthly", request=_template(), cron="0 0 1 * *", catch_up="one")
    first = int(datetime(2027, 1, 1, tzinfo=UTC).timestamp() * 1000)
    scheduler = PeriodicScheduler(authority, [monthly])
    [admitted] = scheduler.run_once(first + 1)
    assert not isinstance(admitted, WorkloadError)
    workload_id = admitted.workload.workload_id
    claim = authority.claim(workload_id, "w", CAPS, first + 2, 60_000)
    authority.start(workload_id, claim.fence, first + 3)
    authority.complete(workload_id, claim.fence, "r-jan", {"ok": True}, first + 4)
    later = first + 30 * DAY
    report = authority.purge(later, older_than_ms=0)
    assert workload_id in report.purged
    # The January tick is still the latest on the 30th: purged, it is not run again.
    assert scheduler.run_once(later) == []
    assert scheduler.counts == {"admitted": 1, "replayed": 0, "refused": 0}
    # February's tick is admitted as usual.
    february = int(datetime(2027, 2, 1, tzinfo=UTC).timestamp() * 1000)
    [next_one] = scheduler.run_once(february)
    assert not isinstance(next_one, WorkloadError)
    assert next_one.created
    store.close()


def _ticks_between(schedule: Schedule, start: int, end: int) -> list[int]:
    ticks, at = [], start
    while (at := schedule.next_tick(at)) < end:
        ticks.append(at)
    return ticks


def test_on_the_night_clocks_go_back_a_fixed_hour_runs_once_and_a_wildcard_hour_ticks_on() -> None:
    # 2026-10-25: Paris goes from 03:00 CEST back to 02:00 CET (01:00 UTC).
    night = int(datetime(2026, 10, 24, 22, tzinfo=UTC).timestamp() * 1000)
    nightly = Schedule(
        name="nightly",
        request=_template(),
        cron="30 2 * * *",
        timezone="Europe/Paris",
        start_at=night,
    )
    assert _ticks_between(nightly, night, night + 6 * HOUR) == [night + 2 * HOUR + 30 * MINUTE]
    morning = night + 12 * HOUR
    assert nightly.latest_tick(morning) == night + 2 * HOUR + 30 * MINUTE
    # The next night's 02:30 is in winter time: 25 hours later.
    assert nightly.ticks_back(morning + DAY, 2) == [
        night + 2 * HOUR + 30 * MINUTE + DAY + HOUR,
        night + 2 * HOUR + 30 * MINUTE,
    ]
    store = MemoryStore()
    scheduler = PeriodicScheduler(Authority(store, grants=VERIFIER), [nightly])
    for at in range(night, night + 6 * HOUR, 15 * MINUTE):
        scheduler.run_once(at)
    assert len(_admitted_keys(store)) == 1
    halves = Schedule(
        name="halves", request=_template(), cron="*/30 * * * *", timezone="Europe/Paris"
    )
    # Through the repeated hour every half hour of elapsed time ticks: 02:00 and 02:30 twice.
    between = _ticks_between(halves, night + 2 * HOUR - 1, night + 4 * HOUR)
    assert between == [night + 2 * HOUR + k * 30 * MINUTE for k in range(4)]


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
def test_on_the_night_clocks_go_forward_a_fixed_hour_fires_after_the_gap_and_every_hour_ticks_on(
    zone: str,
) -> None:
    # 2026-03-29 in Berlin, 2026-03-08 in New York: 02:00 local is 03:00 at once.
    day = (29, 3) if zone == "Europe/Berlin" else (8, 3)
    gap = datetime(2026, day[1], day[0], 3, tzinfo=ZoneInfo(zone))
    at_gap = int(gap.timestamp() * 1000)
    evening = at_gap - 6 * HOUR

    def ticks(cron: str) -> list[int]:
        schedule = Schedule(name="s", request=_template(), cron=cron, timezone=zone)
        return [t - at_gap for t in _ticks_between(schedule, evening, at_gap + 2 * HOUR)]

    # 02:30 does not exist: a schedule at that hour fires at the first moment after it.
    assert ticks("30 2 * * *") == [0]
    assert ticks("30 1-3 * * *") == [-30 * MINUTE, 0, 30 * MINUTE]
    # A schedule of every hour ticks by elapsed time, one hour from 01:30 to 03:30: no
    # tick at 03:00 for the 02:30 that does not exist.
    expected = [k * HOUR + 30 * MINUTE for k in range(-6, 2)]
    assert ticks("30 * * * *") == expected
    assert ticks("30 0-23 * * *") == expected


@pytest.mark.parametrize(
    # Lord Howe Island sets its clocks back by half an hour (02:00 to 01:30).
    ("zone", "night"),
    [("Australia/Lord_Howe", datetime(2026, 4, 4, 12, tzinfo=UTC)), ("Europe/Berlin", None)],
    ids=["lord-howe", "berlin"],
)
def test_a_catch_up_over_the_night_clocks_go_back_admits_what_a_running_scheduler_would(
    zone: str, night: datetime | None
) -> None:
    start = int((night or datetime(2026, 10, 24, 20, tzinfo=UTC)).timestamp() * 1000)
    schedule = Schedule(
        name="thirds",
        request=_template(),
        cron="*/20 1-3 * * *",
        timezone=zone,
        catch_up="all",
        start_at=start,
    )
    running = _ticks_between(schedule, start, start + 12 * HOUR)
    assert len(running) == 9, "01:00 to 03:40, the repeated times once"
    store = MemoryStore()
    scheduler = PeriodicScheduler(Authority(store, grants=VERIFIER), [schedule])
    answers = scheduler.run_once(start + 12 * HOUR)
    keys = [a.workload.idempotency_key for a in answers if not isinstance(a, WorkloadError)]
    assert keys == [tick_key("thirds", tick) for tick in running]


@pytest.mark.parametrize(
    # `localtime` and `posixrules` (where the zone database holds them) are the host's zone.
    "zone",
    ["Europe", "a" * 300, "../etc/passwd", "Nowhere/City", "localtime", "posixrules"],
)
def test_a_time_zone_that_is_not_a_zone_is_refused_naming_it(zone: str) -> None:
    with pytest.raises(WorkloadError) as caught:
        Schedule(name="x", request=_template(), cron="0 * * * *", timezone=zone)
    assert caught.value.code == errors.INVALID
    assert [e["field"] for e in caught.value.details["errors"]] == ["timezone"]


def test_a_schedule_with_no_cadence_at_all_is_refused_naming_every_ms() -> None:
    with pytest.raises(WorkloadError) as caught:
        Schedule(name="x", request=_template())
    assert caught.value.code == errors.INVALID
    assert caught.value.details["errors"][0]["field"] == "every_ms"


@pytest.mark.parametrize(
    ("schedules", "poll_s", "field"),
    [([], 1.0, "schedules"), (None, 3600.5, "poll_s"), (None, 1e308, "poll_s")],
)
def test_a_scheduler_without_schedules_or_with_an_endless_poll_is_refused(
    schedules: list[Schedule] | None, poll_s: float, field: str
) -> None:
    chosen = [_every_7_minutes()] if schedules is None else schedules
    with pytest.raises(WorkloadError) as caught:
        PeriodicScheduler(Authority(MemoryStore(), grants=VERIFIER), chosen, poll_s=poll_s)
    assert caught.value.code == errors.INVALID
    assert caught.value.details["field"] == field


@pytest.mark.parametrize(
    ("authority", "clock", "field"),
    [(None, None, "authority"), ("store", None, "authority"), (True, object(), "clock")],
)
def test_a_scheduler_without_an_authority_or_a_clock_is_refused_naming_it(
    authority: Any, clock: Any, field: str
) -> None:
    store = MemoryStore()
    chosen = Authority(store, grants=VERIFIER) if authority is True else authority
    with pytest.raises(WorkloadError) as caught:
        PeriodicScheduler(chosen, [_every_7_minutes()], clock=clock)
    assert caught.value.code == errors.INVALID
    assert caught.value.details["field"] == field
    assert store.audit_log() == []


def test_scheduler_once_exits_1_when_a_due_tick_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cron_jobs.py").write_text(textwrap.dedent(SCHEDULES_MODULE), encoding="utf-8")
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"k": "' + bytes(range(1, 33)).hex() + '"}', encoding="utf-8")
    db = tmp_path / "work.db"
    base = [sys.executable, "-m", "workwarden", "scheduler", "--store", str(db), "--create"]
    refused = subprocess.run(
        [*base, "--schedules", "cron_jobs:schedules", "--grant-keys", str(wrong), "--once"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1, refused.stderr
    assert "schedule_refused schedule=every-second" in refused.stderr
    assert "WORKLOAD_UNAUTHORIZED: 1 of 1 due ticks refused" in refused.stderr
    assert "Traceback" not in refused.stderr
    endless = subprocess.run(
        [*base, "--schedules", "cron_jobs:schedules", "--no-grant-signatures", "--poll-s", "1e308"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert endless.returncode == 2, endless.stderr
    assert "more than 3600 seconds" in endless.stderr


@pytest.mark.parametrize(
    ("attr", "message"),
    [("none", "no schedules"), ("twice", "two schedules are named every-second")],
)
def test_scheduler_refuses_bad_schedules_before_it_creates_the_store(
    tmp_path: Path, attr: str, message: str
) -> None:
    module = SCHEDULES_MODULE + "none = []\ntwice = schedules * 2\n"
    (tmp_path / "cron_jobs.py").write_text(textwrap.dedent(module), encoding="utf-8")
    db = tmp_path / "work.db"
    command = [sys.executable, "-m", "workwarden", "scheduler", "--store", str(db), "--create"]
    refused = subprocess.run(
        [*command, "--schedules", f"cron_jobs:{attr}", "--no-grant-signatures", "--once"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(f"WORKLOAD_INVALID: {message}"), refused.stderr
    assert "Traceback" not in refused.stderr
    assert sorted(path.name for path in tmp_path.iterdir() if path.suffix != "") == ["cron_jobs.py"]


class _FailingReads(MemoryStore):
    """A store whose reads fail with a message of several lines, as a driver's do."""

    def read(self, key: str) -> Any:
        raise StoreError('server closed the connection\n\tThis probably means "it" stopped')


def test_the_schedulers_lines_are_one_line_each_with_their_texts_quoted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = GrantVerifier({"k": bytes(range(1, 33))})
    refusing = PeriodicScheduler(Authority(MemoryStore(), grants=wrong), [_every_7_minutes()])
    failing = PeriodicScheduler(
        Authority(_FailingReads(), grants=VERIFIER),
        [_every_7_minutes()],
        clock=ManualClock(DAY_START + HOUR),
        poll_s=0.01,
    )
    with caplog.at_level("INFO", logger="workwarden.runtime"):
        [answer] = refusing.run_once(DAY_START + 3 * MINUTE)
        runner = threading.Thread(target=failing.run)
        runner.start()
        time.sleep(0.1)
        failing.stop()
        runner.join(5)
    assert isinstance(answer, WorkloadError)
    lines = [record.getMessage() for record in caplog.records]
    [refused] = [line for line in lines if line.startswith("schedule_refused ")]
    [failed, *_] = [line for line in lines if line.startswith("store_error ")]
    for line in (refused, failed):
        assert len(line.splitlines()) == 1, line
    assert _fields(refused)["code"] == answer.code
    assert _fields(refused)["message"] == answer.message
    assert _fields(failed)["code"] == errors.STORAGE_FAILURE
    assert "\\n\\tThis probably means" in _fields(failed)["message"]


def _fields(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in shlex.split(line)[1:])


# The schedules module stops its own process as it is imported, and the thread a signal
# handler hands its action to starts late (as it may: it waits for the interpreter's lock).
_STOPPED_WHILE_STARTING = """
import os, signal, sys, threading, time
import workwarden.cli.scheduler as command

def _late(action):
    threading.Thread(target=lambda: (time.sleep(0.5), action()), daemon=True).start()

command.from_handler = _late
from workwarden.cli import main
sys.exit(main(sys.argv[1:]))
"""


_SCHEDULES = ("--schedules", "cron_jobs:schedules", "--no-grant-signatures")


def _scheduler_process(tmp_path: Path, db: Path, *how: str) -> subprocess.Popen[str]:
    """`python HOW scheduler` on `db` with the schedules of `cron_jobs.py` in `tmp_path`."""
    return subprocess.Popen(
        [sys.executable, *how, "scheduler", "--store", str(db), *_SCHEDULES],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_stop_signal_while_the_scheduler_starts_is_never_lost(tmp_path: Path) -> None:
    (tmp_path / "cron_jobs.py").write_text(
        textwrap.dedent(SCHEDULES_MODULE)
        + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
        encoding="utf-8",
    )
    db = tmp_path / "work.db"
    SQLiteStore(db).close()
    process = _scheduler_process(tmp_path, db, "-c", _STOPPED_WHILE_STARTING)
    try:
        _, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"the scheduler ran on after the signal: {err}")
    assert process.returncode == 0, err
    with SQLiteStore(db) as store:
        assert _admitted_keys(store) == Counter(), "stopped before its first pass"


# A pass that does not end (a store that does not answer): the schedules module makes it so.
_STUCK = """
import time
from workwarden.periodic import PeriodicScheduler

PeriodicScheduler.run_once = lambda self, now=None: time.sleep(120)
"""


def test_a_second_signal_ends_a_scheduler_whose_pass_does_not_end(tmp_path: Path) -> None:
    (tmp_path / "cron_jobs.py").write_text(
        textwrap.dedent(SCHEDULES_MODULE) + textwrap.dedent(_STUCK), encoding="utf-8"
    )
    db = tmp_path / "work.db"
    SQLiteStore(db).close()
    process = _scheduler_process(tmp_path, db, "-m", "workwarden")
    try:
        time.sleep(3)  # started, and in its first pass
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert process.poll() is None, "the first signal waits for the pass under way"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err


def test_the_scheduler_help_points_to_the_page_that_documents_it() -> None:
    from workwarden.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    described = commands.choices["scheduler"].description or ""
    pages = re.findall(r"docs/[\w/]+\.md", described)
    assert pages == ["docs/periodic.md"]
    page = Path(__file__).parent.parent / pages[0]
    assert "workwarden scheduler --store URL --schedules" in page.read_text(encoding="utf-8")
