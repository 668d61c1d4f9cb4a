"""A journal of 1,000,000 entries (SPEC 26): `ricochet job ID` from the stream alone, and the
monitor's index of it.

In a vhost of its own, made for it and deleted after: the journal is filled with N entries in
records of 2,000, as workers write them (a job's started and succeeded entries, the jobs of four
queues), with the job asked for among the first; then `ricochet job ID --since 1h` is run as a
user runs it, and its wall time and RSS are the figures, beside `ricochet jobs --limit 20`.
Then `ricochet monitor` starts on it: the time until its index says it is complete (its
rebuild), its RSS then, and the latency of GET /api/jobs/ID (the job asked for, the oldest) and
of GET /api/jobs?limit=20, each asked ASKS times one after the other.

    .venv/bin/python -m bench.journal                     # 1,000,000 entries
    .venv/bin/python -m bench.journal --entries 100000

The broker is RICOCHET_BENCH_AMQP_URL's host and its management API, as for bench.cancels.
"""

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import aio_pika
import psutil

from bench.cancels import ROOT, fresh_vhost, management

sys.path.insert(0, str(ROOT / "app"))

from ricochet.broker.declare import declare
from ricochet.broker.journal import BATCH_MOST, Entry, journal_record, now_ms
from ricochet.names import SHARED
from ricochet.settings import Settings

VHOST = "ricochet-bench-journal"
QUEUES = ["bench-journal", "orders", "mail", "thumbnails"]
ASKED = "job-asked-for"
RESULTS = ROOT / "bench" / "results" / "journal.json"
ASKS = 200


def _entries(n: int, at_ms: int) -> list[Entry]:
    """n entries: each job's started and succeeded, the one asked for among the first."""
    entries = []
    for i in range(n // 2):
        message_id = ASKED if i == 10 else f"job-{i}"
        queue = QUEUES[i % len(QUEUES)]
        entries.append(Entry(at_ms + i, "started", queue, message_id, "bench", 1, {}))
        entries.append(
            Entry(at_ms + i + 1, "succeeded", queue, message_id, "bench", 1, {"duration_s": 0.01})
        )
    return entries


async def _fill(url: str, n: int) -> float:
    started = time.monotonic()
    connection = await aio_pika.connect(url)
    await declare(connection, Settings(queue=QUEUES[0], amqp_url=url))
    channel = await connection.channel(publisher_confirms=True)
    entries = _entries(n, now_ms() - 600_000)
    for start in range(0, len(entries), BATCH_MOST * 20):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    journal_record(entries[i : i + BATCH_MOST]), SHARED.journal
                )
                for i in range(start, min(len(entries), start + BATCH_MOST * 20), BATCH_MOST)
            )
        )
    await connection.close()
    return time.monotonic() - started


def _timed(url: str, *args: str) -> tuple[float, int, str]:
    """Seconds, peak RSS (KB) and output of `ricochet ARGS` against the vhost."""
    env = _env(url)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ricochet", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    took = time.monotonic() - started
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return took, max(rss, before), done.stdout


def _env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    return {**env, "RICOCHET_AMQP_URL": url, "RICOCHET_QUEUE": QUEUES[0], **extra}


def _get(url: str) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = json.loads(answer.read())
    return time.perf_counter() - started, body


def _latency_ms(url: str) -> dict[str, float]:
    took = sorted(_get(url)[0] * 1000 for _ in range(ASKS))
    return {"p50_ms": round(statistics.median(took), 2), "max_ms": round(took[-1], 2)}


def spawn_monitor(env: dict[str, str]) -> tuple["subprocess.Popen[bytes]", str]:
    """`ricochet monitor` with env, on a free port of this host: the process and its address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monitor = subprocess.Popen(
        [sys.executable, "-m", "ricochet", "monitor"],
        env={**env, "RICOCHET_HTTP_PORT": str(port), "RICOCHET_HTTP_HOST": "127.0.0.1"},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return monitor, f"http://127.0.0.1:{port}"


def _monitor(url: str) -> dict[str, object]:
    """The monitor's index over the journal: rebuild time, RSS, and its API's latency."""
    started = time.monotonic()
    monitor, base = spawn_monitor(_env(url))
    try:
        while True:
            time.sleep(0.1)
            try:
                _, listed = _get(f"{base}/api/jobs?limit=1")
            except OSError:
                continue
            if listed["complete"]:
                break
        rebuilt_s = time.monotonic() - started
        rss_mb = psutil.Process(monitor.pid).memory_info().rss / 1024 / 1024
        _, asked = _get(f"{base}/api/jobs/{ASKED}")
        assert asked["state"] == "succeeded", asked
        return {
            "rebuild_s": round(rebuilt_s, 1),
            "rss_mb": round(rss_mb),
            "api_job": _latency_ms(f"{base}/api/jobs/{ASKED}"),
            "api_jobs_20": _latency_ms(f"{base}/api/jobs?limit=20"),
        }
    finally:
        monitor.terminate()
        monitor.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.journal", description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()
    url = fresh_vhost(VHOST)
    try:
        filled_s = asyncio.run(_fill(url, args.entries))
        job_s, job_rss, out = _timed(url, "job", ASKED, "--json", "--since", "1h")
        assert json.loads(out)["state"] == "succeeded", out
        jobs_s, jobs_rss, _ = _timed(url, "jobs", "--limit", "20", "--json", "--since", "1h")
        monitor = _monitor(url)
    finally:
        management("DELETE", f"api/vhosts/{VHOST}")
    result = {
        "entries": args.entries,
        "fill_s": round(filled_s, 1),
        "job_s": round(job_s, 2),
        "job_max_rss_mb": round(job_rss / 1024),
        "jobs_s": round(jobs_s, 2),
        "jobs_max_rss_mb": round(jobs_rss / 1024),
        "monitor": monitor,
    }
    print(json.dumps(result, indent=2))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
