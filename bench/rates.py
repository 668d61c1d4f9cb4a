"""A rate limit held by several workers (SPEC 28): RICOCHET_RATE_LIMITS=work=50/s on 2 workers
of 2 processes each (4 processes), a backlog of 4,000 jobs that all want to run at once, over
60 s: the starts of each second (p50 and max, the first second's burst apart) and how far the
total is from the 3,000 the limit allows.

    .venv/bin/python -m bench.rates
    .venv/bin/python -m bench.rates --seconds 20 --rate 20

Prints one line and writes bench/results/rates.json.
"""

import argparse
import asyncio
import collections
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import aio_pika
from ricochet import Client

from bench.harness import URL, ricochet_queue, spawn_workers, worker_settings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "rates.json"


async def run(seconds: float, rate: int, workers: int, processes: int) -> dict[str, object]:
    queue = f"bench.rates.{uuid.uuid4().hex[:8]}"
    settings = worker_settings(queue, "quorum", 32, journal="off")
    backlog = int(rate * seconds * 4 / 3)
    connection = await aio_pika.connect(URL)
    with tempfile.NamedTemporaryFile("r", suffix=".starts") as starts:
        try:
            async with ricochet_queue(connection, settings):
                async with Client(URL, queue) as client:
                    for start in range(0, backlog, 500):
                        await asyncio.gather(
                            *(client.enqueue("work", {}) for _ in range(min(500, backlog - start)))
                        )
                env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
                env.update(
                    RICOCHET_AMQP_URL=URL,
                    RICOCHET_QUEUE=queue,
                    RICOCHET_HANDLER="bench.handlers:record_start",
                    RICOCHET_RATE_LIMITS=f"work={rate}/s",
                    RICOCHET_PROCESSES=str(processes),
                    RICOCHET_JOURNAL="off",
                    RICOCHET_HTTP_PORT="0",
                    BENCH_STARTS=starts.name,
                    PYTHONPATH=str(ROOT),
                )
                spawned = spawn_workers(env, workers)
                try:
                    await asyncio.sleep(seconds + 10)  # the starts, and the first 10 s of them
                finally:
                    for worker in spawned:
                        worker.terminate()
                    for worker in spawned:
                        worker.wait(60)
        finally:
            await connection.close()
        stamps = sorted(float(line) for line in starts.read().split())
    first = stamps[0]
    window = [t for t in stamps if t < first + seconds]
    per_second = collections.Counter(int(t - first) for t in window)
    counts = [per_second.get(s, 0) for s in range(int(seconds))]
    return {
        "limit_per_s": rate,
        "processes": workers * processes,
        "seconds": seconds,
        "started": len(window),
        "allowed": int(rate * seconds),
        "off_by": len(window) - int(rate * seconds),
        "first_second": counts[0],
        "p50_per_s": statistics.median(counts[1:]),
        "max_per_s": max(counts[1:]),
        "min_per_s": min(counts[1:]),
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rates", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    row = asyncio.run(run(args.seconds, args.rate, args.workers, args.processes))
    print(json.dumps(row))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
