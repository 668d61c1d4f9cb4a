"""One channel's subscription to the main queue, and the settling of its deliveries.

A subscription is made anew on every channel, so nothing of a lost one (its delivery tags, acks
still pending, its consumer tag, a subscription still opening) reaches the next.
"""

import asyncio
from collections.abc import Callable

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from aio_pika.exceptions import DeliveryError

from app.acks import Acks
from app.amqp import CONNECTION_ERRORS, Delivery, Frames, refusal
from app.publish import OnePerMessageId, publish_confirmed, publish_until_confirmed

log = structlog.get_logger("ricochet.subscription")

# Runs a delivery's job in a task of its own; returns the task.
Spawn = Callable[["Subscription", Delivery], asyncio.Task[None]]


class Subscription:
    """A channel with publisher confirms: its deliveries, its acks, and where its copies go."""

    def __init__(self, frames: Frames, default: AbstractExchange, frame_max: int) -> None:
        self.frames = frames
        # Copies go straight to their queue: a confirm then means that very queue took it.
        self._default = default
        self._copying = OnePerMessageId()
        self.frame_max = frame_max
        self.acks = Acks()
        # Set when the channel stays open but this subscription stops taking deliveries on its
        # own: the broker cancelled the consumer, or subscribing failed.
        self.interrupted = asyncio.Event()
        self._tag: str | None = None
        self._opening: asyncio.Task[None] | None = None
        frames.on_cancelled(self._cancelled_by_broker)

    @classmethod
    async def open(cls, channel: AbstractChannel, frame_max: int) -> "Subscription":
        return cls(await Frames.under(channel), channel.default_exchange, frame_max)

    @property
    def consuming(self) -> bool:
        """Whether deliveries are being taken (subscribed, or fetching redelivered jobs first)."""
        if self.frames.is_closed:
            return False
        return self._tag is not None or (self._opening is not None and not self._opening.done())

    def subscribe(self, queue: str, spawn: Spawn) -> None:
        """Take the queue's deliveries, each handed to spawn, which runs its job in a task."""
        self.interrupted.clear()
        self._opening = asyncio.get_running_loop().create_task(self._subscribe(queue, spawn))

    async def _subscribe(self, queue: str, spawn: Spawn) -> None:
        """Run the jobs that come back redelivered one at a time, then subscribe.

        A job redelivered after a crash may be the one that killed its worker. The broker counts
        a return against every delivery that was unacked at that moment, so with a full prefetch
        the jobs around a poison job would reach the poison limit with it. Taken one by one with
        basic.get, a redelivered job is the only delivery this worker holds while it runs.
        """
        try:
            while (delivery := await self.frames.get(queue)) is not None:
                job = spawn(self, delivery)
                if not delivery.redelivered:
                    break
                await asyncio.wait({job})  # never cancels the job when this task is cancelled
            self._tag = await self.frames.consume(queue, lambda d: spawn(self, d))
        except CONNECTION_ERRORS as error:
            # The worker sees the channel close and starts over on a new connection, or, if the
            # channel stays open, subscribes again.
            log.warning("consuming interrupted", error=str(error))
            self.interrupted.set()

    def _cancelled_by_broker(self, tag: str) -> None:
        if tag != self._tag:
            return
        self._tag = None
        log.warning("consumer cancelled by the broker", consumer_tag=tag)
        self.interrupted.set()

    async def stop(self) -> None:
        """Stop taking deliveries (a subscription still opening too); jobs in flight carry on."""
        if self._opening is not None:
            self._opening.cancel()
        tag, self._tag = self._tag, None
        if tag is None or self.frames.is_closed:
            return
        try:
            await self.frames.cancel(tag)
        except CONNECTION_ERRORS as error:
            log.warning("consumer cancel failed", error=str(error))

    def ack(self, delivery: Delivery) -> None:
        """Ack together with the other deliveries that finish in this turn of the loop."""
        self.acks.ack_soon(delivery)

    async def dead_letter(self, delivery: Delivery) -> bool:
        """Nack without requeue (the queue dead-letters it); False if the channel closed first."""
        try:
            await delivery.dead_letter()
        except CONNECTION_ERRORS:
            log.warning("job not settled: channel closed, the broker delivers it again")
            return False
        # Only now, with the nack written, may a multiple ack pass it; a nack cancelled before
        # that keeps its tag held back for as long as the channel lives.
        self.acks.release(delivery)
        return True

    async def copy_then_ack(
        self,
        delivery: Delivery,
        copy: aio_pika.Message,
        queue: str,
        notify: str | None = None,
    ) -> bool:
        """Publish the copy to the queue until it is confirmed, then a second copy to the notify
        queue (if any), then ack the original; False if the channel closed first (the broker
        hands the original back).

        The original stays unacked while the copy is refused: a requeue would raise its delivery
        count until the job looked like poison and lost its real reason. A notify queue that
        refuses its copy costs a notice, never the job.
        """
        try:
            async with self._copying.alone(copy.message_id):
                await publish_until_confirmed(self._default, copy, queue)
                if notify is not None:
                    await self._notify(copy, notify)
        except CONNECTION_ERRORS as error:
            log.warning(
                "copy not published: channel closed, the job stays in the queue", error=str(error)
            )
            return False
        self.acks.ack_soon(delivery)
        return True

    async def _notify(self, copy: aio_pika.Message, queue: str) -> None:
        try:
            await publish_confirmed(self._default, copy, queue)
        except DeliveryError as error:
            log.error("failure not announced", queue=queue, broker_said=refusal(error))


class Gate:
    """Where deliveries wait, unacked and not run, while the worker pauses: one that arrives
    before the broker has the cancel spends no attempt."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._held: set[asyncio.Task[None]] = set()

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.clear()

    async def passed(self) -> None:
        """Return at once while open; else wait, held, until it opens."""
        if self._open.is_set():
            return
        task = asyncio.current_task()
        assert task is not None
        self._held.add(task)
        try:
            await self._open.wait()
        finally:
            self._held.discard(task)

    def drop_held(self) -> None:
        """Cancel the held deliveries' tasks: their channel is going, the broker delivers them
        again."""
        for task in self._held:
            task.cancel()
