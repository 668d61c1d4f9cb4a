"""One job per key at a time (SPEC 28): 100 keys x 20 jobs against the same 2,000 jobs without
keys, on one worker at the default prefetch (32) and RICOCHET_KEY_LANES (16), each job an
async I/O wait of 10 ms (a call to another service). Prints the throughput of each, how many
keys ran at once at most (and how often two jobs of one key overlapped: never, or the run is
wrong), and writes bench/results/keys.json.

    .venv/bin/python -m bench.keys
    .venv/bin/python -m bench.keys --keys 20 --per-key 10
"""

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aio_pika
from ricochet import Client, Job
from ricochet.handlers.invoker import Invoker
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.worker.worker import Worker
from structlog.testing import capture_logs

from bench.harness import URL, ricochet_queue, run_name, worker_settings

RESULTS = Path(__file__).resolve().parent / "results" / "keys.json"
JOB_S = 0.010
ENQUEUE_WINDOW = 200


class Runs:
    """Counts the jobs, the keys running at once, and any two jobs of one key that overlap."""

    def __init__(self, total: int) -> None:
        self.running: dict[str, int] = {}
        self.most_keys = 0
        self.overlaps = 0
        self.started: dict[str, list[str]] = {}
        self.count = 0
        self._total = total
        self.first = asyncio.Event()
        self.done = asyncio.Event()

    async def __call__(self, job: Job) -> None:
        key = job.payload["key"]
        self.overlaps += key in self.running
        self.running[key] = self.running.get(key, 0) + 1
        self.started.setdefault(key, []).append(str(job.message_id))
        self.most_keys = max(self.most_keys, len(self.running))
        await asyncio.sleep(JOB_S)
        self.running[key] -= 1
        if not self.running[key]:
            del self.running[key]
        self.count += 1
        self.first.set()
        if self.count == self._total:
            self.done.set()


async def run(keyed: bool, keys: int, per_key: int) -> dict[str, Any]:
    """Enqueue keys x per_key jobs (interleaved by key), then time one worker running them."""
    queue = run_name("keys" if keyed else "nokeys", "quorum")
    settings = worker_settings(queue, "quorum", 32, journal="off")
    total = keys * per_key
    ids = [(f"k{k}", f"k{k}-{i}") for i in range(per_key) for k in range(keys)]
    connection = await aio_pika.connect(URL)
    try:
        async with ricochet_queue(connection, settings):
            runs = Runs(total)
            lifecycle = Lifecycle()
            with capture_logs():
                task = asyncio.create_task(
                    Worker(settings, Invoker(runs, 30), Metrics(queue), lifecycle).serve()
                )
                async with Client(URL, queue) as client:
                    # The first job declares the lanes, and the worker finds them.
                    key, job_id = ids[0]
                    await client.enqueue(
                        "work", {"key": key}, message_id=job_id, key=key if keyed else None
                    )
                    await asyncio.wait_for(runs.first.wait(), 30)
                    began = time.monotonic()
                    for start in range(1, total, ENQUEUE_WINDOW):
                        await asyncio.gather(
                            *(
                                client.enqueue(
                                    "work",
                                    {"key": key},
                                    message_id=job_id,
                                    key=key if keyed else None,
                                )
                                for key, job_id in ids[start : start + ENQUEUE_WINDOW]
                            )
                        )
                await asyncio.wait_for(runs.done.wait(), 600)
                took_s = time.monotonic() - began
                lifecycle.request_stop()
                await task
    finally:
        await connection.close()
    in_order = all(
        line == [job_id for key, job_id in ids if key == k] for k, line in runs.started.items()
    )
    return {
        "keys": keyed,
        "jobs": total - 1,
        "run_s": round(took_s, 2),
        "jobs_per_s": round((total - 1) / took_s, 1),
        "most_keys_at_once": runs.most_keys,
        "overlaps": runs.overlaps,
        "each_key_in_order": in_order,
    }


async def main(keys: int, per_key: int) -> None:
    rows = []
    for keyed in (False, True):
        row = await run(keyed, keys, per_key)
        rows.append(row)
        print(
            f"{'with keys' if keyed else 'no keys':<10} {row['jobs']} jobs in {row['run_s']} s:"
            f" {row['jobs_per_s']} jobs/s; most keys at once {row['most_keys_at_once']},"
            f" overlaps {row['overlaps']}, each key in order {row['each_key_in_order']}",
            flush=True,
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--per-key", type=int, default=20)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.keys, arguments.per_key))
