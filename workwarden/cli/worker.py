"""`workwarden worker` and `workwarden sweeper`: the runtime as processes.

`worker` imports an `App` (`--app MODULE:ATTR`, the module found with the
current directory on `sys.path`), claims the work of one tenant and
application and runs its handlers until SIGTERM or SIGINT (or, with
`--until-idle`, until nothing is left to do). `sweeper` recovers expired
leases and enforces deadlines at the instants they fall. Both log one event
a line on standard error, `name key=value ...` (logger `workwarden.runtime`).

Remote mode: `--warden URL --token TOKEN` (or `$WORKWARDEN_TOKEN`) instead of
`--store` runs over the service's HTTP API (`HttpAuthority`), with a token
and no database credentials. `--metrics-port N` serves the process's counts
to Prometheus on that port (`workwarden.service.metrics.runtime_registry`).

`--spec FILE` (with `--store`) decides under a spec of your own, the one the
store's work was admitted under; over `--warden` the service's spec decides.

Signals: the first SIGTERM or SIGINT stops claiming and lets running
handlers finish within `--grace-s`, then the command exits 0 (every report
still buffered for a batch is sent first); a second signal exits at once,
with status 143 (SIGTERM) or 130 (SIGINT).

Batching: `--batch` (the default) claims with `claim_many` and sends reports
with `report_many`, each waiting at most `--batch-window-ms`; `--no-batch`
makes one call per claim and per report.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from types import FrameType, ModuleType
from typing import Any

from workwarden.cli import STORE_HELP, opened_store, port_number, positive_int, seconds
from workwarden.cli.logs import library_logs_one_line
from workwarden.runtime import App, Sweeper, Worker
from workwarden.runtime.arguments import MAX_LEASE_MS
from workwarden.runtime.reports import DEFAULT_WINDOW_MS
from workwarden.runtime.signals import from_handler
from workwarden.runtime.worker import _exception_text
from workwarden.statemachine import Authority, GrantVerifier
from workwarden.statemachine import errors as codes
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.spec import Spec, load_spec
from workwarden.storage import MemoryStore

__all__ = [
    "MAX_LEASE_MS",
    "MAX_WINDOW_MS",
    "TOKEN_VARIABLE",
    "import_target",
    "load_app",
    "register",
]

#: Where `--warden` reads its bearer token when `--token` is not given.
TOKEN_VARIABLE = "WORKWARDEN_TOKEN"
_EXTRA = "pip install 'workwarden[service]'"


#: The longest `--batch-window-ms`, an hour: a report buffered longer would outlive most
#: leases (a stop or a full buffer still sends it at once).
MAX_WINDOW_MS = 3_600_000


def _window_ms(text: str) -> int:
    """`--batch-window-ms`: whole milliseconds, 0 to `MAX_WINDOW_MS`."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_WINDOW_MS:
        raise argparse.ArgumentTypeError(f"{text}: give whole milliseconds, 0 to {MAX_WINDOW_MS:,}")
    return value


def _lease_ms(text: str) -> int:
    """`--lease-ms`: whole milliseconds, 1 to `MAX_LEASE_MS`."""
    value = positive_int(text)
    if value > MAX_LEASE_MS:
        raise argparse.ArgumentTypeError(
            f"{value} ms is longer than the longest lease, a year ({MAX_LEASE_MS:,} ms)"
        )
    return value


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    runtime = logging.getLogger("workwarden.runtime")
    runtime.handlers[:] = [handler]
    runtime.setLevel(logging.INFO)
    runtime.propagate = False
    library_logs_one_line()


