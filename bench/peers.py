"""Worker processes beside the peers (`python -m bench.peers`): three job shapes, each run by
ricochet with 1 and 2 processes, Celery's prefork pool (-c 2) and Dramatiq (-p 2), acked after
the job, in one run with the sides interleaved; jobs per second over the jobs that end once the
fill is done, and over all of them.

Each run starts the consumer as its users start it on a queue of its own, waits until every
process of it consumes, publishes the jobs, waits for every job's end in the run's journal,
stops the consumer and deletes the queue. The fill runs in this process, beside the workers on
the same cores, and each side fills with its own library (ricochet's with publisher confirms,
the peers' without, as their defaults are): while it runs, the figure measures the producer too,
so the budgets are judged on the jobs that end after it.
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import aio_pika

from bench.harness import ROOT, URL, worker_settings
from bench.stats import median

OUT = ROOT / "bench" / "results" / "peers"


@dataclass(frozen=True)
class Shape:
    """A job shape: ricochet's handler, the peers' task name (None: the peers have no async
    tasks), and how many jobs a run takes."""

    handler: str
    task: str | None
    jobs: int


SHAPES = {
    "sync, ~2 ms of CPU": Shape("bench.peer_jobs:cpu", "cpu", 3_000),
    "sync, blocks 20 ms": Shape("bench.peer_jobs:blocking", "blocking", 2_000),
    "async, awaits 20 ms": Shape("bench.peer_jobs:awaiting", None, 8_000),
}
SIDES = ["ricochet, 1 process", "ricochet, 2 processes", "Celery prefork -c 2", "Dramatiq -p 2"]


@dataclass(frozen=True)
class Result:
    shape: str
    side: str
    round: int
    jobs: int
    jobs_per_s: float  # over the jobs that ended once the fill was done
    after_fill: int  # how many those were
    whole_jobs_per_s: float  # from the first job's end to the last, the fill's time included


# The consumers each side has on its queue once every process of it takes jobs (Celery's main
# process consumes for its pool).
CONSUMERS = dict(zip(SIDES, [1, 2, 1, 2], strict=True))


async def consuming(queue: str, consumers: int, process: asyncio.subprocess.Process) -> None:
    """Until the side's processes all consume its queue: jobs are published only then, so no
    side's figure counts one process working alone while another still starts."""
    connection = await aio_pika.connect(URL)
    async with connection:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.returncode is None:
            channel = await connection.channel()
            try:
                declared = await channel.declare_queue(queue, passive=True)
                if (declared.declaration_result.consumer_count or 0) >= consumers:
                    return
                await channel.close()
            except aio_pika.exceptions.ChannelNotFoundEntity:
                pass  # the channel is closed by the broker
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{queue}: fewer than {consumers} consumers after 60 s")


async def fill_ricochet(queue: str, shape: Shape, jobs: int) -> None:
    """The jobs, published persistent with confirms to ricochet's queue."""
    connection = await aio_pika.connect(URL)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        body = json.dumps({"shape": shape.handler}).encode()
        for start in range(0, jobs, 500):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=queue,
                    )
                    for _ in range(start, min(start + 500, jobs))
                )
            )


def fill_celery(queue: str, shape: Shape, jobs: int) -> None:
    from bench.peer_celery import app

    assert shape.task is not None
    with app.producer_or_acquire() as producer:
        for _ in range(jobs):
            app.send_task(shape.task, queue=queue, producer=producer)


def fill_dramatiq(queue: str, shape: Shape, jobs: int) -> None:
    import dramatiq

    from bench.peer_dramatiq import broker

    assert shape.task is not None
    for _ in range(jobs):
        broker.enqueue(
            dramatiq.Message(
                queue_name=queue, actor_name=shape.task, args=(), kwargs={}, options={}
            )
        )


def command(side: str, queue: str, shape: Shape) -> tuple[list[str], dict[str, str]]:
    """The consumer as its users start it, and its environment."""
    python = sys.executable
    if side.startswith("ricochet"):
        env = {
            "RICOCHET_AMQP_URL": URL,
            "RICOCHET_QUEUE": queue,
            "RICOCHET_QUEUE_TYPE": "classic",
            "RICOCHET_HANDLER": shape.handler,
            "RICOCHET_PROCESSES": "2" if "2" in side else "1",
            "RICOCHET_HTTP_PORT": "0",
        }
        return [python, "-m", "ricochet", "worker"], env
    if side.startswith("Celery"):
        args = ["-m", "celery", "-A", "bench.peer_celery", "worker", "-P", "prefork", "-c", "2"]
        quiet = ["--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"]
        return [python, *args, "-Q", queue, *quiet], {}
    return [python, "-m", "dramatiq", "bench.peer_dramatiq", "-p", "2", "-Q", queue], {}


async def delete_queues(queue: str) -> None:
    """The run's queue and what its side declared beside it: ricochet's own topology (not the
    objects the vhost's queues share), Dramatiq's delay and dead-letter queues, Celery's
    exchange."""
    from ricochet.broker.plan import plan

    declared = plan(worker_settings(queue, "classic", 32))
    queues = [*declared.queues, *declared.tiers, *declared.lanes]
    names = {queue, f"{queue}.DQ", f"{queue}.XQ", declared.names.record, *(q.name for q in queues)}
    connection = await aio_pika.connect(URL)
    async with connection:
        channel = await connection.channel()
        for name in sorted(names):
            await channel.queue_delete(name)
        # Celery's exchange is named after its queue.
        for name in [queue, *(name for name, _, _ in declared.exchanges)]:
            await channel.exchange_delete(name)


