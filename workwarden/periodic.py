"""Periodic work: schedules that admit one workload per tick, however many schedulers run.

A `Schedule` names a cadence (a cron expression in a time zone, read by
`croniter`, or a fixed interval in milliseconds) and the admission request
to make at each tick. The request of a tick is the schedule's template with
the idempotency key `schedule/<name>/<tick instant in ms>`: admission is
idempotent per requester and key, so any number of schedulers admitting the
same tick admit it once, and every other one is answered with the original
(`AdmitReply.created` is False). No scheduler state is kept anywhere but in
the store: whether a tick was admitted is whether the workload its request
names exists (`workload_id_for`), so a scheduler that restarts, or a second
one that starts, knows what was done.

What becomes of ticks that fell while no scheduler ran is the schedule's
`catch_up` rule:

- `"all"`: every missed tick is admitted, oldest first, looking back at most
  `lookback` ticks (and never before `start_at`);
- `"one"` (the default): only the latest tick is admitted, once, however
  many were missed;
- `"skip"`: a tick is admitted only within `grace_ms` after it fell; missed
  ticks are dropped.

Under `"one"` and `"skip"` a tick is never admitted once the tick after it
is: a clock set back, or a scheduler whose clock is behind another's, does
not bring back a tick they passed over.

`PeriodicScheduler` runs schedules against an authority: `run_once(now)`
admits what is due at `now` (one `admit_many` for every schedule), `run()`
does so until stopped, sleeping until the next tick of any schedule.
`workwarden scheduler --store URL --schedules MODULE:ATTR` is the same as a
process.

A tick whose workload was purged (retention) counts as admitted on a store
that keeps tombstones (`storage.base.Tombstones`: the memory, SQLite and
PostgreSQL stores), so a purge never makes a tick run again. On a store
without them a purged tick looks missed: keep such a store's scheduled
workloads longer than a schedule's period (and than `lookback` ticks for
`catch_up = "all"`).

Cron ticks are read in the schedule's time zone the way cron reads local
time. A tick that falls in the hour the clocks skip (spring forward) falls
at the first instant after the gap (`30 2 * * *` at 03:00), unless the hour
field names every hour (`*`, `0-23`): such a schedule ticks by elapsed time,
and `30 * * * *` goes from 01:30 to 03:30. When the clocks go back, a local time
that happens twice is one tick, at its first occurrence, for a schedule at
fixed hours (its hour field does not start with `*`): `30 2 * * *` in
`Europe/Paris` runs once that night. A schedule whose hour field starts
with `*` (`*/15 * * * *`) ticks on through the repeated hour, as its
elapsed time says.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from itertools import islice
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from workwarden.runtime import arguments
from workwarden.runtime.clock import MAX_WAIT_S, Clock, WallClock, event
from workwarden.statemachine import errors, inputs
from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.authority import Authority
from workwarden.statemachine.batches import MAX_BATCH
from workwarden.statemachine.commands import AdmitReply
from workwarden.statemachine.models import MAX_INSTANT, CreateWorkload, Name
from workwarden.storage.base import Tombstones

__all__ = [
    "SCHEDULE_NAME_MAX",
    "CatchUp",
    "PeriodicScheduler",
    "Schedule",
    "tick_key",
    "validated_schedules",
]

CatchUp = Literal["skip", "one", "all"]
"""What a schedule does with ticks that fell while no scheduler ran (see the module docstring)."""

_MS = Annotated[int, Field(strict=True, ge=1, le=10**13)]

SCHEDULE_NAME_MAX = 256 - len("schedule/") - len("/") - len(str(MAX_INSTANT))
"""The longest schedule name (230): every tick's key `schedule/<name>/<tick>` is then a name."""

# A cron expression is read from here once, to refuse one whose date never comes.
_CRON_PROBE = datetime(2000, 1, 1, tzinfo=UTC)

