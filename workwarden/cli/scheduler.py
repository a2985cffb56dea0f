"""`workwarden scheduler`: admit the ticks of periodic schedules (`workwarden.periodic`).

`--schedules MODULE:ATTR` names a list of `Schedule` objects (the module
imported with the current directory on `sys.path`, as `worker --app` is).
The process admits each tick once, however many schedulers run the same
schedules against the store, and logs one line per admitted tick
(`scheduled schedule=... tick=... workload=... created=...`), and one per
refused tick (`schedule_refused schedule=... tick=... code=... message=...`).
`--once` admits what is due now and exits: 0 when every due tick was
admitted (or found admitted), 1 with the first refusal's code when any
was refused. Admissions' grants are verified with
`--grant-keys FILE` (JSON `{key id: hex secret}`), or not at all with
`--no-grant-signatures`. The first SIGTERM or SIGINT stops it after its
current pass (exit 0); a second one exits at once, with status 143
(SIGTERM) or 130 (SIGINT), as a worker does: a pass the store does not
answer is not waited for (an admission is one transaction: nothing of it
is left half done).
"""

from __future__ import annotations

import argparse
import os
import signal
from types import FrameType
from typing import Any

from workwarden.cli import STORE_HELP, opened_store, seconds
from workwarden.periodic import PeriodicScheduler, Schedule, validated_schedules
from workwarden.runtime.clock import MAX_WAIT_S
from workwarden.runtime.signals import from_handler
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine import errors as codes
from workwarden.statemachine.errors import WorkloadError

__all__ = ["load_schedules", "register"]


def load_schedules(target: str) -> list[Schedule]:
    """The schedules named by `MODULE:ATTR`: a list (or tuple) of `Schedule`.

    At least one, each named once (`WORKLOAD_INVALID` naming `schedules` otherwise).
    """
    from workwarden.cli.worker import import_target

    module, attr = import_target(target, "--schedules", "tasks:schedules")
    found = vars(module).get(attr)
    if not isinstance(found, (list, tuple)) or not all(isinstance(s, Schedule) for s in found):
        kind = "nothing" if found is None else type(found).__name__
        raise WorkloadError(
            codes.INVALID, f"--schedules {target}: {attr} is {kind}, not a list of Schedule"
        )
    return validated_schedules(found)


def _grants(args: argparse.Namespace) -> GrantVerifier:
    from workwarden.cli.serve import read_keys

    if args.no_grant_signatures:
        return GrantVerifier.without_signatures()
    if not args.grant_keys:
        raise WorkloadError(
            "WORKWARDEN_USAGE",
            "scheduler: give --grant-keys FILE, or --no-grant-signatures to admit unsigned grants",
        )
    return GrantVerifier(read_keys(args.grant_keys, "--grant-keys"))


def _all_admitted(answers: list[Any]) -> None:
    """Refuse (exit 1) a pass in which a due tick was refused: `--once` must not hide one."""
    refused = [answer for answer in answers if isinstance(answer, WorkloadError)]
    if refused:
        first = refused[0]
        raise WorkloadError(
            first.code,
            f"{len(refused)} of {len(answers)} due ticks refused; the first: {first.message}",
            first.details,
        )


def _scheduler(args: argparse.Namespace) -> int:
    from workwarden.cli.worker import _configure_logging

    _configure_logging()
    # Handlers first: a signal during start-up stops the command as cleanly as a later one.
    # `signalled` is set by the handler itself (a list's append takes no lock), so a signal
    # that comes before the scheduler is in `running` is seen when it is put there.
    signalled: list[int] = []
    running: list[PeriodicScheduler] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        signalled.append(signum)
        if len(signalled) > 1:
            os._exit(128 + signum)  # a second signal: at once, whatever the pass is doing
        for scheduler in running:
            from_handler(scheduler.stop)

    if not args.once:
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    grants = _grants(args)
    # The schedules before the store: a bad one refused after `--create` made a file
    # would leave that file behind.
    schedules = load_schedules(args.schedules)
    with opened_store(args.store, "create" if args.create else "write") as store:
        scheduler = PeriodicScheduler(
            Authority(store, grants=grants), schedules, poll_s=args.poll_s
        )
        if args.once:
            _all_admitted(scheduler.run_once())
            return 0
        running.append(scheduler)
        if not signalled:
            scheduler.run()
    return 0


def register(subparsers: Any) -> None:
    """Add the `scheduler` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "scheduler",
        help="admit the ticks of periodic schedules, each exactly once",
        description=(
            "Admit one workload per tick of each schedule (cron in a time zone, or a fixed "
            "interval), with an idempotency key made of the schedule's name and the tick's "
            "instant: any number of schedulers admit each tick once. Missed ticks follow "
            "each schedule's catch_up rule (skip, one, all). See docs/periodic.md."
        ),
    )
    parser.add_argument("--store", default=None, metavar="URL", help=STORE_HELP)
    parser.add_argument("--create", action="store_true", help="create the store if absent")
    parser.add_argument(
        "--schedules",
        required=True,
        metavar="MODULE:ATTR",
        help="the list of workwarden.periodic.Schedule to run, e.g. tasks:schedules",
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--grant-keys",
        default=None,
        metavar="FILE",
        help="JSON {key id: hex secret}: the keys the admissions' grants are verified with",
    )
    keys.add_argument(
        "--no-grant-signatures",
        action="store_true",
        help="do not verify the signatures of the admissions' grants (say so explicitly)",
    )
    parser.add_argument(
        "--poll-s",
        type=seconds(at_most=MAX_WAIT_S),
        default=1.0,
        metavar="S",
        help="look at least every S seconds, at most 3600 (default: 1.0)",
    )
    parser.add_argument(
        "--once", action="store_true", help="admit what is due now, then exit (default: run)"
    )
    parser.set_defaults(handler=_scheduler)
