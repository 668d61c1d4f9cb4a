"""A job the client schedules waits in the shared levels from its enqueue on (SPEC 18, 24): with
no worker running, its queue deleted while it waits leaves it in ricochet.orphans, not deleted
with the queue. A job due later is published by the client exactly as a worker sends one to
wait; a queue that does not exist is refused as before, a cancel after the enqueue covers it,
and a vhost without the shared levels (or a queue an earlier ricochet declared) gets the job in
the queue itself with its run-at, as any producer sends one.

Each test has a vhost of its own, so that ricochet.orphans and the levels hold its jobs alone."""

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import quote

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from ricochet import Client, Job, NotConfirmed, SyncClient
from ricochet.broker.declare import declare
from ricochet.broker.management import vhost
from ricochet.headers import RUN_AT, WAITING_SINCE
from ricochet.names import DELAY_LEVELS, SHARED

from tests.broker import BROKER
from tests.support import InProcessWorker, depth, make_settings, orphans_tally, take, wait_for

JOBS = 40
DUE_S = 2  # each job's delay: its queue is deleted within it
ORPHANED_WITHIN_S = 5  # how late after its due time a job may reach ricochet.orphans
ON_TIME_S = 2.5  # how late a job may start on a worker of a loaded machine (1 s when idle)
HEADER = "x-app-trace"  # the application's own header, which every orphan keeps

# An enqueue of (client, job type, payload, keyword arguments), awaited in the test's loop: the
# async Client's own, or SyncClient's in a thread.
Enqueue = Callable[..., Awaitable[str]]


@pytest.fixture(params=["Client", "SyncClient"])
async def enqueuer(
    request: pytest.FixtureRequest, vhost_url: str, queue_name: str
) -> AsyncIterator[Enqueue]:
    """enqueue of a Client or a SyncClient of the vhost, whose own queue is Q-stays."""
    if request.param == "Client":
        async with Client(vhost_url, f"{queue_name}-stays") as client:
            yield client.enqueue
        return
    sync = SyncClient(vhost_url, f"{queue_name}-stays")
    try:

        async def enqueue(*args: object, **kwargs: object) -> str:
            return await asyncio.to_thread(sync.enqueue, *args, **kwargs)  # type: ignore[arg-type]

        yield enqueue
    finally:
        await asyncio.to_thread(sync.close)


async def held_anywhere(channel: AbstractChannel, queues: list[str]) -> int:
    """The messages these queues and the levels hold (ready)."""
    levels = [SHARED.delay(k) for k in range(DELAY_LEVELS)]
    return sum([await depth(channel, name) for name in [*queues, *levels]])


async def test_a_scheduled_job_whose_queue_is_deleted_with_no_worker_is_in_the_orphans(
    queue_name: str, vhost_url: str, enqueuer: Enqueue
) -> None:
    """`ricochet topology` for Q-gone and Q-stays, no worker anywhere; a client of Q-stays
    enqueues 40 jobs to Q-gone due in 2 s; Q-gone is deleted through the management API at
    once. Every one of the 40 is in ricochet.orphans once, with its headers, within 5 s of its
    due time, and none is anywhere else."""
    gone, stays = f"{queue_name}-gone", f"{queue_name}-stays"
    async with await aio_pika.connect(vhost_url) as connection:
        for queue in (gone, stays):
            await declare(connection, make_settings(queue, amqp_url=vhost_url))
        ids = [f"{gone}-{i}" for i in range(JOBS)]
        enqueued = time.monotonic()
        for message_id in ids:
            await enqueuer(
                "job",
                {},
                message_id=message_id,
                delay=DUE_S,
                headers={HEADER: message_id},
                queue=gone,
            )
        # as an operator deletes it in the management UI: the queue alone
        where = f"queues/{quote(vhost(vhost_url), safe='')}/{quote(gone, safe='')}"
        status, reply = BROKER.api("DELETE", where)
        assert status == 204, reply
        assert time.monotonic() - enqueued < DUE_S, "deleted after the first job came due"

        channel = await connection.channel()
        taken: Counter[str] = Counter()
        found: list[AbstractIncomingMessage] = []

        async def all_orphaned() -> bool:
            found.extend(await orphans_tally(channel, taken))
            return set(ids) <= set(taken)

        due = enqueued + DUE_S
        await wait_for(
            all_orphaned, due + ORPHANED_WITHIN_S - time.monotonic(), "the jobs in the orphans"
        )
        await asyncio.sleep(1)  # a late copy would show
        found.extend(await orphans_tally(channel, taken))
        assert taken == Counter(ids)  # each once, no other
        for message in found:
            headers = message.headers or {}
            assert headers[HEADER] == message.message_id
            assert RUN_AT in headers
            assert message.routing_key is not None
            assert message.routing_key.endswith(f".{gone}")
        assert await held_anywhere(channel, [stays]) == 0


