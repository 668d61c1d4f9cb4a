"""Faults of the monitor's index of the journal (SPEC 26): the monitor killed with kill -9 while
it builds its index, its API (and a look at the waiting jobs) asked while the broker is stopped,
and the journal stream deleted and declared again while it reads it. The index is memory only: a
new monitor builds it again from the journal, one that lost the broker answers from what it holds
and goes on reading once the broker is back, and one whose stream is new reads it from its first
record. Every job id is accounted for, as the workers ran it and as the index shows it."""

import asyncio
import contextlib
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

from ricochet import Client
from ricochet.broker.journal import Entry, journal_record, now_ms
from ricochet.names import SHARED

from tests.faults.harness import PUBLISH_BATCH, FaultRun, progress
from tests.support import answers, exists, free_port, ricochet_env, run_cli, spawn, wait_for

JOBS = 200
# Records of old jobs the journal holds before the monitor starts: many more than the stream
# declared again gets during the row, so that a reader left where the old stream ended would
# not reach a job of the new one.
OLD_RECORDS = 500


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        body: dict[str, Any] = json.loads(answer.read())
        return body


async def indexed(base: str, queue: str) -> tuple[dict[str, str], bool]:
    """Every job of the queue in the monitor's index, by id, with its state; and whether the
    index said it was complete."""
    states: dict[str, str] = {}
    cursor = ""
    while True:
        listed = await asyncio.to_thread(
            _get, f"{base}/api/jobs?queue={queue}&limit=500{cursor and f'&before={cursor}'}"
        )
        states.update({row["message_id"]: row["state"] for row in listed["jobs"]})
        if listed["next"] is None:
            return states, listed["complete"]
        cursor = listed["next"]


async def stopped(monitor: "subprocess.Popen[str]") -> None:
    """SIGTERM, and the monitor's clean exit."""
    monitor.terminate()
    assert await asyncio.to_thread(monitor.wait, 30) == 0


def all_succeeded(base: str, queue: str, ids: list[str]) -> Callable[[], Any]:
    async def check() -> bool:
        try:
            states, complete = await indexed(base, queue)
        except OSError:
            return False
        return complete and all(states.get(m) == "succeeded" for m in ids)

    return check


async def test_the_monitor_killed_while_it_builds_its_index(
    fault_run: Callable[..., FaultRun],
) -> None:
    """Jobs run, then a monitor starts and is killed with kill -9 as soon as it answers, while
    it reads the journal; a second monitor builds the index again and shows every job
    succeeded."""
    run = fault_run("monitor kill -9 while it builds its index")
    ids = await run.publish(JOBS)
    await run.start_worker()
    await progress(run, JOBS)
    port = free_port()
    env = ricochet_env(run.settings, RICOCHET_HTTP_PORT=str(port))
    first = spawn(["monitor"], env, run.tmp_path / "monitor-1.log")
    await wait_for(lambda: answers(port, "/healthz", 200), 30, "the first monitor's port")
    first.kill()
    await asyncio.to_thread(first.wait, 30)
    second = spawn(["monitor"], env, run.tmp_path / "monitor-2.log")
    try:
        await wait_for(lambda: answers(port, "/healthz", 200), 30, "the second monitor's port")
        base = f"http://127.0.0.1:{port}"
        await wait_for(all_succeeded(base, run.settings.queue, ids), 60, "every job indexed")
    finally:
        await stopped(second)
    await run.account()


