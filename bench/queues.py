"""One worker of five queues against five workers of one queue each (SPEC 19): the same jobs on
five queues (bench.queue_jobs: an async handler awaiting 5-20 ms), the queues' default prefetch,
each worker started as its users start it (`ricochet worker`, RICOCHET_QUEUES or
RICOCHET_QUEUE).

A run starts a side's workers, waits until each queue has its consumer, publishes the jobs
(each worker holds its prefetch of them at the gate, bench.queue_jobs), opens the gate and waits
for every job's end in the run's journal: jobs per second from the first job's end to the last.
Then, before the workers stop, the total RSS of the side's processes, and what the side holds
at the broker by the management API: the queues, exchanges and bindings its workers declared
(the objects every queue of a vhost shares, the delays' levels, the cancels and the orphans,
are the same for both sides and not counted), and its connections, channels and consumers.
"""

import asyncio
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import psutil
from ricochet.broker.management import Api, open_api, vhost

from bench.harness import MB, ROOT, URL, publish
from bench.peers import consuming, delete_queues, ended, stop
from bench.stats import median

QUEUES = 5
HANDLER = "bench.queue_jobs:awaiting"
MANAGEMENT_URL = os.environ.get("RICOCHET_BENCH_MANAGEMENT_URL", "http://127.0.0.1:15672/")
# side -> the queues of each of its worker processes, by their place among the run's queues
SIDES: dict[str, list[list[int]]] = {
    "one worker, 5 queues": [list(range(QUEUES))],
    "5 workers, one queue each": [[i] for i in range(QUEUES)],
}
# The management API lists a new connection or channel within its statistics interval (5 s).
LISTED_WITHIN_S = 15