@pytest.mark.timing  # no later than ON_TIME_S after its due time
async def test_a_scheduled_job_waits_in_the_levels_and_runs_on_time(
    queue_name: str, vhost_url: str, enqueuer: Enqueue
) -> None:
    """A job due in 2 s waits in the shared levels, not in its queue, as a worker's copy does
    (since when it waits, which `ricochet waiting` reads); a worker started after the enqueue
    runs it once, no earlier than its due time and on time."""
    queue = f"{queue_name}-stays"
    settings = make_settings(queue, amqp_url=vhost_url)
    started: list[float] = []

    def handler(job: Job) -> None:
        started.append(time.time())
        assert job.attempt == 1

    async with await aio_pika.connect(vhost_url) as connection:
        await declare(connection, settings)
        channel = await connection.channel()
        due = time.time() + DUE_S
        await enqueuer("job", {}, message_id="later", delay=DUE_S)
        assert await depth(channel, queue) == 0, "the job is in its queue, not in the levels"
        assert await held_anywhere(channel, []) == 1
        worker = await InProcessWorker(settings, handler).start()
        try:
            await wait_for(lambda: started, DUE_S + 10, "the job to run")
            await asyncio.sleep(0.5)  # a second run would show
        finally:
            await worker.stop()
    assert len(started) == 1
    assert due <= started[0] <= due + ON_TIME_S, started[0] - due


async def test_a_typod_queue_is_refused_and_never_orphaned(
    queue_name: str, vhost_url: str, enqueuer: Enqueue
) -> None:
    """A job due later to a queue that does not exist, in a vhost with the shared levels: the
    enqueue is refused (NotConfirmed, the queue does not exist) and nothing reaches the orphans,
    then or when it would have come due."""
    async with await aio_pika.connect(vhost_url) as connection:
        await declare(connection, make_settings(f"{queue_name}-stays", amqp_url=vhost_url))
        with pytest.raises(NotConfirmed, match="does not exist"):
            await enqueuer("job", {}, message_id="typo", delay=0.5, queue=f"{queue_name}-stay")
        await asyncio.sleep(1.5)
        channel = await connection.channel()
        assert await depth(channel, SHARED.orphans) == 0
        assert await held_anywhere(channel, []) == 0


async def test_a_cancel_after_the_enqueue_covers_the_job_in_the_levels(
    queue_name: str, vhost_url: str, enqueuer: Enqueue
) -> None:
    """A job due in 1.5 s, cancelled once its enqueue returned (it waits in the levels by
    then), and one not cancelled: a worker started after both runs the second alone and counts
    the first cancelled when it comes due."""
    queue = f"{queue_name}-stays"
    settings = make_settings(queue, amqp_url=vhost_url)
    ran: list[str | None] = []

    def handler(job: Job) -> None:
        ran.append(job.message_id)

    async with await aio_pika.connect(vhost_url) as connection:
        await declare(connection, settings)
        channel = await connection.channel()
        await enqueuer("job", {}, message_id="cancelled", delay=1.5)
        await enqueuer("job", {}, message_id="kept", delay=1.5)
        assert await depth(channel, queue) == 0, "the jobs are in their queue, not in the levels"
        async with Client(vhost_url, queue) as client:
            await client.cancel("cancelled")
        worker = await InProcessWorker(settings, handler).start()
        try:
            await wait_for(lambda: worker.count("cancelled") == 1, 15, "the job cancelled")
            await wait_for(lambda: ran == ["kept"], 5, "the job not cancelled")
        finally:
            await worker.stop()


async def test_without_the_shared_levels_a_scheduled_job_goes_to_its_queue(
    queue_name: str, vhost_url: str, enqueuer: Enqueue
) -> None:
    """A vhost where no topology of this ricochet was declared (the queue alone, as a producer or
    an earlier ricochet made it): the job goes to the queue with its run-at, for a worker to
    send to wait, as before."""
    queue = f"{queue_name}-stays"
    async with await aio_pika.connect(vhost_url) as connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        await enqueuer("job", {}, message_id="alone", delay=60)
        [message] = await take(channel, queue, 1)
    headers = message.headers or {}
    assert (message.message_id, message.routing_key, message.exchange) == ("alone", queue, "")
    assert RUN_AT in headers
    assert WAITING_SINCE not in headers


async def test_a_queue_of_an_earlier_ricochet_beside_the_levels_gets_its_job_itself(
    queue_name: str, vhost_url: str, enqueuer: Enqueue
) -> None:
    """The shared levels are there (another queue's topology), but the job's queue was declared
    by an earlier ricochet, with no route back from the levels to it: the job goes to the queue
    with its run-at, never to the levels, where nothing would route it back but the orphans."""
    earlier = f"{queue_name}-earlier"
    async with await aio_pika.connect(vhost_url) as connection:
        await declare(connection, make_settings(f"{queue_name}-stays", amqp_url=vhost_url))
        channel = await connection.channel()
        await channel.declare_queue(earlier, durable=True)
        await enqueuer("job", {}, message_id="earlier", delay=60, queue=earlier)
        [message] = await take(channel, earlier, 1)
        assert message.message_id == "earlier"
        assert RUN_AT in (message.headers or {})
        assert await held_anywhere(channel, []) == 0
