"""Every shipped alert rule, seen firing in a real Prometheus that scrapes real ricochet processes.

One Prometheus serves the module. It loads config/prometheus/rules.yml with each rule's `for`
cut to zero and the few constants in STAND_INS swapped for ones a test can wait out, so the
expressions under test are the shipped ones. Each test starts a worker, a monitor or both as
processes on its own queue, brings about the situation a rule names, and reads the alerts from
Prometheus's HTTP API: the rule fires with the labels an operator would see, and stays quiet
while the situation is absent.
"""

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.settings import Settings

from tests.prometheus import CONFIG_DIR, Prometheus
from tests.support import free_port, make_settings, publish, ricochet_env, spawn, wait_for

WORKER, MONITOR = "ricochet-worker", "ricochet-monitor"
# What each rule is evaluated with besides `for: 0s`: a text of its shipped expression, and the
# stand-in a test can wait out. Every shipped rule is listed: a new one needs its line here and
# a test below that sees it fire.
STAND_INS: dict[str, dict[str, str]] = {
    # delta() extrapolates over the samples it has: growth a few seconds old shows in 15m.
    "RicochetFailedQueueGrowing": {},
    # rate() divides by the whole window: seconds of attempts over 5m read as a trickle below
    # the 0.1 attempts/s floor.
    "RicochetRetrySpike": {"[5m]": "[10s]"},
    "RicochetWorkerNotConsuming": {},
    "RicochetWorkerPaused": {},
    # A day: 3 seconds.
    "RicochetFailedCopyOld": {"> 86400": "> 3"},
    "RicochetNoWorker": {},
    "RicochetMonitorDown": {},
}
SCRAPED_TIMEOUT_S = 30


@dataclass(frozen=True)
class Scraped:
    """A ricochet process that Prometheus scrapes as `target` (its alerts' instance label)."""

    process: "subprocess.Popen[str]"
    target: str

    async def stop(self) -> None:
        """SIGTERM, and wait for the exit (a second SIGTERM cuts a drain short)."""
        self.process.terminate()
        await asyncio.to_thread(self.process.wait, 30)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """One Prometheus for every test here, scraping what each test starts."""
    directory = tmp_path_factory.mktemp("prometheus")
    with Prometheus(directory, {WORKER: [], MONITOR: []}, STAND_INS) as prometheus:
        yield prometheus


@asynccontextmanager
async def scraped(
    prom: Prometheus, role: str, settings: Settings, logs: Path
) -> AsyncIterator[Scraped]:
    """`ricochet ROLE` as a process, scraped by prom under the stack's job name for it, once
    Prometheus has seen it ready (connected; a worker consuming, its queue declared)."""
    port, log = free_port(), logs / f"{role}.log"
    env = {**ricochet_env(settings), "RICOCHET_HTTP_PORT": str(port)}
    service = Scraped(spawn([role], env, log), f"127.0.0.1:{port}")

    def ready() -> bool:
        assert service.process.poll() is None, f"the {role} exited:\n{log.read_text()}"
        return prom.value(f'ricochet_ready{{instance="{service.target}"}}') == 1

    try:
        with prom.scraping(f"ricochet-{role}", service.target):
            await wait_for(ready, SCRAPED_TIMEOUT_S, f"the {role} ready in Prometheus")
            yield service
    finally:
        await service.stop()


async def reads(prom: Prometheus, query: str, expected: float, what: str) -> None:
    """Wait until the query's one series has the expected value in Prometheus."""
    await wait_for(lambda: prom.value(query) == expected, SCRAPED_TIMEOUT_S, what)


def raised(prom: Prometheus, alertname: str, **labels: str) -> list[dict[str, Any]]:
    """The alerts of that rule, pending or firing, whose labels include these."""
    return [
        alert
        for alert in prom.alerts()
        if alert["labels"]["alertname"] == alertname and labels.items() <= alert["labels"].items()
    ]


async def quiet(prom: Prometheus, *alertnames: str, **labels: str) -> None:
    """Once the rules have been evaluated on what Prometheus holds now, none of these rules is
    raised for an alert with these labels."""
    now = time.time()
    await wait_for(lambda: prom.evaluated_since(now), 10, "the rules to be evaluated")
    for alertname in alertnames:
        assert raised(prom, alertname, **labels) == [], alertname


