"""`ricochet waiting` over many waiting jobs (SPEC 23, 26): how long a look takes, how much memory
it uses, and how late it made the jobs that fell due while it looked (it reads the journal and the
tiers' depths, never a tier: nothing, by design; this measures it).

In a vhost of its own, made for it and deleted after:

1. the topology of a queue whose one tier waits SPREAD_S + LEAD_S;
2. N jobs go into the tier, paced over SPREAD_S, as the worker sends them there: each with the
   journal's `retrying` entry (PER_RECORD entries a record of the stream, as a worker at that
   pace writes them), and its due time in a header of the bench's own;
3. right after the Nth, `ricochet waiting --json` runs as a process: its wall time, its largest
   RSS (wait4), the jobs it listed; then the monitor (started before the jobs, its index
   following the journal) is asked `GET /api/waiting`, as the command asks it when
   RICOCHET_MONITOR_URL is set: how long it took, the jobs it listed; the first jobs fall due
   LEAD_S after the command started, and go on falling due while it reads;
4. retries go on coming at the same pace for KEEP_S more, as they would on a service whose
   tiers hold that many jobs: the look must account for a tier that jobs keep entering and
   leaving while it reads;
5. a consumer of the main queue takes every job as it comes back: how late each came, past its
   due time, for those due while the look ran and for the others.

The same jobs run first with no look, in a vhost made afresh: how late the broker alone brings
them back, beside what the look adds. With --unreached-limit, the vhost's tiers and levels get
the policy docs/waiting-jobs.md gives for RabbitMQ 3.10 (a delivery limit no job reaches, so that
a job handed back goes to the head of its queue).

    .venv/bin/python -m bench.waiting                  # 100,000 jobs
    .venv/bin/python -m bench.waiting --jobs 2000      # a quick look that it runs
    .venv/bin/python -m bench.waiting --per-record 1   # an entry a record: many idle workers
    .venv/bin/python -m bench.waiting --unreached-limit

The broker is RICOCHET_BENCH_AMQP_URL's host (default 127.0.0.1:5672, guest), its management API
RICOCHET_BENCH_MANAGEMENT_URL (default http://127.0.0.1:15672/).
"""

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

from ricochet.broker.journal import Entry, journal_record  # noqa: E402
from ricochet.broker.record import declare_recorded  # noqa: E402
from ricochet.headers import RETRIES  # noqa: E402
from ricochet.names import SHARED, Names  # noqa: E402
from ricochet.settings import Settings  # noqa: E402

from bench.cancels import fresh_vhost, management  # noqa: E402
from bench.journal import spawn_monitor  # noqa: E402

QUEUE = "bench-waiting"
VHOST = "ricochet-bench-waiting"
DUE = "bench-due-ms"
LEAD_S = 2.0  # the first job falls due this long after the look starts
KEEP_S = 20.0  # retries go on coming this long after the look starts
BATCH = 500
# A worker writes a record of the journal every WRITE_EVERY_S (0.1 s), of its entries since: one
# sending 3,333 jobs a second to a tier (the pace of 100,000 over 30 s) writes about 333 a record.
PER_RECORD = 333
RESULTS = ROOT / "bench" / "results" / "waiting.json"
REASON = "ConnectionError: payments API: 503 Service Unavailable"
# docs/waiting-jobs.md's policy for RabbitMQ 3.10, on the bench's tiers and the vhost's levels.
UNREACHED_LIMIT_POLICY = {
    "pattern": r"^(ricochet\.delay\.[0-9]+|.+\.retry\.[0-9]+(\.lane\.[0-9]+)?)$",
    "definition": {"delivery-limit": 1_000_000_000},
    "apply-to": "queues",
    "priority": 10,
}


def _total(n: int, spread_s: float) -> int:
    """The jobs of a run: n over spread_s, then as many a second for KEEP_S more."""
    return n + int(n * KEEP_S / spread_s)


async def _fill(url: str, n: int, spread_s: float, per_record: int, filled: asyncio.Event) -> None:
    """The run's jobs into the tier, n a spread_s, each with the journal's entry of its retry,
    per_record entries a record of the stream; filled is set once the nth is in."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    tier = Names(QUEUE).tier(1)
    wait_ms = int((spread_s + LEAD_S) * 1000)
    started, total = time.monotonic(), _total(n, spread_s)
    for start in range(0, total, BATCH):
        if start >= n:
            filled.set()
        ahead = started + spread_s * start / n - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
        now_ms = int(time.time() * 1000)
        ids = [f"job-{i}" for i in range(start, min(total, start + BATCH))]
        detail = {"tier": 1, "due_at_ms": now_ms + wait_ms, "reason": REASON}
        entries = [Entry(now_ms, "retrying", QUEUE, i, "payment.charge", 1, detail) for i in ids]
        publishes = [
            channel.default_exchange.publish(
                journal_record(entries[k : k + per_record]), SHARED.journal
            )
            for k in range(0, len(entries), per_record)
        ]
        for message_id in ids:
            job = aio_pika.Message(
                b'{"order": 1}',
                message_id=message_id,
                type="payment.charge",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                headers={RETRIES: 1, DUE: now_ms + wait_ms},
            )
            publishes.append(channel.default_exchange.publish(job, tier))
        await asyncio.gather(*publishes)
    filled.set()
    await connection.close()


async def _arrivals(url: str, n: int) -> list[tuple[float, float]]:
    """Take every job back from the main queue as it comes: (its due time, when it came) each,
    in epoch seconds."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=1000)
    came: list[tuple[float, float]] = []
    done = asyncio.Event()

    async def take(message: AbstractIncomingMessage) -> None:
        due_ms = (message.headers or {})[DUE]
        assert isinstance(due_ms, int)
        came.append((due_ms / 1000, time.time()))
        await message.ack()
        if len(came) >= n:
            done.set()

    await (await channel.get_queue(QUEUE, ensure=False)).consume(take)
    await done.wait()
    await connection.close()
    return came


