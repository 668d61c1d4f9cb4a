"""Prometheus metrics of one process (a registry of its own, so several can live in a test)."""

import math
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ricochet.delivery.events import Settled
from ricochet.delivery.retry import Action, Outcome


class Metrics:
    """The counters ricochet exports on /metrics."""

    def __init__(self, queue: str) -> None:
        self.registry = CollectorRegistry()
        self.queue = queue
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
        self._attempt_children: dict[tuple[str, ...], Counter] = {}
        self.ready = Gauge(
            "ricochet_ready",
            "1 while /readyz answers 200 (connected and consuming), else 0.",
            ["queue"],
            registry=self.registry,
        )
        self.worker_consuming = Gauge(
            "ricochet_worker_consuming",
            "1 while the worker takes jobs from its queue; 0 while it connects, runs the jobs "
            "that came back redelivered, subscribes again after a broker cancel, drains or is "
            "paused.",
            ["queue"],
            registry=self.registry,
        )
        self.worker_recovering = Gauge(
            "ricochet_worker_recovering",
            "1 while the worker runs the jobs that came back redelivered after a (re)connect, "
            "before it subscribes; else 0.",
            ["queue"],
            registry=self.registry,
        )
        self.worker_paused = Gauge(
            "ricochet_worker_paused",
            "1 while the worker pauses on a failure spike (RICOCHET_PAUSE_*), else 0.",
            ["queue"],
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

    def count_attempt(self, attempt: int, outcome: str) -> None:
        """One handler attempt settled: succeeded, retried or failed."""
        _child(self._attempt_children, self.attempts, self.queue, str(attempt), outcome).inc()

    def ready_when(self, ready: Callable[[], bool]) -> None:
        """Export ready() as ricochet_ready, read at every scrape."""
        self.ready.labels(self.queue).set_function(lambda: float(ready()))

    def worker_when(
        self,
        consuming: Callable[[], bool],
        paused: Callable[[], bool],
        recovering: Callable[[], bool],
    ) -> None:
        """Export the worker's state (read at every scrape) as ricochet_worker_*."""
        self.worker_consuming.labels(self.queue).set_function(lambda: float(consuming()))
        self.worker_paused.labels(self.queue).set_function(lambda: float(paused()))
        self.worker_recovering.labels(self.queue).set_function(lambda: float(recovering()))

    def observe_queue(self, role: str, messages: int | None, consumers: int | None) -> None:
        """One queue as the monitor read it (role as `ricochet status` names it; None: missing)."""
        stage = role.replace(" ", "_")  # "tier 2" -> "tier_2"
        self.queue_messages.labels(self.queue, stage).set(_or_nan(messages))
        self.queue_consumers.labels(self.queue, stage).set(_or_nan(consumers))

    def observe_failed_oldest(self, failed_at: float | None) -> None:
        """When the oldest failed copy failed (Unix time), None while the failed queue is empty."""
        self.failed_oldest.labels(self.queue).set(_or_nan(failed_at))


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

    def attempted(self, outcome: Outcome, seconds: float) -> None:
        """A handler call ended: how long it took."""
        self.duration.observe(seconds)

    def settled(self, event: Settled) -> None:
        """A delivery settled: what became of its attempt, counted (a job cleaned of a forged
        header, or sent to wait for its run-at, made no attempt)."""
        decision, attempt = event.decision, event.facts.attempt
        action = decision.action
        if action is Action.ACK:
            self._succeeded.inc()
            self._metrics.count_attempt(attempt, "succeeded")
        elif action is Action.RETRY or action is Action.RETRY_BY_COPY:
            # A job sent to tier k failed on its attempt k.
            self._retried.inc()
            _child(self._tiers, self._metrics.retries, self._queue, str(decision.tier)).inc()
            self._metrics.count_attempt(attempt, "retried")
        elif action is Action.DELAY and event.failure is not None:  # a RetryLater
            self._retried.inc()
            self._metrics.count_attempt(attempt, "retried")
        elif action is Action.FAIL:
            self._failed.inc()
            _child(self._kinds, self._metrics.failed, self._queue, str(decision.kind)).inc()
            self._metrics.count_attempt(attempt, "failed")
        elif action is Action.CANCEL:
            self._cancelled.inc()


def _child(children: dict[tuple[str, ...], Counter], metric: Counter, *labels: str) -> Counter:
    """metric.labels(*labels), kept in children (this metric's own cache) after its first use:
    labels() takes a lock and a lookup on every call."""
    child = children.get(labels)
    if child is None:
        child = children[labels] = metric.labels(*labels)
    return child


def _or_nan(value: float | None) -> float:
    """Prometheus' 'no value': comparisons with NaN are false, so no rule fires on it."""
    return math.nan if value is None else value
