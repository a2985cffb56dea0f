"""The plain data of an exploration: its bounds (`Universe`) and its states (`CheckState`).

A state is plain hashable data: the instant, each workload's committed
document (its JSON text), what each worker holds (its current fence and the
last fence it lost), and the racing writer's pending write. The transition
system over these states is `universe.py`; what of a state decides its future
is `abstraction.py`. Both read these types, so they live here, apart from
either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workwarden.statemachine import errors
from workwarden.statemachine.spec import Spec

__all__ = ["CheckState", "Pending", "Universe", "WorkerHold"]


@dataclass(frozen=True)
class Universe:
    """The bounds of an exploration. Every field but `workloads` can be set in the `[check]` table.

    `moves` bounds the operations a spec adds with the effect `move` (a pause, a
    resume, an approval): how many of them each workload may take along one
    path. A workload resting in a `held` state whose budget is spent is cut
    off by the bound, as a state past the time horizon is.
    """

    workers: int = 2
    max_attempts: int = 2
    lease_ms: int = 10
    horizon_ms: int = 60
    rearms: int = 1
    operator_actions: int = 1
    moves: int = 1
    crashes: int = 0
    racer_prepares: int = 1
    checkpoints_per_attempt: int = 2
    initial_delay_ms: int = 3
    max_delay_ms: int = 6
    dependent: bool = True
    #: How many workloads a dependent universe admits, each depending on the one
    #: before (a chain); set by `workwarden check --workloads`, not the `[check]` table.
    workloads: int = 2
    racer: bool = False
    #: Workers that lost a claim call again through the old fence: a completion and a
    #: heartbeat while another claim holds the workload, and a cancellation confirmation
    #: once their attempt ended cancelled (the repeat after a lost reply).
    stale_workers: bool = True
    #: Claims and the operator's calls carry request ids, and are sent again as after a
    #: lost reply: a worker holding a claim sends it again (with its request id, and with
    #: another), and the operator sends its last request again (as the same call, and as
    #: another call under the same request id).
    request_ids: bool = False
    first_timeouts: dict[str, int] = field(default_factory=lambda: {"claim_ms": 8})
    second_timeouts: dict[str, int] = field(default_factory=lambda: {"queue_ms": 8, "claim_ms": 4})
    second_retry_on: tuple[str, ...] = ("transient_connection",)
    first_retry_on: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The universe as JSON-ready data (for reports and traces)."""
        return {
            "workers": self.workers,
            "max_attempts": self.max_attempts,
            "lease_ms": self.lease_ms,
            "horizon_ms": self.horizon_ms,
            "rearms": self.rearms,
            "operator_actions": self.operator_actions,
            "moves": self.moves,
            "crashes": self.crashes,
            "racer_prepares": self.racer_prepares,
            "checkpoints_per_attempt": self.checkpoints_per_attempt,
            "initial_delay_ms": self.initial_delay_ms,
            "max_delay_ms": self.max_delay_ms,
            "dependent": self.dependent,
            "workloads": self.workloads,
            "racer": self.racer,
            "stale_workers": self.stale_workers,
            "request_ids": self.request_ids,
            "first_timeouts": dict(self.first_timeouts),
            "second_timeouts": dict(self.second_timeouts),
            "second_retry_on": list(self.second_retry_on),
            "first_retry_on": None if self.first_retry_on is None else list(self.first_retry_on),
        }

    @classmethod
    def from_spec(cls, spec: Spec, **overrides: Any) -> Universe:
        """The universe of the spec's `[check]` table, with `overrides` applied."""
        settings = {k: v for k, v in spec.data.check.model_dump().items() if v is not None}
        settings.update(overrides)
        return cls.from_dict(settings)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Universe:
        """A universe from `to_dict` output (unknown keys are an error)."""
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise errors.WorkloadError(
                errors.INVALID, f"unknown universe settings: {sorted(unknown)}"
            )
        values = dict(data)
        for name in ("second_retry_on", "first_retry_on"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values)


WorkerHold = tuple[tuple[int, str, str, int] | None, tuple[int, str, str, int] | None]
"""What a worker holds: (slot, claim id, worker id, token) of its fence, and of the last it lost."""


@dataclass(frozen=True, slots=True)
class Pending:
    """The racing writer's prepared write: decided on a version, not yet committed."""

    slot: int
    document: str | None
    refusal: str | None
    stale: bool = False

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its fields, as `CheckState` is.
        return (Pending, (self.slot, self.document, self.refusal, self.stale))


@dataclass(frozen=True, slots=True)
class CheckState:
    """One state of the universe."""

    now: int
    docs: tuple[str | None, ...]
    workers: tuple[WorkerHold, ...]
    pending: Pending | None = None
    crashes: int = 0
    prepares: int = 0

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its fields (a checker's helper processes are sent many): a frozen
        # dataclass with slots is otherwise restored field by field, much slower.
        return (
            CheckState,
            (self.now, self.docs, self.workers, self.pending, self.crashes, self.prepares),
        )
