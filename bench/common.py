"""What every harness shares: the machine's description, a quiet machine, alternation, output.

A figure is only worth recording on a machine that is not busy with something
else: `Quiet.wait` holds each repetition until the one-minute load average is
at most `--max-load` (or gives up after a few tries and records the load it
ran at). Every sample carries that load beside its value.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workwarden.statemachine import (
    CreateWorkload,
    Grant,
    GrantSigner,
    GrantVerifier,
    SignedGrant,
    Subject,
)

__all__ = [
    "BENCH_DIR",
    "NOW",
    "Fixture",
    "Quiet",
    "Sample",
    "alternate",
    "base_parser",
    "command_line",
    "fsync_ms",
    "load1",
    "machine",
    "median",
    "need_matplotlib",
    "quiet_from",
    "save",
    "save_figure",
    "summary",
]

BENCH_DIR = Path(__file__).resolve().parent
"""Where results and plots go by default."""

NOW = 1_700_000_000_000
"""The instant every harness runs at (milliseconds); time is passed in, never read."""

_SECRET = b"a benchmark secret of 16+ bytes"


def load1() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


def _memory_gib() -> float:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """nproc, memory, CPU, Python, the date and the load averages, for the record."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "cpu": _cpu(),
        "python": platform.python_version(),
        "load": [round(value, 2) for value in os.getloadavg()],
    }


@dataclass
class Quiet:
    """Waits for a quiet machine before each measurement."""

    max_load: float = 1.5
    tries: int = 4
    pause_s: float = 20.0
    log: Callable[[str], None] = field(default=lambda text: print(text, file=sys.stderr))

    def wait(self) -> float:
        """Wait (a few times at most) for the load to fall to `max_load`; return the load."""
        load = load1()
        for _ in range(self.tries):
            if load <= self.max_load:
                return load
            self.log(f"  load {load:.2f} > {self.max_load}: waiting {self.pause_s:.0f} s")
            time.sleep(self.pause_s)
            load = load1()
        if load > self.max_load:
            self.log(f"  load still {load:.2f}: measuring anyway, the load is recorded")
        return load


@dataclass(frozen=True)
class Sample:
    """One measurement, the one-minute load average when it started, and the disk's flush time.

    `fsync_ms` is the median time of a small write and `fsync` in the
    harness's scratch directory, taken before the round: on a shared
    machine it moves between fractions of a millisecond and several, and
    every durable commit moves with it.
    """

    value: float
    load: float
    fsync_ms: float | None = None


def fsync_ms(directory: str | None = None, count: int = 15) -> float:
    """The median time (ms) to write 4 KiB and `fsync` it, in `directory` (default: temp)."""
    handle, path = tempfile.mkstemp(dir=directory, prefix="bench-fsync-")
    times: list[float] = []
    try:
        for _ in range(count):
            os.write(handle, b"x" * 4096)
            started = time.perf_counter()
            os.fsync(handle)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(handle)
        os.unlink(path)
    return round(statistics.median(times), 3)


def median(values: Sequence[float]) -> float:
    """The median (0.0 of nothing)."""
    return float(statistics.median(values)) if values else 0.0


def alternate(
    reps: int,
    runs: Mapping[str, Callable[[], float]],
    quiet: Quiet,
    log: Callable[[str], None] | None = None,
) -> dict[str, list[Sample]]:
    """Run each of `runs` once per round, in order, `reps` rounds: A B A B ... .

    The machine is waited for before each round, not between its runs, so
    that the runs of one round go back to back and their ratio is fair.
    """
    samples: dict[str, list[Sample]] = {name: [] for name in runs}
    for rep in range(reps):
        quiet.wait()
        flush = fsync_ms()
        for name, run in runs.items():
            load = load1()
            value = run()
            samples[name].append(Sample(value, load, flush))
            if log is not None:
                log(
                    f"  rep {rep + 1}/{reps} {name}: {value:,.1f}"
                    f" (load {load:.2f}, fsync {flush:.2f} ms)"
                )
                sys.stdout.flush()
    return samples


def summary(samples: Sequence[Sample]) -> dict[str, Any]:
    """Median, spread and loads of a list of samples."""
    values = [s.value for s in samples]
    loads = [s.load for s in samples]
    flushes = [s.fsync_ms for s in samples if s.fsync_ms is not None]
    return {
        "fsync_ms": [round(f, 2) for f in flushes],
        "median": round(median(values), 3),
        "min": round(min(values), 3) if values else 0.0,
        "max": round(max(values), 3) if values else 0.0,
        "samples": [round(v, 3) for v in values],
        "load_median": round(median(loads), 2),
        "load_max": round(max(loads), 2) if loads else 0.0,
    }


def base_parser(description: str) -> argparse.ArgumentParser:
    """The options every harness takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=5, help="repetitions (medians of them)")
    parser.add_argument(
        "--max-load",
        type=float,
        default=1.5,
        help="wait before each repetition until the 1-minute load is at most this",
    )
    parser.add_argument("--load-wait", type=float, default=20.0, help="seconds between load checks")
    parser.add_argument(
        "--out",
        type=Path,
        default=BENCH_DIR,
        help="directory for results/NAME.json and plots/NAME.png (default: bench/)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    parser.add_argument(
        "--name", default=None, help="save as results/NAME.json and plots/NAME.png instead"
    )
    return parser


def quiet_from(args: argparse.Namespace) -> Quiet:
    """The `Quiet` the common options ask for."""
    return Quiet(max_load=args.max_load, pause_s=args.load_wait)


def save(out: Path, name: str, data: Mapping[str, Any]) -> Path:
    """Write `data` as `out/results/NAME.json` (sorted keys); return the path."""
    path = out / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=_plain) + "\n")
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, Sample):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that produced a result, for the record."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python", "-m", module, *args])


class Fixture:
    """A signer, a verifier and admission requests of a chosen input size."""

    def __init__(self, tenant: str = "bench", application: str = "jobs") -> None:
        self.tenant = tenant
        self.application = application
        self.verifier = GrantVerifier({"bench": _SECRET})
        self.requester = Subject(kind="service", id="bench-producer")
        self.grant: SignedGrant = GrantSigner("bench", _SECRET).sign(
            Grant(
                id="grant-bench",
                issuer=Subject(kind="human", id="ops"),
                subject=self.requester,
                tenant_id=tenant,
                application_id=application,
                issued_at=0,
                expires_at=4_000_000_000_000,
            )
        )

    def request(self, key: str, payload_bytes: int = 0, **extra: Any) -> CreateWorkload:
        """An admission under idempotency key `key` with an input of about `payload_bytes`."""
        return CreateWorkload(
            tenant_id=self.tenant,
            application_id=self.application,
            environment="production",
            definition_id="bench-job",
            definition_revision="r1",
            trigger="api",
            input={"job": key, "payload": "x" * payload_bytes},
            requested_by=self.requester,
            authorization_snapshot=self.grant,
            capability_snapshot=("bench",),
            idempotency_key=key,
            **extra,
        )


def save_figure(plt: Any, fig: Any, path: Path) -> None:
    """Lay `fig` out, write it to `path` as a PNG (making its folder), and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def need_matplotlib() -> Any:
    """`matplotlib.pyplot` on the Agg backend, or exit saying how to install it."""
    try:
        import matplotlib  # only the plotting step needs it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            'the plots need matplotlib: pip install -e ".[bench]" (or pass --no-plot)'
        ) from None
    return plt
