"""What every benchmark shares, a leaf of bench/: the broker it runs on, queues declared with
ricochet's topology and filled with jobs, and the consumer processes (bench.child)."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import psutil
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.declare import declare
from ricochet.broker.plan import key_lanes_plan
from ricochet.settings import Settings, variable_name

ROOT = Path(__file__).resolve().parent.parent
BENCH_ENV = "RICOCHET_BENCH_"  # the driver's own settings
URL = os.environ.get(f"{BENCH_ENV}AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
MB = 1024 * 1024
PUBLISH_WINDOW = 500  # publishes in flight at once: confirms are pipelined, not awaited one by one
PACE_S = 0.01  # the delay scenario publishes in steps this long: a steady load, not bursts


class Child:
    """A consumer process (bench.child) that reports events on stdout."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self._process = process
        self.name = name
        self.pid = process.pid

    @classmethod
    async def start(cls, args: list[str], env: dict[str, str]) -> "Child":
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.child",
            *args,
            cwd=ROOT,
            # The worker refuses a RICOCHET_* variable it does not know, as the driver's own are.
            env={**{k: v for k, v in os.environ.items() if not k.startswith(BENCH_ENV)}, **env},
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process, args[0])

    async def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout_s)
        if not line:
            raise RuntimeError(f"{self.name} consumer exited (code {await self._process.wait()})")
        report: dict[str, Any] = json.loads(line)
        if report["event"] != event:
            raise RuntimeError(f"{self.name} consumer said {report}, expected {event}")
        return report

    def rss_bytes(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    async def stop(self) -> None:
        if self._process.returncode is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._process.wait(), 30)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()


def worker_settings(queue: str, queue_type: str, prefetch: int, **overrides: Any) -> Settings:
    """The worker's settings: defaults (INFO JSON logs, one line a job, as users run it), no
    HTTP server."""
    values: dict[str, Any] = {
        "amqp_url": URL,
        "queue": queue,
        "queue_type": queue_type,
        "prefetch": prefetch,
        "http_port": 0,
        **overrides,
    }
    return Settings(**values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The same settings as RICOCHET_* variables, the way a deployment passes them: those not at
    their default, so that an A/B run's older checkout is not given settings it does not know."""
    defaults = Settings.model_fields
    return {
        variable_name(key): ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        for key, value in settings.model_dump().items()
        if value is not None and value != defaults[key].default
    }


@contextlib.asynccontextmanager
async def ricochet_queue(
    connection: AbstractConnection, settings: Settings
) -> AsyncIterator[dict[str, str]]:
    """Declare ricochet's topology for the settings; delete all of it afterwards."""
    p = await declare(connection, settings)
    try:
        yield settings_env(settings)
    finally:
        channel = await connection.channel()
        keys = key_lanes_plan(settings.queue, settings.key_lanes, None)
        for spec in [*p.queues, *p.shared.queues, *p.tiers, *p.lanes, *keys.lanes]:
            await channel.queue_delete(spec.name)
        await channel.exchange_delete(keys.exchange.name)
        await channel.queue_delete(p.names.record)  # the settings the worker recorded
        for name, _, _ in p.exchanges:
            await channel.exchange_delete(name)
        await channel.close()


def job(queue: str, n: int, job_type: str = "bench") -> aio_pika.Message:
    return aio_pika.Message(
        json.dumps({"n": n}).encode(),
        message_id=f"{queue}.{job_type}.{n}",
        type=job_type,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


async def publish(
    channel: AbstractChannel, queue: str, first: int, count: int, job_type: str = "bench"
) -> None:
    """Publish persistent jobs, confirmed, PUBLISH_WINDOW confirms in flight at a time."""
    exchange = channel.default_exchange
    for start in range(first, first + count, PUBLISH_WINDOW):
        stop = min(start + PUBLISH_WINDOW, first + count)
        await asyncio.gather(
            *(exchange.publish(job(queue, n, job_type), queue) for n in range(start, stop))
        )


def spawn_workers(env: dict[str, str], workers: int) -> "list[subprocess.Popen[bytes]]":
    """`ricochet worker` processes with env, their output dropped."""
    return [
        subprocess.Popen(
            [sys.executable, "-m", "ricochet", "worker"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]


def run_name(scenario: str, queue_type: str) -> str:
    return f"bench.{scenario.replace('@', '-')}.{queue_type}.{uuid.uuid4().hex[:8]}"


async def paced(
    channel: AbstractChannel, queue: str, streams: dict[str, tuple[float, int]]
) -> None:
    """Publish each stream (job type -> rate per second, total) evenly, step by step."""
    started = time.monotonic()
    sent = dict.fromkeys(streams, 0)
    while any(sent[kind] < total for kind, (_, total) in streams.items()):
        elapsed_s = time.monotonic() - started
        for kind, (rate, total) in streams.items():
            due = min(total, int(rate * elapsed_s))
            await publish(channel, queue, sent[kind], due - sent[kind], kind)
            sent[kind] = due
        await asyncio.sleep(PACE_S)
