"""The shared cancel store (SPEC 18, SPEC 24): one stream per vhost whose cancels name their
queue, decided by the store's order rather than by two clocks, and read from a snapshot.

The store ricochet.cancels is shared by every test: none deletes it, and each names its own
queues, so other tests' records in it change nothing here."""

import asyncio
import datetime as dt
import time
import zlib
from collections.abc import Callable, MutableMapping
from typing import Any
from urllib.parse import quote, urlsplit

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelClosed
from ricochet import Client, Job
from ricochet.broker import cancels
from ricochet.broker.cancel_log import SNAPSHOT_MAX_BYTES, Snapshot, encode_snapshot
from ricochet.broker.cancels import cancel_record, read_snapshot
from ricochet.broker.declare import declare
from ricochet.broker.stream_log import tail
from ricochet.client import client as client_module
from ricochet.client import message as message_module
from ricochet.names import SHARED
from structlog.testing import capture_logs

from tests.broker import BROKER
from tests.support import (
    AMQP_URL,
    InProcessWorker,
    StartWorker,
    delete_topology,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    wait_for,
)


class Runs:
    """Handler recording each attempt; payload {"fail": N} fails attempts 1..N."""

    def __init__(self) -> None:
        self.runs: dict[str | None, list[int]] = {}

    async def __call__(self, job: Job) -> None:
        self.runs.setdefault(job.message_id, []).append(job.attempt)
        if job.attempt <= job.payload.get("fail", 0):
            raise ConnectionError(f"transient trouble on attempt {job.attempt}")


def skewed(monkeypatch: pytest.MonkeyPatch, skew_s: float) -> None:
    """The client's clock skew_s seconds off: its jobs' timestamps and schedules with it."""
    made = message_module.job_message

    def job_message(*args: Any, now: dt.datetime, **kwargs: Any) -> Any:
        return made(*args, now=now + dt.timedelta(seconds=skew_s), **kwargs)

    monkeypatch.setattr(client_module, "job_message", job_message)


async def test_a_job_enqueued_again_after_its_cancel_runs(
    start_worker: StartWorker, queue_name: str
) -> None:
    """cancel(B) then at once enqueue(B, delay=2): the new job runs; cancel(C) then enqueue(C)
    that fails once: it runs again at its retry. A job waiting before the cancel does not."""
    runs = Runs()
    worker = await start_worker(runs, retry_delays_ms="1000")
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("job", {}, message_id="waiting", delay=1.5)
        await client.cancel("waiting")
        for message_id in ("B", "C"):
            await client.cancel(message_id)
        await client.enqueue("job", {}, message_id="B", delay=2)
        await client.enqueue("job", {"fail": 1}, message_id="C")
    await wait_for(lambda: runs.runs.get("B") == [1], 10, "B to run")
    await wait_for(lambda: runs.runs.get("C") == [1, 2], 10, "C to run again at its retry")
    await wait_for(lambda: worker.count("cancelled") == 1, 10, "the waiting job cancelled")
    assert "waiting" not in runs.runs


@pytest.mark.parametrize("skew_s", [-5.0, 5.0])
async def test_the_producers_clock_decides_nothing(
    start_worker: StartWorker,
    queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
    skew_s: float,
) -> None:
    """A client whose clock is 5 s ahead or behind: a job cancelled 2 s before its due time is
    cancelled, one waiting in a retry tier when cancelled never runs again, and the same id
    enqueued again after the cancel runs, and is retried."""
    runs = Runs()
    worker = await start_worker(runs, retry_delays_ms="2500")
    skewed(monkeypatch, skew_s)
    due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2.5)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("job", {}, message_id="cancelled", run_at=due)
        await client.enqueue("job", {"fail": 1}, message_id="again")
        await wait_for(lambda: runs.runs.get("again") == [1], 10, "the first job to fail")
        await client.cancel("cancelled")
        await client.cancel("again")
        await client.enqueue("job", {"fail": 1}, message_id="again")
    await wait_for(lambda: runs.runs.get("again") == [1, 1, 2], 15, "the job enqueued again")
    await wait_for(lambda: worker.count("cancelled") == 2, 10, "the two cancelled jobs")
    assert "cancelled" not in runs.runs


