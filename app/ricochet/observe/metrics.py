"""Prometheus metrics of one process (a registry of its own, so several can live in a test), and
of a worker's processes together (prometheus_client's multiprocess mode: each worker process
writes its values to files in a folder, which the parent sums at every scrape), labelled by
queue: one process serves every queue of its worker."""

import math
from collections.abc import Callable
from typing import assert_never

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from ricochet.delivery.events import Settled
from ricochet.delivery.retry import (
    Ack,
    Cancel,
    Delay,
    Fail,
    Hold,
    Line,
    Outcome,
    Retry,
    RetryByCopy,
    Sanitize,
)

READY_HELP = "1 while /readyz answers 200 (connected and consuming), else 0."


class Metrics:
    """The counters ricochet exports on /metrics.

    shared: this is one of a parent's worker processes (PROMETHEUS_MULTIPROC_DIR set): the
    parent exports readiness for all of them, and the gauges a single process reads at every
    scrape are written by refresh() instead (a function is not shared across processes). Each
    gauge's multiprocess mode says how the parent combines the values of its live processes (a
    dead one's go with it).
    """

    def __init__(self, *queues: str, shared: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.queues = queues
        self._shared = shared
        # What refresh() writes, each gauge once (a new session's read replaces its gauge's).
        self._reads: dict[Gauge, Callable[[], float]] = {}
        self.jobs = Counter(
            "ricochet_jobs",
            "Jobs handled, by outcome (succeeded, retried, failed, cancelled).",
            ["queue", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "ricochet_job_duration_seconds",
            "Time spent in the handler per attempt.",
            ["queue"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.retries = Counter(
            "ricochet_retries",
            "Jobs sent to a retry tier, by tier.",
            ["queue", "tier"],
            registry=self.registry,
        )
        self.failed = Counter(
            "ricochet_failed_copies",
            "Failed copies published, by kind (exhausted, permanent, poison).",
            ["queue", "kind"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "ricochet_jobs_in_flight",
            "Jobs being handled now.",
            ["queue"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.alerts = Counter(
            "ricochet_alerts",
            "Alerts delivered to the webhook, by event.",
            ["queue", "event"],
            registry=self.registry,
        )
        self.attempts = Counter(
            "ricochet_attempts",
            "Handler attempts, by attempt number (1 is the first delivery) and outcome.",
            ["queue", "attempt", "outcome"],
            registry=self.registry,
        )
        self.ready = Gauge("ricochet_ready", READY_HELP, ["queue"], registry=self.registry)
        self.worker_consuming = Gauge(
            "ricochet_worker_consuming",
            "1 while the worker takes jobs from its queue; 0 while it connects, runs the jobs "
            "that came back redelivered, subscribes again after a broker cancel, drains or is "
            "paused.",
            ["queue"],
            registry=self.registry,
            multiprocess_mode="livemin",  # 1 while every process takes jobs
        )
        self.worker_recovering = Gauge(
            "ricochet_worker_recovering",
            "1 while the worker runs the jobs that came back redelivered after a (re)connect, "
            "before it subscribes; else 0.",
            ["queue"],
            registry=self.registry,
            multiprocess_mode="livemax",  # 1 while any process does
        )
        self.worker_paused = Gauge(
            "ricochet_worker_paused",
            "1 while the worker pauses on a failure spike (RICOCHET_PAUSE_*), else 0.",
            ["queue"],
            registry=self.registry,
            multiprocess_mode="livemax",  # 1 while any process does
        )
        self.key_lanes_busy = Gauge(
            "ricochet_key_lanes_busy",
            "Key lanes whose job runs now (SPEC 28): one job at a time per lane.",
            ["queue"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.rate_limited = Gauge(
            "ricochet_rate_limited_jobs",
            "Jobs of a rate-limited type waiting for a token, as the leader of the queue's limits "
            "reads them (SPEC 28).",
            ["queue", "type"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.rate_limit = Gauge(
            "ricochet_rate_limit_per_second",
            "The rate limit the leader of the queue's limits applies to a type (the lowest any "
            "worker announces), in jobs per second.",
            ["queue", "type"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.schedules_leading = Gauge(
            "ricochet_schedules_leading",
            "1 while this process leads the schedules of the queue (router.schedule), else 0.",
            ["queue"],
            registry=self.registry,
            multiprocess_mode="livemax",  # 1 while a live process leads
        )
        self.occurrences = Counter(
            "ricochet_schedule_occurrences",
            "Occurrences of recurring jobs this process enqueued, by schedule.",
            ["queue", "schedule"],
            registry=self.registry,
        )
        self.relaunched = Counter(
            "ricochet_relaunched",
            "Failed copies the monitor relaunched on its timer (RICOCHET_RELAUNCH_*).",
            ["queue"],
            registry=self.registry,
        )
        self.journal_entries = Counter(
            "ricochet_journal_entries",
            "Entries this process wrote to the journal (ricochet.journal), confirmed.",
            registry=self.registry,
        )
        self.journal_dropped = Counter(
            "ricochet_journal_dropped",
            "Entries this process could not write to the journal (never a job's failure).",
            registry=self.registry,
        )
        self.queue_messages = Gauge(
            "ricochet_queue_messages",
            "Messages ready in each queue of the topology, by stage (main, tier_1.., failed, "
            "failed_events), read by the monitor every RICOCHET_ALERT_INTERVAL_S.",
            ["queue", "stage"],
            registry=self.registry,
        )
        self.queue_consumers = Gauge(
            "ricochet_queue_consumers",
            "Consumers of each queue of the topology, by stage, read by the monitor.",
            ["queue", "stage"],
            registry=self.registry,
        )
        self.failed_oldest = Gauge(
            "ricochet_failed_oldest_timestamp_seconds",
            "When the oldest copy in the failed queue failed (Unix time; NaN while it is empty), "
            "as far as the monitor saw it fail (see docs/observability.md).",
            ["queue"],
            registry=self.registry,
        )

    def ready_when(self, ready: Callable[[], bool]) -> None:
        """Export ready() as ricochet_ready of every queue, read at every scrape (by the parent
        for a shared process's: ready when every process is)."""
        if not self._shared:
            for queue in self.queues:
                self.ready.labels(queue).set_function(_as_float(ready))

    def journal_counted(self, written: int, dropped: int) -> None:
        """Entries written to the journal and dropped, since the last count."""
        self.journal_entries.inc(written)
        self.journal_dropped.inc(dropped)

    def worker_when(
        self,
        queue: str,
        consuming: Callable[[], bool],
        paused: Callable[[], bool],
        recovering: Callable[[], bool],
    ) -> None:
        """Export the state of the worker's queue (read at every scrape, or by refresh()) as
        ricochet_worker_*."""
        for gauge, read in (
            (self.worker_consuming, consuming),
            (self.worker_paused, paused),
            (self.worker_recovering, recovering),
        ):
            self.read_at_scrape(gauge.labels(queue), _as_float(read))

    def key_lanes_busy_when(self, queue: str, busy: Callable[[], int]) -> None:
        """Export busy() as the queue's ricochet_key_lanes_busy."""
        self.read_at_scrape(self.key_lanes_busy.labels(queue), lambda: float(busy()))

    def read_at_scrape(self, child: Gauge, read: Callable[[], float]) -> None:
        """Export read() as this gauge's value: read at every scrape, or by refresh() in a
        shared process."""
        if self._shared:
            self._reads[child] = read
        else:
            child.set_function(read)

    def refresh(self) -> None:
        """Write what a shared process's gauges read now, for the parent's next scrape."""
        for child, read in self._reads.items():
            child.set(read())

    def observe_queue(
        self, queue: str, role: str, messages: int | None, consumers: int | None
    ) -> None:
        """One object of queue's topology as the monitor read it (role as `ricochet status`
        names it; None: missing)."""
        stage = role.replace(" ", "_")  # "tier 2" -> "tier_2"
        self.queue_messages.labels(queue, stage).set(_or_nan(messages))
        self.queue_consumers.labels(queue, stage).set(_or_nan(consumers))

    def observe_failed_oldest(self, queue: str, failed_at: float | None) -> None:
        """When the oldest copy in queue's failed queue failed (Unix time), None while it is
        empty."""
        self.failed_oldest.labels(queue).set(_or_nan(failed_at))


def processes_registry(
    queues: tuple[str, ...], folder: str, ready: Callable[[], bool], alive: Callable[[], int]
) -> tuple[CollectorRegistry, Counter]:
    """The parent's registry: every worker process's metrics summed from their folder, its own
    readiness (every process consuming), the processes alive, and a counter of restarts."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=folder)  # type: ignore[no-untyped-call]
    ready_gauge = Gauge("ricochet_ready", READY_HELP, ["queue"], registry=registry)
    for queue in queues:
        ready_gauge.labels(queue).set_function(_as_float(ready))
    Gauge(
        "ricochet_worker_processes",
        "Worker processes running now (RICOCHET_PROCESSES > 1).",
        registry=registry,
    ).set_function(alive)
    restarts = Counter(
        "ricochet_worker_process_restarts",
        "Worker processes started again after one died (RICOCHET_PROCESSES > 1).",
        registry=registry,
    )
    return registry, restarts


class QueueMetrics:
    """The job metrics of one queue, kept as an observer of its worker's handler calls and
    settlements (ricochet.delivery.events); resolved once: labels() costs a lock and a lookup a
    call."""

    def __init__(self, metrics: Metrics, queue: str) -> None:
        self._metrics = metrics
        self._queue = queue
        self.in_flight = metrics.in_flight.labels(queue)
        self.duration = metrics.duration.labels(queue)
        self._succeeded = metrics.jobs.labels(queue, "succeeded")
        self._retried = metrics.jobs.labels(queue, "retried")
        self._failed = metrics.jobs.labels(queue, "failed")
        self._cancelled = metrics.jobs.labels(queue, "cancelled")
        # Children made on first use, one cache per metric: the retries by tier, the failures by
        # kind.
        self._tiers: dict[tuple[str, ...], Counter] = {}
        self._kinds: dict[tuple[str, ...], Counter] = {}
        self._attempts: dict[tuple[str, ...], Counter] = {}

    def in_flight_when(self, running: Callable[[], int]) -> None:
        """Export running() as the queue's jobs in flight."""
        self._metrics.read_at_scrape(self.in_flight, lambda: float(running()))

    def count_attempt(self, attempt: int, outcome: str) -> None:
        """One handler attempt settled: succeeded, retried or failed."""
        _child(self._attempts, self._metrics.attempts, self._queue, str(attempt), outcome).inc()

    def attempted(self, outcome: Outcome, seconds: float) -> None:
        """A handler call ended: how long it took."""
        self.duration.observe(seconds)

    def settled(self, event: Settled) -> None:
        """A delivery settled: what became of its attempt, counted (a job cleaned of a forged
        header, or sent to wait for its run-at, made no attempt)."""
        attempt = event.facts.attempt
        match event.decision:
            case Ack():
                self._succeeded.inc()
                self.count_attempt(attempt, "succeeded")
            case Retry(tier) | RetryByCopy(tier):
                # A job sent to tier k failed on its attempt k.
                self._retried.inc()
                _child(self._tiers, self._metrics.retries, self._queue, str(tier)).inc()
                self.count_attempt(attempt, "retried")
            case Delay():
                if event.failure is not None:  # a RetryLater, not a schedule
                    self._retried.inc()
                    self.count_attempt(attempt, "retried")
            case Fail(kind):
                self._failed.inc()
                _child(self._kinds, self._metrics.failed, self._queue, str(kind)).inc()
                self.count_attempt(attempt, "failed")
            case Cancel():
                self._cancelled.inc()
            case Sanitize() | Line() | Hold():
                pass
            case _:
                assert_never(event.decision)


def _child(children: dict[tuple[str, ...], Counter], metric: Counter, *labels: str) -> Counter:
    """metric.labels(*labels), kept in children (this metric's own cache) after its first use:
    labels() takes a lock and a lookup on every call."""
    child = children.get(labels)
    if child is None:
        child = children[labels] = metric.labels(*labels)
    return child


def _as_float(read: Callable[[], bool]) -> Callable[[], float]:
    return lambda: float(read())


def _or_nan(value: float | None) -> float:
    """Prometheus' 'no value': comparisons with NaN are false, so no rule fires on it."""
    return math.nan if value is None else value
