"""Reading the status of every queue of a plan (nothing is consumed)."""

from aio_pika.abc import AbstractConnection

from ricochet.broker.depth import KeptChannel, read_depth
from ricochet.broker.plan import Plan
from ricochet.broker.record import declared_plan
from ricochet.ops.report import QueueStatus, roles
from ricochet.settings import Settings


class StatusReader:
    """Reads queue statuses on one channel, kept from one read to the next: a reader called every
    interval costs the broker no channel churn."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._channel = KeptChannel(connection)

    async def read(self, plan: Plan) -> list[QueueStatus]:
        """Depth and consumers of every queue of the plan (None for a missing queue)."""
        result = []
        for name, role, delay_ms in roles(plan):
            depth = await read_depth(await self._channel.get(), name)
            if depth is None:
                result.append(QueueStatus(name, role, delay_ms, None, None))
            else:
                result.append(QueueStatus(name, role, delay_ms, depth.messages, depth.consumers))
        return result

    async def close(self) -> None:
        await self._channel.close()


async def read_status(connection: AbstractConnection, settings: Settings) -> list[QueueStatus]:
    """Depth and consumers of every queue of the topology as it was declared, read once."""
    declared = await declared_plan(connection, settings)
    reader = StatusReader(connection)
    statuses = await reader.read(declared)
    await reader.close()
    return statuses
