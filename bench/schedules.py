"""Recurring jobs (SPEC 22): how late occurrences run under other work, and what leading costs
when nothing is due.

1. lateness: a worker runs a schedule every second beside `--rate` jobs/s of other work (500 by
   default) for `--seconds`; each occurrence's lateness is the time its handler started less
   the time its message_id names. SPEC 22 asks p99 <= 1 s.
2. idle: `--processes` worker processes (2: one leads, one follows) of a queue whose only
   schedule is never due (once a year) run for `--seconds`; the figures are each process's CPU
   seconds per minute and the AMQP operations per minute the broker counted on their
   connections (the follower's probes of the lead, the leader's checkpoints).

    .venv/bin/python -m bench.schedules                    # both, 60 s each
    .venv/bin/python -m bench.schedules --seconds 5 --rate 50

The broker is RICOCHET_BENCH_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/) and its
management API RICOCHET_BENCH_MANAGEMENT_URL (default http://127.0.0.1:15672/).
"""

import argparse
import asyncio
import base64
import datetime as dt
import json
import os
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import aio_pika
import psutil
from ricochet import Job, Router
from ricochet.handlers.invoker import Invoker
from ricochet.names import Names
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.worker import Worker

from bench.harness import spawn_workers
from bench.stats import percentile

AMQP_URL = os.environ.get("RICOCHET_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
MANAGEMENT_URL = os.environ.get("RICOCHET_BENCH_MANAGEMENT_URL", "http://127.0.0.1:15672/")
ROOT = Path(__file__).resolve().parent.parent
# The idle row's handler module: a schedule never due while it runs.
IDLE_HANDLER = "bench.schedules:yearly"

yearly = Router()
yearly.schedule("new-year", "new_year", cron="0 0 1 1 *")


@yearly.handler("new_year")
async def new_year(job: Job) -> None:
    """Never runs during a bench."""


async def _delete(queue: str) -> None:
    """Remove the queue's own objects (with the default 3 tiers) after a row."""
    names = Names(queue)
    connection = await aio_pika.connect(AMQP_URL)
    channel = await connection.channel()
    for name in (
        names.queue,
        names.failed,
        names.events,
        names.record,
        *map(names.tier, (1, 2, 3)),
    ):
        await channel.queue_delete(name)
    for name in (names.dlx, names.first_tier_exchange, names.return_exchange, names.failed):
        await channel.exchange_delete(name)
    await connection.close()


def _due_ms(message_id: str) -> int:
    text = message_id.partition("@")[2].removesuffix("Z") + "+00:00"
    return round(dt.datetime.fromisoformat(text).timestamp() * 1000)


async def lateness(seconds: float, rate: int) -> dict[str, float]:
    """Occurrence lateness in ms (p50, p99, max) beside rate jobs/s of other work."""
    queue = f"bench.schedules.{uuid.uuid4().hex[:8]}"
    router, late = Router(), []
    router.schedule("probe", "probe", every=1)

    @router.handler("probe")
    async def probe(job: Job) -> None:
        late.append(time.time_ns() // 1_000_000 - _due_ms(str(job.message_id)))

    @router.handler("work")
    async def work(job: Job) -> None:
        pass

    settings = Settings(amqp_url=AMQP_URL, queue=queue, http_port=0, prefetch=64)
    lifecycle = Lifecycle()
    worker = Worker(settings, Invoker(router, 30), Metrics(queue), lifecycle)
    serving = asyncio.create_task(worker.serve())
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel(publisher_confirms=False)
        while not lifecycle.ready:  # noqa: ASYNC110 - the lifecycle has no event for it
            await asyncio.sleep(0.1)
        body, started = b'{"type":"work"}', time.monotonic()
        sent = 0
        while time.monotonic() - started < seconds:
            due = int((time.monotonic() - started) * rate)
            for _ in range(due - sent):
                message = aio_pika.Message(body, type="work", delivery_mode=2)
                await channel.default_exchange.publish(message, routing_key=queue)
            sent = due
            await asyncio.sleep(0.01)
    finally:
        lifecycle.request_stop()
        await serving
        await connection.close()
        await _delete(queue)
    return {
        "occurrences": len(late),
        "p50_ms": percentile(late, 50),
        "p99_ms": percentile(late, 99),
        "max_ms": max(late, default=0),
    }


def _publishes(queue: str) -> int:
    """Publishes the broker counted on the channels of the connections of queue's processes
    (workers and their leader's client): a follower's probes of the lead, a leader's records."""
    url = urllib.parse.urlsplit(AMQP_URL)
    token = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
    request = urllib.request.Request(f"{MANAGEMENT_URL}api/channels")
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:
        channels = json.load(answer)
    return sum(
        (channel.get("message_stats") or {}).get("publish", 0)
        for channel in channels
        if f" {queue} " in (channel.get("connection_details") or {}).get("name", "")
    )


def idle(seconds: float, processes: int) -> dict[str, object]:
    """CPU seconds per minute of each process, and publishes per minute, with nothing due."""
    queue = f"bench.schedules.idle.{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    env.update(
        RICOCHET_AMQP_URL=AMQP_URL,
        RICOCHET_QUEUE=queue,
        RICOCHET_HANDLER=IDLE_HANDLER,
        RICOCHET_HTTP_PORT="0",
        RICOCHET_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    workers = spawn_workers(env, processes)
    try:
        time.sleep(10)  # started, declared, one leading
        cpu = [psutil.Process(w.pid).cpu_times() for w in workers]
        published, before = _publishes(queue), time.monotonic()
        time.sleep(seconds)
        after = [psutil.Process(w.pid).cpu_times() for w in workers]
        minutes = (time.monotonic() - before) / 60
        # The management API refreshes its figures every 5 s.
        publishes = _publishes(queue) - published
    finally:
        for w in workers:
            w.terminate()
            w.wait(30)
        asyncio.run(_delete(queue))
    per_minute = [
        round((a.user + a.system - b.user - b.system) / minutes, 3)
        for a, b in zip(after, cpu, strict=True)
    ]
    return {
        "cpu_s_per_minute_per_process": per_minute,
        "publishes_per_minute": round(publishes / minutes, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.schedules", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=int, default=500, help="other jobs per second")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps({"lateness": asyncio.run(lateness(args.seconds, args.rate))}))
    print(json.dumps({"idle": idle(args.seconds, args.processes)}))


if __name__ == "__main__":
    main()