async def test_a_cancel_never_touches_another_queues_job(
    start_worker: StartWorker,
    connection: AbstractConnection,
    queue_name: str,
) -> None:
    """The same id scheduled in two queues: a cancel of queue a's job leaves queue b's to run."""
    other = f"{queue_name}-b"
    runs, other_runs = Runs(), Runs()
    worker = await start_worker(runs)
    other_worker = InProcessWorker(make_settings(other), other_runs)
    try:
        await other_worker.start()
        async with Client(AMQP_URL, other) as client:
            await client.enqueue("job", {}, message_id="same", delay=1.5)
        async with Client(AMQP_URL, queue_name) as client:
            await client.enqueue("job", {}, message_id="same", delay=1.5)
            await client.cancel("same")
        await wait_for(lambda: other_runs.runs.get("same") == [1], 10, "b's job to run")
        await wait_for(lambda: worker.count("cancelled") == 1, 10, "a's job cancelled")
        assert "same" not in runs.runs
        assert other_worker.count("cancelled") == 0
    finally:
        await other_worker.stop()
        await delete_topology(connection, other)


async def test_ricochet_cancel_takes_the_queue_it_is_told(
    start_worker: StartWorker, queue_name: str
) -> None:
    """`ricochet cancel --queue Q ID` cancels Q's job, whatever RICOCHET_QUEUE says; a queue
    name the settings refuse, or an id no job can have, exits 2."""
    runs = Runs()
    worker = await start_worker(runs)
    async with Client(AMQP_URL, queue_name) as client:
        # Due well after the command has started and connected, on a loaded machine too (8 s
        # were too few once: the job ran).
        await client.enqueue("job", {}, message_id="told", delay=20)
    due_s = time.monotonic() + 20
    env = ricochet_env(make_settings(f"{queue_name}-elsewhere"))
    done = await asyncio.to_thread(run_cli, ["cancel", "--queue", queue_name, "told"], env)
    assert time.monotonic() < due_s, "the job came due before its cancel returned"
    assert (done.returncode, done.stdout) == (0, "cancelled told\n"), done.stderr
    refused = await asyncio.to_thread(run_cli, ["cancel", "--queue", "amq.x", "told"], env)
    assert refused.returncode == 2, refused.stderr
    for no_id in ("", "x" * 256):  # no job can have it: refused before anything is sent
        refused = await asyncio.to_thread(run_cli, ["cancel", "--queue", queue_name, no_id], env)
        assert refused.returncode == 2, refused.stderr
        assert "Invalid value for MESSAGE_ID: message_id" in refused.stderr
    await wait_for(lambda: worker.count("cancelled") == 1, 45, "the cancelled job")
    assert "told" not in runs.runs


async def fill(channel: AbstractChannel, queue: str, n: int) -> None:
    """n cancels of queue's ids in the store, published with their confirms awaited together."""
    batch: list[asyncio.Future[Any]] = []
    for i in range(n):
        message = cancel_record(queue, f"filler-{i:08d}")
        batch.append(
            asyncio.ensure_future(channel.default_exchange.publish(message, SHARED.cancels))
        )
        if len(batch) == 1000:
            await asyncio.gather(*batch)
            batch = []
    await asyncio.gather(*batch)


async def first_job_after(
    start: Callable[[], Any], runs: Runs, message_id: str
) -> tuple[Any, float]:
    started = time.monotonic()
    worker = await start()
    await wait_for(lambda: message_id in runs.runs, 60, "the first job")
    return worker, time.monotonic() - started


async def until_cancelled(
    start_worker: StartWorker, url: str, *ran: str
) -> tuple[Runs, list[MutableMapping[str, Any]]]:
    """Run a worker on url until the jobs ran have run and it has dropped one cancelled job, then
    stop it (before its vhost goes): its runs, and what it logged."""
    runs = Runs()
    with capture_logs() as logs:
        worker = await start_worker(runs, amqp_url=url)
        try:
            await wait_for(lambda: set(ran) <= runs.runs.keys(), 20, f"jobs {ran}")
            await wait_for(lambda: worker.count("cancelled") == 1, 20, "the cancelled job")
        finally:
            await worker.stop()
    return runs, logs


# More than a reader takes between two snapshots (cancels.SNAPSHOT_EVERY).
FILLED = 10_000


