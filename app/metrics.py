"""Prometheus metrics of one process (a registry of its own, so several can live in a test)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """The counters ricochet exports on /metrics."""

    def __init__(self, queue: str) -> None:
        self.registry = CollectorRegistry()
        self.queue = queue
        self.jobs = Counter(
            "ricochet_jobs",
            "Jobs handled, by outcome (succeeded, retried, failed).",
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