async def fires(prom: Prometheus, alertname: str, *, since: float = 0, **labels: str) -> None:
    """Wait until the rule fires an alert with exactly these labels (and its name), raised
    after the Unix time since."""
    expected = {"alertname": alertname, **labels}

    def firing() -> bool:
        return any(
            alert["state"] == "firing"
            and alert["labels"] == expected
            and datetime.fromisoformat(alert["activeAt"]).timestamp() > since
            for alert in prom.alerts()
        )

    await wait_for(firing, SCRAPED_TIMEOUT_S, f"{alertname} to fire with {labels}")


def test_every_shipped_rule_has_its_stand_ins() -> None:
    """STAND_INS names every rule of config/prometheus/rules.yml (and the tests below see each
    one fire), so a rule added there is not left out here."""
    groups = yaml.safe_load((CONFIG_DIR / "rules.yml").read_text())["groups"]
    assert {rule["alert"] for group in groups for rule in group["rules"]} == set(STAND_INS)


async def test_permanent_failures_fire_failed_queue_growing_then_failed_copy_old(
    prom: Prometheus, tmp_path: Path, queue_name: str, channel: AbstractChannel
) -> None:
    """Prometheus sees a worker count jobs by outcome and a monitor read the failed queue: with
    the failed queue empty neither rule is raised; once jobs fail for good,
    RicochetFailedQueueGrowing fires, then RicochetFailedCopyOld as the oldest copy ages."""
    settings = make_settings(queue_name, alert_interval_s=1, connect_timeout_s=20)
    q = f'queue="{queue_name}"'
    async with (
        scraped(prom, "worker", settings, tmp_path),
        scraped(prom, "monitor", settings, tmp_path) as monitor,
    ):
        await reads(
            prom, f'ricochet_queue_messages{{{q}, stage="failed"}}', 0, "an empty failed queue"
        )
        await quiet(prom, "RicochetFailedQueueGrowing", "RicochetFailedCopyOld", queue=queue_name)
        outcomes = {"succeeded": 3, "failed": 2}
        for i in range(outcomes["succeeded"]):
            await publish(channel, queue_name, json.dumps({"report_id": f"ok-{i}"}), type="report")
        for i in range(outcomes["failed"]):
            body = json.dumps({"report_id": f"bad-{i}", "fail": "permanent"})
            await publish(channel, queue_name, body, type="report")
        for outcome, n in outcomes.items():
            query = f'ricochet_jobs_total{{{q}, outcome="{outcome}"}}'
            await reads(prom, query, n, f"{n} {outcome} jobs counted")

        await fires(
            prom,
            "RicochetFailedQueueGrowing",
            severity="warning",
            job=MONITOR,
            instance=monitor.target,
            queue=queue_name,
            stage="failed",
        )
        await fires(
            prom,
            "RicochetFailedCopyOld",
            severity="warning",
            job=MONITOR,
            instance=monitor.target,
            queue=queue_name,
        )


async def test_transient_failures_fire_retry_spike(
    prom: Prometheus, tmp_path: Path, queue_name: str, channel: AbstractChannel
) -> None:
    """Jobs that succeed at once keep RicochetRetrySpike quiet; jobs retried three times each
    before they succeed (most attempts retried) fire it for their queue."""
    settings = make_settings(queue_name, max_retries=3)
    q = f'queue="{queue_name}"'
    async with scraped(prom, "worker", settings, tmp_path):
        for i in range(5):
            await publish(channel, queue_name, json.dumps({"report_id": f"ok-{i}"}), type="report")
        await reads(prom, f'ricochet_jobs_total{{{q}, outcome="succeeded"}}', 5, "5 successes")
        await quiet(prom, "RicochetRetrySpike", queue=queue_name)
        for i in range(10):
            body = json.dumps({"report_id": f"flaky-{i}", "fail_times": 3})
            await publish(channel, queue_name, body, type="report")
        await fires(prom, "RicochetRetrySpike", severity="warning", queue=queue_name)


# Pause once 4 jobs in 10 s ran and half of them failed transiently, for longer than the test.
PAUSE_MIN_JOBS = 4
PAUSING = {
    "pause_failure_ratio": 0.5,
    "pause_min_jobs": PAUSE_MIN_JOBS,
    "pause_window_s": 10,
    "pause_s": 600,
}


