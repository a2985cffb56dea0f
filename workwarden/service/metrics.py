"""Prometheus metrics of the warden: what the store holds, and what was called through it.

`registry(store=...)` gives a fresh `CollectorRegistry` and the `Metrics`
that count into it; the service exposes it at `/metrics`, and any other
process (the worker runtime) can expose its own the same way
(`prometheus_client.generate_latest(metrics.registry)`).

- `workwarden_workloads` (gauge; tenant, application, state): workloads in
  the store, counted at each scrape (every state of the spec, 0 when empty,
  for each tenant and application held);
- `workwarden_claims_total`: claims granted (`claim`, `claim_next`);
- `workwarden_completions_total`: results recorded (not their replays);
- `workwarden_failures_total` (kind): failure reports recorded;
- `workwarden_recoveries_total`: workloads a recovery sweep recovered;
- `workwarden_deadline_timeouts_total`: workloads timed out by a fallen
  deadline (by the sweep, or at a worker call refused `WORKLOAD_TIMED_OUT`);
- `workwarden_conflicts_total`: calls refused `WORKLOAD_CONFLICT`;
- `workwarden_admission_to_start_seconds` (histogram): admission to start;
- `workwarden_claim_to_complete_seconds` (histogram): claim to result.

The counters count calls made through this process since it started; the
gauge reads the whole store (`Store.scan`) at every scrape.

A worker or sweeper process (`workwarden worker|sweeper --metrics-port N`)
serves `runtime_registry(counts)` instead: one counter
`workwarden_runtime_<name>_total` for each of `RUNTIME_COUNTS` (claimed,
completed, retried, failed, lost, cancelled, recovered, timed_out,
store_error), read from the runtime's `counts` at each scrape.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from workwarden.storage.base import Store

__all__ = [
    "DURATION_BUCKETS",
    "RUNTIME_COUNTS",
    "Metrics",
    "RuntimeCollector",
    "StoreCollector",
    "registry",
    "runtime_registry",
    "serve_runtime_metrics",
]

#: Histogram buckets, in seconds: from 5 ms to an hour.
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)

#: The runtime's counts served as counters by a worker or sweeper process.
RUNTIME_COUNTS = (
    "claimed",
    "completed",
    "retried",
    "failed",
    "lost",
    "cancelled",
    "recovered",
    "timed_out",
    "store_error",
)


class StoreCollector(Collector):
    """The `workwarden_workloads` gauge, counted from the store at each scrape.

    With `states` (the spec's), every tenant and application the store holds has a
    sample for each of them, 0 when none of its workloads is in it: a series that
    drops to zero reads 0, rather than vanishing from the scrape.
    """

    def __init__(self, store: Callable[[], Store], states: Sequence[str] = ()) -> None:
        self._store = store
        self._states = tuple(states)

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "workwarden_workloads",
            "Workloads in the store, by tenant, application and state.",
            labels=["tenant", "application", "state"],
        )

    def describe(self) -> Iterable[Metric]:
        """The gauge, without samples (so registering it reads nothing)."""
        yield self._family()

    def collect(self) -> Iterable[Metric]:
        """Count the store's workloads by tenant, application and state."""
        gauge = self._family()
        counts = Tally(
            (doc.index.tenant, doc.index.application, doc.index.state)
            for doc in self._store().scan()
        )
        for scope in {(tenant, application) for tenant, application, _ in counts}:
            for state in self._states:
                counts.setdefault((*scope, state), 0)
        for labels, count in sorted(counts.items()):
            gauge.add_metric(list(labels), count)
        yield gauge


@dataclass
class Metrics:
    """The counters and histograms of calls, registered in `registry`."""

    registry: CollectorRegistry
    claims: Counter
    completions: Counter
    failures: Counter
    recoveries: Counter
    deadline_timeouts: Counter
    conflicts: Counter
    admission_to_start: Histogram
    claim_to_complete: Histogram


def registry(store: Callable[[], Store] | None = None, states: Sequence[str] = ()) -> Metrics:
    """A new registry with every metric of the warden; with `store`, the workload gauge too.

    `store` is called at each scrape (so a service whose store is replaced
    counts the new one); `states` (the spec's) are the states the gauge
    gives a sample of, 0 or more, for each tenant and application it holds.
    """
    reg = CollectorRegistry(auto_describe=True)
    if store is not None:
        reg.register(StoreCollector(store, states))
    return Metrics(
        registry=reg,
        claims=Counter("workwarden_claims", "Claims granted.", registry=reg),
        completions=Counter("workwarden_completions", "Results recorded.", registry=reg),
        failures=Counter(
            "workwarden_failures", "Failure reports recorded, by kind.", ["kind"], registry=reg
        ),
        recoveries=Counter(
            "workwarden_recoveries", "Workloads recovered after their lease expired.", registry=reg
        ),
        deadline_timeouts=Counter(
            "workwarden_deadline_timeouts",
            "Workloads timed out because a deadline fell.",
            registry=reg,
        ),
        conflicts=Counter(
            "workwarden_conflicts", "Calls refused with WORKLOAD_CONFLICT.", registry=reg
        ),
        admission_to_start=Histogram(
            "workwarden_admission_to_start_seconds",
            "Time from admission to the start of an attempt.",
            buckets=DURATION_BUCKETS,
            registry=reg,
        ),
        claim_to_complete=Histogram(
            "workwarden_claim_to_complete_seconds",
            "Time from the claim to the recorded result.",
            buckets=DURATION_BUCKETS,
            registry=reg,
        ),
    )


class RuntimeCollector(Collector):
    """`workwarden_runtime_<name>_total` for each of `RUNTIME_COUNTS`, read at each scrape."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        """One counter per count (0 for a count not reached yet)."""
        counts = dict(self._counts())
        for name in RUNTIME_COUNTS:
            yield CounterMetricFamily(
                f"workwarden_runtime_{name}",
                f"Runtime events {name} in this process since it started.",
                value=counts.get(name, 0),
            )


def runtime_registry(counts: Callable[[], Mapping[str, int]]) -> CollectorRegistry:
    """A new registry of the runtime's counters; `counts` is called at each scrape."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(RuntimeCollector(counts))
    return reg


def serve_runtime_metrics(
    port: int, counts: Callable[[], Mapping[str, int]], host: str = "0.0.0.0"
) -> CollectorRegistry:
    """Serve `runtime_registry(counts)` on `host:port` (a daemon thread); the registry."""
    reg = runtime_registry(counts)
    start_http_server(port, addr=host, registry=reg)
    return reg
