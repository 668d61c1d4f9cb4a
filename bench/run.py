"""The benchmark driver: fills queues, runs the consumer processes, and reports (make bench)."""

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import psutil
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.handlers.invoker import Invoker
from ricochet.handlers.job import Job
from ricochet.names import SHARED, Names, delay_key
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.worker import Worker
from structlog.testing import capture_logs

from bench import wait
from bench.enqueue import enqueue_throughput
from bench.harness import (
    MB,
    ROOT,
    URL,
    Child,
    paced,
    publish,
    ricochet_queue,
    run_name,
    worker_settings,
)
from bench.queues import queues_bench
from bench.report import enqueue_table, evaluate, evaluate_wait, print_table, queues_table
from bench.stats import median, paired_ratios, percentile
from bench.wait_handlers import TYPE_LADDER_MS

# scenario -> (handler, the outcome the worker counts, the raw loop doing the same broker work)
SCENARIOS: dict[str, tuple[str, str, str]] = {
    "happy": ("bench.handlers:noop", "succeeded", "raw"),
    "retry": ("bench.handlers:fail_once", "succeeded", "raw-retry"),
    "failure": ("bench.handlers:fail", "failed", "raw-failure"),
    # The retry path through a jittered tier (RICOCHET_RETRY_JITTER=0.5: lanes and a random
    # exchange), against the raw loop nacking into the same lanes.
    "retry-jitter": ("bench.handlers:fail_once", "succeeded", "raw-retry-jitter"),
    # The retry path on a type's own ladder (SPEC 21): the retry waits in the shared delay levels,
    # against the raw loop publishing the job into the level of the same delay, then acking.
    "retry-type-ladder": ("bench.wait_handlers:laddered", "succeeded", "raw-retry-delay"),
}
# The raw loops (bench.child raw --mode): consume and ack; nack once then ack; copy then ack.
RAW = {
    "raw": "ack",
    "raw-retry": "retry",
    "raw-retry-jitter": "retry",
    "raw-retry-delay": "delay",
    "raw-failure": "fail",
    "raw-multiple": "ack",
}
JITTER = 0.5  # the jittered scenarios' RICOCHET_RETRY_JITTER
# Variants: NAME-no-otel runs the worker with opentelemetry not importable (as without the
# otel extra), which every full run measures beside the happy path (installed, no tracer
# configured: the default), and NAME-warnings runs it with RICOCHET_LOG_LEVEL=WARNING (no log
# line per successful job), the row beside the default INFO that shows what the line costs.
# Only on request (--scenarios): NAME-uvloop runs the worker on uvloop, NAME@base runs the app/
# of another checkout (--base-src), raw-multiple acks the raw loop's deliveries prefetch/2 at a
# time with multiple=True.
NO_OTEL = "-no-otel"
WARNINGS = "-warnings"
# NAME-no-journal runs the worker with RICOCHET_JOURNAL=off: what the journal costs.
NO_JOURNAL = "-no-journal"
# The happy path's variants beside it, so that each run of a repeat sits next to what it is
# compared with (run_order).
FULL_RUN_SCENARIOS = [
    "happy",
    f"happy{NO_OTEL}",
    f"happy{WARNINGS}",
    f"happy{NO_JOURNAL}",
    "retry",
    "failure",
    "retry-jitter",
    "retry-type-ladder",
]
DELAY_TIERS_MS = (100, 1000, 5000)  # 100 ms * 10^(k-1), capped at 5 s


@dataclass
class Config:
    """How much to run; the defaults make a full run of 20-25 minutes on a 2-core machine."""

    jobs: int = 10_000
    repeats: int = 5
    memory_jobs: int = 100_000
    delay_s: float = 20.0
    probes_per_s: float = 50.0
    load_per_s: float = 500.0
    prefetch: int = 32
    queue_types: list[str] = field(default_factory=lambda: ["quorum", "classic"])
    scenarios: list[str] = field(default_factory=lambda: list(FULL_RUN_SCENARIOS))
    parts: list[str] = field(
        default_factory=lambda: ["delay", "memory", "outage", "enqueue", "wait", "queues"]
    )
    enqueue_jobs: int = 2_000
    base_src: Path | None = None
    out: Path = ROOT / "bench" / "results"


