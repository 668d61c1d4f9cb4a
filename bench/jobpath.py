"""What the worker's own code spends on a job, without the broker (python -m bench.jobpath).

The worker's consumer, settler and observers (metrics, the job's log lines at the default INFO
to /dev/null, the pause window, the journal's entries, encoded as its writer does) run as
`ricochet worker` wires them (Worker.consumer), on deliveries read from real AMQP frames, in
batches of the prefetch; the settler's writes go nowhere. What the broker
and the AMQP library cost (reading frames, writing them) is left out, and so is their noise:
the figure moves by a few percent from run to run, where a throughput run moves by a third.
Two paths: the happy one (one delivery, acked) and the retry one (a first attempt that fails
into a jittered tier and a second that succeeds, with the x-death the broker writes). With
--base-src, the same runs against the app/ of another checkout, in alternation.
"""

import argparse
import asyncio
import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.sides import alternate, app_first

QUEUE = "bench.jobpath"
PREFETCH = 32
NOW = dt.datetime(2026, 11, 26, 14, 35, 38, tzinfo=dt.UTC)
# What the broker writes on a job dead-lettered from the queue into a lane of tier 1 and back.
BACK_FROM_A_LANE: dict[str, Any] = {
    "x-death": [
        {
            "count": 1,
            "exchange": f"{QUEUE}.dlx",
            "queue": f"{QUEUE}.retry.1.lane.3",
            "reason": "expired",
            "routing-keys": [QUEUE],
            "time": NOW,
        },
        {
            "count": 1,
            "exchange": "",
            "queue": QUEUE,
            "reason": "rejected",
            "routing-keys": [QUEUE],
            "time": NOW,
        },
    ],
    "x-first-death-exchange": "",
    "x-first-death-queue": QUEUE,
    "x-first-death-reason": "rejected",
}


def measure(jobs: int) -> dict[str, float]:
    """CPU µs a job on each path, in this process's ricochet."""
    from ricochet.log import configure_logging

    devnull = open(os.devnull, "w")  # noqa: SIM115 (open for the process's life)
    configure_logging("INFO", "json", devnull)  # the defaults
    return {
        "happy path (one delivery)": asyncio.run(run_path(jobs, "bench.handlers:noop")),
        "retry path, jitter 0.5 (two deliveries)": asyncio.run(
            run_path(jobs, "bench.handlers:fail_once")
        ),
    }


async def run_path(jobs: int, handler: str) -> float:
    from aiormq.abc import DeliveredMessage
    from pamqp import commands, header
    from ricochet.broker.amqp import Delivery
    from ricochet.broker.plan import plan
    from ricochet.handlers.invoker import Invoker, load_handler
    from ricochet.observe.metrics import Metrics
    from ricochet.service.process import Lifecycle
    from ricochet.settings import Settings
    from ricochet.worker.settler import Settler
    from ricochet.worker.worker import Worker

    class Nowhere:
        """The channel and its frames: copies and settlements go nowhere."""

        default_exchange = None

        async def settle(self, *_: object) -> None:
            pass

    settings = Settings(
        queue=QUEUE, prefetch=PREFETCH, handler=handler, max_retries=1, retry_jitter=0.5
    )
    topology = plan(settings)
    invoker = Invoker(load_handler(settings.handler), settings.handler_timeout_s)
    worker = Worker(settings, invoker, Metrics(QUEUE), Lifecycle())
    queue = worker.queues[0]
    # The plan the broker applies, as a declare at the session's start leaves it: a retry's
    # log line and journal entry read its tier's delay there.
    queue._applied._plan = topology
    consumer = queue.consumer()  # with the queue's observers, as its sessions run it
    observers = queue.observers
    settler = Settler(Nowhere(), Nowhere(), topology.names, 131072, observers)  # type: ignore[arg-type]
    # (routing key, exchange, headers) of a first attempt, and of one back from tier 1's lanes.
    attempts = [(QUEUE, "", {}), (f"{QUEUE}.attempt.1", f"{QUEUE}.return", BACK_FROM_A_LANE)]
    retried = handler.endswith("fail_once")

    def delivered(tag: int, n: int, attempt: int) -> Delivery:
        key, exchange, headers = attempts[attempt - 1]
        properties = commands.Basic.Properties(
            headers=headers,
            message_id=f"{QUEUE}.bench.{n}",
            message_type="bench",
            content_type="application/json",
            delivery_mode=2,
        )
        body = json.dumps({"n": n}).encode()
        method = commands.Basic.Deliver("ctag", tag, False, exchange, key)
        content = header.ContentHeader(body_size=len(body), properties=properties)
        return Delivery(DeliveredMessage(method, content, body, None))  # type: ignore[arg-type]

    raws = [(n, a) for n in range(jobs) for a in ((1, 2) if retried else (1,))]
    deliveries = [delivered(tag, n, a) for tag, (n, a) in enumerate(raws, 1)]
    started = time.process_time()
    for first in range(0, len(deliveries), PREFETCH):
        running = []
        for delivery in deliveries[first : first + PREFETCH]:
            settler.delivered(delivery)
            running.append(consumer.spawn(settler, consumer.intake(delivery)))
        await asyncio.wait(running)
    await settler.drain()
    _encode_journal(worker)
    return (time.process_time() - started) / jobs * 1e6


def _encode_journal(worker: Any) -> None:
    """What the journal's writer spends on the entries kept, but its publishes (a frame a
    batch of them); a checkout from before the journal has none."""
    try:
        from ricochet.broker.journal import BATCH_MOST, journal_record
    except ImportError:
        return
    while batch := worker.journal.take(BATCH_MOST):
        journal_record(batch)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jobpath", description=__doc__)
    parser.add_argument("--base-src", type=Path, help="the checkout whose app/ to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="alternating runs of each side")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs a path, a run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        app_first()
        print(json.dumps(measure(args.jobs)))
        return
    runs = alternate("bench.jobpath", [f"--jobs={args.jobs}"], args.base_src, args.rounds)
    for side, results in runs.items():
        print(f"\n{side}: CPU µs a job, the least and the median of {args.rounds} runs")
        for path in results[0]:
            values = sorted(r[path] for r in results)
            print(f"  {values[0]:7.1f} {values[len(values) // 2]:7.1f}  {path}")


if __name__ == "__main__":
    main()
