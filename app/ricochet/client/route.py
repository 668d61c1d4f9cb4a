"""Where the client publishes a job due later: into the shared levels of the delays, as a worker
sends a job to wait (SPEC 18, 24), so that it waits there from its enqueue on. In its queue, a
job waits only until a worker takes it; with no worker running, a queue deleted meanwhile takes
it along (RabbitMQ dead-letters nothing it deletes). In the levels, its queue deleted, it ends in
ricochet.orphans when it comes due.

That route needs what the broker holds, asked for once in the client's life with passive declares
on a channel of their own (one for an object that is not there closes its channel, never the one
the enqueues publish on):

- the levels (their entry exchange): a vhost where no ricochet of this version declared them
  gets the job in its queue with its run-at, as before, for a worker to send to wait;
- the job's queue, and beside it the exchange this version declares on its route back from the
  tiers, Q.return.queue, which says the queue's topology is this version's and so binds the
  levels' return exchange to the queue: a queue that does not exist is refused (MissingQueue),
  as a job published to it would be returned, and one declared by an earlier ricochet gets the
  job itself. A queue found is taken for there from then on: one deleted later has its jobs due
  later in the orphans, as any job that waited when its queue was deleted.
"""

import asyncio
import datetime as dt
from typing import Any

from aio_pika.abc import AbstractConnection

from ricochet.broker.amqp import ACCESS_REFUSED
from ricochet.broker.depth import KeptChannel, exchange_exists, read_depth
from ricochet.broker.key_lanes import declare_key_lanes
from ricochet.delivery.failed import note_wait
from ricochet.delivery.retry import due_in_ms
from ricochet.errors import MissingQueue
from ricochet.names import SHARED, Names, delay_route


def to_the_delays(headers: dict[str, Any], queue: str, now: dt.datetime) -> tuple[str, str] | None:
    """(exchange, routing key) of queue's job when its run-at is ahead of now, its headers then
    noting since when it waits, as a worker's copy to the delays does; None (and the headers as
    they were) when it is due now, for its queue. A first wait: no failure, no retries."""
    ahead_ms, _ = due_in_ms(headers, now)
    if ahead_ms is None:
        return None
    note_wait(headers, int(now.timestamp() * 1000), None)
    return delay_route(ahead_ms, queue)


class Routes:
    """What the client learnt of the broker, for its life: whether the vhost has the shared
    levels, and which queues the levels route back to."""

    def __init__(self) -> None:
        self._levels: bool | None = None  # None: not asked yet
        self._queues: dict[str, bool] = {}
        # The queues whose key lanes are declared (True), or may not be by this client (False).
        self._lanes: dict[str, bool] = {}
        self._asking = asyncio.Lock()

    async def through_levels(self, connection: AbstractConnection, queue: str) -> bool:
        """Whether queue's jobs due later go through the shared levels; MissingQueue when the
        vhost has the levels and the queue does not exist (asked again at the next call)."""
        known = self._known(queue)
        if known is not None:
            return known
        async with self._asking:  # callers of one queue at once ask once
            known = self._known(queue)
            if known is None:
                known = await self._ask(connection, queue)
            return known

    async def to_lanes(
        self, connection: AbstractConnection, amqp_url: str, queue: str, count: int
    ) -> tuple[str, str] | None:
        """(exchange, routing key) of queue's job with a key: the queue's key exchange, its
        lanes declared first (once in the client's life; count of them if it has none yet), so
        that the jobs of a key join their lane in the order they are enqueued. None when the
        client's user may not declare them: the job goes to its queue, and a worker sends it on.
        MissingQueue when the queue does not exist, ConfigError when the broker lacks the
        consistent-hash exchange, TopologyConflict when a lane is not as ricochet declares it."""
        known = self._lanes.get(queue)
        if known is None:
            async with self._asking:
                known = self._lanes.get(queue)
                if known is None:
                    known = self._lanes[queue] = await _declare_lanes(
                        connection, amqp_url, queue, count
                    )
        return (Names(queue).keys, queue) if known else None

    def _known(self, queue: str) -> bool | None:
        if self._levels is None or not self._levels:
            return self._levels
        return self._queues.get(queue)

    async def _ask(self, connection: AbstractConnection, queue: str) -> bool:
        channel = KeptChannel(connection)
        try:
            if self._levels is None:
                self._levels = await exchange_exists(await channel.get(), SHARED.delay_entry)
            if not self._levels:
                return False
            if await read_depth(await channel.get(), queue) is None:
                raise MissingQueue(queue)
            routed = await exchange_exists(await channel.get(), Names(queue).return_to_queue)
            self._queues[queue] = routed
            return routed
        finally:
            await channel.close()


async def _declare_lanes(
    connection: AbstractConnection, amqp_url: str, queue: str, count: int
) -> bool:
    """Declare queue's key lanes (MissingQueue when the queue does not exist); False when the
    client's user may not."""
    channel = KeptChannel(connection)
    try:
        if await read_depth(await channel.get(), queue) is None:
            raise MissingQueue(queue)
    finally:
        await channel.close()
    try:
        await declare_key_lanes(connection, amqp_url, queue, count)
    except ACCESS_REFUSED:
        return False
    return True
