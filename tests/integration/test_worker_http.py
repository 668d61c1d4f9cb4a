"""The worker's HTTP side: what /metrics says after real jobs, and a port that is taken."""

import asyncio
import os
import signal
import socket

import aiohttp
from aio_pika.abc import AbstractChannel
from prometheus_client.parser import text_string_to_metric_families
from ricochet.errors import PermanentError
from ricochet.handlers.invoker import Invoker
from ricochet.handlers.job import Job
from ricochet.names import Names
from ricochet.observe.metrics import Metrics
from ricochet.worker.worker import run_worker

from tests.support import (
    answers,
    depth,
    free_port,
    free_ports,
    http_status,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    take,
    wait_for,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class BackendDown(Exception):
    """A transient failure."""


async def handler(job: Job) -> None:
    """ok succeeds; permanent fails at once; flaky fails its first attempt; broken always fails."""
    if job.type == "permanent":
        raise PermanentError("no such customer")
    if job.type == "broken" or (job.type == "flaky" and job.attempt == 1):
        raise BackendDown("backend timed out")


async def scrape(port: int) -> Samples:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        text = await response.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_count_what_happened(queue_name: str, channel: AbstractChannel) -> None:
    """After 3 successes, 1 retried success, 2 permanent and 1 exhausted failure (2 retries),
    the worker's /metrics shows exactly those outcomes, tiers, kinds and handler calls."""
    port = free_port()
    settings = make_settings(queue_name, max_retries=2, http_port=port)
    metrics = Metrics(queue_name)
    invoker = Invoker(handler, settings.handler_timeout_s)
    worker = asyncio.create_task(run_worker(settings, invoker, metrics))

    async def ready() -> bool:
        assert not worker.done(), worker.result()
        return await answers(port, "/readyz", 200)

    try:
        await wait_for(ready, 20, "/readyz to answer 200")
        for job_type in ["ok", "ok", "ok", "flaky", "permanent", "permanent", "broken"]:
            await publish(channel, queue_name, b"{}", type=job_type)

        q = {"queue": queue_name}

        def value(samples: Samples, name: str, **labels: str) -> float:
            return samples.get((name, frozenset({**q, **labels}.items())), 0.0)

        async def settled() -> bool:
            samples = await scrape(port)
            return (
                value(samples, "ricochet_jobs_total", outcome="succeeded") == 4
                and value(samples, "ricochet_jobs_total", outcome="failed") == 3
            )

        await wait_for(settled, 30, "4 successes and 3 failures on /metrics")
        samples = await scrape(port)
    finally:
        if not worker.done():
            os.kill(os.getpid(), signal.SIGTERM)  # run_worker's own handler: a graceful stop
        await asyncio.wait_for(worker, 30)

    assert value(samples, "ricochet_jobs_total", outcome="retried") == 3
    assert value(samples, "ricochet_retries_total", tier="1") == 2
    assert value(samples, "ricochet_retries_total", tier="2") == 1
    assert value(samples, "ricochet_failed_copies_total", kind="permanent") == 2
    assert value(samples, "ricochet_failed_copies_total", kind="exhausted") == 1
    # One handler call per attempt: 3 + 2 (flaky) + 2 (permanent) + 3 (broken).
    assert value(samples, "ricochet_job_duration_seconds_count") == 10
    assert value(samples, "ricochet_jobs_in_flight") == 0
    kinds = sorted(
        str(m.headers["failed-kind"]) for m in await take(channel, Names(queue_name).failed, 3)
    )
    assert kinds == ["exhausted", "permanent", "permanent"]


async def test_worker_exits_1_when_its_http_port_is_taken(queue_name: str) -> None:
    """`ricochet worker` with RICOCHET_HTTP_PORT in use exits 1 with a message naming the port,
    before it touches the broker."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = ricochet_env(make_settings(queue_name, http_port=port))
        result = await asyncio.to_thread(run_cli, ["worker"], env)
    assert result.returncode == 1, result.stderr
    assert f"RICOCHET_HTTP_PORT={port}: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert '"event":"connected"' not in result.stdout


def stop(worker: asyncio.Task[None]) -> None:
    """SIGTERM to this process, which run_worker handles as a graceful stop while it runs."""
    if not worker.done():
        os.kill(os.getpid(), signal.SIGTERM)


async def test_readyz_is_503_while_waiting_for_the_broker(queue_name: str) -> None:
    """A worker whose broker does not answer yet is alive (/healthz 200) but not ready (503)."""
    port, closed = free_ports(2)
    nothing_there = f"amqp://guest:guest@127.0.0.1:{closed}/"
    settings = make_settings(
        queue_name, http_port=port, amqp_url=nothing_there, connect_timeout_s=60
    )
    invoker = Invoker(handler, settings.handler_timeout_s)
    worker = asyncio.create_task(run_worker(settings, invoker, Metrics(queue_name)))
    try:
        await wait_for(lambda: answers(port, "/healthz", 200), 20, "/healthz to answer 200")
        assert await http_status(port, "/readyz") == 503
        assert not worker.done()
    finally:
        stop(worker)
        await asyncio.wait_for(worker, 30)


async def test_readyz_is_503_while_the_worker_drains(
    queue_name: str, channel: AbstractChannel
) -> None:
    """/readyz says 200 while the worker consumes and 503 as soon as SIGTERM stops it taking
    jobs, while the job in flight still runs; /healthz stays 200; the job is then acked."""
    port = free_port()
    settings = make_settings(queue_name, http_port=port)
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(job: Job) -> None:
        started.set()
        await release.wait()

    invoker = Invoker(slow, settings.handler_timeout_s)
    worker = asyncio.create_task(run_worker(settings, invoker, Metrics(queue_name)))
    stopped = False
    try:
        await wait_for(lambda: answers(port, "/readyz", 200), 20, "/readyz to answer 200")
        await publish(channel, queue_name, b"{}", message_id="inflight")
        await wait_for(started.is_set, 10, "the job to start")
        stop(worker)
        stopped = True
        await wait_for(lambda: answers(port, "/readyz", 503), 10, "/readyz to answer 503")
        assert await http_status(port, "/healthz") == 200
        assert not worker.done()
    finally:
        release.set()
        if not stopped:  # a second SIGTERM would cut the drain short
            stop(worker)
        await asyncio.wait_for(worker, 30)
    assert await depth(channel, queue_name) == 0