def _env(url: str, **more: str) -> dict[str, str]:
    """A ricochet process's environment for the bench's queue and vhost."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    env.update(
        RICOCHET_AMQP_URL=url,
        RICOCHET_QUEUE=QUEUE,
        RICOCHET_MANAGEMENT_URL=os.environ.get(
            "RICOCHET_BENCH_MANAGEMENT_URL", "http://127.0.0.1:15672/"
        ),
        PYTHONPATH=f"{ROOT / 'app'}:{ROOT}",
        **more,
    )
    return env


def _monitor(url: str) -> tuple["subprocess.Popen[bytes]", str]:
    """`ricochet monitor` on the bench's vhost (its index follows the journal as the jobs come
    in), once it answers: the process and its address."""
    proc, base = spawn_monitor(_env(url))
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=1):
                return proc, base
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the monitor never answered")


def _ask_monitor(base: str) -> tuple[float, int, dict[str, int]]:
    """GET /api/waiting of the bench's queue, as `ricochet waiting` asks it with
    RICOCHET_MONITOR_URL set: (seconds, rows, unrecorded)."""
    started = time.time()
    with urllib.request.urlopen(f"{base}/api/waiting?queue={QUEUE}", timeout=120) as answer:
        listed = json.loads(answer.read())
    return time.time() - started, len(listed["jobs"]), listed["unrecorded"]


def _look(url: str) -> tuple[float, float, float, float, int]:
    """`ricochet waiting --json` as a process: (started, ended, largest RSS in MiB, CPU seconds,
    rows)."""
    env = _env(url)
    with tempfile.TemporaryFile() as errors:
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", "ricochet", "waiting", "--json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        assert proc.stdout is not None
        rows = sum(1 for _ in proc.stdout)
        _, status, usage = os.wait4(proc.pid, 0)
        ended = time.time()
        if status:
            errors.seek(0)
            said = errors.read().decode(errors="replace")[-2000:]
            raise RuntimeError(
                f"ricochet waiting exited with {os.waitstatus_to_exitcode(status)}: {said}"
            )
    return started, ended, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, rows


async def _measure(
    url: str, n: int, spread_s: float, per_record: int, look: bool
) -> dict[str, Any]:
    """One row: the jobs filled, taken back as they come, with a look run meanwhile or not."""
    connection = await aio_pika.connect(url)
    wait_ms = int((spread_s + LEAD_S) * 1000)
    await declare_recorded(
        connection, Settings(queue=QUEUE, amqp_url=url, retry_delays_ms=str(wait_ms))
    )
    await connection.close()
    if look:  # its index reads the journal as the jobs come in, as a running monitor's does
        monitor, base = await asyncio.to_thread(_monitor, url)
    filled = asyncio.Event()
    filling = asyncio.ensure_future(_fill(url, n, spread_s, per_record, filled))
    await filled.wait()
    arrivals = asyncio.ensure_future(_arrivals(url, _total(n, spread_s)))  # as they come
    if not look:
        await filling
        delays = [at - due for due, at in await arrivals]
        return {
            "jobs": n,
            "entries_per_record": per_record,
            "look": False,
            "largest_delay_s": round(max(delays), 3),
        }
    started, ended, rss_mib, cpu_s, rows = await asyncio.to_thread(_look, url)
    asked_s, asked_rows, unrecorded = await asyncio.to_thread(_ask_monitor, base)
    monitor.terminate()
    await asyncio.to_thread(monitor.wait, 30)
    await filling
    came = await arrivals
    during = [at - due for due, at in came if started <= due <= ended]
    other = [at - due for due, at in came if not started <= due <= ended]
    return {
        "jobs": n,
        "entries_per_record": per_record,
        "look": True,
        "listed": rows,
        "look_s": round(ended - started, 2),
        "look_rss_mib": round(rss_mib, 1),
        "look_cpu_s": round(cpu_s, 2),
        "monitor_api_s": round(asked_s, 2),
        "monitor_listed": asked_rows,
        "monitor_unrecorded": unrecorded,
        "due_while_looking": len(during),
        "largest_delay_due_while_looking_s": round(max(during), 3) if during else None,
        "largest_delay_other_s": round(max(other), 3) if other else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--spread-s", type=float, default=30.0)
    parser.add_argument("--per-record", type=int, default=PER_RECORD, help="entries a record")
    parser.add_argument("--unreached-limit", action="store_true")
    args = parser.parse_args()
    rows = []
    # The same jobs with no look first: how late the broker alone brings them back.
    for look in (False, True):
        url = fresh_vhost(VHOST)
        try:
            if args.unreached_limit:
                management("PUT", f"api/policies/{VHOST}/returns-at-head", UNREACHED_LIMIT_POLICY)
            row = asyncio.run(_measure(url, args.jobs, args.spread_s, args.per_record, look))
            rows.append(row | {"unreached_limit": args.unreached_limit})
        finally:
            management("DELETE", f"api/vhosts/{VHOST}")
        print(json.dumps(rows[-1], indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"at": dt.datetime.now(dt.UTC).isoformat(), "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
