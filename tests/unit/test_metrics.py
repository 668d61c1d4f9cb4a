"""The metrics a dashboard reads: names, labels and the values a reading gives them."""

import math

from ricochet.observe.metrics import Metrics, QueueMetrics


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value: float | None = metrics.registry.get_sample_value(name, {"queue": "q", **labels})
    return value


def test_queue_stages_are_label_values() -> None:
    """Each queue's role in `ricochet status` becomes a stage label without spaces."""
    metrics = Metrics("q")
    metrics.observe_queue("q", "main", 4, 2)
    metrics.observe_queue("q", "tier 2", 7, 0)
    metrics.observe_queue("q", "failed events", 1, 1)
    assert sample(metrics, "ricochet_queue_messages", stage="main") == 4
    assert sample(metrics, "ricochet_queue_consumers", stage="main") == 2
    assert sample(metrics, "ricochet_queue_messages", stage="tier_2") == 7
    assert sample(metrics, "ricochet_queue_consumers", stage="failed_events") == 1


def test_unknown_values_are_nan() -> None:
    """A missing queue, or an empty failed queue's oldest copy, reads NaN, never 0."""
    metrics = Metrics("q")
    metrics.observe_queue("q", "failed", None, None)
    metrics.observe_failed_oldest("q", None)
    assert math.isnan(sample(metrics, "ricochet_queue_messages", stage="failed") or 0)
    assert math.isnan(sample(metrics, "ricochet_failed_oldest_timestamp_seconds") or 0)
    metrics.observe_failed_oldest("q", 1700000000.0)
    assert sample(metrics, "ricochet_failed_oldest_timestamp_seconds") == 1700000000.0


def test_ready_is_read_at_each_scrape() -> None:
    """ricochet_ready follows the readiness callable, as /readyz does."""
    metrics = Metrics("q")
    state = {"ready": False}
    metrics.ready_when(lambda: state["ready"])
    assert sample(metrics, "ricochet_ready") == 0
    state["ready"] = True
    assert sample(metrics, "ricochet_ready") == 1


def test_worker_state_is_read_at_each_scrape() -> None:
    """ricochet_worker_consuming, ricochet_worker_paused and ricochet_worker_recovering follow
    the worker's state."""
    metrics = Metrics("q")
    state = {"consuming": True, "paused": False, "recovering": False}
    metrics.worker_when(
        "q", lambda: state["consuming"], lambda: state["paused"], lambda: state["recovering"]
    )
    names = ["ricochet_worker_consuming", "ricochet_worker_paused", "ricochet_worker_recovering"]
    assert [sample(metrics, name) for name in names] == [1, 0, 0]
    state.update(consuming=False, paused=True)
    assert [sample(metrics, name) for name in names] == [0, 1, 0]
    state.update(paused=False, recovering=True)
    assert [sample(metrics, name) for name in names] == [0, 0, 1]


def test_attempts_count_by_number_and_outcome() -> None:
    """ricochet_attempts_total counts each settled attempt under its number and outcome."""
    metrics = Metrics("q")
    counts = QueueMetrics(metrics, "q")
    counts.count_attempt(1, "retried")
    counts.count_attempt(2, "succeeded")
    counts.count_attempt(2, "succeeded")
    assert sample(metrics, "ricochet_attempts_total", attempt="1", outcome="retried") == 1
    assert sample(metrics, "ricochet_attempts_total", attempt="2", outcome="succeeded") == 2
    assert sample(metrics, "ricochet_attempts_total", attempt="1", outcome="succeeded") is None
