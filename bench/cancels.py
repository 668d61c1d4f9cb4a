"""Start-up against the cancel history: a worker's time to its first job, and its RSS, with 0,
100,000 and 500,000 cancels kept in the store (SPEC 24: within 5 s at 500,000).

Each size runs in a vhost of its own, made for it and deleted after, so that the cancels it
keeps never reach the shared store of the broker's other users:

1. the store is filled with N cancels (of several queues, ids like uuid4().hex);
2. a first worker reads them all, as the first worker after an upgrade does, and leaves a
   snapshot (its catch-up time is the figure of a start without one);
3. a job is published, and a new worker process is started: the time from its connection to the
   job's log line, and its RSS then, are the figures.

    .venv/bin/python -m bench.cancels                      # 0, 100,000 and 500,000
    .venv/bin/python -m bench.cancels --sizes 0,20000

The broker is RICOCHET_BENCH_AMQP_URL's host (default 127.0.0.1:5672, guest) and its management
API on RICOCHET_BENCH_MANAGEMENT_URL (default http://127.0.0.1:15672/).
"""

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aio_pika

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

from ricochet.broker.cancels import cancel_record  # noqa: E402
from ricochet.broker.declare import declare  # noqa: E402
from ricochet.names import SHARED  # noqa: E402
from ricochet.settings import Settings  # noqa: E402

QUEUE = "bench-cancels"
VHOST = "ricochet-bench-cancels"
BATCH = 2000
RESULTS = ROOT / "bench" / "results" / "cancels.json"


def management(method: str, path: str, body: dict[str, Any] | None = None) -> None:
    """One call of the management API (a DELETE of what is gone is no error)."""
    base = os.environ.get("RICOCHET_BENCH_MANAGEMENT_URL", "http://127.0.0.1:15672/")
    request = urllib.request.Request(
        urllib.parse.urljoin(base, path),
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"content-type": "application/json"},
    )
    password = urllib.request.HTTPPasswordMgrWithDefaultRealm()
    password.add_password(None, base, "guest", "guest")
    opener = urllib.request.build_opener(urllib.request.HTTPBasicAuthHandler(password))
    try:
        opener.open(request, timeout=30).read()
    except urllib.error.HTTPError as error:
        if not (method == "DELETE" and error.code == 404):
            raise


def vhost_url(vhost: str = VHOST) -> str:
    """The bench broker's URL, in the vhost given."""
    base = os.environ.get("RICOCHET_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    return base.rstrip("/") + "/" + urllib.parse.quote(vhost, safe="")


def fresh_vhost(vhost: str) -> str:
    """A vhost made anew for one measure (guest may do anything in it): its URL."""
    management("DELETE", f"api/vhosts/{vhost}")
    management("PUT", f"api/vhosts/{vhost}", {})
    management(
        "PUT", f"api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    return vhost_url(vhost)


async def _fill(url: str, n: int) -> float:
    """Declare the store and put n cancels in it; seconds taken."""
    started = time.monotonic()
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await declare(connection, Settings(queue=QUEUE, amqp_url=url))  # the store with the rest
    queues = [QUEUE, "orders", "mail", "thumbnails"]
    for start in range(0, n, BATCH):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    cancel_record(queues[i % len(queues)], uuid.uuid4().hex), SHARED.cancels
                )
                for i in range(start, min(n, start + BATCH))
            )
        )
    await connection.close()
    return time.monotonic() - started


async def _publish_job(url: str) -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.default_exchange.publish(
        aio_pika.Message(b"{}", type="noop", message_id="first", delivery_mode=2), QUEUE
    )
    await connection.close()


def _worker(url: str) -> "subprocess.Popen[str]":
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    env.update(
        RICOCHET_AMQP_URL=url,
        RICOCHET_QUEUE=QUEUE,
        RICOCHET_HANDLER="bench.handlers:noop",
        RICOCHET_LOG_FORMAT="json",
        # "connected", the start of every figure, is a debug line (SPEC 27's quiet start).
        RICOCHET_LOG_LEVEL="DEBUG",
        RICOCHET_HTTP_PORT="0",
        PYTHONPATH=f"{ROOT / 'app'}:{ROOT}",
        PYTHONUNBUFFERED="1",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "ricochet", "worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _until(proc: "subprocess.Popen[str]", events: set[str], timeout_s: float) -> dict[str, float]:
    """Read the worker's log lines until each of events was seen: their local clock times."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    lines: list[str] = []
    while not events <= seen.keys():
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker did not log {events - seen.keys()} in {timeout_s:g} s")
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited ({proc.wait()}): {''.join(lines[-5:])}")
        lines.append(line)
        try:
            event = json.loads(line).get("event")
        except ValueError:
            continue
        if event in events and event not in seen:
            seen[event] = time.monotonic()
    return seen


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _stop(proc: "subprocess.Popen[str]") -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(n: int) -> dict[str, Any]:
    """One size: the figures of a worker started with n cancels kept (and a snapshot of them)."""
    url = fresh_vhost(VHOST)
    try:
        fill_s = asyncio.run(_fill(url, n))
        first = _worker(url)
        started = time.monotonic()
        seen = _until(first, {"connected", "consuming"}, 900)
        if n >= 1000:  # the snapshot the first worker writes once it has read up to now
            _until(first, {"cancels snapshot written"}, 300)
        whole_s = seen["consuming"] - seen["connected"]
        whole_rss = _rss_mib(first.pid)
        _stop(first)
        asyncio.run(_publish_job(url))
        second = _worker(url)
        started = time.monotonic()
        seen = _until(second, {"connected", "consuming", "job succeeded"}, 300)
        rss = _rss_mib(second.pid)
        _stop(second)
        return {
            "cancels": n,
            "fill_s": round(fill_s, 1),
            "first_worker_reads_all_s": round(whole_s, 2),
            "first_worker_rss_mib": round(whole_rss, 1),
            "process_start_to_connected_s": round(seen["connected"] - started, 2),
            "connected_to_first_job_s": round(seen["job succeeded"] - seen["connected"], 2),
            "rss_mib": round(rss, 1),
        }
    finally:
        management("DELETE", f"api/vhosts/{VHOST}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0,100000,500000")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    rows = []
    print(
        f"{'cancels':>8} {'fill s':>7} {'read all s':>10} {'RSS MiB':>8}"
        f" {'to 1st job s':>12} {'RSS MiB':>8}"
    )
    for n in sizes:
        row = measure(n)
        rows.append(row)
        print(
            f"{n:>8} {row['fill_s']:>7} {row['first_worker_reads_all_s']:>10}"
            f" {row['first_worker_rss_mib']:>8} {row['connected_to_first_job_s']:>12}"
            f" {row['rss_mib']:>8}",
            flush=True,
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"at": dt.datetime.now(dt.UTC).isoformat(), "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
