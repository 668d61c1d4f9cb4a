"""`ricochet job ID` from the stream alone over a journal of 1,000,000 entries (SPEC 26).

In a vhost of its own, made for it and deleted after: the journal is filled with N entries in
records of 2,000, as workers write them (a job's started and succeeded entries, the jobs of four
queues), with the job asked for among the first; then `ricochet job ID --since 1h` is run as a
user runs it, and its wall time and RSS are the figures, beside `ricochet jobs --limit 20`.

    .venv/bin/python -m bench.journal                     # 1,000,000 entries
    .venv/bin/python -m bench.journal --entries 100000

The broker is RICOCHET_BENCH_AMQP_URL's host and its management API, as for bench.cancels.
"""

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time

import aio_pika

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    env.update(RICOCHET_AMQP_URL=url, RICOCHET_QUEUE=QUEUES[0])
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
    finally:
        management("DELETE", f"api/vhosts/{VHOST}")
    result = {
        "entries": args.entries,
        "fill_s": round(filled_s, 1),
        "job_s": round(job_s, 2),
        "job_max_rss_mb": round(job_rss / 1024),
        "jobs_s": round(jobs_s, 2),
        "jobs_max_rss_mb": round(jobs_rss / 1024),
    }
    print(json.dumps(result, indent=2))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
