"""The enqueue benchmark: ricochet's Client and SyncClient against a raw aio-pika confirmed publish.

Every scenario publishes the same jobs (persistent, a JSON body, a type and a random message_id,
mandatory, each awaited until the broker confirms it) to a queue declared with ricochet's
topology, in the driver's own process; the raw loops do it with aio-pika alone. The scenarios
alternate, in reverse order every other repeat, and each ratio is the median of the ratios of
each repeat to the raw loop of the same concurrency, measured next to it.
"""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aio_pika
from aio_pika.abc import AbstractConnection
from ricochet import Client, SyncClient

from bench.stats import median, paired_ratios

CONCURRENCY = 32
WARM_UP_JOBS = 50
# scenario -> the raw loop of the same concurrency that its ratio is taken to
TWINS = {
    "raw-publish": "raw-publish",
    f"raw-publish-{CONCURRENCY}": f"raw-publish-{CONCURRENCY}",
    "client": "raw-publish",
    f"client-{CONCURRENCY}": f"raw-publish-{CONCURRENCY}",
    "raw-publish-from-a-thread": "raw-publish",
    f"raw-publish-from-{CONCURRENCY}-threads": f"raw-publish-{CONCURRENCY}",
    "sync-client": "raw-publish",
    f"sync-client-{CONCURRENCY}": f"raw-publish-{CONCURRENCY}",
}
ENQUEUE_SCENARIOS = list(TWINS)

Publish = Callable[[int], Awaitable[object]]
T = TypeVar("T")


def _payload(n: int) -> dict[str, int]:
    return {"n": n}


async def _timed(publish: Publish, jobs: int, concurrency: int) -> tuple[float, float]:
    """Seconds and CPU seconds (every thread of this process) to publish jobs, `concurrency`
    publishers at a time, each awaiting its confirm."""

    async def publisher(first: int) -> None:
        for n in range(first, jobs, concurrency):
            await publish(n)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(publisher(first) for first in range(concurrency)))
    return time.perf_counter() - t0, time.process_time() - cpu0


async def _raw(url: str, queue: str, jobs: int, concurrency: int) -> tuple[float, float]:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)

        async def publish(n: int) -> None:
            message = aio_pika.Message(
                json.dumps(_payload(n)).encode(),
                message_id=uuid.uuid4().hex,
                type="bench",
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await channel.default_exchange.publish(message, routing_key=queue, mandatory=True)

        await _timed(publish, WARM_UP_JOBS, 1)
        return await _timed(publish, jobs, concurrency)
    finally:
        await connection.close()


async def _client(url: str, queue: str, jobs: int, concurrency: int) -> tuple[float, float]:
    async with Client(url, queue) as client:

        async def publish(n: int) -> str:
            return await client.enqueue("bench", _payload(n))

        await _timed(publish, WARM_UP_JOBS, 1)
        return await _timed(publish, jobs, concurrency)


async def _sync_client(url: str, queue: str, jobs: int, concurrency: int) -> tuple[float, float]:
    """SyncClient.enqueue called from `concurrency` threads of their own, as a sync application
    (a threaded web server) does."""
    client = SyncClient(url, queue)

    def publisher(first: int, count: int) -> None:
        for n in range(first, count, concurrency):
            client.enqueue("bench", _payload(n))

    def publish_all(count: int, threads: int) -> tuple[float, float]:
        t0, cpu0 = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(publisher, first, count) for first in range(threads)]:
                done.result()
        return time.perf_counter() - t0, time.process_time() - cpu0

    try:
        await asyncio.to_thread(publish_all, WARM_UP_JOBS, 1)
        return await asyncio.to_thread(publish_all, jobs, concurrency)
    finally:
        await asyncio.to_thread(client.close)


async def _raw_from_threads(url: str, queue: str, jobs: int, threads: int) -> tuple[float, float]:
    """The raw publish driven from threads of their own, as SyncClient is driven: each publish
    handed to an event loop running in another thread, and waited for."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    async def connect() -> tuple[AbstractConnection, Callable[[int], Coroutine[Any, Any, None]]]:
        connection = await aio_pika.connect(url)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)

        async def publish(n: int) -> None:
            message = aio_pika.Message(
                json.dumps(_payload(n)).encode(),
                message_id=uuid.uuid4().hex,
                type="bench",
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await channel.default_exchange.publish(message, routing_key=queue, mandatory=True)

        return connection, publish

    def publish_all(
        publish: Callable[[int], Coroutine[Any, Any, None]], count: int, threads: int
    ) -> tuple[float, float]:
        def publisher(first: int) -> None:
            for n in range(first, count, threads):
                run(publish(n))

        t0, cpu0 = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(publisher, first) for first in range(threads)]:
                done.result()
        return time.perf_counter() - t0, time.process_time() - cpu0

    connection, publish = run(connect())
    try:
        await asyncio.to_thread(publish_all, publish, WARM_UP_JOBS, 1)
        return await asyncio.to_thread(publish_all, publish, jobs, threads)
    finally:
        run(connection.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


async def run_scenario(url: str, queue: str, name: str, jobs: int) -> tuple[float, float]:
    """Seconds and CPU seconds of one scenario's jobs."""
    concurrency = CONCURRENCY if name.endswith(f"-{CONCURRENCY}") else 1
    if name == "raw-publish-from-a-thread":
        return await _raw_from_threads(url, queue, jobs, 1)
    if name == f"raw-publish-from-{CONCURRENCY}-threads":
        return await _raw_from_threads(url, queue, jobs, CONCURRENCY)
    if name.startswith("raw-publish"):
        return await _raw(url, queue, jobs, concurrency)
    if name.startswith("client"):
        return await _client(url, queue, jobs, concurrency)
    return await _sync_client(url, queue, jobs, concurrency)


async def enqueue_throughput(
    url: str, connection: AbstractConnection, queue: str, jobs: int, repeats: int, label: str
) -> dict[str, Any]:
    """Every scenario `repeats` times, interleaved; the queue is emptied after each run."""
    rates: dict[str, list[float]] = {name: [] for name in ENQUEUE_SCENARIOS}
    cpu: dict[str, list[float]] = {name: [] for name in ENQUEUE_SCENARIOS}
    channel = await connection.channel()
    declared = await channel.get_queue(queue, ensure=False)
    try:
        for r in range(repeats):
            for name in ENQUEUE_SCENARIOS if r % 2 == 0 else ENQUEUE_SCENARIOS[::-1]:
                seconds, cpu_s = await run_scenario(url, queue, name, jobs)
                await declared.purge()
                rates[name].append(jobs / seconds)
                cpu[name].append(cpu_s / jobs * 1e6)
                print(
                    f"  {label:8} repeat {r + 1}/{repeats} {name:14} {jobs / seconds:8.0f} jobs/s"
                    f" {cpu_s / jobs * 1e6:6.0f} CPU us/job",
                    flush=True,
                )
    finally:
        await channel.close()
    result: dict[str, Any] = {}
    for name, values in rates.items():
        ratios = paired_ratios(values, rates[TWINS[name]])
        result[name] = {
            "jobs_per_s": [round(v) for v in values],
            "median": round(median(values)),
            "cpu_us_per_job": round(median(cpu[name])),
            "ratios": [round(x, 3) for x in ratios],
            "ratio": round(median(ratios), 3),
        }
    return result