# croniter's random field (`R`, `R(0-29)`, `R/15`), drawn anew each time it is read.
_RANDOM_FIELD = re.compile(r"r(\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE | re.ASCII)

# Names the zone database may hold that stand for the host's configured zone, not a zone.
_HOST_ZONES = frozenset({"localtime", "posixrules"})


def tick_key(name: str, tick: int) -> str:
    """The idempotency key of a schedule's tick: `schedule/<name>/<tick in ms>`."""
    return f"schedule/{name}/{tick}"


class Schedule(errors.ValidatedModel):
    """A cadence and the admission request made at each of its ticks.

    Exactly one of `cron` (five fields, minute to weekday, read in
    `timezone`, an IANA name) or `every_ms` (ticks at `start_at + k *
    every_ms`). `start_at`: no tick before this instant (ms) is ever
    admitted. `catch_up`, `grace_ms` and `lookback`: the module docstring.
    `request`: the admission each tick makes; its `idempotency_key` is
    replaced by `tick_key(name, tick)`. `tick_field`: when set, the tick
    instant is added to the template's input under that name (the input is
    an object without that key, or the schedule is refused). Bad fields are
    `WORKLOAD_INVALID` naming each: `name` is 1 to `SCHEDULE_NAME_MAX` (230)
    printable characters, so that every tick's key is a name of at most 256;
    a `cron` whose date never comes (`0 0 31 2 *`) is refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[Name, Field(max_length=SCHEDULE_NAME_MAX)]
    request: CreateWorkload
    cron: str | None = None
    timezone: str = "UTC"
    every_ms: Annotated[_MS | None, Field(validate_default=True)] = None
    start_at: Annotated[int, Field(strict=True, ge=0, le=10**13)] = 0
    catch_up: CatchUp = "one"
    grace_ms: Annotated[int, Field(strict=True, ge=0, le=10**13)] = 60_000
    lookback: Annotated[int, Field(strict=True, ge=1, le=10_000)] = 100
    tick_field: Name | None = None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        if value in _HOST_ZONES:
            # The host's own zone under a zone's name: schedulers on two hosts would tick
            # at different instants, and each tick would be admitted once per host.
            raise ValueError(
                f"{value!r} names the host's configured zone, not a zone: give an IANA"
                " name (Europe/Paris, UTC)"
            )
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            # OSError: a folder of the zone database ("Europe"), or a name too long for a file.
            raise ValueError(f"unknown time zone {value[:64]!r}") from None
        return value

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        if value is not None and (len(value.split()) != 5 or not croniter.is_valid(value)):
            raise ValueError(f"not a five-field cron expression: {value!r}")
        if value is not None and any(_RANDOM_FIELD.match(part) for part in value.split()):
            # croniter draws an `R` field again each time it reads the expression: the
            # ticks would differ between schedulers and between two looks of one.
            raise ValueError(
                f"the cron expression {value!r} has a random field (R): a schedule's"
                " ticks must be the same for every scheduler"
            )
        if value is not None:
            try:
                croniter(value, _CRON_PROBE).get_next(datetime)
            except CroniterError:
                raise ValueError(
                    f"the cron expression {value!r} names no date that comes"
                ) from None
        return value

    @field_validator("every_ms")
    @classmethod
    def _one_cadence(cls, value: int | None, info: ValidationInfo) -> int | None:
        # Checked on `every_ms` (after `cron`), so that the refusal names a field.
        if "cron" in info.data and (info.data["cron"] is None) == (value is None):
            raise ValueError("give exactly one of cron or every_ms")
        return value

    @field_validator("tick_field")
    @classmethod
    def _room_for_the_tick(cls, value: str | None, info: ValidationInfo) -> str | None:
        request = info.data.get("request")
        if value is None or request is None:
            return value
        # Refused rather than passed over: a handler reading the tick would find none, or
        # find the instant where the template's own value was.
        if not isinstance(request.input, dict):
            kind = "null" if request.input is None else type(request.input).__name__
            raise ValueError(f"the tick is added to the request's input, {kind}, not an object")
        if value in request.input:
            raise ValueError(f"the request's input has a {value[:64]!r} of its own already")
        return value

    # -- ticks -------------------------------------------------------------------------

    def latest_tick(self, now: int) -> int | None:
        """The last tick at or before `now` (None when none falls from `start_at` to `now`)."""
        if now < self.start_at:
            return None
        if self.every_ms is not None:
            return self.start_at + (now - self.start_at) // self.every_ms * self.every_ms
        ticks = self._cron_from(now + 1, backwards=True)
        tick = next(ticks)
        return tick if tick >= self.start_at else None

    def ticks_back(self, now: int, count: int) -> list[int]:
        """Up to `count` ticks at or before `now`, latest first, none before `start_at`."""
        return list(islice(self._ticks_back(now), count))

    def _ticks_back(self, now: int) -> Iterator[int]:
        """The ticks at or before `now`, latest first, none before `start_at`, as they are
        asked for: a catch-up that stops at the first tick admitted reckons no more."""
        latest = self.latest_tick(now)
        if latest is None:
            return
        if self.every_ms is not None:
            yield from range(latest, self.start_at - 1, -self.every_ms)
            return
        yield latest
        for tick in self._cron_from(latest, backwards=True):
            if tick < self.start_at:
                return
            yield tick

    def next_tick(self, after: int) -> int:
        """The first tick strictly after `after` (and not before `start_at`)."""
        if after < self.start_at:
            if self.every_ms is not None:
                return self.start_at
            after = self.start_at - 1
        if self.every_ms is not None:
            return self.start_at + ((after - self.start_at) // self.every_ms + 1) * self.every_ms
        return next(self._cron_from(after, backwards=False))

    def _cron_from(self, instant: int, *, backwards: bool) -> Iterator[int]:
        """Cron ticks (ms) strictly before (backwards) or after `instant`.

        Cron ticks fall within the calendar `datetime` holds (years 1 to
        9999): asking past it is `WORKLOAD_INVALID`, never the bare
        `ValueError` or croniter error it raised.
        """
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        fixed_hours = not self.cron.split()[1].startswith("*")
        while True:
            try:
                start = datetime.fromtimestamp(instant / 1000, tz=UTC).astimezone(zone)
                iterator = croniter(self.cron, start)
            except (CroniterError, ValueError, OverflowError, OSError):
                raise _past_calendar(instant) from None
            step = iterator.get_prev if backwards else iterator.get_next
            while True:
                try:
                    moment: datetime = step(datetime)
                except (CroniterError, ValueError, OverflowError, OSError):
                    raise _past_calendar(instant) from None
                if not (fixed_hours and _repeated(moment, zone)):
                    yield int(moment.timestamp() * 1000)
                    continue
                # The second occurrence of a repeated local time is no tick. Backwards,
                # croniter steps from it to the local time before it, passing over its
                # first occurrence when the clocks went back by less than an hour (half
                # an hour on Lord Howe Island): start again just after that occurrence.
                instant = int(moment.timestamp() * 1000)
                if backwards:
                    first = moment.astimezone(zone).replace(fold=0)
                    instant = int(first.timestamp() * 1000) + 1
                break

    # -- requests ----------------------------------------------------------------------

    def request_for(self, tick: int) -> CreateWorkload:
        """The admission request of `tick`."""
        changes: dict[str, Any] = {"idempotency_key": tick_key(self.name, tick)}
        if self.tick_field is not None and isinstance(self.request.input, dict):
            changes["input"] = {**self.request.input, self.tick_field: tick}
        return self.request.model_copy(update=changes)

    def workload_id_at(self, tick: int) -> str:
        """The id of the workload `tick` admits."""
        return workload_id_for(self.request_for(tick))


def _repeated(moment: datetime, zone: ZoneInfo) -> bool:
    """Is `moment` the second occurrence of its local time (the hour the clocks go back)?"""
    aware = moment.astimezone(zone)
    local = aware.replace(tzinfo=None)
    first = local.replace(tzinfo=zone, fold=0).utcoffset()
    second = local.replace(tzinfo=zone, fold=1).utcoffset()
    return first != second and aware.utcoffset() == second


def _past_calendar(instant: int) -> errors.WorkloadError:
    return errors.bad_argument(
        "now", f"no cron tick is known around {instant}: cron ticks end in the year 9999"
    )


def _schedule(fields: Any) -> Schedule:
    if not isinstance(fields, dict):
        raise errors.bad_argument(
            "schedules", "a schedule is a Schedule or a mapping of its fields"
        )
    return Schedule(**fields)


def validated_schedules(schedules: Iterable[Any]) -> list[Schedule]:
    """`schedules` as a list of `Schedule`: at least one, each named once.

    A mapping stands for a schedule's fields; anything else, an empty list or
    two schedules of one name is `WORKLOAD_INVALID` naming `schedules`.
    """
    if isinstance(schedules, (str, bytes, Schedule)) or not isinstance(schedules, Iterable):
        raise errors.bad_argument("schedules", "schedules must be a list of Schedule")
    chosen = [s if isinstance(s, Schedule) else _schedule(s) for s in schedules]
    names = [schedule.name for schedule in chosen]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise errors.bad_argument("schedules", f"two schedules are named {', '.join(twice)}")
    if not chosen:
        raise errors.bad_argument("schedules", "no schedules: a scheduler needs at least one")
    return chosen


class PeriodicScheduler:
    """Admits the ticks of `schedules` through `authority`, at the instants of `clock`.

    Any number of schedulers may run the same schedules against one store:
    each tick is admitted once (see the module docstring). `poll_s` bounds
    how long `run` sleeps between looks (so a stop is seen, and a clock
    that jumps is followed): a number of seconds above 0, at most
    `runtime.clock.MAX_WAIT_S` (an hour). `schedules` holds at least one,
    each named once. `authority` has `get` and `admit_many` (an
    `Authority`), `clock` has `now()`. A bad argument is `WORKLOAD_INVALID`
    naming it. Thread-safety: one scheduler
    is driven by one thread; `stop()` may be called from any.
    """

    def __init__(
        self,
        authority: Authority,
        schedules: Iterable[Schedule | Any],
        *,
        clock: Clock | None = None,
        poll_s: float = 1.0,
    ) -> None:
        if (
            not isinstance(poll_s, (int, float))
            or isinstance(poll_s, bool)
            or not math.isfinite(poll_s)
            or not 0 < poll_s <= MAX_WAIT_S
        ):
            raise errors.bad_argument(
                "poll_s", f"poll_s must be a number of seconds above 0, at most {MAX_WAIT_S:g}"
            )
        arguments.calls(authority, "authority", ("get", "admit_many"), "an Authority")
        if clock is not None:
            arguments.calls(clock, "clock", ["now"], "a Clock")
        self.authority = authority
        self.schedules: tuple[Schedule, ...] = tuple(validated_schedules(schedules))
        self.clock: Clock = clock if clock is not None else WallClock()
        self.poll_s = float(poll_s)
        self.counts = {"admitted": 0, "replayed": 0, "refused": 0}
        """Ticks this scheduler admitted, found admitted by another, and had refused."""
        self._stop = threading.Event()

    def due(self, schedule: Schedule, now: int) -> list[int]:
        """The ticks of `schedule` to admit at `now` under its catch-up rule, oldest first."""
        if schedule.catch_up == "all":
            missed: list[int] = []
            for tick in islice(schedule._ticks_back(now), schedule.lookback):
                if self._admitted(schedule, tick):
                    break
                missed.append(tick)
            return missed[::-1]
        latest = schedule.latest_tick(now)
        if latest is None or self._admitted(schedule, latest):
            return []
        if schedule.catch_up == "skip" and now - latest > schedule.grace_ms:
            return []
        if self._passed_over(schedule, latest):
            return []
        return [latest]

    def _passed_over(self, schedule: Schedule, tick: int) -> bool:
        """Is the tick after `tick` admitted already? Then a clock set back (or another
        scheduler's clock, ahead of this one) must not bring `tick` back."""
        try:
            later = schedule.next_tick(tick)
        except errors.WorkloadError:
            return False  # the last cron tick of the calendar: none comes after it
        return self._admitted(schedule, later)

    def _admitted(self, schedule: Schedule, tick: int) -> bool:
        """Was `tick` admitted: does its workload exist, or did its purge leave a tombstone?"""
        workload_id = schedule.workload_id_at(tick)
        try:
            self.authority.get(workload_id)
        except errors.WorkloadError as exc:
            if exc.code != errors.NOT_FOUND:
                raise
        else:
            return True
        store = getattr(self.authority, "store", None)
        if not isinstance(store, Tombstones):
            return False
        return self.authority._store_call(store.tombstone, workload_id) is not None

    def run_once(self, now: int | None = None) -> list[AdmitReply | errors.WorkloadError]:
        """Admit every tick due at `now` (the clock's by default), in one batch; the answers.

        `now` is an integer instant in ms (`WORKLOAD_INVALID` otherwise, and
        for an instant past the calendar a cron schedule's ticks fall in).
        """
        at = self.clock.now() if now is None else now
        inputs.check_now(at)
        ticks: list[tuple[Schedule, int]] = [
            (schedule, tick) for schedule in self.schedules for tick in self.due(schedule, at)
        ]
        answers: list[AdmitReply | errors.WorkloadError] = []
        # In batches of at most `MAX_BATCH`: a catch-up may find more ticks due than one takes.
        for start in range(0, len(ticks), MAX_BATCH):
            part = ticks[start : start + MAX_BATCH]
            admitted = self.authority.admit_many(
                [schedule.request_for(tick) for schedule, tick in part], at
            )
            for (schedule, tick), answer in zip(part, admitted, strict=True):
                self._record(schedule, tick, answer)
            answers.extend(admitted)
        return answers

    def _record(self, schedule: Schedule, tick: int, answer: Any) -> None:
        if isinstance(answer, errors.WorkloadError):
            self.counts["refused"] += 1
            event(
                "schedule_refused",
                schedule=schedule.name,
                tick=tick,
                code=answer.code,
                message=answer.message,
            )
            return
        kind = "admitted" if answer.created else "replayed"
        self.counts[kind] += 1
        event(
            "scheduled",
            schedule=schedule.name,
            tick=tick,
            workload=answer.workload.workload_id,
            created=answer.created,
        )

    def next_instant(self, now: int) -> int | None:
        """The next tick of any schedule after `now` (None without schedules).

        `WORKLOAD_INVALID` when a cron schedule has no tick after `now` in the
        calendar (past the year 9999).
        """
        return min((schedule.next_tick(now) for schedule in self.schedules), default=None)

    def run(self) -> None:
        """Admit due ticks until `stop()`: at each tick, and at least every `poll_s`."""
        while not self._stop.is_set():
            try:
                self.run_once()
            except errors.WorkloadError as exc:
                # The store is down or refused a read: log it, look again after a poll.
                event("store_error", code=exc.code, message=exc.message)
            wait = self.poll_s
            now = self.clock.now()
            try:
                upcoming = self.next_instant(now)
            except errors.WorkloadError as exc:
                # The clock is past every cron tick (`_cron_from`): look again after a poll.
                event("schedule_error", code=exc.code, message=exc.message)
                upcoming = None
            if upcoming is not None:
                wait = min(self.poll_s, (upcoming - now) / 1000)
            self._stop.wait(max(wait, 0.001))

    def stop(self) -> None:
        """Make `run` return after its current pass."""
        self._stop.set()

    def tick_ids(self, schedule: Schedule, ticks: Sequence[int]) -> list[str]:
        """The workload ids the `ticks` of `schedule` admit (for audits and tests)."""
        return [schedule.workload_id_at(tick) for tick in ticks]
