"""One channel's subscription to the main queue: how deliveries come in, and nothing else (the
channel's settler settles them).

A subscription is made anew on every channel, so nothing of a lost one (its consumer tag, a
subscription still opening, deliveries held) reaches the next.
"""

import asyncio
from collections.abc import Callable

from ricochet.broker.amqp import CONNECTION_ERRORS, Delivery, Frames
from ricochet.log import get_logger
from ricochet.worker.consumer import Arrival
from ricochet.worker.settler import Settler

log = get_logger("ricochet.subscription")

# A delivery's facts, read once as it comes in (ricochet.worker.consumer.Consumer.intake).
Intake = Callable[[Delivery], Arrival]
# Runs an arrival's job in a task of its own, settled by the channel's settler; returns the task.
Spawn = Callable[[Settler, Arrival], asyncio.Task[None]]


class Subscription:
    """Takes the queue's deliveries on one channel: first the jobs that came back redelivered
    (fetched, a suspect one run alone), then by subscribing; while held, deliveries that still
    arrive wait unrun."""

    def __init__(
        self,
        frames: Frames,
        settler: Settler,
        queue: str,
        prefetch: int,
        running: set[asyncio.Task[None]],
    ) -> None:
        self.frames = frames
        self.settler = settler
        self._queue = queue
        # The channel's QoS, which bounds its consumer's deliveries but not basic.get's.
        self._prefetch = prefetch
        # The worker's jobs still running, on any channel: a lost channel's jobs run on, and one
        # that crashes the worker returns this channel's deliveries with a count raised too.
        self._running = running
        # A delivery fetched to run alone, still waiting for the others to settle.
        self._waiting: Arrival | None = None
        # Deliveries that arrived after hold(), not run (nor spawned) until release().
        self._held: list[Delivery] | None = None
        # Set when the channel stays open but this subscription stops taking deliveries on its
        # own: the broker cancelled the consumer, or subscribing failed. Cleared by whoever opens
        # it again, before open() runs.
        self.interrupted = asyncio.Event()
        self._tag: str | None = None
        frames.on_cancelled(self._cancelled_by_broker)

    async def open(self, intake: Intake, spawn: Spawn) -> bool:
        """Run the jobs that come back redelivered, then subscribe; False if interrupted.

        A job redelivered after a crash may be the one that killed its worker. The broker counts
        a return against every delivery that was unacked at that moment, so the jobs beside a
        poison job would reach the poison limit with it. So they are fetched with basic.get
        before subscribing: side by side, as many as the prefetch (which basic.get ignores), but
        one whose facts say it may be the poison runs with nothing else unacked or running. A
        fresh job ends the redelivered ones; the subscription starts once those fetched have
        finished, so that no more jobs run than the prefetch allows (and the fresh one).
        """
        try:
            recovered = await self._recover(intake, spawn)
            if recovered:
                log.info("redelivered jobs done, subscribing", jobs=recovered)
            self._tag = await self.frames.consume(
                self._queue, lambda d: self._take(intake, spawn, d)
            )
        except CONNECTION_ERRORS as error:
            # The worker sees the channel close and starts over on a new connection, or, if the
            # channel stays open, subscribes again.
            log.warning("consuming interrupted", error=str(error))
            self.interrupted.set()
            return False
        return True

    async def _recover(self, intake: Intake, spawn: Spawn) -> int:
        """Run the deliveries kept from before (the one waiting to run alone, the held ones),
        then fetch until a fresh job or none; the number of redelivered jobs fetched."""
        if self._waiting is not None:  # fetched before a pause or a cancel: it goes first
            await self._alone(spawn, self._waiting)
        for held in self._release():
            self._take(intake, spawn, held)
        fetched: set[asyncio.Task[None]] = set()
        recovered = 0
        while True:
            await self._fewer_running_than(self._prefetch)
            delivery = await self.frames.get(self._queue)
            if delivery is None:
                break
            if not delivery.redelivered:
                self._take(intake, spawn, delivery)
                break
            if not recovered:
                log.info("running the jobs that came back redelivered before subscribing")
            recovered += 1
            self.settler.delivered(delivery)
            arrival = intake(delivery)
            if arrival.facts.alone:
                await self._alone(spawn, arrival)
            else:
                fetched.add(spawn(self.settler, arrival))
        if fetched:
            await asyncio.wait(fetched)  # never cancels the jobs when this task is cancelled
        return recovered

    @property
    def consuming(self) -> bool:
        """Whether the queue's deliveries are being taken (subscribed)."""
        return self._tag is not None and not self.frames.is_closed

    def _take(self, intake: Intake, spawn: Spawn, delivery: Delivery) -> None:
        self.settler.delivered(delivery)  # unsettled from now on, run or held
        if self._held is not None:
            self._held.append(delivery)
        else:
            spawn(self.settler, intake(delivery))

    def _release(self) -> list[Delivery]:
        held, self._held = self._held or [], None
        return held

    async def _alone(self, spawn: Spawn, arrival: Arrival) -> None:
        """Run the arrival's job once no other job of the worker runs and every other delivery
        of the channel is settled (its ack written), then wait for it.

        Stopped meanwhile, the subscription keeps the delivery for its next start on this
        channel; if the channel closes instead, the broker delivers it again.
        """
        log.warning(
            "job returned more than once runs alone: it may be the one that crashes the worker",
            message_id=arrival.delivery.message_id,
        )
        self._waiting = arrival
        await self._fewer_running_than(1)
        await self.settler.drain()
        self._waiting = None
        await asyncio.wait({spawn(self.settler, arrival)})  # never cancels the job, as above

    async def _fewer_running_than(self, limit: int) -> None:
        while len(self._running) >= limit:
            await asyncio.wait(set(self._running), return_when=asyncio.FIRST_COMPLETED)

    def _cancelled_by_broker(self, tag: str) -> None:
        if tag != self._tag:
            return
        self._tag = None
        log.warning("consumer cancelled by the broker", queue=self._queue, consumer_tag=tag)
        self.interrupted.set()

    async def hold(self) -> None:
        """Stop taking deliveries; those still arriving meanwhile (before the broker has the
        cancel) wait unrun, spending no attempt, until the next open() runs them first."""
        self._held = self._held or []
        await self._cancel()

    async def stop(self) -> None:
        """Stop taking deliveries; jobs in flight carry on, held ones go back on channel close."""
        self._held = []
        await self._cancel()

    async def _cancel(self) -> None:
        tag, self._tag = self._tag, None
        if tag is None or self.frames.is_closed:
            return
        try:
            await self.frames.cancel(tag)
        except CONNECTION_ERRORS as error:
            log.warning("consumer cancel failed", error=str(error))
