"""An upgrade from the per-queue delay levels to the shared ones (SPEC 18): jobs waiting in the
old levels still come due and run, and the old levels are retired only once they are empty and
no worker of the earlier version is connected."""

import datetime as dt

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job
from ricochet.broker.legacy import LEVEL_FIGURES, older_workers_connected
from ricochet.broker.management import open_api, vhost
from ricochet.broker.plan import TTL, delay_bindings
from ricochet.names import DELAY_LEVELS, DELAY_UNIT_MS, Names, delay_key

from tests.broker import BROKER
from tests.support import AMQP_URL, StartWorker, api_queue, exists, wait_for


async def declare_legacy_levels(channel: AbstractChannel, queue: str) -> None:
    """Q's delay levels as an earlier version declared them (the queue's own return exchange
    is declared by this version too)."""
    n = Names(queue)
    await channel.declare_exchange(n.return_exchange, "fanout", durable=True)
    for k in range(DELAY_LEVELS):
        await channel.declare_exchange(n.delay(k), "topic", durable=True)
        below = n.delay(k - 1) if k else n.return_exchange
        await channel.declare_queue(
            n.delay(k),
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                TTL: 2**k * DELAY_UNIT_MS,
                "x-dead-letter-exchange": below,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        )
    for b in delay_bindings(n):
        if b.to_exchange:
            destination = await channel.get_exchange(b.destination, ensure=False)
            await destination.bind(b.source, routing_key=b.routing_key)
        else:
            level = await channel.get_queue(b.destination, ensure=False)
            await level.bind(b.source, routing_key=b.routing_key)


async def test_jobs_in_the_old_levels_run_and_the_levels_go_once_empty(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A job an earlier version sent to wait in Q's own levels: the new worker keeps the levels
    while the job waits (and while a worker of the earlier version is connected), runs the job
    when due as a first attempt, and its next start retires the levels."""
    n = Names(queue_name)
    ran: list[tuple[str | None, int]] = []

    async def handler(job: Job) -> None:
        ran.append((job.message_id, job.attempt))

    await (await start_worker(handler)).stop()  # Q and its return exchange, as an upgrade finds
    await declare_legacy_levels(channel, queue_name)
    old_key = delay_key(3000, queue_name).removesuffix(f".{queue_name}")
    entry = await channel.get_exchange(n.delay_entry, ensure=False)
    due = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)).isoformat()
    await entry.publish(
        aio_pika.Message(b"{}", message_id="waiting", headers={"run-at": due}), old_key
    )
    older = await aio_pika.connect(
        AMQP_URL, client_properties={"connection_name": f"ricochet worker {queue_name} old:1"}
    )
    try:
        worker = await start_worker(handler)
        assert await exists(connection, n.delay(4))  # it holds the job: kept
        await wait_for(lambda: ran == [("waiting", 1)], 15, "the job to come due and run")
        await worker.stop()
        await start_worker(handler)
        assert await exists(connection, n.delay(4))  # empty, but an older worker is connected
    finally:
        await older.close()

    async def empty_by_the_api() -> bool:  # its figures lag a few seconds behind
        levels = [n.delay(k) for k in range(DELAY_LEVELS)]  # all the worker reads, not a few
        figures = [await api_queue(level, LEVEL_FIGURES) for level in levels]
        return all(f.get("messages") == 0 and not f.get("messages_dlx") for f in figures)

    async def no_older_worker_by_the_api() -> bool:  # its list of connections lags too
        async with open_api(BROKER.management_url, BROKER.amqp_url) as api:
            return not await older_workers_connected(api, vhost(BROKER.amqp_url), queue_name)

    await wait_for(empty_by_the_api, 20, "the API to show the old levels empty")
    await wait_for(no_older_worker_by_the_api, 20, "the API to show the older worker gone")
    await start_worker(handler)
    for k in range(DELAY_LEVELS):
        assert not await exists(connection, n.delay(k))
    assert ran == [("waiting", 1)]