async def test_paused_worker_fires_worker_paused_and_not_worker_not_consuming(
    prom: Prometheus, tmp_path: Path, queue_name: str, channel: AbstractChannel
) -> None:
    """A worker that pauses on a failure spike (/readyz 503) fires RicochetWorkerPaused, and
    RicochetWorkerNotConsuming stays quiet for it; neither is raised while it consumes."""
    settings = make_settings(queue_name, **PAUSING)
    async with scraped(prom, "worker", settings, tmp_path) as worker:
        instance = f'instance="{worker.target}"'
        paused, not_consuming = "RicochetWorkerPaused", "RicochetWorkerNotConsuming"
        await quiet(prom, paused, not_consuming, instance=worker.target)
        for i in range(PAUSE_MIN_JOBS):
            body = json.dumps({"report_id": f"down-{i}", "fail": "always"})
            await publish(channel, queue_name, body, type="report")
        await fires(
            prom,
            paused,
            severity="warning",
            job=WORKER,
            instance=worker.target,
            queue=queue_name,
        )
        assert prom.value(f"ricochet_ready{{{instance}}}") == 0
        await quiet(prom, not_consuming, instance=worker.target)


async def test_worker_stuck_draining_fires_worker_not_consuming(
    prom: Prometheus, tmp_path: Path, queue_name: str, channel: AbstractChannel
) -> None:
    """A worker asked to stop while a long job runs stops consuming (/readyz 503) but is still
    scraped while it waits for the job: RicochetWorkerNotConsuming fires for it, and was quiet
    while it consumed."""
    settings = make_settings(queue_name, shutdown_timeout_s=60)
    async with scraped(prom, "worker", settings, tmp_path) as worker:
        instance = f'instance="{worker.target}"'
        await publish(
            channel, queue_name, json.dumps({"report_id": "r", "work_s": 60}), type="report"
        )
        await reads(prom, f"ricochet_jobs_in_flight{{{instance}}}", 1, "the job in flight")
        await quiet(prom, "RicochetWorkerNotConsuming", instance=worker.target)
        worker.process.terminate()  # the first SIGTERM: drain (leaving, the second ends it)
        await fires(
            prom,
            "RicochetWorkerNotConsuming",
            severity="warning",
            job=WORKER,
            instance=worker.target,
            queue=queue_name,
        )
        assert prom.value(f"up{{{instance}}}") == 1


async def test_stopped_worker_fires_no_worker(
    prom: Prometheus, tmp_path: Path, queue_name: str, connection: AbstractConnection
) -> None:
    """While a worker consumes the queue RicochetNoWorker is quiet; once it stops (Prometheus
    finds it down), the monitor reads no consumer on the main queue and the rule fires."""
    settings = make_settings(queue_name, alert_interval_s=1)
    q = f'queue="{queue_name}"'
    async with (
        scraped(prom, "worker", settings, tmp_path) as worker,
        scraped(prom, "monitor", settings, tmp_path) as monitor,
    ):
        consumers = f'ricochet_queue_consumers{{{q}, stage="main"}}'
        await reads(prom, consumers, 1, "the worker consuming")
        await quiet(prom, "RicochetNoWorker", queue=queue_name)
        await worker.stop()
        await reads(prom, f'up{{instance="{worker.target}"}}', 0, "the worker down")
        await fires(
            prom,
            "RicochetNoWorker",
            severity="critical",
            job=MONITOR,
            instance=monitor.target,
            queue=queue_name,
            stage="main",
        )


async def test_stopped_or_unscraped_monitor_fires_monitor_down(
    prom: Prometheus, tmp_path: Path, queue_name: str, connection: AbstractConnection
) -> None:
    """RicochetMonitorDown is quiet while the monitor is scraped, fires for its instance once it
    stops, and fires without an instance once Prometheus scrapes no monitor at all."""
    settings = make_settings(queue_name, alert_interval_s=1)
    async with scraped(prom, "monitor", settings, tmp_path) as monitor:
        await quiet(prom, "RicochetMonitorDown", instance=monitor.target)
        # absent() is false while this monitor is scraped: an alert without an instance raised
        # from now on is about the monitor going away.
        scraped_at = time.time()
        await monitor.stop()
        await fires(
            prom, "RicochetMonitorDown", severity="warning", job=MONITOR, instance=monitor.target
        )
    await fires(prom, "RicochetMonitorDown", since=scraped_at, severity="warning", job=MONITOR)