async def throughput(
    connection: AbstractConnection, channel: AbstractChannel, cfg: Config, scenario: str, qt: str
) -> tuple[float, float]:
    """Jobs per second, and consumer CPU microseconds per job, on a queue pre-filled with jobs.

    Every consumer, raw or not, reads a queue declared with ricochet's topology for the same
    settings, so the raw loops' nacks and copies take the routes the worker's take.
    """
    queue = run_name(scenario, qt)
    name = base_name(scenario)
    handler, outcome, _ = SCENARIOS.get(name, SCENARIOS["happy"])
    retry: dict[str, Any] = {"max_retries": 1, "retry_delay_ms": 10}
    if "jitter" in scenario:
        retry["retry_jitter"] = JITTER
    settings = worker_settings(queue, qt, cfg.prefetch, handler=handler, **retry)
    async with ricochet_queue(connection, settings) as env:
        await publish(channel, queue, 0, cfg.jobs)
        if name in RAW:
            args = raw_args(settings, RAW[name])
            env = {}
            if name == "raw-multiple":
                args.append(f"--ack-every={cfg.prefetch // 2}")
        else:
            args = ["ricochet", f"--outcome={outcome}"]
            args += ["--uvloop"] if scenario.endswith("-uvloop") else []
            args += ["--no-otel"] if scenario.endswith(NO_OTEL) else []
            if scenario.endswith(WARNINGS):
                env["RICOCHET_LOG_LEVEL"] = "WARNING"
            if scenario.endswith(NO_JOURNAL):
                env["RICOCHET_JOURNAL"] = "off"
            if scenario.endswith("@base"):
                env["BENCH_APP_SRC"] = str(cfg.base_src)
        done = await run_child([*args, f"--target={cfg.jobs}"], env, 60 + cfg.jobs / 100)
    return per_job(done, cfg.jobs)


def base_name(scenario: str) -> str:
    """happy@base, happy-uvloop, happy-warnings, happy-no-otel and happy-no-journal are
    variants of happy."""
    name = scenario.split("@")[0]
    for variant in ("-uvloop", WARNINGS, NO_OTEL, NO_JOURNAL):
        name = name.removesuffix(variant)
    return name


def raw_twin(scenario: str) -> str:
    """The raw loop that does a scenario's broker work; the ack loop for the raw loops."""
    return SCENARIOS[base_name(scenario)][2] if base_name(scenario) in SCENARIOS else "raw"


def run_order(scenarios: list[str]) -> list[str]:
    """One repeat's runs: the ack loop, then each scenario right after its raw twin.

    A ratio pairs a scenario's run with its twin's run of the same repeat. Run next to each
    other, both meet the same state of the broker and the machine, which drift over a full run
    (quorum queues of earlier runs being cleaned up, other load); the driver reverses the order
    every other repeat, so neither side of a pair always goes first.
    """
    order = ["raw"]
    for name in scenarios:
        order += [raw_twin(name), name]
    return list(dict.fromkeys(order))


def raw_args(settings: Settings, mode: str) -> list[str]:
    return [
        "raw",
        f"--url={URL}",
        f"--queue={settings.queue}",
        f"--prefetch={settings.prefetch}",
        f"--mode={mode}",
        # The failure path's broker work: the copy to Q.failed, then the notice to Q.failed.events.
        f"--copy-to={Names(settings.queue).failed}",
        f"--copy-to={Names(settings.queue).events}",
        # The retry on a type's ladder: the copy into the delay level of its wait.
        f"--delay-exchange={SHARED.delay_entry}",
        f"--delay-key={delay_key(TYPE_LADDER_MS, settings.queue)}",
    ]


def per_job(done: dict[str, Any], jobs: int) -> tuple[float, float]:
    return jobs / float(done["seconds"]), float(done["cpu_s"]) / jobs * 1e6


