"""Pausing on failure spikes: a dependency down for longer than the whole retry ladder."""

import json
from collections import Counter

from aio_pika.abc import AbstractChannel
from ricochet import RetryLater
from ricochet.handlers.job import Job
from ricochet.names import Names
from structlog.typing import EventDict

from tests.support import (
    StartWebhook,
    StartWorker,
    depth,
    publish,
    readiness_at_each_log_line,
    wait_depth,
    wait_for,
)

JOBS = 30
# A ladder of 100 + 200 ms: the dependency stays down far longer than a job's whole budget.
LADDER = {"max_retries": 2, "retry_delay_ms": 100, "prefetch": 2}
PAUSING = {"pause_failure_ratio": 0.5, "pause_min_jobs": 4, "pause_window_s": 5, "pause_s": 1}


class Dependency:
    """A handler whose downstream service is down until brought up."""

    def __init__(self) -> None:
        self.up = False
        self.done: list[str | None] = []

    async def __call__(self, job: Job) -> None:
        if not self.up:
            raise ConnectionError("dependency down")
        self.done.append(job.message_id)


class RateLimited(Dependency):
    """A downstream service that answers "429, retry after 200 ms" until brought up."""

    async def __call__(self, job: Job) -> None:
        if not self.up:
            raise RetryLater(0.2, "rate limited")
        self.done.append(job.message_id)


async def publish_jobs(channel: AbstractChannel, queue: str) -> list[str]:
    ids = [f"j{i}" for i in range(JOBS)]
    for message_id in ids:
        await publish(channel, queue, json.dumps({}), message_id=message_id)
    return ids


async def test_without_pausing_every_job_fails(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Pausing off: a dependency down for longer than the ladder puts every job in Q.failed."""
    dependency = Dependency()
    await start_worker(dependency, **LADDER)
    await publish_jobs(channel, queue_name)
    await wait_depth(channel, Names(queue_name).failed, JOBS)
    assert dependency.done == []


def paused(lines: list[EventDict]) -> list[EventDict]:
    return [line for line in lines if "paused" in line["event"]]


async def test_pausing_saves_every_job(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, webhook: StartWebhook
) -> None:
    """Pausing on: the worker pauses (503, the gauge at 1, a log line with the ratio, a
    worker.paused alert) and again while failures continue; no job reaches Q.failed, and every
    one is done once the dependency is back, after a worker.resumed alert."""
    dependency = Dependency()
    hook = await webhook([200])
    worker = await start_worker(dependency, **LADDER, **PAUSING, alert_webhook_url=hook.url)
    with readiness_at_each_log_line(lambda: worker.lifecycle.ready) as lines:
        ids = await publish_jobs(channel, queue_name)
        await wait_for(lambda: len(paused(lines)) >= 1, 10, "a pause")
        assert (
            worker.metrics.registry.get_sample_value(
                "ricochet_worker_paused", {"queue": queue_name}
            )
            == 1
        )
        await wait_for(lambda: len(paused(lines)) >= 3, 10, "pauses while failures continue")
        dependency.up = True
        await wait_for(lambda: Counter(dependency.done) == Counter(ids), 30, "every job done")
    assert await depth(channel, Names(queue_name).failed) == 0
    assert all(not line["ready"] and line["failure_ratio"] >= 0.5 for line in paused(lines))
    assert worker.lifecycle.ready
    await wait_for(lambda: len(hook.delivered("worker.resumed")) >= 3, 10, "resumed alerts")
    [first, *_] = hook.delivered("worker.paused")
    assert first["queue"] == queue_name
    assert first["failure_ratio"] >= 0.5


async def test_a_rate_limited_dependency_pauses_the_worker_too(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Jobs that ask to be retried later fail transiently, as RetryLater is defined: a
    dependency that only rate-limits pauses the worker as one that is down does, and every job
    is done once it is back."""
    dependency = RateLimited()
    worker = await start_worker(dependency, **LADDER, **PAUSING)
    with readiness_at_each_log_line(lambda: worker.lifecycle.ready) as lines:
        ids = await publish_jobs(channel, queue_name)
        await wait_for(lambda: len(paused(lines)) >= 1, 10, "a pause")
        dependency.up = True
        await wait_for(lambda: Counter(dependency.done) == Counter(ids), 30, "every job done")
    assert await depth(channel, Names(queue_name).failed) == 0
    assert all(not line["ready"] and line["failure_ratio"] >= 0.5 for line in paused(lines))