def import_target(target: str, option: str, example: str) -> tuple[ModuleType, str]:
    """The module and attribute name `MODULE:ATTR` names, the module imported with the
    current directory on `sys.path`.

    `WORKLOAD_INVALID` naming `option` when `target` is not `MODULE:ATTR` with
    MODULE a dotted name (not a path), or when importing the module fails in
    any way: not found, a syntax error, or an exception its code raised, a
    `SystemExit` (`sys.exit`) or another `BaseException` included (only
    `KeyboardInterrupt` goes through, as Ctrl-C).
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise WorkloadError(codes.INVALID, f"{option} {target}: write MODULE:ATTR, e.g. {example}")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise WorkloadError(
            codes.INVALID,
            f"{option} {target}: {module_name!r} is not a module name (dotted names, not a path;"
            " the module is found from the current directory)",
        )
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(codes.INVALID, f"{option} {target}: cannot import: {exc}") from None
    except (KeyboardInterrupt, _Stopped):
        raise  # Ctrl-C, or a stop signal while the module was imported
    except BaseException as exc:  # noqa: BLE001 - the user's module failed as it was imported
        # A `sys.exit` too (a script's own command line): the command did not run.
        raise WorkloadError(
            codes.INVALID,
            f"{option} {target}: importing {module_name} raised"
            f" {type(exc).__name__}: {_exception_text(exc)}",
        ) from None
    return module, attr


def load_app(target: str) -> App:
    """The `App` named by `MODULE:ATTR`, imported with the current directory on `sys.path`."""
    module, attr = import_target(target, "--app", "tasks:app")
    app = vars(module).get(attr)
    if not isinstance(app, App):
        found = "nothing" if app is None else type(app).__name__
        raise WorkloadError(
            codes.INVALID, f"--app {target}: {attr} is {found}, not a workwarden App"
        )
    return app


def _authority(store: Any, spec: Spec | None) -> Authority:
    # Workers and sweepers admit nothing: no grant signature is ever checked here.
    return Authority(store, grants=GrantVerifier.without_signatures(), spec=spec)


def _checked_before_opening(
    remote: tuple[str, str] | None, spec: Spec | None, build: Callable[[Authority], object]
) -> None:
    """Build the worker or sweeper once over an empty memory store, before the real one
    is opened: an option it refuses is refused before `--create` makes a store that the
    refusal would leave behind. Over `--warden` nothing is created, and the service's
    spec is not known here.
    """
    if remote is None:
        build(_authority(MemoryStore(), spec))


def _usage(message: str) -> WorkloadError:
    return WorkloadError("WORKWARDEN_USAGE", message)


def _remote(command: str, args: argparse.Namespace) -> tuple[str, str] | None:
    """`(URL, token)` of `--warden`, None for `--store`; a usage error unless exactly one."""
    if args.warden is None:
        if args.token is not None:
            raise _usage(f"{command}: --token goes with --warden URL")
        return None
    if args.store is not None:
        raise _usage(f"{command}: give --store URL or --warden URL, not both")
    if not args.warden.startswith(("http://", "https://")):
        raise _usage(f"{command}: --warden {args.warden}: give an http:// or https:// URL")
    _check_warden_url(command, args.warden)
    token = args.token if args.token is not None else os.environ.get(TOKEN_VARIABLE, "")
    if not token:
        raise _usage(f"{command}: --warden needs --token TOKEN (or ${TOKEN_VARIABLE})")
    return args.warden, token


def _check_warden_url(command: str, url: str) -> None:
    """A usage error unless `url` names a host (and a port from 1 to 65535, when it has one).

    A URL no service can be reached at would otherwise be refused only when the
    first call is made, as a bug, or retried as an unreachable service forever.
    The URL is not repeated: it may hold a password.
    """
    problem = None
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is not a number from 0 to 65535
    except ValueError as exc:
        problem = "its host or port cannot be read" + ("" if "@" in url else f" ({exc})")
    else:
        if any(c.isspace() or not c.isprintable() for c in url):
            problem = "it holds a space or an unprintable character"
        elif not parts.hostname:
            problem = "it names no host"
        elif port == 0:
            problem = "port 0 is no port a service listens on"
    if problem is not None:
        raise _usage(f"{command}: --warden: give http(s)://HOST[:PORT]: {problem}")


def _spec(command: str, args: argparse.Namespace) -> Spec | None:
    """The spec `--spec` names (None: the shipped one), read before the store is opened.

    A usage error when `--create` or `--spec` comes with `--warden`.
    """
    if args.warden is None:
        return load_spec(args.spec) if args.spec is not None else None
    if args.create:
        raise _usage(f"{command}: --create goes with --store; the service keeps its own store")
    if args.spec is not None:
        raise _usage(f"{command}: --spec goes with --store; over --warden the service's spec holds")
    return None


@contextlib.contextmanager
def _opened_authority(command: str, args: argparse.Namespace, spec: Spec | None) -> Iterator[Any]:
    """The authority over `--store` (deciding under `spec`), or over HTTP with `--warden`."""
    remote = _remote(command, args)
    if remote is None:
        with opened_store(args.store, "create" if args.create else "write") as store:
            yield _authority(store, spec)
        return
    try:
        from workwarden.service.client import HttpAuthority
    except ImportError as exc:
        raise WorkloadError(
            codes.EXTRA_MISSING, f"--warden needs the service extra ({exc.name}): {_EXTRA}"
        ) from None
    with HttpAuthority(*remote) as authority:
        yield authority


def _serve_metrics(port: int | None, counts: Callable[[], Mapping[str, int]]) -> None:
    if port is None:
        return
    try:
        from workwarden.service.metrics import serve_runtime_metrics
    except ImportError as exc:
        raise WorkloadError(
            codes.EXTRA_MISSING, f"--metrics-port needs prometheus_client ({exc.name}): {_EXTRA}"
        ) from None
    try:
        serve_runtime_metrics(port, counts)
    except OSError as exc:
        raise _usage(f"--metrics-port {port}: cannot listen: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _stops_early() -> Iterator[list[Any]]:
    """SIGTERM and SIGINT before the loop runs: the process stops at once, with status 0.

    Yields a list: a worker or sweeper put in it is stopped by a signal that
    comes before its loop puts in handlers of its own.
    """
    running: list[Any] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        for runner in running:
            from_handler(runner.stop)
        if not running:
            raise _Stopped

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield running
    except _Stopped:
        pass  # nothing was held yet: the process just ends
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Stopped(BaseException):
    """A signal came while the process was starting: nothing is held, it just ends."""


def _worker(args: argparse.Namespace) -> int:
    if (args.tenant is None or args.application is None) and not (
        args.all_scopes and args.tenant is None and args.application is None
    ):
        raise _usage("worker: name --tenant and --application, or serve --all-scopes")
    with _stops_early() as running:
        return _work(args, running)
    return 0  # stopped by a signal while starting


def _work(args: argparse.Namespace, running: list[Any]) -> int:
    _configure_logging()
    remote = _remote("worker", args)
    app = load_app(args.app)
    spec = _spec("worker", args)

    def build(authority: Any) -> Worker:
        return Worker(
            authority,
            app,
            tenant=args.tenant,
            application=args.application,
            worker_id=args.worker_id,
            concurrency=args.concurrency,
            lease_ms=args.lease_ms,
            grace_s=args.grace_s,
            batch=args.batch,
            batch_window_ms=args.batch_window_ms,
            also_serve=args.also_serve,
            all_scopes=args.all_scopes,
        )

    _checked_before_opening(remote, spec, build)
    # The port before the store too; its counts are the worker's once there is one.
    _serve_metrics(args.metrics_port, lambda: running[0].counts if running else {})
    with _opened_authority("worker", args, spec) as authority:
        worker = build(authority)
        running.append(worker)
        if args.until_idle:
            worker.run_until_idle()
        else:
            worker.run()
    return 0


def _sweeper(args: argparse.Namespace) -> int:
    with _stops_early() as running:
        return _sweep(args, running)
    return 0  # stopped by a signal while starting


def _sweep(args: argparse.Namespace, running: list[Any]) -> int:
    _configure_logging()
    remote = _remote("sweeper", args)
    spec = _spec("sweeper", args)

    def build(authority: Any) -> Sweeper:
        return Sweeper(authority, tenant=args.tenant, application=args.application)

    _checked_before_opening(remote, spec, build)
    _serve_metrics(args.metrics_port, lambda: running[0].counts if running else {})
    with _opened_authority("sweeper", args, spec) as authority:
        sweeper = build(authority)
        running.append(sweeper)
        if args.until_idle:
            sweeper.run_until_idle()
        else:
            sweeper.run()
    return 0


def _remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--create",
        action="store_true",
        help="with --store: create the store if absent (an empty one, waiting for work)",
    )
    parser.add_argument(
        "--warden",
        metavar="URL",
        default=None,
        help="run over the HTTP API of `workwarden serve` at URL instead of --store",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"the worker's bearer token for --warden (default: ${TOKEN_VARIABLE})",
    )


def _spec_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec",
        metavar="FILE",
        help="with --store: the spec its work was admitted under (the shipped one by default)",
    )


def _metrics_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        metavar="N",
        help="serve the process's counts to Prometheus on port N (default: none)",
    )


def register(subparsers: Any) -> None:
    """Add the `worker` and `sweeper` commands."""
    worker: argparse.ArgumentParser = subparsers.add_parser(
        "worker",
        help="claim work and run an app's handlers on it",
        description=(
            "Claim the work of one tenant and application and run the handlers of an App "
            "on it: heartbeats, cancellation, retries and store failures are handled; see "
            "docs/worker.md. SIGTERM or SIGINT stops gracefully; a second one exits at once."
        ),
    )
    worker.add_argument("--store", metavar="URL", help=STORE_HELP)
    _remote_options(worker)
    worker.add_argument(
        "--app", required=True, metavar="MODULE:ATTR", help="the App, e.g. tasks:app"
    )
    worker.add_argument("--tenant", help="the tenant whose work to claim")
    worker.add_argument("--application", help="the application whose work to claim")
    worker.add_argument(
        "--all-scopes",
        action="store_true",
        help=(
            "claim the work of every tenant and application the store has work in, in the "
            "order the spec's [fairness] declares (not over --warden)"
        ),
    )
    worker.add_argument(
        "--also-serve",
        action="append",
        default=[],
        metavar="TENANT/APP",
        help=(
            "also claim this tenant's and application's work (repeatable); the scopes are "
            "served in the order the spec's [fairness] declares"
        ),
    )
    worker.add_argument(
        "--concurrency", type=positive_int, default=1, help="handlers running at once"
    )
    worker.add_argument(
        "--lease-ms",
        type=_lease_ms,
        default=30_000,
        help=f"the lease of each claim, in ms, 1 to {MAX_LEASE_MS:,} (a year)",
    )
    worker.add_argument(
        "--worker-id", default=None, help="the worker's id (default host-pid-random)"
    )
    worker.add_argument(
        "--grace-s",
        type=seconds(zero=True),
        default=30.0,
        help="how long running handlers may finish after a stop signal, in seconds (0 or more)",
    )
    worker.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing is claimable, held or eligible within a lease",
    )
    worker.add_argument(
        "--batch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            "claim every free slot in one claim_many and send the reports of many attempts "
            "in one report_many (default: on; over --warden, only when the service offers them)"
        ),
    )
    worker.add_argument(
        "--batch-window-ms",
        type=_window_ms,
        default=DEFAULT_WINDOW_MS,
        metavar="N",
        help=(
            "how long a report waits for others to join its batch, in ms, 0 to "
            f"{MAX_WINDOW_MS:,}; 0 sends at once (default: {DEFAULT_WINDOW_MS})"
        ),
    )
    _spec_option(worker)
    _metrics_option(worker)
    worker.set_defaults(handler=_worker)

    sweeper: argparse.ArgumentParser = subparsers.add_parser(
        "sweeper",
        help="recover expired leases and enforce deadlines as they fall",
        description=(
            "Recover expired leases and enforce fallen deadlines at the instants they are "
            "due (the store says when), for the whole store or one tenant and/or application. "
            "Several sweepers on one store are safe."
        ),
    )
    sweeper.add_argument("--store", metavar="URL", help=STORE_HELP)
    _remote_options(sweeper)
    sweeper.add_argument("--tenant", default=None, help="only this tenant's work")
    sweeper.add_argument("--application", default=None, help="only this application's work")
    sweeper.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing falls due within 30 s",
    )
    _spec_option(sweeper)
    _metrics_option(sweeper)
    sweeper.set_defaults(handler=_sweeper)
