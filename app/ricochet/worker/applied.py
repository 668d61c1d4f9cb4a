"""A queue's plan as the broker applies it, in the worker: what its last declare found (the
conflict that kept it from being done, or the plan), with a tier kept at an older delay (it held
jobs when the settings changed) declared again with the planned delay once it is empty.

A tier's delay is its queue's x-message-ttl, fixed for the queue's life: it changes only by
deleting the queue, which must hold nothing. So while a tier is kept, the worker looks every few
seconds (a passive declare, on one channel) whether it is empty, and then declares it as a start
does (broker/declare.py), one declarer at a time (broker/redeclaring.py): unbound first, deleted
only if still empty (a classic queue by queue.delete if-empty, which the broker refuses when a
job came in meanwhile; a quorum queue, which cannot, once the management API shows it empty),
declared with the planned delay and routed to again. The record of the topology is written
again, so that every tool shows the delay the broker applies.
"""

import asyncio

from aio_pika.abc import AbstractConnection

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.connection import is_lost, lost_or_cancelled
from ricochet.broker.declare import declare_tier_again
from ricochet.broker.depth import KeptChannel, read_depth
from ricochet.broker.plan import Plan
from ricochet.broker.record import declare_recorded, record_declared
from ricochet.errors import ConfigError, TopologyConflict
from ricochet.log import get_logger
from ricochet.settings import Settings

log = get_logger("ricochet.topology")

# How often a worker looks whether a kept tier is empty yet.
KEPT_CHECK_S = 2.0


class AppliedPlan:
    """The queue's plan as the broker applies it now, declared by the worker."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._plan: Plan | None = None
        self.conflict: TopologyConflict | None = None  # what the last declare found, if in conflict
        # One declare of the queue's tiers at a time in the process: a lock held by the
        # connection (broker/redeclaring.py) keeps out only other connections.
        self._declaring = asyncio.Lock()

    @property
    def plan(self) -> Plan:
        """The plan of the last declare, with the tiers declared again since."""
        assert self._plan is not None, "declared first"
        return self._plan

    async def declare(self, connection: AbstractConnection) -> Plan:
        """Declare the queue's topology (and what every queue shares), and record it;
        TopologyConflict, kept as conflict until a declare is done, when the queue (or one of its
        objects) is in conflict."""
        async with self._declaring:
            try:
                self._plan = await declare_recorded(connection, self._settings)
            except TopologyConflict as error:
                self.conflict = error
                raise
            self.conflict = None
            return self._plan

    async def declare_kept_once_empty(self, connection: AbstractConnection) -> None:
        """Every KEPT_CHECK_S, declare again each kept tier that is empty, until the connection
        closes (or the task is cancelled)."""
        channel = KeptChannel(connection)
        try:
            while not lost_or_cancelled(connection):
                await asyncio.sleep(KEPT_CHECK_S)
                try:
                    for k in [] if self._plan is None else self._plan.kept_tiers():
                        await self._declare_again_if_empty(connection, channel, k)
                except (*CONNECTION_ERRORS, ConfigError) as error:
                    if is_lost(connection):
                        return
                    log.warning(
                        "kept tier not declared again, looking again later",
                        queue=self._settings.queue,
                        error=str(error),
                    )
        finally:
            await channel.close()

    async def _declare_again_if_empty(
        self, connection: AbstractConnection, channel: KeptChannel, k: int
    ) -> None:
        before = self.plan
        for spec in before.waiting_of(k):
            if spec.name in before.kept:
                depth = await read_depth(await channel.get(), spec.name)
                if depth is not None and depth.messages:
                    return
        async with self._declaring:
            if self._plan is not before:  # declared whole meanwhile (a session subscribing again)
                return
            self._plan = await declare_tier_again(connection, self._settings, before, k)
            if self._plan.kept != before.kept:
                await record_declared(connection, self._settings, self._plan)
