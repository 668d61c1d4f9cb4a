"""The wait's benchmarks: the herd with and without jitter, the retry path with jitter on, and
how late scheduled jobs and RetryLater run under load (python -m bench --wait, and make bench)."""

import asyncio
import datetime as dt
import json
import time
from collections import defaultdict
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job
from ricochet.handlers.invoker import Invoker
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.worker.worker import Worker
from structlog.testing import capture_logs

from bench.harness import Child, paced, publish, ricochet_queue, run_name
from bench.probe import LADDER_TYPE, LATER_TYPE, PROBE_DELAYS_S, SCHEDULED_TYPE, ladder_type
from bench.stats import percentile

HERD_JOBS = 1000
HERD_DELAY_MS = 5000
HERD_JITTERS = (0.0, 0.5, 1.0)
HERD_BIN_S = 0.25
# The kinds of wait probed for lateness: a schedule, a RetryLater, a type's ladder (SPEC 21).
PROBE_KINDS = (SCHEDULED_TYPE, LATER_TYPE, LADDER_TYPE)


class Herd:
    """Fails every job's first attempt, and records when each failed and came back."""

    def __init__(self) -> None:
        self.failed_at: dict[str | None, float] = {}
        self.back_at: dict[str | None, float] = {}
        self.all_back = asyncio.Event()

    async def __call__(self, job: Job) -> None:
        if job.attempt == 1:
            self.failed_at[job.message_id] = time.monotonic()
            raise ConnectionError("benchmark: the dependency is down for everyone at once")
        self.back_at[job.message_id] = time.monotonic()
        if len(self.back_at) == HERD_JOBS:
            self.all_back.set()


async def herd(
    connection: AbstractConnection,
    channel: AbstractChannel,
    settings_for: Any,
    qt: str,
    jitter: float,
) -> dict[str, Any]:
    """1,000 jobs failing together into a 5 s tier: when they come back, after the first
    failure, as a histogram of 0.25 s bins."""
    queue = run_name(f"herd-{jitter}", qt)
    settings = settings_for(
        queue, qt, prefetch=HERD_JOBS, retry_delays_ms=str(HERD_DELAY_MS), retry_jitter=jitter
    )
    handler = Herd()
    async with ricochet_queue(connection, settings):
        lifecycle = Lifecycle()
        invoker = Invoker(handler, settings.handler_timeout_s)
        with capture_logs():
            task = asyncio.create_task(Worker(settings, invoker, Metrics(queue), lifecycle).serve())
            await publish(channel, queue, 0, HERD_JOBS)
            await handler.all_back.wait()
            lifecycle.request_stop()
            await task
    first = min(handler.failed_at.values())
    back = sorted(at - first for at in handler.back_at.values())
    waits = sorted(handler.back_at[m] - handler.failed_at[m] for m in handler.back_at)
    bins: dict[str, int] = defaultdict(int)
    for s in back:
        bins[f"{int(s / HERD_BIN_S) * HERD_BIN_S:.2f}"] += 1
    return {
        "jobs": HERD_JOBS,
        "delay_ms": HERD_DELAY_MS,
        "jitter": jitter,
        "failing_spread_s": round(max(handler.failed_at.values()) - first, 2),
        "back_s_histogram": dict(sorted(bins.items(), key=lambda kv: float(kv[0]))),
        "wait_p10_s": round(percentile(waits, 10), 3),
        "wait_p90_s": round(percentile(waits, 90), 3),
        "wait_min_s": round(waits[0], 3),
        "wait_max_s": round(waits[-1], 3),
        "most_back_in_one_bin": max(bins.values()),
    }


def probe(kind: str, n: int, delay_s: int) -> aio_pika.Message:
    """A scheduled probe (run-at delay_s from now), a RetryLater probe (asks for delay_s), or a
    probe of the type whose own ladder waits delay_s."""
    headers: dict[str, Any] = {"probe-delay-s": delay_s}
    if kind == SCHEDULED_TYPE:
        at = dt.datetime.fromtimestamp(time.time() + delay_s, dt.UTC)
        headers["run-at"] = at.isoformat()
    return aio_pika.Message(
        json.dumps({"n": n}).encode(),
        message_id=f"{kind}-{delay_s}-{n}",
        type=ladder_type(delay_s) if kind == LADDER_TYPE else kind,
        headers=headers,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


async def lateness(
    connection: AbstractConnection, channel: AbstractChannel, cfg: Any, settings_for: Any, qt: str
) -> dict[str, Any]:
    """How late scheduled, RetryLater and a type's ladder probes of 1, 10 and 60 s run, in a
    worker process busy with cfg.load_per_s jobs a second: p50 / p99 / max, seconds."""
    settings = settings_for(run_name("lateness", qt), qt, handler="bench.wait_handlers:probes")
    probes_per_delay = max(10, int(cfg.delay_s))  # one a second per delay and kind
    load_s = cfg.delay_s + max(PROBE_DELAYS_S) + 2
    load = int(cfg.load_per_s * load_s)
    target = load + len(PROBE_KINDS) * probes_per_delay * len(PROBE_DELAYS_S)
    async with ricochet_queue(connection, settings) as env:
        child = await Child.start(["ricochet", f"--target={target}"], env)
        try:
            await child.expect("ready", 60)
            probing = asyncio.create_task(_probes(channel, settings.queue, probes_per_delay))
            await paced(channel, settings.queue, {"load": (cfg.load_per_s, load)})
            await probing
            done = await child.expect("done", 120)
        finally:
            await child.stop()
    result: dict[str, Any] = {"load_jobs_per_s": round(cfg.load_per_s)}
    for key, late in sorted(done["lateness_s"].items()):
        result[key] = {
            "samples": len(late),
            "p50_s": round(percentile(late, 50), 3),
            "p99_s": round(percentile(late, 99), 3),
            "max_s": round(max(late), 3),
        }
    return result


async def _probes(channel: AbstractChannel, queue: str, per_delay: int) -> None:
    """One probe of each kind and delay a second, per_delay seconds long."""
    for n in range(per_delay):
        for delay_s in PROBE_DELAYS_S:
            for kind in PROBE_KINDS:
                await channel.default_exchange.publish(probe(kind, n, delay_s), queue)
        await asyncio.sleep(1)
