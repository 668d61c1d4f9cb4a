"""Reading the status of every queue of a plan (nothing is consumed)."""

from aio_pika.abc import AbstractChannel, AbstractConnection

from app.depth import read_depth
from app.report import QueueStatus, roles
from app.topology import Plan


class StatusReader:
    """Reads queue statuses on one channel, kept from one read to the next.

    A passive declare of a missing queue makes the broker close the channel; only then is
    another one opened, so a reader called every interval costs the broker no channel churn.
    """

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None

    async def read(self, plan: Plan) -> list[QueueStatus]:
        """Depth and consumers of every queue of the plan (None for a missing queue)."""
        result = []
        for name, role, delay_ms in roles(plan):
            depth = await read_depth(await self._open_channel(), name)
            if depth is None:
                result.append(QueueStatus(name, role, delay_ms, None, None))
            else:
                result.append(QueueStatus(name, role, delay_ms, depth.messages, depth.consumers))
        return result

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()

    async def _open_channel(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(publisher_confirms=False)
        return self._channel


async def read_status(connection: AbstractConnection, plan: Plan) -> list[QueueStatus]:
    """Depth and consumers of every queue of the plan, read once."""
    reader = StatusReader(connection)
    statuses = await reader.read(plan)
    await reader.close()
    return statuses
