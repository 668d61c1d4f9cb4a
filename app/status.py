"""Reading the status of every queue of a plan (nothing is consumed)."""

from aio_pika.abc import AbstractConnection

from app.depth import read_depth
from app.report import QueueStatus, roles
from app.topology import Plan


async def read_status(connection: AbstractConnection, plan: Plan) -> list[QueueStatus]:
    """Depth and consumers of every queue of the plan."""
    result = []
    channel = await connection.channel(publisher_confirms=False)
    for name, role, delay_ms in roles(plan):
        depth = await read_depth(channel, name)
        if depth is None:  # no such queue: the broker closed the channel
            channel = await connection.channel(publisher_confirms=False)
            result.append(QueueStatus(name, role, delay_ms, None, None))
        else:
            result.append(QueueStatus(name, role, delay_ms, depth.messages, depth.consumers))
    await channel.close()
    return result
