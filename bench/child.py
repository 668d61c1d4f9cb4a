"""A consumer process of the benchmark: the raw aio-pika loop, or the real ricochet worker.

Both report on stdout, one JSON object per line: {"event": "ready"} once consuming, then
{"event": "done", "seconds": ...} when `--target` jobs are settled; then they wait for SIGTERM
(so the driver can read their RSS) and exit. The ricochet worker takes its settings from the
RICOCHET_* environment like `ricochet worker`, and logs at its configured level to /dev/null.
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.probe import PROBE_TYPE, lateness_s, observed_delays_s, probe_fails
from bench.sides import app_first

RAW_MODES = ("ack", "retry", "fail", "probe", "delay")
# The header the worker's copy carries when it sends a job to wait: the retries it made.
RETRIES = "ricochet-retries"
# Both consumers look at their progress this often: a 0.25 % error on a 4-second run.
POLL_S = 0.01


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def _measure(
    started: Callable[[], bool], settled: Callable[[], int], target: int
) -> dict[str, float]:
    """Wall-clock and CPU seconds of this process from the start of consuming until target jobs
    are settled. CPU time is the steadier figure when other processes share the machine."""
    # Polling, not an event: both consumers are timed the same way, without touching app/.
    while not started():  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    t0, cpu0 = time.perf_counter(), time.process_time()
    emit("ready")
    while settled() < target:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    return {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}


def attempt_of(message: AbstractIncomingMessage, queue: str) -> int:
    """1 + the times the broker dead-lettered this message out of the queue (from x-death)."""
    deaths = (message.headers or {}).get("x-death")
    if not isinstance(deaths, list):
        return 1
    counts = [d["count"] for d in deaths if isinstance(d, dict) and d["queue"] == queue]
    # The broker writes each count as a long integer.
    return 1 + sum(n for n in counts if isinstance(n, int))


async def raw(
    url: str,
    queue: str,
    prefetch: int,
    target: int,
    mode: str,
    ack_every: int,
    copies_to: list[str],
    delay_exchange: str | None = None,
    delay_key: str | None = None,
) -> None:
    """The baseline: a minimal aio-pika loop that does one scenario's broker work, nothing else.

    ack: consume and ack. retry: nack the first delivery (the broker dead-letters it through
    ricochet's 10 ms tier and back), and ack the second. fail:
    publish a persistent copy to each queue of copies_to in turn, each confirmed before the
    next, then ack (the worker's copy to Q.failed, then its notice to Q.failed.events). delay:
    publish a persistent copy of a first delivery, marked as a retry, to delay_exchange with
    delay_key (the shared delay level of its wait), confirmed, then ack it; ack the copy when it
    comes back. probe: nack a probe three times, timing its tiers as the ricochet handler does,
    and ack everything else. ack_every > 1 acks with multiple=True once per that many
    deliveries, which is safe here only because this
    loop settles its deliveries in order and never fails one.
    """
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    acked = received = 0
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.set_qos(prefetch_count=prefetch)

    def fails(message: AbstractIncomingMessage) -> bool:
        if mode == "retry":
            return attempt_of(message, queue) == 1
        if mode == "probe" and message.type == PROBE_TYPE:
            return probe_fails(message.message_id, attempt_of(message, queue))
        return False

    waits = await _waits(channel, delay_exchange, delay_key) if mode == "delay" else None

    async def on_message(message: AbstractIncomingMessage) -> None:
        nonlocal acked, received
        if waits is not None and RETRIES not in (message.headers or {}):
            await waits(message)
            return
        if fails(message):
            await message.nack(requeue=False)
            return
        if mode == "fail":
            await _fail(channel, message, copies_to)
        received += 1
        n = received
        if n % ack_every == 0 or n == target:
            await message.ack(multiple=ack_every > 1)
            acked = max(acked, n)

    consuming = asyncio.Event()

    async def consume() -> None:
        await (await channel.get_queue(queue, ensure=False)).consume(on_message)
        consuming.set()

    task = asyncio.ensure_future(consume())
    measured = await _measure(consuming.is_set, lambda: acked, target)
    await task
    emit("done", **measured, delays_s=observed_delays_s)
    await stop.wait()
    await connection.close()


async def _fail(
    channel: aio_pika.abc.AbstractChannel, message: AbstractIncomingMessage, copies_to: list[str]
) -> None:
    """The worker's broker work for a failed job, before its ack: a persistent copy to each
    queue of copies_to in turn, each confirmed before the next."""
    copy = aio_pika.Message(
        message.body,
        headers={"failed-reason": "benchmark: this job always fails"},
        message_id=message.message_id,
        type=message.type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
    for copy_queue in copies_to:
        await channel.default_exchange.publish(copy, routing_key=copy_queue, mandatory=True)


async def _waits(
    channel: aio_pika.abc.AbstractChannel, exchange_name: str | None, routing_key: str | None
) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
    """The worker's broker work for a job sent to wait in the delay levels: a persistent copy
    marked as a retry, published to the level of its wait and confirmed, then the ack."""
    assert exchange_name is not None
    assert routing_key is not None
    exchange = await channel.get_exchange(exchange_name, ensure=False)

    async def wait(message: AbstractIncomingMessage) -> None:
        copy = aio_pika.Message(
            message.body,
            headers={RETRIES: 1},
            message_id=message.message_id,
            type=message.type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await exchange.publish(copy, routing_key=routing_key, mandatory=True)
        await message.ack()

    return wait


async def ricochet(outcome: str, target: int, log_stream: TextIO) -> None:
    """The real worker (ricochet.worker.worker.Worker, as `ricochet worker` runs it), timed from
    outside."""
    from ricochet.handlers.invoker import Invoker, load_handler
    from ricochet.log import configure_logging
    from ricochet.observe.metrics import Metrics
    from ricochet.service.process import stop_signals
    from ricochet.settings import load_settings
    from ricochet.worker.worker import Worker

    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format, log_stream)
    invoker = Invoker(load_handler(settings.handler), settings.handler_timeout_s)
    metrics = Metrics(settings.queue)
    sample = {"queue": settings.queue, "outcome": outcome}

    def settled() -> int:
        return int(metrics.registry.get_sample_value("ricochet_jobs_total", sample) or 0)

    with stop_signals() as lifecycle:
        serving = asyncio.ensure_future(Worker(settings, invoker, metrics, lifecycle).serve())
        measuring = asyncio.ensure_future(_measure(lambda: lifecycle.ready, settled, target))
        await asyncio.wait({serving, measuring}, return_when=asyncio.FIRST_COMPLETED)
        if not measuring.done():
            measuring.cancel()
            await serving  # raises what stopped the worker
            raise RuntimeError("the worker stopped before the jobs were done")
        emit("done", **measuring.result(), delays_s=observed_delays_s, lateness_s=lateness_s)
        await serving


def main() -> None:
    app_first()  # an A/B run against another checkout of ricochet (python -m bench --base-src DIR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("consumer", choices=["raw", "ricochet"])
    parser.add_argument("--target", type=int, required=True, help="jobs to settle")
    parser.add_argument("--outcome", default="succeeded", help="ricochet: the outcome to count")
    parser.add_argument("--url", help="raw: the broker")
    parser.add_argument("--queue", help="raw: the queue")
    parser.add_argument("--prefetch", type=int, default=32, help="raw: the prefetch")
    parser.add_argument("--mode", choices=RAW_MODES, default="ack", help="raw: the broker work")
    parser.add_argument("--ack-every", type=int, default=1, help="raw: multiple=True acks")
    parser.add_argument(
        "--copy-to", action="append", default=[], help="raw, fail mode: a queue for the copy"
    )
    parser.add_argument("--delay-exchange", help="raw, delay mode: where a retry waits")
    parser.add_argument("--delay-key", help="raw, delay mode: the routing key of its wait")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (an A/B scenario)")
    parser.add_argument("--no-otel", action="store_true", help="opentelemetry not importable")
    args = parser.parse_args()
    if args.no_otel:
        # As if ricochet[otel] were not installed: ricochet.tracing's import of it fails. Set before
        # anything imports app.
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    if args.uvloop:
        import uvloop

        uvloop.install()
    if args.consumer == "raw":
        asyncio.run(
            raw(
                args.url,
                args.queue,
                args.prefetch,
                args.target,
                args.mode,
                args.ack_every,
                args.copy_to,
                args.delay_exchange,
                args.delay_key,
            )
        )
    else:
        with open(os.environ.get("BENCH_LOG", os.devnull), "a") as log_stream:
            asyncio.run(ricochet(args.outcome, args.target, log_stream))


if __name__ == "__main__":
    main()