async def test_the_index_asked_while_the_broker_is_stopped(
    fault_run: Callable[..., FaultRun], restart_ctl: Callable[..., str]
) -> None:
    """With the index built, `rabbitmqctl stop_app` for a few seconds: the API answers from
    memory meanwhile (every job of before, succeeded), a look at the waiting jobs (the command,
    the console's page) says the broker does not answer, and once the broker is back the index
    reads on: jobs run after the restart show succeeded too, and a look answers again."""
    run = fault_run("index asked while the broker is stopped")
    before = await run.publish(JOBS // 2)
    await run.start_worker()
    await progress(run, len(before))
    async with monitor_of(run) as (base, env):
        await wait_for(all_succeeded(base, run.settings.queue, before), 60, "the jobs before")
        await asyncio.to_thread(restart_ctl, "stop_app")
        try:
            states, _ = await indexed(base, run.settings.queue)
            assert {states.get(m) for m in before} == {"succeeded"}
            asked = await asyncio.to_thread(_get, f"{base}/api/jobs/{before[0]}")
            assert asked["state"] == "succeeded"
            # A look at the waiting jobs needs the broker's depths: it says so, and takes nothing.
            looked = await asyncio.to_thread(run_cli, ["waiting", "--json"], env)
            assert looked.returncode == 1, looked.stderr
            assert "does not answer" in looked.stderr
            assert await asyncio.to_thread(status_of, f"{base}/waiting") == 503
        finally:
            await asyncio.to_thread(restart_ctl, "start_app")
        await run.reconnect()
        after = await run.publish(JOBS // 2)
        await progress(run, JOBS)
        await wait_for(all_succeeded(base, run.settings.queue, after), 90, "the jobs after")
        looked = await asyncio.to_thread(run_cli, ["waiting", "--json"], env)
        assert looked.returncode == 0, looked.stderr
        assert looked.stdout == ""  # every job ran: none waits
        assert await asyncio.to_thread(status_of, f"{base}/waiting") == 200
    await run.account()


@contextlib.asynccontextmanager
async def monitor_of(run: FaultRun) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A monitor of the run's settings on a port of its own, once it answers: its address, and
    its environment (for commands that ask it); stopped, cleanly, after the block."""
    port = free_port()
    env = ricochet_env(run.settings, RICOCHET_HTTP_PORT=str(port))
    monitor = spawn(["monitor"], env, run.tmp_path / "monitor.log")
    try:
        await wait_for(lambda: answers(port, "/healthz", 200), 30, "the monitor's port")
        yield f"http://127.0.0.1:{port}", env
    finally:
        await stopped(monitor)


async def old_records(run: FaultRun, n: int) -> list[str]:
    """Write n records to the journal, each a job of the run's queue that succeeded, as a
    journal of some age holds them: their ids."""
    ids = [f"old-{i}" for i in range(n)]
    channel = await run.connection.channel(publisher_confirms=True, on_return_raises=True)
    entries = [Entry(now_ms(), "succeeded", run.settings.queue, m, "job", 1, {}) for m in ids]
    for start in range(0, n, PUBLISH_BATCH):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    journal_record([entry]), routing_key=SHARED.journal, mandatory=True
                )
                for entry in entries[start : start + PUBLISH_BATCH]
            )
        )
    await channel.close()
    return ids


async def enqueued(run: FaultRun, client: Client, n: int) -> list[str]:
    """Enqueue n jobs with the Client (each writes its enqueued entry), counted in the run."""
    ids = [f"enqueued-{len(run.published) + i}" for i in range(n)]
    for message_id in ids:
        await client.enqueue("job", {}, message_id=message_id)
    run.published.extend(ids)
    return ids


async def test_the_journal_stream_deleted_and_declared_again_while_the_monitor_reads_it(
    fault_run: Callable[..., FaultRun],
) -> None:
    """The journal holds 500 records of old jobs when a monitor starts; a job enqueued with the
    Client shows succeeded, then the stream is deleted (the run's: its vhost, or its node, is
    its test process's own) and declared again by the next write that finds it gone. The new
    stream's offsets start at 0 again: the index reads it from its first record, so every job
    enqueued after shows succeeded within 30 s, and the jobs of the old stream stay."""
    run = fault_run("journal stream deleted and declared again while the monitor reads it")
    queue = run.settings.queue
    await run.publish_messages([])  # the queue's topology, the journal with it
    old = await old_records(run, OLD_RECORDS)
    await run.start_worker()
    async with monitor_of(run) as (base, _):
        async with Client(run.settings.amqp_url, queue) as client:
            before = await enqueued(run, client, 1)
            await wait_for(all_succeeded(base, queue, before), 60, "the job before")
            deleting = await run.connection.channel()
            await deleting.queue_delete(SHARED.journal)
            await deleting.close()
            # Its entries find the stream gone: dropped, and the stream declared again.
            await enqueued(run, client, 1)
            await wait_for(
                lambda: exists(run.connection, SHARED.journal), 30, "the journal declared again"
            )
            after = await enqueued(run, client, JOBS // 10)
        await wait_for(all_succeeded(base, queue, after), 30, "every job enqueued after")
        states, _ = await indexed(base, queue)
        assert {states.get(m) for m in old + before} == {"succeeded"}
    await run.account()
