"""Reading the status of every queue of a plan (nothing is consumed)."""

from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import ChannelNotFoundEntity

from ricochet.broker.depth import KeptChannel, queue_exists, read_depth
from ricochet.broker.lead import lead_is_held
from ricochet.broker.plan import Plan
from ricochet.broker.rate_store import read_applied
from ricochet.broker.record import declared_plan
from ricochet.broker.register import amqp_user
from ricochet.names import SHARED, Names
from ricochet.ops.report import QueueStatus, roles
from ricochet.settings import Settings


class StatusReader:
    """Reads queue statuses on one channel, kept from one read to the next: a reader called every
    interval costs the broker no channel churn."""

    def __init__(self, connection: AbstractConnection, user: str) -> None:
        self._user = user  # the workers' AMQP user, who records the rate limits applied
        self._channel = KeptChannel(connection)
        # A confirming channel, for the probe of the rate limits' lead.
        self._probes = KeptChannel(connection, confirming=True)

    async def read(self, plan: Plan) -> list[QueueStatus]:
        """Depth and consumers of every queue of the plan (None for a missing queue)."""
        result = []
        for name, role, delay_ms in roles(plan):
            depth = await read_depth(await self._channel.get(), name)
            if depth is None:
                result.append(QueueStatus(name, role, delay_ms, None, None))
            else:
                result.append(QueueStatus(name, role, delay_ms, depth.messages, depth.consumers))
        return result + await self._rate_limits(plan.names)

    async def _rate_limits(self, names: Names) -> list[QueueStatus]:
        """Each limit the leader of the queue's limits applies, with the jobs waiting for its
        tokens (none when no worker limits the queue's types); a limit no process leads any more
        is said to be unapplied."""
        probes = await self._probes.get()
        # Asked by a probe first (of the announcements' queue, declared with the register: a
        # probe must not take the register's one place): reading a register that is not there
        # would close the channel, and the broker would log it, at every read of a queue whose
        # workers limit nothing.
        if not await queue_exists(probes, names.rates):
            return []
        try:
            limits = (await read_applied(await self._channel.get(), names, self._user)).limits
        except ChannelNotFoundEntity:  # deleted since
            return []
        if not limits:
            return []
        led = await lead_is_held(probes, SHARED.rates_lead(names.queue))
        rows = []
        for job_type, limit in sorted(limits.items()):
            depth = await read_depth(await self._channel.get(), names.limited(job_type))
            role = f"rate limit {job_type} {limit.text()}" + (
                "" if led else ", unapplied: no leader"
            )
            rows.append(
                QueueStatus(
                    names.limited(job_type),
                    role,
                    None,
                    None if depth is None else depth.messages,
                    None if depth is None else depth.consumers,
                )
            )
        return rows

    async def close(self) -> None:
        await self._channel.close()
        await self._probes.close()


async def read_status(connection: AbstractConnection, settings: Settings) -> list[QueueStatus]:
    """Depth and consumers of every queue of the topology as it was declared, read once."""
    declared = await declared_plan(connection, settings)
    reader = StatusReader(connection, amqp_user(settings.amqp_url))
    statuses = await reader.read(declared)
    await reader.close()
    return statuses
