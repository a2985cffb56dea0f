"""Handlers: the `App` registry, the `Job` a handler receives, and what a handler may raise.

A handler is a plain function or an `async def` that takes a `Job` and
returns the workload's output (any JSON value). It says how the attempt
ended by what it does:

- returns a value: the attempt completes with that output, under a result id
  derived from the fence (`result_id_for`), so a report repeated after a lost
  reply is answered with the result it recorded;
- raises `Retry(kind=...)`: a failure with effect `none` (nothing happened
  that a retry would repeat); the failure policy retries it when the
  workload's retry policy lists the kind;
- raises `Fail(kind=..., effect=...)`: a failure with the kind and effect
  given;
- raises anything else: a failure of the app's `failure_kind` (default
  `worker_failure`) whose effect is `unknown` once the handler has
  checkpointed, or has run for `unknown_after_ms` (when set), and `none`
  before that. With effect `unknown` the failure policy decides as for a
  lost worker.

The runtime, not the handler, talks to the authority: `Job.checkpoint` is
the one call a handler makes, and it is safe to repeat.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workwarden.runtime import arguments
from workwarden.statemachine import errors
from workwarden.statemachine.models import Checkpoint, Fence

__all__ = [
    "App",
    "Fail",
    "Handler",
    "HandlerSpec",
    "Job",
    "Retry",
    "result_id_for",
]

#: What a handler is: a function of the job, returning the output (or an awaitable of it).
Handler = Callable[["Job"], Any]


def result_id_for(fence: Fence) -> str:
    """The result id of the attempt a fence names: the same for every report of that attempt."""
    text = f"{fence.claim_id}\x1f{fence.worker_id}\x1f{fence.token}"
    return "result_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class Retry(Exception):
    """Raised by a handler: the attempt failed with effect `none`; the policy may retry it.

    `kind` is the failure kind the retry policy's `retry_on` is matched
    against. `after_ms` is how long the handler would like the next attempt
    to wait; the workload's backoff decides the wait, and `after_ms` is
    recorded in the failure's message.

    A bad argument (`kind` not a name, `after_ms` not a whole number of ms,
    0 or more, `message` not a str) is `WORKLOAD_INVALID` when the
    exception is built; raised from a handler, that error is then what the
    handler raised, and is reported as the app's `failure_kind`.
    """

    def __init__(self, kind: str, *, after_ms: int | None = None, message: str = "") -> None:
        kind = arguments.name(kind, "kind")
        if after_ms is not None:
            arguments.whole(after_ms, "after_ms", 0)
        _check_message(message)
        super().__init__(message or kind)
        self.kind = kind
        self.after_ms = after_ms
        self.message = message


class Fail(Exception):
    """Raised by a handler: the attempt failed with `kind` and `effect` (`none` or `unknown`).

    A bad argument (`kind` not a name, another `effect`, `message` not a
    str) is `WORKLOAD_INVALID` when the exception is built, as for `Retry`.
    """

    def __init__(self, kind: str, *, effect: str = "none", message: str = "") -> None:
        kind = arguments.name(kind, "kind")
        if effect not in ("none", "unknown"):
            raise errors.bad_argument("effect", "effect must be 'none' or 'unknown'")
        _check_message(message)
        super().__init__(message or kind)
        self.kind = kind
        self.effect = effect
        self.message = message


def _check_message(message: object) -> None:
    if not isinstance(message, str):
        raise errors.bad_argument("message", "message must be a str")


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler: the definition it runs, the function, and the capabilities it needs."""

    definition_id: str
    function: Handler
    needs: tuple[str, ...]

    @property
    def is_async(self) -> bool:
        """Whether the handler is an `async def`."""
        return inspect.iscoroutinefunction(self.function)


