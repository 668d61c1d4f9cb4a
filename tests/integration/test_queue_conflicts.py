"""A fault of one of a worker's queues is that queue's alone (SPEC 24): a queue deleted and
declared again by someone else with other arguments, while the worker runs or before it starts,
is reported (error log, /readyz 503 naming it, its consuming gauge 0) and declared again with
backoff, while the worker's other queues, in every process, go on."""

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aio_pika.abc import AbstractChannel, AbstractConnection

from tests.conflicts import declare_plain, delete_queue
from tests.integration.test_worker_http import scrape
from tests.support import (
    answers,
    consumers,
    free_port,
    journal,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    spawn,
    wait_for,
)

PREFETCH = 2
CONSUMING = "ricochet_worker_consuming"


def start(
    queues: list[str], tmp_path: Path, processes: int = 1
) -> tuple["subprocess.Popen[str]", int]:
    """`ricochet worker` of these queues (each with PREFETCH), its HTTP port; each queue's jobs
    journaled in tmp_path/<queue>."""
    port = free_port()
    settings = make_settings(
        queues[0],
        queues=",".join(f"{q}={PREFETCH}" for q in queues),
        processes=processes,
        http_port=port,
        handler="tests.handlers:fault",
    )
    env = ricochet_env(settings, TEST_JOURNAL=str(tmp_path / "{queue}"))
    return spawn(["worker"], env, tmp_path / "worker.log"), port


def lines(tmp_path: Path) -> list[dict[str, Any]]:
    text = (tmp_path / "worker.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def readyz(port: int) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        return response.status, await response.text()


async def jobs_done(channel: AbstractChannel, queue: str, tmp_path: Path, n: int) -> None:
    """Publish n jobs to the queue and wait until each is done."""
    tag = uuid.uuid4().hex[:6]
    ids = [f"{queue}-{tag}-{i}" for i in range(n)]
    for message_id in ids:
        await publish(channel, queue, json.dumps({"sleep_s": 0.05}), message_id=message_id)

    def done() -> set[str]:
        path = tmp_path / queue
        return {m for event, m, _ in journal(path) if event == "done"} if path.exists() else set()

    await wait_for(lambda: set(ids) <= done(), 30, f"{n} jobs of {queue} done")


async def reported(
    worker: "subprocess.Popen[str]", port: int, tmp_path: Path, healthy: str, conflict: str
) -> None:
    """The conflict is reported: /readyz 503 naming the queue, its gauge 0 (the healthy one's
    1), an error line naming it; the worker runs on."""

    async def named() -> bool:
        status, body = await readyz(port)
        return status == 503 and f"{conflict}: conflict" in body and healthy not in body

    # The parent hears of a process's queues up to REPORT_S after the broker sees a consumer.
    await wait_for(named, 30, f"/readyz 503 naming {conflict} in conflict, and only it")
    _, body = await readyz(port)
    assert healthy not in body
    samples = await scrape(port)
    assert samples[(CONSUMING, frozenset({("queue", conflict)}))] == 0
    assert samples[(CONSUMING, frozenset({("queue", healthy)}))] == 1

    def errors() -> list[dict[str, Any]]:
        return [x for x in lines(tmp_path) if x["level"] == "error" and x.get("queue") == conflict]

    await wait_for(errors, 10, f"an error line naming {conflict}")
    assert "conflicts with the settings" in errors()[-1]["error"]
    assert worker.poll() is None


async def mended(
    connection: AbstractConnection, port: int, conflict: str, processes: int = 1
) -> None:
    """Once the test deletes the conflicting queue, the worker declares it again and consumes
    it, and /readyz says 200."""
    await delete_queue(connection, conflict)

    async def consumed() -> bool:
        return await consumers(connection, conflict) == processes

    await wait_for(consumed, 60, f"{conflict} declared and consumed again")
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200 again")


async def test_a_queue_declared_again_in_conflict_holds_only_itself(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
) -> None:
    """The second queue is deleted and declared again as a plain classic queue under a running
    worker: the first queue's jobs all run, the conflict is reported and declared again with
    backoff until the test deletes the queue, then the worker consumes it again."""
    a, b = f"{queue_name}-a", f"{queue_name}-b"
    worker, port = start([a, b], tmp_path)
    await wait_for(lambda: answers(port, "/readyz", 200), 60, "/readyz 200")
    await declare_plain(connection, b)
    await reported(worker, port, tmp_path, a, b)
    await jobs_done(channel, a, tmp_path, 10)
    assert await consumers(connection, a) == 1
    await mended(connection, port, b)
    await jobs_done(channel, b, tmp_path, 3)
    assert worker.poll() is None
    tries = [x for x in lines(tmp_path) if x["event"] == "queue in conflict, declaring it again"]
    assert {x["queue"] for x in tries} == {b}
    waits = [x["retry_in_s"] for x in tries]
    assert waits == sorted(waits)  # backing off
    assert not any("reconnecting" in x["event"] for x in lines(tmp_path))


async def test_a_queue_in_conflict_at_start(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
) -> None:
    """A worker of two queues, one already declared with other arguments, consumes the other
    and reports the conflict until the queue is deleted; a worker of that queue alone exits 2
    naming it, as before."""
    a, b = f"{queue_name}-a", f"{queue_name}-b"
    await declare_plain(connection, b)
    alone = run_cli(["worker"], ricochet_env(make_settings(b)), timeout_s=60)
    assert alone.returncode == 2, alone.stdout + alone.stderr
    assert f"queue {b!r} conflicts with the settings" in alone.stdout + alone.stderr
    worker, port = start([a, b], tmp_path)
    await wait_for(lambda: consumers(connection, a), 60, f"{a} consumed")
    await reported(worker, port, tmp_path, a, b)
    await jobs_done(channel, a, tmp_path, 10)
    await mended(connection, port, b)
    await jobs_done(channel, b, tmp_path, 3)


async def test_a_queue_in_conflict_under_two_processes(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
) -> None:
    """RICOCHET_PROCESSES=2: a queue in conflict at start, then again while they run, stops
    neither the parent nor a process; both consume the healthy queue all along."""
    a, b = f"{queue_name}-a", f"{queue_name}-b"
    await declare_plain(connection, b)
    worker, port = start([a, b], tmp_path, processes=2)

    async def both_on_a() -> bool:
        return await consumers(connection, a) == 2

    await wait_for(both_on_a, 60, f"two processes consuming {a}")
    await reported(worker, port, tmp_path, a, b)
    await jobs_done(channel, a, tmp_path, 10)
    await mended(connection, port, b, processes=2)
    await declare_plain(connection, b)
    await reported(worker, port, tmp_path, a, b)
    await jobs_done(channel, a, tmp_path, 10)
    assert await both_on_a()
    assert not any(x["event"].startswith("worker process died") for x in lines(tmp_path))
    await mended(connection, port, b, processes=2)
