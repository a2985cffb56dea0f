"""A signal that lands while the authority serialises a document stops the program as itself.

pydantic-core reports a KeyboardInterrupt or SystemExit raised inside its serialiser (by a
signal handler: Ctrl-C, or SIGTERM under the command line, which raises SystemExit(143))
as its own `PydanticSerializationError`; the command line then took a stopped run for a
bug in workwarden (exit 70) and skipped the clean-up it does on a stop. Real signals, from
an interval timer, land at random points of a large document's serialisation.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from types import FrameType

import pytest

from support import authority, request
from workwarden.statemachine.authority import serialise
from workwarden.statemachine.safety import canonical_json
from workwarden.storage import MemoryStore


def _stops(interrupt: Callable[[], BaseException], work: Callable[[], object]) -> Counter[str]:
    """Run `work` over and over under a timer whose signal raises `interrupt()`; what stopped it."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise interrupt()

    previous = signal.signal(signal.SIGALRM, handler)
    seen: Counter[str] = Counter()
    try:
        for _ in range(200):
            signal.setitimer(signal.ITIMER_REAL, 0.0003)
            try:
                for _ in range(500):
                    work()
            except BaseException as exc:  # noqa: BLE001 - what stopped it is the finding
                seen[
                    type(exc).__name__ + (f" {exc.code}" if isinstance(exc, SystemExit) else "")
                ] += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return seen


@pytest.mark.parametrize(
    ("interrupt", "name"),
    [(KeyboardInterrupt, "KeyboardInterrupt"), (lambda: SystemExit(143), "SystemExit 143")],
)
def test_a_signal_while_a_document_is_serialised_raises_the_interrupt_itself(
    interrupt: Callable[[], BaseException], name: str
) -> None:
    warden = authority(MemoryStore())
    workload = warden.admit(request(input={"text": "x" * 200_000, "n": [1.5] * 2_000}), 10_000)
    document = workload.workload

    seen = _stops(interrupt, lambda: serialise(document))
    assert set(seen) == {name}, seen

    floats = {"values": [0.1 * n for n in range(20_000)]}
    seen = _stops(interrupt, lambda: canonical_json(floats))
    assert set(seen) == {name}, seen
