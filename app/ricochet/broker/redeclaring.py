"""One declarer at a time deletes and declares again a queue's tiers whose delay changed.

Two that did it at once could lose a job: one declares the tier anew and routes to it again while
the other, which saw it empty a moment before, deletes it. Every worker process, and `ricochet
topology`, takes this lock once per declare, at the first tier that differs, and holds it to the
declare's end (the routes restored included), looking again under it whether each tier still
differs: an exclusive queue, which the broker refuses to any other connection (RESOURCE_LOCKED)
and deletes with its connection, so that a process killed holds nothing. Within a process, one
declare at a time per queue (worker/applied.py).
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelClosed

from ricochet.broker.plan import QUEUE_TYPE
from ricochet.names import Names

# Another declarer holds the lock for the rest of its declare, an unbinding, a look and a deletion
# for each tier that differs: seconds at most (a new quorum tier's figures may take up to 15 s to
# appear).
LOCK_WAIT_S = 30.0
LOCK_RETRY_S = 0.2


@asynccontextmanager
async def redeclaring(connection: AbstractConnection, names: Names) -> AsyncIterator[bool]:
    """Hold the queue's lock for declaring its tiers again (True), or, when another connection
    still holds it after LOCK_WAIT_S, say so (False: leave the tiers as they are)."""
    deadline = asyncio.get_running_loop().time() + LOCK_WAIT_S
    channel = await _take(connection, names)
    while channel is None and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(LOCK_RETRY_S)
        channel = await _take(connection, names)
    try:
        yield channel is not None
    finally:
        if channel is not None and not channel.is_closed:
            await channel.queue_delete(names.redeclaring)
            await channel.close()


async def _take(connection: AbstractConnection, names: Names) -> AbstractChannel | None:
    """The channel that declared the lock, or None when another connection holds it."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.declare_queue(
            names.redeclaring, exclusive=True, arguments={QUEUE_TYPE: "classic"}
        )
    except ChannelClosed:  # the broker closed the channel: another connection holds the lock
        return None
    return channel
