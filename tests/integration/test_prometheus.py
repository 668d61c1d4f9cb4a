"""A real Prometheus scraping a real worker and monitor, with the repository's rules."""

import asyncio
from pathlib import Path

from aio_pika.abc import AbstractChannel

from tests.prometheus import Prometheus
from tests.support import free_port, make_settings, publish, ricochet_env, spawn, wait_for

OUTCOMES = {"succeeded": 3, "failed": 2}


async def test_prometheus_sees_counters_move_and_a_rule_fire(
    tmp_path: Path, queue_name: str, channel: AbstractChannel
) -> None:
    """Prometheus scrapes the jobs counted by outcome from a worker and the failed queue's depth
    from a monitor, and RicochetFailedQueueGrowing fires once failed copies arrive."""
    worker_port, monitor_port = free_port(), free_port()
    settings = make_settings(queue_name, alert_interval_s=1, connect_timeout_s=20)
    env = ricochet_env(settings)
    worker = spawn(["worker"], {**env, "RICOCHET_HTTP_PORT": str(worker_port)}, tmp_path / "w.log")
    monitor = spawn(
        ["monitor"], {**env, "RICOCHET_HTTP_PORT": str(monitor_port)}, tmp_path / "m.log"
    )
    targets = {
        "ricochet-worker": [f"127.0.0.1:{worker_port}"],
        "ricochet-monitor": [f"127.0.0.1:{monitor_port}"],
    }
    try:
        with Prometheus(tmp_path, targets) as prom:
            q = f'queue="{queue_name}"'

            def scraped(query: str, expected: float) -> bool:
                return prom.value(query) == expected

            # The empty failed queue is recorded before anything fails, so growth shows.
            await wait_for(
                lambda: scraped(f'ricochet_queue_messages{{{q}, stage="failed"}}', 0),
                30,
                "the failed queue's depth in Prometheus",
            )
            await wait_for(
                lambda: scraped(f'ricochet_ready{{{q}, job="ricochet-worker"}}', 1),
                30,
                "the worker ready in Prometheus",
            )
            assert [a for a in prom.firing() if a.get("queue") == queue_name] == []
            for i in range(OUTCOMES["succeeded"]):
                await publish(channel, queue_name, f'{{"report_id": "ok-{i}"}}', type="report")
            for i in range(OUTCOMES["failed"]):
                body = f'{{"report_id": "bad-{i}", "fail": "permanent"}}'
                await publish(channel, queue_name, body, type="report")

            for outcome, n in OUTCOMES.items():

                def counted(o: str = outcome, n: int = n) -> bool:
                    return scraped(f'ricochet_jobs_total{{{q}, outcome="{o}"}}', n)

                await wait_for(
                    counted,
                    30,
                    f"{n} {outcome} jobs counted in Prometheus",
                )

            def growing() -> bool:
                return any(
                    alert["alertname"] == "RicochetFailedQueueGrowing"
                    and alert["queue"] == queue_name
                    for alert in prom.firing()
                )

            await wait_for(growing, 30, "RicochetFailedQueueGrowing to fire")
            age = prom.value(f"time() - ricochet_failed_oldest_timestamp_seconds{{{q}}}")
            assert age is not None
            assert 0 <= age < 60
    finally:
        for process in (worker, monitor):
            process.terminate()
        for process in (worker, monitor):
            await asyncio.to_thread(process.wait, 30)
