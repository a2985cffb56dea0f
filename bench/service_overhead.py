"""The service's cost per call over the library's (`python -m bench.service_overhead`).

One lifecycle is a worker's five calls (`admit`, `claim`, `start`,
`heartbeat`, `complete`) on a memory store: once on an `Authority` in this
process, once through `HttpAuthority` to a `workwarden serve` process on
loopback (a memory store too, so the difference is the service: HTTP, JSON,
the token check, validation and the metrics). The two sides alternate round
by round; a figure is microseconds per call, the median of the rounds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bench.common import (
    NOW,
    Fixture,
    alternate,
    base_parser,
    command_line,
    machine,
    quiet_from,
    save,
    summary,
)
from workwarden.service.testing import running_service
from workwarden.statemachine import Authority
from workwarden.storage import MemoryStore

__all__ = ["lifecycles", "main"]

CALLS_PER_LIFECYCLE = 5


def lifecycles(authority: Any, fixture: Fixture, prefix: str, count: int) -> float:
    """Run `count` lifecycles through `authority`; microseconds per call."""
    started = time.perf_counter()
    for n in range(count):
        now = NOW + n * 10
        admitted = authority.admit(fixture.request(f"{prefix}-{n}", 256), now)
        wid = admitted.workload.workload_id
        claim = authority.claim(wid, "bench-worker", ("bench",), now + 1, 60_000)
        authority.start(wid, claim.fence, now + 2)
        authority.heartbeat(wid, claim.fence, now + 3, 60_000)
        authority.complete(wid, claim.fence, f"result-{prefix}-{n}", {"n": n}, now + 4)
    elapsed = time.perf_counter() - started
    return elapsed * 1e6 / (count * CALLS_PER_LIFECYCLE)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print and save the figures; returns the exit status."""
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--lifecycles", type=int, default=300, help="lifecycles per round")
    args = parser.parse_args(argv)
    fixture = Fixture()
    library = Authority(MemoryStore(), grants=fixture.verifier)
    rounds = {"n": 0}
    with running_service() as service, service.client() as client:
        # One lifecycle each first, so neither side pays its first-call costs in a round.
        lifecycles(library, fixture, "warm", 1)
        lifecycles(client, fixture, "warm", 1)

        def library_round() -> float:
            rounds["n"] += 1
            return lifecycles(library, fixture, f"lib{rounds['n']}", args.lifecycles)

        def http_round() -> float:
            return lifecycles(client, fixture, f"http{rounds['n']}", args.lifecycles)

        samples = alternate(
            args.reps,
            {"library": library_round, "http": http_round},
            quiet_from(args),
            log=print,
        )
    figures = {name: summary(values) for name, values in samples.items()}
    ratios = [
        h.value / lib.value for h, lib in zip(samples["http"], samples["library"], strict=True)
    ]
    overheads = [
        h.value - lib.value for h, lib in zip(samples["http"], samples["library"], strict=True)
    ]
    lib_us, http_us = figures["library"]["median"], figures["http"]["median"]
    print(f"library  {lib_us:8.1f} us/call")
    print(f"http     {http_us:8.1f} us/call")
    print(
        f"overhead {sorted(overheads)[len(overheads) // 2]:8.1f} us/call (median of rounds),"
        f" x{sorted(ratios)[len(ratios) // 2]:.1f}"
    )
    path = save(
        args.out,
        args.name or "service_overhead",
        {
            "command": command_line("bench.service_overhead", argv),
            "machine": machine(),
            "lifecycles_per_round": args.lifecycles,
            "calls_per_lifecycle": CALLS_PER_LIFECYCLE,
            "us_per_call": figures,
            "overhead_us": [round(o, 1) for o in overheads],
            "ratio": [round(r, 2) for r in ratios],
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