async def test_a_worker_starts_from_the_snapshot_not_the_whole_history(
    start_worker: StartWorker, queue_name: str
) -> None:
    """10,000 cancels kept: a worker that has read them leaves a snapshot, and the next worker
    starts from it (reading a few records after it, not the 10,000) and takes its first job
    within 5 s, honouring a cancel among them. On a vhost of its own: every worker starting on
    the shared one while they were kept would read them too (the other suites' on this broker
    among them)."""
    async with BROKER.scratch_vhost() as url:
        async with await aio_pika.connect(url) as connection:
            await declare(connection, make_settings(queue_name, amqp_url=url))  # the store
            await fill(await connection.channel(), f"{queue_name}-filler", FILLED)
            runs = Runs()
            first = await start_worker(runs, ready=False, amqp_url=url)
            # Reading them all is what the first worker is for: slow on a loaded machine (27 s
            # seen).
            await wait_for(lambda: first.lifecycle.ready, 90, "the first worker to read them all")
            await wait_for(lambda: not first.worker.cancels.snapshot_pending, 60, "the snapshot")
            await first.stop()
            # Workers starting together (a deploy, a broker restart) each find it: a reader
            # hands the one message back at once, and one that finds the queue empty looks again.
            readers = [await connection.channel() for _ in range(8)]
            found = await asyncio.gather(*(read_snapshot(reader, "guest") for reader in readers))
            assert all(snapshot is not None for snapshot in found)
        async with Client(url, queue_name) as client:
            await client.enqueue("job", {}, message_id="old", delay=1)
            await client.cancel("old")
            await client.enqueue("job", {}, message_id="first")
        with capture_logs() as logs:
            second, took_s = await first_job_after(
                lambda: start_worker(runs, amqp_url=url), runs, "first"
            )
        try:
            assert took_s < 5.0, f"first job {took_s:.1f} s after start"
            [read] = [x for x in logs if x["event"] == "cancels read"]
            assert read["snapshot"] is not None, read  # it started from the snapshot...
            assert read["read"] < FILLED // 10, read  # ...not from the store's first record
            await wait_for(lambda: second.count("cancelled") == 1, 10, "the cancelled job")
            assert "old" not in runs.runs
        finally:
            await second.stop()  # before its vhost goes (the fixture's stop is then a no-op)


async def test_a_snapshot_that_would_inflate_past_its_bound_is_passed_over(
    start_worker: StartWorker, queue_name: str
) -> None:
    """Anyone who may publish in the vhost can write the snapshot: one that would decompress to
    more than SNAPSHOT_MAX_BYTES (130 KB that inflate to 128 MiB) is passed over with a warning,
    the store is read from its start, and a cancel in it holds."""
    bomb = zlib.compress(b" " * (SNAPSHOT_MAX_BYTES + 1), 9)
    async with BROKER.scratch_vhost() as url:
        async with await aio_pika.connect(url) as connection:
            await declare(connection, make_settings(queue_name, amqp_url=url))  # the store
            # Written as the workers' own user: only its content can be refused.
            channel = await connection.channel()
            await publish(channel, SHARED.cancels_snapshot, bomb, user_id="guest")
        async with Client(url, queue_name) as client:
            await client.enqueue("job", {}, message_id="old", delay=1)
            await client.cancel("old")
        runs, logs = await until_cancelled(start_worker, url)
    assert "old" not in runs.runs
    [unread] = [x for x in logs if x["event"].startswith("cancels snapshot unreadable")]
    assert unread["bytes"] == len(bomb)


async def test_a_snapshot_written_by_another_user_is_passed_over(
    start_worker: StartWorker, queue_name: str
) -> None:
    """A producer of another user writes a snapshot that forgets a cancel (no cancels, an offset
    past it): the worker passes it over, and the cancelled job stays cancelled. The broker will
    not let that producer write as the workers' user."""
    producer = f"{queue_name}-producer"
    async with BROKER.scratch_vhost() as url:
        vhost = quote(urlsplit(url).path[1:], safe="")
        BROKER.api("PUT", f"users/{producer}", {"password": "p", "tags": ""})
        try:
            every = {"configure": ".*", "write": ".*", "read": ".*"}
            BROKER.api("PUT", f"permissions/{vhost}/{producer}", every)
            async with await aio_pika.connect(url) as connection:
                await declare(connection, make_settings(queue_name, amqp_url=url))  # the store
            async with Client(url, queue_name) as client:
                await client.enqueue("job", {}, message_id="old", delay=1)
                await client.cancel("old")
            as_producer = url.replace("guest:guest@", f"{producer}:p@")
            async with await aio_pika.connect(as_producer) as connection:
                end = await tail(connection, SHARED.cancels, 10)
                assert end is not None
                forged = encode_snapshot(Snapshot([], [], end + 1, {}))
                channel = await connection.channel()
                await publish(channel, SHARED.cancels_snapshot, forged, user_id=producer)
                with pytest.raises(ChannelClosed, match="PRECONDITION_FAILED"):
                    await publish(channel, SHARED.cancels_snapshot, forged, user_id="guest")
            runs, logs = await until_cancelled(start_worker, url)
        finally:
            BROKER.api("DELETE", f"users/{producer}")
    assert "old" not in runs.runs
    [passed] = [x for x in logs if x["event"].startswith("register not written by this user")]
    assert (passed["written_by"], passed["user"]) == (producer, "guest")


