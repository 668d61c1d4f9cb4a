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

from ricochet.broker.amqp import CONNECTION_ERRORS, Delivery, Frames, refusal
from ricochet.broker.publish import OnePerMessageId, publish_confirmed, publish_until_confirmed
from ricochet.worker.acks import Acks

log = structlog.get_logger("ricochet.subscription")

# Runs a delivery's job in a task of its own; returns the task.
Spawn = Callable[["Subscription", Delivery], asyncio.Task[None]]
# Whether a redelivered job must run with nothing else unacked (ricochet.delivery.retry.runs_alone).
RunsAlone = Callable[[Delivery], bool]


class Subscription:
    """A channel with publisher confirms: its deliveries, its acks, and where its copies go."""

    def __init__(
        self,
        frames: Frames,
        channel: AbstractChannel,
        frame_max: int,
        prefetch: int,
        running: set[asyncio.Task[None]],
    ) -> None:
        self.frames = frames
        self._channel = channel
        # Copies go straight to their queue: a confirm then means that very queue took it.
        self._default = channel.default_exchange
        self._exchanges: dict[str, AbstractExchange] = {}
        self._copying = OnePerMessageId()
        self.frame_max = frame_max
        # The channel's QoS, which bounds its consumer's deliveries but not basic.get's.
        self._prefetch = prefetch
        # The worker's jobs still running, on any channel: a lost channel's jobs run on, and one
        # that crashes the worker returns this channel's deliveries with a count raised too.
        self._running = running
        self.acks = Acks()
        # A delivery fetched to run alone, still waiting for the others to settle.
        self._waiting: Delivery | None = None
        # Set when the channel stays open but this subscription stops taking deliveries on its
        # own: the broker cancelled the consumer, or subscribing failed.
        self.interrupted = asyncio.Event()
        self._tag: str | None = None
        self._opening: asyncio.Task[None] | None = None
        frames.on_cancelled(self._cancelled_by_broker)

    @classmethod
    async def open(
        cls,
        channel: AbstractChannel,
        frame_max: int,
        prefetch: int,
        running: set[asyncio.Task[None]],
    ) -> "Subscription":
        frames = await Frames.under(channel)
        return cls(frames, channel, frame_max, prefetch, running)

    @property
    def consuming(self) -> bool:
        """Whether the queue's deliveries are being taken (subscribed)."""
        return self._tag is not None and not self.frames.is_closed

    @property
    def recovering(self) -> bool:
        """Whether the jobs that came back redelivered are being run, before subscribing."""
        opening = self._opening is not None and not self._opening.done()
        return opening and not self.frames.is_closed

    def subscribe(self, queue: str, spawn: Spawn, alone: RunsAlone) -> None:
        """Take the queue's deliveries, each handed to spawn, which runs its job in a task."""
        self.interrupted.clear()
        self._opening = asyncio.get_running_loop().create_task(self._subscribe(queue, spawn, alone))

    async def _subscribe(self, queue: str, spawn: Spawn, alone: RunsAlone) -> None:
        """Run the jobs that come back redelivered, then subscribe.

        A job redelivered after a crash may be the one that killed its worker. The broker counts
        a return against every delivery that was unacked at that moment, so the jobs beside a
        poison job would reach the poison limit with it. So they are fetched with basic.get
        before subscribing: side by side, as many as the prefetch (which basic.get ignores), but
        one that alone() says may be the poison runs with nothing else unacked or running. A
        fresh job ends the redelivered ones; the subscription starts once those fetched have
        finished, so that no more jobs run than the prefetch allows (and the fresh one).
        """
        fetched: set[asyncio.Task[None]] = set()
        recovered = 0
        try:
            if self._waiting is not None:  # fetched before a pause or a cancel: it goes first
                await self._alone(spawn, self._waiting)
            while True:
                await self._fewer_running_than(self._prefetch)
                delivery = await self.frames.get(queue)
                if delivery is None:
                    break
                if not delivery.redelivered:
                    self._run(spawn, delivery)
                    break
                if not recovered:
                    log.info("running the jobs that came back redelivered before subscribing")
                recovered += 1
                if alone(delivery):
                    await self._alone(spawn, delivery)
                else:
                    fetched.add(self._run(spawn, delivery))
            if fetched:
                await asyncio.wait(fetched)  # never cancels the jobs when this task is cancelled
            if recovered:
                log.info("redelivered jobs done, subscribing", jobs=recovered)
            self._tag = await self.frames.consume(queue, lambda d: self._run(spawn, d))
        except CONNECTION_ERRORS as error:
            # The worker sees the channel close and starts over on a new connection, or, if the
            # channel stays open, subscribes again.
            log.warning("consuming interrupted", error=str(error))
            self.interrupted.set()

    def _run(self, spawn: Spawn, delivery: Delivery) -> asyncio.Task[None]:
        self.acks.delivered(delivery)
        return spawn(self, delivery)

    async def _alone(self, spawn: Spawn, delivery: Delivery) -> None:
        """Run the delivery's job once no other job of the worker runs and every other delivery
        of the channel is settled (its ack written), then wait for it.

        Stopped meanwhile, the subscription keeps the delivery for its next start on this
        channel; if the channel closes instead, the broker delivers it again.
        """
        log.warning(
            "job returned more than once runs alone: it may be the one that crashes the worker",
            message_id=delivery.message_id,
        )
        self._waiting = delivery
        self.acks.delivered(delivery)  # unsettled from now on: no multiple ack may reach it
        await self._fewer_running_than(1)
        await self.acks.drain()
        self._waiting = None
        await asyncio.wait({self._run(spawn, delivery)})  # never cancels the job, as above

    async def _fewer_running_than(self, limit: int) -> None:
        while len(self._running) >= limit:
            await asyncio.wait(set(self._running), return_when=asyncio.FIRST_COMPLETED)

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
        routing_key: str,
        *,
        exchange: str = "",
        notify: str | None = None,
    ) -> bool:
        """Publish the copy (to a queue by name, or through an exchange) until it is confirmed,
        then a second copy to the notify queue (if any), then ack the original; False if the
        channel closed first (the broker hands the original back).

        The original stays unacked while the copy is refused: a requeue would raise its delivery
        count until the job looked like poison and lost its real reason. A notify queue that
        refuses its copy costs a notice, never the job.
        """
        try:
            target = await self._exchange(exchange)
            async with self._copying.alone(copy.message_id):
                await publish_until_confirmed(target, copy, routing_key)
                if notify is not None:
                    await self._notify(copy, notify)
        except CONNECTION_ERRORS as error:
            log.warning(
                "copy not published: channel closed, the job stays in the queue", error=str(error)
            )
            return False
        self.acks.ack_soon(delivery)
        return True

    async def _exchange(self, name: str) -> AbstractExchange:
        if not name:
            return self._default
        if name not in self._exchanges:
            self._exchanges[name] = await self._channel.get_exchange(name, ensure=False)
        return self._exchanges[name]

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