class App:
    """The handlers of one application, keyed by definition id.

        app = App()

        @app.handler("send-invoice", needs=("billing",))
        def send_invoice(job): ...

    `failure_kind` (default `worker_failure`) is the kind reported for an
    exception other than `Retry` and `Fail`; its effect is `unknown` once
    the handler has checkpointed, or has run `unknown_after_ms` or longer
    (None: only a checkpoint counts), and `none` before.

    `failure_kind` must be a name, and a kind the spec declares: a `Worker`
    refuses an app whose `failure_kind` its authority's spec does not
    declare. `unknown_after_ms` is None or a whole number of ms, 0 or more.
    A bad argument is `WORKLOAD_INVALID` naming it.
    """

    def __init__(
        self, *, failure_kind: str = "worker_failure", unknown_after_ms: int | None = None
    ) -> None:
        failure_kind = arguments.name(failure_kind, "failure_kind")
        if unknown_after_ms is not None:
            arguments.whole(unknown_after_ms, "unknown_after_ms", 0)
        self.failure_kind = failure_kind
        self.unknown_after_ms = unknown_after_ms
        self._handlers: dict[str, HandlerSpec] = {}

    def handler(
        self, definition_id: str, *, needs: Iterable[str] = ()
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of `definition_id`.

        `needs` are the capabilities a workload of this definition asks for
        (its `capability_snapshot`), a collection of names such as a tuple
        (a bare string is refused, not split into characters); the worker
        offers their union. `definition_id` must be a name. A bad argument,
        or a definition registered twice, is `WORKLOAD_INVALID` (an
        `InvalidArgument`, also a `ValueError`).
        """
        definition_id = arguments.name(definition_id, "definition_id")
        wanted = tuple(sorted(set(arguments.names(needs, "needs"))))

        def register(function: Handler) -> Handler:
            if definition_id in self._handlers:
                raise errors.bad_argument(
                    "definition_id", f"definition {definition_id!r} already has a handler"
                )
            if not callable(function):
                raise errors.bad_argument("handler", "a handler must be callable")
            self._handlers[definition_id] = HandlerSpec(definition_id, function, wanted)
            return function

        return register

    @property
    def handlers(self) -> Mapping[str, HandlerSpec]:
        """Every registered handler, by definition id."""
        return dict(self._handlers)

    @property
    def definitions(self) -> frozenset[str]:
        """The definition ids the app has a handler for."""
        return frozenset(self._handlers)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The union of what the registered definitions need, sorted."""
        return tuple(sorted({need for spec in self._handlers.values() for need in spec.needs}))

    def get(self, definition_id: str) -> HandlerSpec | None:
        """The handler of `definition_id`, or None."""
        return self._handlers.get(definition_id)


class Job:
    """One attempt of a workload, as its handler sees it.

    Set by the worker: `cancel_requested` once a heartbeat found that an
    operator asked for cancellation (finish early: the worker confirms the
    cancellation whatever the handler then returns or raises), and `lost`
    once the authority refused the lease (stale, expired or timed out: stop,
    nothing the handler returns will be reported). Both are read-only for
    the handler and safe to read from any thread.
    """

    def __init__(
        self,
        *,
        workload_id: str,
        definition_id: str,
        attempt: int,
        fence: Fence,
        input: Any,
        checkpoints: Iterable[Checkpoint],
        record: Callable[[Job, Any, int], Checkpoint],
    ) -> None:
        self.workload_id = workload_id
        self.definition_id = definition_id
        self.attempt = attempt
        self.fence = fence
        self.input = input
        self._checkpoints = [c.state for c in checkpoints]
        self._record = record
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._lost = threading.Event()
        self._checkpointed = False
        self._expires_at = 0

    @property
    def checkpoints(self) -> list[Any]:
        """Every checkpoint state of the workload so far, earlier attempts' too, oldest first."""
        with self._lock:
            return list(self._checkpoints)

    @property
    def cancel_requested(self) -> bool:
        """Whether cancellation was requested (seen on a heartbeat's answer)."""
        return self._cancel.is_set()

    @property
    def lost(self) -> bool:
        """Whether the authority refused this attempt's lease."""
        return self._lost.is_set()

    def checkpoint(self, state: Any) -> Checkpoint:
        """Record `state` as the attempt's next checkpoint, and return it.

        Names its sequence (the workload's checkpoints so far plus one), so
        the runtime repeats it safely when a reply is lost. Raises the
        authority's `WorkloadError` when the attempt is over (`job.lost`
        is then set) or the store stayed unreachable.
        """
        with self._lock:
            sequence = len(self._checkpoints) + 1
        recorded = self._record(self, state, sequence)
        with self._lock:
            self._checkpoints.append(recorded.state)
            self._checkpointed = True
        return recorded

    def _mark_cancel_requested(self) -> None:
        self._cancel.set()

    def _mark_lost(self) -> None:
        self._lost.set()

    def __repr__(self) -> str:
        return f"<Job {self.definition_id} {self.workload_id} attempt {self.attempt}>"
