"""A queue's key lanes on this worker (SPEC 28): declared once the queue has jobs with a key,
then consumed, one job at a time per lane, on a channel of their own.

Each lane has one active consumer in the vhost (the broker's single active consumer): this
worker runs a lane's jobs only while the broker makes it that lane's consumer, and a worker
that dies or disconnects hands its lanes to the next at once, with its connection. A job with a
key comes to the queue first (from a producer that does not know the lanes, back from a wait, or
replayed) and a worker sends it on to the end of its key's lane (ricochet.delivery.retry.Line).
"""

import asyncio
import contextlib
import functools
from collections.abc import Callable, Sequence

from aio_pika.abc import AbstractChannel, AbstractConnection

from ricochet.broker.amqp import CONNECTION_ERRORS, Delivery, Frames, frame_max
from ricochet.broker.connection import lost_or_cancelled
from ricochet.broker.depth import queue_exists
from ricochet.broker.key_lanes import declare_key_lanes
from ricochet.broker.publish import confirming_channel
from ricochet.delivery.events import Observer
from ricochet.errors import ConfigError, TopologyConflict
from ricochet.headers import PROBE
from ricochet.log import get_logger
from ricochet.names import Names
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.consumer import Consumer
from ricochet.worker.settler import Settler

log = get_logger("ricochet.lanes")

# How often lane jobs held through a pause look whether it has ended.
PAUSE_LOOK_S = 0.2
# A lanes' channel the broker closed is opened again after this long.
REOPEN_PAUSE_S = 1.0
# While this worker does not consume the queue's lanes, it asks this often whether another
# declared them: a worker that dies hands its lanes to the next within this long.
LOOK_FOR_LANES_S = 5.0