def worker_env(queues: list[str], queue_type: str, journal: Path, gate: Path) -> dict[str, str]:
    """A worker's environment: its queue (or queues), nothing else of ricochet's inherited."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    consumed = {"RICOCHET_QUEUE": queues[0]} if len(queues) == 1 else {}
    return {
        **inherited,
        **(consumed or {"RICOCHET_QUEUES": ",".join(queues)}),
        "RICOCHET_AMQP_URL": URL,
        "RICOCHET_QUEUE_TYPE": queue_type,
        "RICOCHET_HANDLER": HANDLER,
        "RICOCHET_HTTP_PORT": "0",
        "BENCH_JOURNAL": str(journal),
        "BENCH_GATE": str(gate),
        "PYTHONPATH": str(ROOT),
    }


async def start(env: dict[str, str]) -> asyncio.subprocess.Process:
    output = os.environ.get("BENCH_LOG", os.devnull)
    with Path(output).open("a") as sink:  # noqa: ASYNC230 (opening a log file)
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ricochet",
            "worker",
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=sink,
            stderr=sink,
        )


async def run_side(side: str, queue_type: str, jobs: int) -> dict[str, Any]:
    """One run of a side on queues of its own, deleted afterwards."""
    stem = f"bench.queues.{uuid.uuid4().hex[:8]}"
    queues = [f"{stem}.{i + 1}" for i in range(QUEUES)]
    per_queue = jobs // QUEUES
    processes: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory() as folder:
        journal, gate = Path(folder) / "journal", Path(folder) / "gate"
        try:
            for places in SIDES[side]:
                mine = [queues[i] for i in places]
                processes.append(await start(worker_env(mine, queue_type, journal, gate)))
                for queue in mine:
                    await consuming(queue, 1, processes[-1])
            connection = await aio_pika.connect(URL)
            async with connection:
                channel = await connection.channel(publisher_confirms=True)
                for queue in queues:
                    await publish(channel, queue, 0, per_queue)
            gate.touch()
            total = per_queue * QUEUES
            deadline = asyncio.get_running_loop().time() + 60 + total * 0.01
            while len(times := ended(journal)) < total:
                if any(p.returncode is not None for p in processes):
                    raise RuntimeError(f"{side}: a worker exited")
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"{side}: {len(times)} of {total} jobs ended")
                await asyncio.sleep(0.1)
            memory = [psutil.Process(p.pid).memory_full_info() for p in processes]
            held = await broker_objects(stem, len(processes))
        finally:
            for process in processes:
                await stop(process)
            for queue in queues:
                await delete_queues(queue)
    times.sort()
    return {
        "jobs": total,
        "jobs_per_s": round((total - 1) / (times[-1] - times[0])),
        "rss_mb": round(sum(m.rss for m in memory) / MB, 1),
        "uss_mb": round(sum(m.uss for m in memory) / MB, 1),
        **held,
    }


async def broker_objects(stem: str, processes: int) -> dict[str, int]:
    """What the side holds at the broker: its queues', exchanges' and bindings' count (by the
    run's names), and its workers' connections, channels and consumers, once the API lists a
    connection of each process, a consumer of each queue, and the same figures a second later
    (its lists of channels and consumers lag behind the broker)."""
    host = vhost(URL)
    names = f"^{stem.replace('.', '[.]')}[.]"
    async with open_api(MANAGEMENT_URL, URL) as api:
        deadline = asyncio.get_running_loop().time() + LISTED_WITHIN_S
        before: dict[str, int] = {}
        while True:
            held = await _held(api, host, names, stem)
            listed = held == before and held["connections"] == processes
            listed = listed and held["queues_consumed"] == QUEUES
            if listed:
                return held
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"{stem}: the management API lists {held}, not all of it")
            before = held
            await asyncio.sleep(1)


async def _held(api: Api, host: str, names: str, stem: str) -> dict[str, int]:
    queues = await api.listing("queues", host, names, "name")
    exchanges = await api.listing("exchanges", host, names, "name")
    bindings = await api.get(f"bindings/{quote(host, safe='')}") or []
    # The workers' connections are named after their first queue (ricochet worker Q ...).
    connections = {
        c["name"]
        for c in await api.get("connections") or []
        if str(c.get("user_provided_name", "")).startswith(f"ricochet worker {stem}.")
    }
    channels = [
        c
        for c in await api.get("channels") or []
        if _details(c, "connection_details").get("name") in connections
    ]
    consumers = [
        c
        for c in await api.get(f"consumers/{quote(host, safe='')}") or []
        if _details(c, "channel_details").get("connection_name") in connections
    ]
    return {
        "queues": len(queues),
        "exchanges": len(exchanges),
        # The default exchange's implicit binding of each queue is not one the worker made.
        "bindings": sum(
            1
            for b in bindings
            if b["source"] and (b["source"].startswith(stem) or b["destination"].startswith(stem))
        ),
        "connections": len(connections),
        "channels": len(channels),
        "consumers": len(consumers),
        "queues_consumed": len(
            {c["queue"]["name"] for c in consumers if c["queue"]["name"].startswith(stem)}
        ),
    }


async def queues_bench(repeats: int, jobs: int, queue_type: str) -> dict[str, Any]:
    """Both sides, repeats times, interleaved, the order reversed every other repeat."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for r in range(repeats):
        for side in list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]:
            result = await run_side(side, queue_type, jobs)
            runs[side].append(result)
            print(
                f"  {queue_type:8} repeat {r + 1}/{repeats} {side:26}"
                f" {result['jobs_per_s']:8,} jobs/s {result['rss_mb']:7} MB RSS",
                flush=True,
            )
    return {side: summary(results) for side, results in runs.items()}


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A side's medians over its repeats (every repeat's rate beside them), and what it held
    at the broker in its last repeat."""
    rates = [r["jobs_per_s"] for r in results]
    return {
        "jobs": results[0]["jobs"],
        "jobs_per_s": rates,
        "median": round(median(rates)),
        "rss_mb": round(median([r["rss_mb"] for r in results]), 1),
        "uss_mb": round(median([r["uss_mb"] for r in results]), 1),
        "broker": {
            key: results[-1][key]
            for key in ("queues", "exchanges", "bindings", "connections", "channels", "consumers")
        },
    }


def _details(entry: dict[str, Any], key: str) -> dict[str, Any]:
    """A nested object of the management API's answer: RabbitMQ 3.10 gives an empty list, not an
    object, when it has none."""
    details = entry.get(key)
    return details if isinstance(details, dict) else {}
