"""An upgrade from the per-queue delay levels to the shared ones (SPEC 18): jobs waiting in the
old levels still come due and run; `ricochet migrate` retires the levels (test_migrate.py)."""

import datetime as dt

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job
from ricochet.broker.plan import TTL, delay_bindings
from ricochet.names import DELAY_LEVELS, DELAY_UNIT_MS, Names, delay_key

from tests.support import StartWorker, exists, wait_for


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


async def declare_legacy_store(channel: AbstractChannel, queue: str) -> None:
    """Q's cancel store as an earlier version declared it."""
    await channel.declare_queue(
        Names(queue).cancels,
        durable=True,
        arguments={
            "x-queue-type": "stream",
            "x-max-age": "31D",
            "x-stream-max-segment-size-bytes": 1_000_000,
        },
    )


async def test_jobs_in_the_old_levels_run_and_the_levels_stay_for_migrate(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A job an earlier version sent to wait in Q's own levels (a key of the levels' digits
    alone): this version's worker runs it when due as a first attempt. The levels stay, empty,
    for `ricochet migrate` (tests/integration/test_migrate.py): a start no longer looks at them."""
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
    await start_worker(handler)
    await wait_for(lambda: ran == [("waiting", 1)], 15, "the job to come due and run")
    for k in range(DELAY_LEVELS):
        assert await exists(connection, n.delay(k))
