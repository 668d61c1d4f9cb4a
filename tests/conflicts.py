"""A queue put in conflict with its worker's settings, as a producer that declares the queues it
publishes to does: deleted, then declared again as a plain durable classic queue."""

from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import ChannelPreconditionFailed

from tests.support import wait_for


async def declare_plain(connection: AbstractConnection, queue: str) -> None:
    """Delete the queue and declare it again as a plain durable classic queue; again if its
    worker declared its own in between."""

    async def plain() -> bool:
        channel = await connection.channel()
        try:
            await channel.queue_delete(queue)
            await channel.declare_queue(queue, durable=True)
        except ChannelPreconditionFailed:
            return False
        await channel.close()
        return True

    await wait_for(plain, 20, f"{queue} declared as a plain queue")


async def delete_queue(connection: AbstractConnection, queue: str) -> None:
    """Delete the queue (what mends a conflict: its worker declares it again)."""
    channel = await connection.channel()
    await channel.queue_delete(queue)
    await channel.close()
