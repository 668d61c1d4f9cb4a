"""The benchmark's verdicts: each path against the ack loop and against the same broker work."""

from typing import Any

from bench.report import evaluate, queues_table, table


def results(happy: float, retry: float, retry_same: float, p99_ms: float) -> dict[str, Any]:
    tier = {"samples": 1000, "p50_ms": 5.0, "p99_ms": p99_ms, "max_ms": p99_ms}
    raw_tier = {**tier, "p99_ms": 12.5}
    throughput: dict[str, dict[str, float]] = {
        "raw": {"median": 3000, "cpu_us_per_job": 300},
        "raw-retry": {"median": 1200, "cpu_us_per_job": 650, "ratio": 0.4},
        "raw-failure": {"median": 1300, "cpu_us_per_job": 660, "ratio": 0.43},
        "happy": {"median": 2800, "cpu_us_per_job": 320, "ratio": happy, "tracing_off_ratio": 0.93},
        "happy-no-otel": {"median": 3010, "cpu_us_per_job": 310, "ratio": 1.0},
        "happy-warnings": {"median": 3150, "cpu_us_per_job": 290, "ratio": 1.05},
        "retry": {"median": 900, "cpu_us_per_job": 900, "ratio": retry},
        "failure": {"median": 800, "cpu_us_per_job": 950, "ratio": 0.27},
    }
    throughput["retry"]["same_work_ratio"] = retry_same
    throughput["failure"]["same_work_ratio"] = 0.6
    return {
        "queue_types": {
            "quorum": {
                "throughput": throughput,
                "delay": {
                    "load_jobs_per_s": 500,
                    "ricochet": {"100": tier},
                    "raw": {"100": raw_tier},
                },
                "memory": {"jobs": 100, "idle_mb": 50.0, "after_mb": 50.5, "growth_mb": 0.5},
            }
        }
    }


def test_each_path_is_judged_against_both_loops() -> None:
    verdicts = {v["target"]: v for v in evaluate(results(1.02, 0.3, 0.85, 25.0)["queue_types"])}
    assert verdicts["happy path ratio >= 1.0"]["met"]
    assert not verdicts["retry path ratio >= 0.8"]["met"]
    assert verdicts["retry path ratio (same broker work) >= 0.8"]["value"] == 0.85
    assert verdicts["retry path ratio (same broker work) >= 0.8"]["met"]
    assert "happy path ratio (same broker work) >= 1.0" not in verdicts  # its loop is the ack loop
    delay = verdicts["100 ms tier p99 error <= 20 ms"]
    assert (delay["value"], delay["raw_loop"], delay["met"]) == (25.0, 12.5, False)
    assert verdicts["RSS growth < 10 MB"]["met"]


def test_the_table_shows_both_ratios_and_both_delays() -> None:
    text = table(results(0.95, 0.3, 0.85, 25.0))
    assert "| retry path | 900 | 0.30 | 0.85 | 900 |" in text
    assert "| 100 ms tier | +5.0 / +25.0 ms | +5.0 / +12.5 ms |" in text


def test_tracing_installed_but_off_is_judged_against_tracing_absent() -> None:
    """The happy path with opentelemetry importable and no tracer configured is held to the
    happy path with it not importable, and both show in the table."""
    verdicts = {v["target"]: v for v in evaluate(results(0.95, 0.3, 0.85, 25.0)["queue_types"])}
    off = verdicts["happy path, tracing installed but off, ratio to tracing absent >= 0.95"]
    assert (off["value"], off["met"]) == (0.93, False)
    text = table(results(0.95, 0.3, 0.85, 25.0))
    assert "| happy path, opentelemetry absent | 3,010 | 1.00 | 1.00 | 310 |" in text


def test_the_happy_path_at_warning_is_a_row_beside_the_default() -> None:
    """The happy path at the default INFO is judged; the same at WARNING, without its line a
    job, is shown beside it, unjudged."""
    verdicts = evaluate(results(0.95, 0.3, 0.85, 25.0)["queue_types"])
    assert not {v["target"]: v for v in verdicts}["happy path ratio >= 1.0"]["met"]
    assert not [v for v in verdicts if "WARNING" in v["target"]]
    text = table(results(0.95, 0.3, 0.85, 25.0))
    assert "| happy path, WARNING: no line a job | 3,150 | 1.05 | 1.05 | 290 |" in text


def test_the_clients_are_judged_against_the_raw_publish() -> None:
    """The enqueue scenarios, when measured, get a verdict each against 0.9 of the raw publish
    of the same concurrency, and a table."""
    measured = results(0.95, 0.3, 0.85, 25.0)
    measured["queue_types"]["quorum"]["enqueue"] = {
        name: {"median": 1000, "cpu_us_per_job": 100, "ratio": ratio}
        for name, ratio in [
            ("raw-publish", 1.0),
            ("raw-publish-32", 1.0),
            ("raw-publish-from-a-thread", 0.8),
            ("raw-publish-from-32-threads", 0.6),
            ("client", 0.97),
            ("client-32", 0.85),
            ("sync-client", 0.91),
            ("sync-client-32", 0.95),
        ]
    }
    verdicts = {v["target"]: v["met"] for v in evaluate(measured["queue_types"])}
    assert verdicts["Client.enqueue, one at a time, ratio to the raw publish >= 0.9"]
    assert not verdicts["Client.enqueue, 32 tasks, ratio to the raw publish >= 0.9"]
    assert verdicts["SyncClient.enqueue, one thread, ratio to the raw publish >= 0.9"]
    assert not any("32 threads" in target for target in verdicts)  # shown, not judged
    assert "| SyncClient.enqueue, 32 threads | 1,000 | 0.95 | 100 |" in table(measured)
    assert "| Client.enqueue, 32 tasks | 1,000 | 0.85 | 100 |" in table(measured)


def test_the_queues_table_shows_each_side_per_queue_type() -> None:
    broker = {"queues": 25, "exchanges": 15, "bindings": 20, "consumers": 6}
    side = {"median": 2500, "rss_mb": 60.5, "uss_mb": 50.0}
    runs = {
        "one worker, 5 queues": {**side, "broker": {**broker, "connections": 1, "channels": 8}},
        "5 workers, one queue each": {
            **side,
            "median": 3100,
            "rss_mb": 290.0,
            "uss_mb": 240.0,
            "broker": {**broker, "connections": 5, "channels": 20, "consumers": 10},
        },
    }
    lines = queues_table({"queue_types": {"classic": {"queues": runs}}}).splitlines()
    assert lines[2:] == [
        "| one worker, 5 queues | classic | 2,500 | 60.5 MB | 50.0 MB | 25, 15, 20 | 1, 8, 6 |",
        "| 5 workers, one queue each | classic | 3,100 | 290.0 MB | 240.0 MB | 25, 15, 20 "
        "| 5, 20, 10 |",
    ]
