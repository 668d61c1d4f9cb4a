"""Priority (SPEC 28): where 5 jobs enqueued at priority 8 behind a backlog of 1,000 at the
default priority start, on each broker of the matrix, for quorum queues and for classic ones
with RICOCHET_MAX_PRIORITY=9 (and without, for comparison). One worker at the default prefetch
starts once the backlog is in; the positions are 1-based among the 1,005 starts.

    .venv/bin/python -m bench.priority
    .venv/bin/python -m bench.priority --urls amqp://guest:guest@127.0.0.1:5673/ --backlog 200

Prints one row per broker and queue, and writes bench/results/priority.json.
"""

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aio_pika
from ricochet import Client, Job
from ricochet.broker.amqp import broker_version
from ricochet.handlers.invoker import Invoker
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.worker.worker import Worker
from structlog.testing import capture_logs

from bench.harness import URL, ricochet_queue, run_name, worker_settings

RESULTS = Path(__file__).resolve().parent / "results" / "priority.json"
HIGH = 8
HIGH_JOBS = 5
# The matrix's brokers as scripts/brokers.sh starts them.
MATRIX_URLS = (URL, "amqp://guest:guest@127.0.0.1:5673/", "amqp://guest:guest@127.0.0.1:5674/")
QUEUES = (("quorum", 0), ("classic", 9), ("classic", 0))
ENQUEUE_WINDOW = 200


class Starts:
    """Records the order jobs start in; set once every job has."""

    def __init__(self, total: int) -> None:
        self.order: list[str] = []
        self._total = total
        self.done = asyncio.Event()

    async def __call__(self, job: Job) -> None:
        self.order.append(str(job.message_id))
        if len(self.order) == self._total:
            self.done.set()


async def positions(url: str, queue_type: str, max_priority: int, backlog: int) -> dict[str, Any]:
    """The 1-based start positions of the high jobs enqueued behind the backlog."""
    queue = run_name(f"priority-{max_priority}", queue_type)
    settings = worker_settings(
        queue, queue_type, 32, amqp_url=url, max_priority=max_priority, journal="off"
    )
    connection = await aio_pika.connect(url)
    try:
        version = broker_version(connection)
        async with ricochet_queue(connection, settings):
            async with Client(url, queue) as client:
                for start in range(0, backlog, ENQUEUE_WINDOW):
                    ids = range(start, min(start + ENQUEUE_WINDOW, backlog))
                    await asyncio.gather(
                        *(client.enqueue("work", {}, message_id=f"n{i}") for i in ids)
                    )
                for i in range(HIGH_JOBS):
                    await client.enqueue("work", {}, message_id=f"high{i}", priority=HIGH)
            starts = Starts(backlog + HIGH_JOBS)
            lifecycle = Lifecycle()
            began = time.monotonic()
            with capture_logs():
                task = asyncio.create_task(
                    Worker(settings, Invoker(starts, 30), Metrics(queue), lifecycle).serve()
                )
                await asyncio.wait_for(starts.done.wait(), 300)
                lifecycle.request_stop()
                await task
            took_s = time.monotonic() - began
    finally:
        await connection.close()
    found = [starts.order.index(f"high{i}") + 1 for i in range(HIGH_JOBS)]
    return {
        "broker": ".".join(map(str, version or ())),
        "queue_type": queue_type,
        "max_priority": max_priority,
        "backlog": backlog,
        "positions": found,
        "run_s": round(took_s, 2),
    }


async def main(urls: list[str], backlog: int) -> None:
    rows = []
    for url in urls:
        for queue_type, max_priority in QUEUES:
            row = await positions(url, queue_type, max_priority, backlog)
            rows.append(row)
            queue = f"{queue_type}, x-max-priority {max_priority}" if max_priority else queue_type
            print(
                f"RabbitMQ {row['broker']:<7} {queue:<28} positions of the {HIGH_JOBS} jobs at"
                f" {HIGH}: {row['positions']} of {backlog + HIGH_JOBS}",
                flush=True,
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", nargs="+", default=list(MATRIX_URLS))
    parser.add_argument("--backlog", type=int, default=1000)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.urls, arguments.backlog))