async def run_child(args: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    child = await Child.start(args, env)
    try:
        await child.expect("ready", 60)
        return await child.expect("done", timeout_s)
    finally:
        await child.stop()


async def delay_accuracy(
    connection: AbstractConnection, channel: AbstractChannel, cfg: Config, qt: str, consumer: str
) -> dict[str, Any]:
    """Observed minus configured delay per tier (ms), while the consumer handles load jobs.

    Probes are published for cfg.delay_s; the load goes on until the last of them has been
    through the 5 s tier, so every tier is measured under the same load.
    """
    settings = worker_settings(
        run_name(f"delay-{consumer}", qt),
        qt,
        cfg.prefetch,
        handler="bench.handlers:probe",
        max_retries=len(DELAY_TIERS_MS),
        retry_delay_ms=DELAY_TIERS_MS[0],
        retry_delay_multiplier=10,
        retry_delay_max_ms=DELAY_TIERS_MS[-1],
    )
    load_s = cfg.delay_s + sum(DELAY_TIERS_MS) / 1000 + 1
    streams = {
        "load": (cfg.load_per_s, int(cfg.load_per_s * load_s)),
        "probe": (cfg.probes_per_s, int(cfg.probes_per_s * cfg.delay_s)),
    }
    target = sum(total for _, total in streams.values())
    async with ricochet_queue(connection, settings) as env:
        if consumer == "raw":
            args, env = raw_args(settings, "probe"), {}
        else:
            args = ["ricochet"]
        child = await Child.start([*args, f"--target={target}"], env)
        try:
            await child.expect("ready", 60)
            await paced(channel, settings.queue, streams)
            done = await child.expect("done", 60)
        finally:
            await child.stop()
    tiers: dict[str, Any] = {}
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
    order = run_order(cfg.scenarios)
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
            result[name].update(ratio_to(values, rates["raw"], "ratio"))
        if (twin := raw_twin(name)) != "raw":
            result[name].update(ratio_to(values, rates[twin], "same_work_ratio"))
        if (untraced := name + NO_OTEL) in rates:  # tracing installed but off, against absent
            result[name].update(ratio_to(values, rates[untraced], "tracing_off_ratio"))
    return result


def ratio_to(values: list[float], baseline: list[float], key: str) -> dict[str, Any]:
    ratios = paired_ratios(values, baseline)
    return {f"{key}s": [round(x, 3) for x in ratios], key: round(median(ratios), 3)}


def cpu_times() -> list[int]:
    """The machine's CPU time so far by kind (user, nice, system, idle, iowait, irq, softirq,
    steal), from /proc/stat; empty where there is none."""
    with contextlib.suppress(OSError):
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return []


def steal_pct(before: list[int], after: list[int]) -> float | None:
    """The share of CPU time the hypervisor gave to other guests between two readings."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent)
    return round(100 * spent[7] / total, 1) if len(spent) == 8 and total else None


def machine(connection: AbstractConnection) -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    assert connection.transport is not None, "measured on an open connection"
    server = getattr(connection.transport.connection, "server_properties", {}) or {}
    version = server.get("version", "unknown")
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(psutil.virtual_memory().total / 1024**3),
        "os": platform.platform(),
        "python": platform.python_version(),
        "aio_pika": aio_pika.__version__,
        "opentelemetry_api": _version("opentelemetry-api"),
        "rabbitmq": version.decode() if isinstance(version, bytes) else str(version),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _version(distribution: str) -> str | None:
    """An installed distribution's version; None when it is not installed."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(distribution)
    return None


OUTAGE_JOBS = 500
OUTAGE_DOWN_S = 20.0
# The outage scenario: a dependency down for longer than the whole retry ladder
# (100 + 200 + 400 ms), with pausing off and on.
OUTAGE_LADDER: dict[str, Any] = {"max_retries": 3, "retry_delay_ms": 100, "prefetch": 8}
OUTAGE_PAUSING: dict[str, Any] = {
    "pause_failure_ratio": 0.5,
    "pause_min_jobs": 20,
    "pause_window_s": 10,
    "pause_s": 5,
}


class Dependency:
    """A handler whose downstream service is down until brought up."""

    def __init__(self) -> None:
        self.up = False
        self.done = 0

    async def __call__(self, job: Job) -> None:
        if not self.up:
            raise ConnectionError("benchmark: the dependency is down")
        self.done += 1


async def outage(
    connection: AbstractConnection, channel: AbstractChannel, qt: str, pausing: bool
) -> dict[str, Any]:
    """One run: jobs published, the dependency down, then up until every job settled."""
    queue = run_name("outage-pausing" if pausing else "outage", qt)
    settings = worker_settings(queue, qt, **OUTAGE_LADDER, **(OUTAGE_PAUSING if pausing else {}))
    dependency = Dependency()
    async with ricochet_queue(connection, settings):
        lifecycle = Lifecycle()
        invoker = Invoker(dependency, settings.handler_timeout_s)
        with capture_logs() as lines:
            task = asyncio.create_task(Worker(settings, invoker, Metrics(queue), lifecycle).serve())
            await publish(channel, queue, 0, OUTAGE_JOBS)
            await asyncio.sleep(OUTAGE_DOWN_S)
            dependency.up = True
            recovered = time.monotonic()
            failed_queue = await channel.declare_queue(Names(queue).failed, passive=True)
            while True:
                failed = failed_queue.declaration_result.message_count or 0
                if dependency.done + failed >= OUTAGE_JOBS:
                    break
                await asyncio.sleep(0.1)
                failed_queue = await channel.declare_queue(Names(queue).failed, passive=True)
            drain_s = time.monotonic() - recovered
            lifecycle.request_stop()
            await task
    return {
        "jobs": OUTAGE_JOBS,
        "down_s": OUTAGE_DOWN_S,
        "failed": failed,
        "saved": OUTAGE_JOBS - failed,
        "drain_after_recovery_s": round(drain_s, 1),
        "pauses": sum(1 for line in lines if "paused" in line["event"]),
    }


async def outages(
    connection: AbstractConnection, channel: AbstractChannel, qt: str
) -> dict[str, Any]:
    result = {}
    for pausing in (False, True):
        name = "pausing" if pausing else "no_pausing"
        result[name] = await outage(connection, channel, qt, pausing)
        print(f"  {qt:8} outage {name:10} {result[name]}", flush=True)
    return result


def _settings_for(queue: str, qt: str, prefetch: int = 32, **overrides: Any) -> Settings:
    return worker_settings(queue, qt, prefetch, **overrides)


async def waits(
    connection: AbstractConnection, channel: AbstractChannel, cfg: Config, qt: str
) -> dict[str, Any]:
    """The herd with each jitter, then scheduled and RetryLater probes under load."""
    result: dict[str, Any] = {"herd": []}
    for jitter in wait.HERD_JITTERS:
        run = await wait.herd(connection, channel, _settings_for, qt, jitter)
        print(
            f"  {qt:8} herd jitter {jitter}: waits p10 {run['wait_p10_s']} s, "
            f"p90 {run['wait_p90_s']} s, at most {run['most_back_in_one_bin']} back in "
            f"{wait.HERD_BIN_S} s",
            flush=True,
        )
        result["herd"].append(run)
    print(f"  {qt:8} schedules and RetryLater under {cfg.load_per_s:.0f} jobs/s", flush=True)
    result["lateness"] = await wait.lateness(connection, channel, cfg, _settings_for, qt)
    return result


async def enqueues(connection: AbstractConnection, cfg: Config, qt: str) -> dict[str, Any]:
    """Enqueue throughput of the Client and SyncClient beside a raw confirmed publish."""
    print(f"  {qt:8} enqueue, {cfg.enqueue_jobs} jobs a run", flush=True)
    settings = worker_settings(run_name("enqueue", qt), qt, cfg.prefetch)
    async with ricochet_queue(connection, settings):
        return await enqueue_throughput(
            URL, connection, settings.queue, cfg.enqueue_jobs, cfg.repeats, qt
        )


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
        started, cpu_before = time.monotonic(), cpu_times()
        for qt in cfg.queue_types:
            tp = await throughputs(connection, channel, cfg, qt) if cfg.scenarios else {}
            results["queue_types"][qt] = {"throughput": tp}
            if "delay" in cfg.parts:
                print(
                    f"  {qt:8} retry delays under {cfg.load_per_s:.0f} jobs/s of load", flush=True
                )
                results["queue_types"][qt]["delay"] = {
                    "load_jobs_per_s": round(cfg.load_per_s),
                    **{
                        consumer: await delay_accuracy(connection, channel, cfg, qt, consumer)
                        for consumer in ("raw", "ricochet")
                    },
                }
            if "enqueue" in cfg.parts:
                results["queue_types"][qt]["enqueue"] = await enqueues(connection, cfg, qt)
            if "outage" in cfg.parts:
                results["queue_types"][qt]["outage"] = await outages(connection, channel, qt)
            if "memory" in cfg.parts:
                print(f"  {qt:8} memory over {cfg.memory_jobs} jobs", flush=True)
                results["queue_types"][qt]["memory"] = await memory(channel, connection, cfg, qt)
            if "wait" in cfg.parts:
                results["queue_types"][qt]["wait"] = await waits(connection, channel, cfg, qt)
            if "queues" in cfg.parts:
                print(f"  {qt:8} one worker of 5 queues, 5 workers of one queue", flush=True)
                results["queue_types"][qt]["queues"] = await queues_bench(cfg.repeats, cfg.jobs, qt)
        results["seconds"] = round(time.monotonic() - started)
        results["machine"]["cpu_steal_pct"] = steal_pct(cpu_before, cpu_times())
        return results
    finally:
        await connection.close()


# The parts a flag runs alone (--outage, ...), into a folder of their own: part -> the throughput
# scenarios run with it.
ALONE: dict[str, tuple[str, ...]] = {
    "outage": (),
    "wait": ("retry-jitter", "retry-type-ladder"),
    "enqueue": (),
    "queues": (),
}


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: a three-minute check")
    parser.add_argument("--jobs", type=int, help="jobs per throughput run (default 10000)")
    parser.add_argument("--repeats", type=int, help="runs of each scenario (default 5)")
    parser.add_argument("--memory-jobs", type=int, help="jobs for the RSS measurement (100000)")
    parser.add_argument("--delay-s", type=float, help="seconds of probes (default 20)")
    parser.add_argument("--load", type=float, help="jobs/s of load under the probes (500)")
    parser.add_argument("--queue-types", help="comma-separated (default quorum,classic)")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument(
        "--scenarios",
        help="A/B of throughput scenarios only, e.g. happy,happy-uvloop or happy,happy@base",
    )
    parser.add_argument(
        "--outage", action="store_true", help="only the outage scenario (pausing off and on)"
    )
    parser.add_argument(
        "--enqueue", action="store_true", help="only the enqueue scenarios (Client, SyncClient)"
    )
    parser.add_argument("--enqueue-jobs", type=int, help="jobs per enqueue run (default 2000)")
    parser.add_argument("--base-src", type=Path, help="the checkout whose app/ NAME@base runs")
    parser.add_argument(
        "--queues",
        action="store_true",
        help="only one worker of 5 queues against 5 workers of one queue each",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="only the wait: the herd, the retry paths with jitter and on a type's ladder, "
        "the lateness of schedules, RetryLater and a type's ladder",
    )
    args = parser.parse_args(argv)
    cfg = Config()
    if args.quick:
        cfg = Config(
            jobs=2_000,
            repeats=3,
            memory_jobs=10_000,
            delay_s=5.0,
            enqueue_jobs=500,
            out=ROOT / "bench" / "results" / "quick",
        )
    for name in ("jobs", "repeats", "memory_jobs", "delay_s", "out", "base_src", "enqueue_jobs"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    if args.load is not None:
        cfg.load_per_s = args.load
    if args.scenarios:
        cfg.scenarios = args.scenarios.split(",")
        cfg.parts = []
        cfg.out = cfg.out / "ab"
    for part, scenarios in ALONE.items():
        if getattr(args, part):
            cfg.scenarios, cfg.parts = list(scenarios), [part]
            cfg.out = cfg.out / part
    if args.queue_types:
        cfg.queue_types = args.queue_types.split(",")
    return cfg


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    results = asyncio.run(bench(cfg))
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if "wait" in cfg.parts:
        from bench.chart import draw_herd  # matplotlib: the bench extra, which make bench installs

        draw_herd(results, cfg.out / "herd.png")
        for qt, r in results["queue_types"].items():
            for v in evaluate_wait(qt, r["wait"], r["throughput"]):
                print(f"{'met    ' if v['met'] else 'NOT MET'}  {qt:8} {v['target']}: {v['value']}")
    if cfg.parts == ["enqueue"]:
        print()
        print(enqueue_table(results))
        return
    if cfg.parts == ["queues"]:
        print()
        print(queues_table(results))
        return
    if cfg.parts != Config().parts or cfg.scenarios != FULL_RUN_SCENARIOS:
        print(json.dumps(results["queue_types"], indent=1))
        return
    results["targets"] = evaluate(results["queue_types"])
    (cfg.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    from bench.chart import draw  # as draw_herd above

    draw(results, cfg.out / "chart.png")
    print(f"\nwritten: {cfg.out / 'results.json'}, {cfg.out / 'chart.png'}")