def ended(journal: Path) -> list[float]:
    if not journal.exists():
        return []
    return [float(line) for line in journal.read_text().split("\n")[:-1]]


async def run_one(shape_name: str, side: str, jobs: int, round_: int) -> Result:
    shape = SHAPES[shape_name]
    queue = f"bench.peers.{uuid.uuid4().hex[:8]}"
    fills: dict[str, Callable[[str, Shape, int], None]] = {
        "Celery": fill_celery,
        "Dramatiq": fill_dramatiq,
    }
    with tempfile.TemporaryDirectory() as folder:
        journal = Path(folder) / "journal"
        args, env = command(side, queue, shape)
        inherited = {k: v for k, v in os.environ.items() if k != "RICOCHET_BENCH_AMQP_URL"}
        env = {
            **inherited,
            **env,
            "BENCH_AMQP_URL": URL,
            "BENCH_QUEUE": queue,
            "BENCH_JOURNAL": str(journal),
            "PYTHONPATH": str(ROOT),
        }
        output = os.environ.get("BENCH_LOG", os.devnull)
        with Path(output).open("a") as sink:  # noqa: ASYNC230 (opening a log file)
            process = await asyncio.create_subprocess_exec(
                *args, cwd=ROOT, env=env, start_new_session=True, stdout=sink, stderr=sink
            )
        try:
            await consuming(queue, CONSUMERS[side], process)
            if side.startswith("ricochet"):
                await fill_ricochet(queue, shape, jobs)
            else:
                await asyncio.to_thread(fills[side.split()[0]], queue, shape, jobs)
            filled_at = time.time()
            deadline = time.monotonic() + 60 + jobs * 0.05
            while len(times := ended(journal)) < jobs:
                if process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{side}: {len(times)} of {jobs} jobs ended")
                await asyncio.sleep(0.1)
        finally:
            await stop(process)
            await delete_queues(queue)
    times.sort()
    after = [at for at in times if at > filled_at]
    if len(after) < jobs // 4:
        raise RuntimeError(f"{side}: only {len(after)} of {jobs} jobs ended after the fill")
    return Result(
        shape_name,
        side,
        round_,
        jobs,
        (len(after) - 1) / (after[-1] - after[0]),
        len(after),
        (jobs - 1) / (times[-1] - times[0]),
    )


async def stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the consumer's process group (its parent and pool), SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 30)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


def sides_of(shape: Shape) -> list[str]:
    return SIDES if shape.task is not None else SIDES[:2]


async def bench(rounds: int, scale: float) -> list[Result]:
    results = []
    for round_ in range(1, rounds + 1):
        for shape_name, shape in SHAPES.items():
            sides = sides_of(shape)
            for side in sides if round_ % 2 else reversed(sides):
                jobs = max(20, int(shape.jobs * scale))
                result = await run_one(shape_name, side, jobs, round_)
                print(
                    f"{shape_name:22} {side:24} round {round_}: {result.jobs_per_s:8,.0f} jobs/s"
                    f" ({result.after_fill} jobs after the fill; {result.whole_jobs_per_s:,.0f}"
                    " over all)"
                )
                results.append(result)
    return results


def table(results: list[Result], whole: bool = False) -> str:
    """Jobs per second after the fill (whole: over every job), each cell the rounds' median
    (every round's figure beside it)."""
    lines = ["| job shape | " + " | ".join(SIDES) + " |", "|---|" + "---:|" * len(SIDES)]
    for shape_name in SHAPES:
        cells = []
        for side in SIDES:
            rates = [
                r.whole_jobs_per_s if whole else r.jobs_per_s
                for r in results
                if (r.shape, r.side) == (shape_name, side)
            ]
            shown = " / ".join(f"{rate:,.0f}" for rate in rates)
            cells.append(f"{median(rates):,.0f} ({shown})" if rates else "-")
        lines.append(f"| {shape_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(results: list[Result]) -> list[str]:
    """The budgets: 2 processes >= 1.6x one and >= 0.9x the fastest peer on the CPU-bound shape;
    the I/O shapes ahead of every peer at the same process count."""

    def rate(shape: str, side: str) -> float | None:
        rates = [r.jobs_per_s for r in results if (r.shape, r.side) == (shape, side)]
        return median(rates) if rates else None

    cpu, out = "sync, ~2 ms of CPU", []
    one, two = rate(cpu, SIDES[0]), rate(cpu, SIDES[1])
    peers = [rate(cpu, side) or 0.0 for side in SIDES[2:]]
    if one and two:
        out.append(f"CPU-bound, 2 processes / 1: {two / one:.2f} (budget 1.6)")
        out.append(f"CPU-bound, 2 processes / fastest peer: {two / max(peers):.2f} (budget 0.9)")
    for shape in ("sync, blocks 20 ms", "async, awaits 20 ms"):
        ours = rate(shape, SIDES[1]) or 0.0
        best = max((rate(shape, side) or 0.0 for side in SIDES[2:]), default=0.0)
        if best:
            out.append(f"{shape}, 2 processes / fastest peer: {ours / best:.2f} (budget > 1.0)")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="share of each shape's jobs (0.05: a quick check)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="results folder")
    args = parser.parse_args(argv)
    results = asyncio.run(bench(args.rounds, args.scale))
    report = "\n".join(
        [
            "Jobs per second once the fill is done (the budgets):",
            "",
            table(results),
            "",
            *verdicts(results),
            "",
            "Jobs per second from the first job's end to the last, the fill's time included:",
            "",
            table(results, whole=True),
        ]
    )
    print("\n" + report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    (args.out / "table.md").write_text(report + "\n")


if __name__ == "__main__":
    main()