async def test_a_snapshot_ahead_of_the_store_is_passed_over_at_once(
    start_worker: StartWorker, queue_name: str
) -> None:
    """A snapshot claiming an offset the store has not reached (10**9) would hold every start
    until its catch-up gave up (a minute): it is passed over at once, and a cancel holds."""
    async with BROKER.scratch_vhost() as url:
        async with await aio_pika.connect(url) as connection:
            await declare(connection, make_settings(queue_name, amqp_url=url))  # the store
            forged = encode_snapshot(Snapshot([], [], 10**9, {}))
            channel = await connection.channel()
            await publish(channel, SHARED.cancels_snapshot, forged, user_id="guest")
        async with Client(url, queue_name) as client:
            await client.enqueue("job", {}, message_id="old", delay=1)
            await client.cancel("old")
            await client.enqueue("job", {}, message_id="first")
        runs, logs = await until_cancelled(start_worker, url, "first")
    assert "old" not in runs.runs
    [ahead] = [x for x in logs if x["event"].startswith("cancels snapshot does not match")]
    assert ahead["reason"] == "ahead of the store"
    assert ahead["snapshot"] == 10**9
    assert ahead["store_end"] < 100


async def test_a_snapshot_another_reader_holds_is_waited_for(
    start_worker: StartWorker, connection: AbstractConnection
) -> None:
    """A start that finds the snapshot's queue empty because another reader holds it (a get,
    slow to hand it back on a loaded machine) looks again rather than read the whole store."""
    worker = await start_worker(Runs())  # the snapshot exists once a worker has started
    await wait_for(lambda: not worker.worker.cancels.snapshot_pending, 60, "the snapshot")
    holder, reader = await connection.channel(), await connection.channel()
    try:
        store = await holder.get_queue(SHARED.cancels_snapshot, ensure=False)
        held = await store.get(no_ack=False)
        reading = asyncio.ensure_future(read_snapshot(reader, "guest"))
        await asyncio.sleep(cancels.SNAPSHOT_PATIENCE_S / 2)
        assert not reading.done(), "the reader gave up while the snapshot was held"
        await held.nack(requeue=True)
        assert await reading is not None
    finally:
        await holder.close()
        await reader.close()


async def test_a_start_that_finds_no_snapshot_leaves_one(start_worker: StartWorker) -> None:
    """On a new vhost (a store of a few records, no snapshot) a worker's start writes one, so
    that the next start does not wait for it; it holds no cancel."""
    async with BROKER.scratch_vhost() as url:
        worker = await start_worker(Runs(), amqp_url=url)
        try:
            await wait_for(lambda: not worker.worker.cancels.snapshot_pending, 20, "the snapshot")
            async with await aio_pika.connect(url) as connection:
                snapshot = await read_snapshot(await connection.channel(), "guest")
        finally:
            await worker.stop()
    assert snapshot is not None
    assert (snapshot.entries, snapshot.waits) == ([], [])


async def test_an_old_per_queue_store_is_read_without_being_declared(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A broker holding an earlier ricochet's Q.cancels: its cancels are honoured."""
    old = f"{queue_name}.cancels"
    await channel.declare_queue(
        old,
        durable=True,
        arguments={
            "x-queue-type": "stream",
            "x-max-age": "31D",
            "x-stream-max-segment-size-bytes": 1_000_000,
        },
    )
    await channel.default_exchange.publish(
        aio_pika.Message(b"", message_id="old", type="cancel", timestamp=time.time()), old
    )
    runs = Runs()
    worker = await start_worker(runs)
    await publish(
        channel,
        queue_name,
        "{}",
        message_id="old",
        headers={"run-at": (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat()},
        timestamp=time.time() - 60,
    )
    await wait_for(lambda: worker.count("cancelled") == 1, 10, "the job cancelled in the old store")
    assert "old" not in runs.runs