class KeyLanes:
    """The key lanes of one queue, consumed on each connection of the worker."""

    def __init__(
        self,
        settings: Settings,
        lifecycle: Lifecycle,
        consumer: Callable[[], Consumer],
        observers: Callable[[], Sequence[Observer]],
        paused: Callable[[], bool],
    ) -> None:
        self._settings = settings
        self._names = Names(settings.queue)
        self._lifecycle = lifecycle
        self._consumer = consumer
        self._observers = observers
        # While the queue pauses on a failure spike (SPEC 12), its lanes run no job either: a
        # delivery waits unrun in its lane's slot until the pause ends.
        self._paused = paused
        self._held: list[tuple[Settler, str, Delivery]] = []
        self._releasing: asyncio.Task[None] | None = None
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._settler: Settler | None = None
        self._opening = asyncio.Lock()
        # The lanes whose job runs on this worker now, and its task.
        self._running: dict[str, asyncio.Task[None]] = {}

    @property
    def busy(self) -> int:
        """The lanes whose job runs on this worker now."""
        return len(self._running)

    async def run(self, connection: AbstractConnection) -> None:
        """Consume the lanes on this connection: at once when the queue has them, else from its
        first job with a key (ensure); at a stop, take no more and settle what ran."""
        self._connection = connection
        looking = asyncio.get_running_loop().create_task(self._look_for_lanes(connection))
        try:
            await self._lifecycle.stopping.wait()
            looking.cancel()  # no lanes consumed again from here
            await self._stop()
        finally:
            # Cancelled with its connection too: a look left running would probe the dead
            # connection every few seconds, and log it, for the process's life.
            looking.cancel()
            self._connection = None

    async def _look_for_lanes(self, connection: AbstractConnection) -> None:
        """Consume the lanes once they exist (declared by another worker, or by an earlier
        run): asked at once, then every LOOK_FOR_LANES_S while they are not consumed here."""
        channel: AbstractChannel | None = None
        while not lost_or_cancelled(connection):
            if not self._consuming:
                try:
                    if channel is None or channel.is_closed:
                        channel = await confirming_channel(connection)
                    if await queue_exists(channel, self._names.key_lane(0)):
                        await self.ensure()
                except (TopologyConflict, ConfigError, *CONNECTION_ERRORS) as error:
                    log.error("key lanes not consumed", queue=self._names.queue, error=str(error))
            await asyncio.sleep(LOOK_FOR_LANES_S)

    @property
    def _consuming(self) -> bool:
        return self._channel is not None and not self._channel.is_closed

    async def ensure(self) -> None:
        """The lanes declared and consumed on the current connection (declared now, with their
        exchange, if they are not yet); TopologyConflict when the broker holds a lane of other
        arguments, ConfigError when it lacks the consistent-hash exchange."""
        async with self._opening:
            if self._consuming:
                return
            connection = self._connection
            if connection is None:  # between connections: its channel is closing anyway
                raise ConnectionError("the worker's connection is being opened again")
            settings = self._settings
            lanes = await declare_key_lanes(
                connection, settings.amqp_url, settings.queue, settings.key_lanes
            )
            if self._running:
                # The lane jobs of a channel lost run on: the broker hands their lanes on at
                # once, so the next job of a key may only start here once they have ended.
                await asyncio.wait(set(self._running.values()))
            await self._consume(connection, lanes)

    async def _consume(self, connection: AbstractConnection, lanes: int) -> None:
        """Consume the queue's lanes (as many as its first declaration made)."""
        channel = await confirming_channel(connection)
        await channel.set_qos(prefetch_count=1)  # per consumer: one job at a time per lane
        frames = await Frames.under(channel)
        settler = Settler(channel, frames, self._names, frame_max(connection), self._observers())
        frames.on_cancelled(lambda tag: self._reopen(channel, f"consumer {tag} cancelled"))
        channel.close_callbacks.add(lambda _, error: self._reopen(channel, str(error)))
        for lane in map(self._names.key_lane, range(lanes)):
            await frames.consume(lane, functools.partial(self._take, settler, lane))
        self._channel, self._settler = channel, settler
        log.info("consuming key lanes", queue=self._settings.queue, lanes=lanes)

    def _take(self, settler: Settler, lane: str, delivery: Delivery) -> None:
        settler.delivered(delivery)
        if PROBE in delivery.headers:  # another worker asking whether the lane exists
            settler.drop(delivery)
            return
        if self._lifecycle.stopping.is_set():
            # Unrun and unsettled: the broker puts it back first in its lane as the channel
            # closes, and only then makes another worker the lane's consumer.
            return
        if self._paused():
            self._held.append((settler, lane, delivery))
            if self._releasing is None or self._releasing.done():
                self._releasing = asyncio.get_running_loop().create_task(self._after_pause())
            return
        self._run(settler, lane, delivery)

    async def _after_pause(self) -> None:
        """Run the lane jobs held through a pause once it ends (unless their channel went, or
        the worker stops: the broker hands them out again)."""
        while True:
            await asyncio.sleep(PAUSE_LOOK_S)
            if not self._paused():
                break
        held, self._held = self._held, []
        for settler, lane, delivery in held:
            if not settler.closed and not self._lifecycle.stopping.is_set():
                self._run(settler, lane, delivery)

    def _run(self, settler: Settler, lane: str, delivery: Delivery) -> None:
        consumer = self._consumer()
        task = consumer.spawn(settler, consumer.intake(delivery, lined=True))
        self._running[lane] = task
        task.add_done_callback(self._ended)

    def _ended(self, task: "asyncio.Task[None]") -> None:
        """A lane's job was settled: its lane is free here, unless the lane has handed this
        worker another job meanwhile (after a reconnect), which is the lane's entry now."""
        for lane, running in list(self._running.items()):
            if running is task:
                del self._running[lane]

    def _reopen(self, channel: AbstractChannel, why: str) -> None:
        """The broker closed the lanes' channel, or cancelled a lane's consumer (its lane was
        deleted): declare and consume them again soon, unless the worker stops or reconnects."""
        if channel is not self._channel or self._lifecycle.stopping.is_set():
            return
        self._channel = None  # once: the cancel's close of it calls back here too
        log.warning("key lanes not consumed, opening them again", error=why)
        asyncio.get_running_loop().create_task(self._again(channel))

    async def _again(self, channel: AbstractChannel) -> None:
        with contextlib.suppress(*CONNECTION_ERRORS):
            await channel.close()
        await asyncio.sleep(REOPEN_PAUSE_S)
        if self._connection is None or self._lifecycle.stopping.is_set():
            return
        try:
            await self.ensure()
        except (TopologyConflict, ConfigError, *CONNECTION_ERRORS) as error:
            log.error("key lanes not consumed", queue=self._settings.queue, error=str(error))

    async def _stop(self) -> None:
        """Run no more lane jobs; once those running are settled and their acks sent, close the
        channel, which hands every lane to its next consumer. Not a cancel of each lane's
        consumer: a job delivered here meanwhile would come back behind the next ones, which
        the next consumer would already have, and the lane's order would be lost."""
        channel, settler = self._channel, self._settler
        if channel is None or settler is None or channel.is_closed:
            return
        self._channel = None  # no reopening from here
        if self._running:
            await asyncio.wait(set(self._running.values()))
        await settler.drain()
        with contextlib.suppress(*CONNECTION_ERRORS):
            await channel.close()
