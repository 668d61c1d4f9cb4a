"""The benchmark driver: fills queues, runs the consumer processes, and reports (make bench)."""

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import psutil
from aio_pika.abc import AbstractChannel, AbstractConnection

from app.settings import Settings
from app.topology import declare
from bench.report import evaluate, print_table
from bench.stats import median, paired_ratios, percentile

ROOT = Path(__file__).resolve().parent.parent
URL = os.environ.get("RICOCHET_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
MB = 1024 * 1024

# scenario -> (handler, the outcome the worker counts); "raw" is the aio-pika loop.
SCENARIOS: dict[str, tuple[str, str]] = {
    "happy": ("bench.handlers:noop", "succeeded"),
    "retry": ("bench.handlers:fail_once", "succeeded"),
    "failure": ("bench.handlers:fail", "failed"),
}
# A/B variants, only on request (--scenarios): NAME-uvloop runs the worker on uvloop,
# NAME@base runs the app/ of another checkout (--base-src), raw-multiple acks the raw loop's
# deliveries prefetch/2 at a time with multiple=True.
DELAY_TIERS_MS = (100, 1000, 5000)  # 100 ms * 10^(k-1), capped at 5 s
PUBLISH_WINDOW = 500  # publishes in flight at once: confirms are pipelined, not awaited one by one
PACE_S = 0.05  # the delay scenario publishes its load in steps this long


@dataclass
class Config:
    """How much to run; the defaults make a full run of about ten minutes."""

    jobs: int = 10_000
    repeats: int = 5
    memory_jobs: int = 100_000
    delay_s: float = 10.0
    probes_per_s: float = 20.0
    load_share: float = 0.5
    prefetch: int = 32
    queue_types: list[str] = field(default_factory=lambda: ["quorum", "classic"])
    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    parts: list[str] = field(default_factory=lambda: ["delay", "memory"])
    base_src: Path | None = None
    out: Path = ROOT / "bench" / "results"


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
            env={**os.environ, **env},
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
    """The worker's settings: defaults (INFO JSON logs included), no HTTP server."""
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
    """The same settings as RICOCHET_* variables, the way a deployment passes them."""
    return {
        f"RICOCHET_{key.upper()}": str(value)
        for key, value in settings.model_dump().items()
        if value is not None
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
        for spec in [*p.queues, *p.tiers]:
            await channel.queue_delete(spec.name)
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


def run_name(scenario: str, queue_type: str) -> str:
    return f"bench.{scenario.replace('@', '-')}.{queue_type}.{uuid.uuid4().hex[:8]}"


async def throughput(
    connection: AbstractConnection, channel: AbstractChannel, cfg: Config, scenario: str, qt: str
) -> tuple[float, float]:
    """Jobs per second, and consumer CPU microseconds per job, on a queue pre-filled with jobs."""
    queue = run_name(scenario, qt)
    timeout_s = 60 + cfg.jobs / 100
    if scenario.startswith("raw"):
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": qt})
        try:
            await publish(channel, queue, 0, cfg.jobs)
            args = ["raw", f"--url={URL}", f"--queue={queue}", f"--prefetch={cfg.prefetch}"]
            if scenario == "raw-multiple":
                args.append(f"--ack-every={cfg.prefetch // 2}")
            done = await run_child([*args, f"--target={cfg.jobs}"], {}, timeout_s)
        finally:
            await channel.queue_delete(queue)
        return per_job(done, cfg.jobs)
    handler, outcome = SCENARIOS[scenario.split("@")[0].removesuffix("-uvloop")]
    retry = {"max_retries": 1, "retry_delay_ms": 10}
    settings = worker_settings(queue, qt, cfg.prefetch, handler=handler, **retry)
    async with ricochet_queue(connection, settings) as env:
        await publish(channel, queue, 0, cfg.jobs)
        args = ["ricochet", f"--target={cfg.jobs}", f"--outcome={outcome}"]
        args += ["--uvloop"] if scenario.endswith("-uvloop") else []
        if scenario.endswith("@base"):
            env["BENCH_APP_SRC"] = str(cfg.base_src)
        done = await run_child(args, env, timeout_s)
    return per_job(done, cfg.jobs)


def per_job(done: dict[str, Any], jobs: int) -> tuple[float, float]:
    return jobs / float(done["seconds"]), float(done["cpu_s"]) / jobs * 1e6


async def run_child(args: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    child = await Child.start(args, env)
    try:
        await child.expect("ready", 60)
        return await child.expect("done", timeout_s)
    finally:
        await child.stop()


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


async def delay_accuracy(
    connection: AbstractConnection, channel: AbstractChannel, cfg: Config, qt: str, load: float
) -> dict[str, Any]:
    """Observed minus configured delay per tier (ms), while the worker handles load jobs/s."""
    settings = worker_settings(
        run_name("delay", qt),
        qt,
        cfg.prefetch,
        handler="bench.handlers:probe",
        max_retries=len(DELAY_TIERS_MS),
        retry_delay_ms=DELAY_TIERS_MS[0],
        retry_delay_multiplier=10,
        retry_delay_max_ms=DELAY_TIERS_MS[-1],
    )
    streams = {
        "load": (load, int(load * cfg.delay_s)),
        "probe": (cfg.probes_per_s, int(cfg.probes_per_s * cfg.delay_s)),
    }
    target = sum(total for _, total in streams.values())
    async with ricochet_queue(connection, settings) as env:
        child = await Child.start(["ricochet", f"--target={target}"], env)
        try:
            await child.expect("ready", 60)
            await paced(channel, settings.queue, streams)
            done = await child.expect("done", 60 + sum(DELAY_TIERS_MS) / 1000)
        finally:
            await child.stop()
    tiers: dict[str, Any] = {"load_jobs_per_s": round(load)}
    for k, configured_ms in enumerate(DELAY_TIERS_MS, start=1):
        errors_ms = [s * 1000 - configured_ms for s in done["delays_s"][str(k)]]
        tiers[str(configured_ms)] = {
            "samples": len(errors_ms),
            "p50_ms": round(percentile(errors_ms, 50), 1),
            "p99_ms": round(percentile(errors_ms, 99), 1),
            "max_ms": round(max(errors_ms), 1),
        }
    return tiers


async def memory(
    channel: AbstractChannel, connection: AbstractConnection, cfg: Config, qt: str
) -> dict[str, Any]:
    """The worker's RSS once consuming and idle, and after cfg.memory_jobs no-op jobs."""
    settings = worker_settings(
        run_name("memory", qt), qt, cfg.prefetch, handler=SCENARIOS["happy"][0]
    )
    async with ricochet_queue(connection, settings) as env:
        child = await Child.start(["ricochet", f"--target={cfg.memory_jobs}"], env)
        try:
            await child.expect("ready", 60)
            await asyncio.sleep(2)
            idle = child.rss_bytes()
            await publish(channel, settings.queue, 0, cfg.memory_jobs)
            await child.expect("done", 120 + cfg.memory_jobs / 100)
            await asyncio.sleep(1)
            after = child.rss_bytes()
        finally:
            await child.stop()
    return {
        "jobs": cfg.memory_jobs,
        "idle_mb": round(idle / MB, 1),
        "after_mb": round(after / MB, 1),
        "growth_mb": round((after - idle) / MB, 1),
    }


async def throughputs(
    connection: AbstractConnection, channel: AbstractChannel, cfg: Config, qt: str
) -> dict[str, Any]:
    """Every scenario cfg.repeats times, interleaved, the order reversed every other repeat."""
    order = ["raw", *(s for s in cfg.scenarios if s != "raw")]
    rates: dict[str, list[float]] = {name: [] for name in order}
    cpu: dict[str, list[float]] = {name: [] for name in order}
    for r in range(cfg.repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            rate, cpu_us = await throughput(connection, channel, cfg, name, qt)
            rates[name].append(rate)
            cpu[name].append(cpu_us)
            print(
                f"  {qt:8} repeat {r + 1}/{cfg.repeats} {name:12} {rate:8.0f} jobs/s"
                f" {cpu_us:6.0f} CPU us/job",
                flush=True,
            )
    result: dict[str, Any] = {}
    for name, values in rates.items():
        result[name] = {
            "jobs_per_s": [round(v) for v in values],
            "median": round(median(values)),
            "cpu_us_per_job": round(median(cpu[name])),
        }
        if name != "raw":
            ratios = paired_ratios(values, rates["raw"])
            result[name]["ratios"] = [round(x, 3) for x in ratios]
            result[name]["ratio"] = round(median(ratios), 3)
    return result


def machine(connection: AbstractConnection) -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    server = getattr(connection.transport.connection, "server_properties", {}) or {}
    version = server.get("version", "unknown")
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(psutil.virtual_memory().total / 1024**3),
        "os": platform.platform(),
        "python": platform.python_version(),
        "aio_pika": aio_pika.__version__,
        "rabbitmq": version.decode() if isinstance(version, bytes) else str(version),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


async def bench(cfg: Config) -> dict[str, Any]:
    connection = await aio_pika.connect(URL)
    try:
        channel = await connection.channel(publisher_confirms=True)
        results: dict[str, Any] = {
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine(connection),
            "config": {k: v for k, v in asdict(cfg).items() if not isinstance(v, Path)},
            "queue_types": {},
        }
        started = time.monotonic()
        for qt in cfg.queue_types:
            tp = await throughputs(connection, channel, cfg, qt)
            results["queue_types"][qt] = {"throughput": tp}
            if "delay" in cfg.parts:
                load = cfg.load_share * tp["happy"]["median"]
                print(f"  {qt:8} retry delays under {load:.0f} jobs/s of load", flush=True)
                delays = await delay_accuracy(connection, channel, cfg, qt, load)
                results["queue_types"][qt]["delay"] = delays
            if "memory" in cfg.parts:
                print(f"  {qt:8} memory over {cfg.memory_jobs} jobs", flush=True)
                results["queue_types"][qt]["memory"] = await memory(channel, connection, cfg, qt)
        results["seconds"] = round(time.monotonic() - started)
        return results
    finally:
        await connection.close()


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: a one-minute check")
    parser.add_argument("--jobs", type=int, help="jobs per throughput run (default 10000)")
    parser.add_argument("--repeats", type=int, help="runs of each scenario (default 5)")
    parser.add_argument("--memory-jobs", type=int, help="jobs for the RSS measurement (100000)")
    parser.add_argument("--delay-s", type=float, help="seconds of probes and load (default 10)")
    parser.add_argument("--queue-types", help="comma-separated (default quorum,classic)")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument(
        "--scenarios",
        help="A/B of throughput scenarios only, e.g. happy,happy-uvloop or happy,happy@base",
    )
    parser.add_argument("--base-src", type=Path, help="the checkout whose app/ NAME@base runs")
    args = parser.parse_args(argv)
    cfg = Config()
    if args.quick:
        cfg = Config(
            jobs=2_000,
            repeats=3,
            memory_jobs=10_000,
            delay_s=3.0,
            out=ROOT / "bench" / "results" / "quick",
        )
    for name in ("jobs", "repeats", "memory_jobs", "delay_s", "out", "base_src"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    if args.scenarios:
        cfg.scenarios = args.scenarios.split(",")
        cfg.parts = []
        cfg.out = cfg.out / "ab"
    if args.queue_types:
        cfg.queue_types = args.queue_types.split(",")
    return cfg


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    results = asyncio.run(bench(cfg))
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if cfg.parts != ["delay", "memory"] or cfg.scenarios != list(SCENARIOS):
        print(json.dumps(results["queue_types"], indent=1))
        return
    results["targets"] = evaluate(results["queue_types"])
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    from bench.chart import draw

    draw(results, cfg.out / "chart.png")
    print(f"\nwritten: {cfg.out / 'results.json'}, {cfg.out / 'chart.png'}")
