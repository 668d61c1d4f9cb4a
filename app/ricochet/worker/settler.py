"""One channel's settling: every delivery taken on a channel is settled there, once, by
Settler.settle, and its observers are told.

A settler is made anew on every channel, so nothing of a lost one (its delivery tags, acks
still pending) reaches the next. Acks and dead-lettering nacks are coalesced: those settled in
one turn of the event loop go out together, the nacks first, then one ack with
multiple=True for the finished deliveries below the oldest one still running, then a single ack
for each finished one above it. A retry's reason and due time go to the journal, after the
settling, like every other outcome (a nack carries nothing; a worker lost between the nack and its
entry leaves the job waiting, counted unrecorded by the waiting view).
"""

import asyncio
import contextvars
import datetime as dt
import time
from collections.abc import Collection, Sequence
from typing import assert_never

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange
from aio_pika.exceptions import DeliveryError

from ricochet.broker.amqp import (
    CONNECTION_ERRORS,
    Delivery,
    Frames,
    header_frame_bytes,
    refusal,
)
from ricochet.broker.publish import OnePerMessageId, publish_confirmed, publish_until_confirmed
from ricochet.delivery.events import Observer, Returned, Settled
from ricochet.delivery.failed import Failure, counted_copy, failed_copy
from ricochet.delivery.retry import (
    FAIL_PERMANENT,
    Ack,
    Cancel,
    Delay,
    Facts,
    Fail,
    Hold,
    Line,
    Retry,
    RetryByCopy,
    Sanitize,
    Settlement,
)
from ricochet.errors import CopyTooLarge
from ricochet.headers import KEY
from ricochet.log import get_logger
from ricochet.names import Names, delay_route

log = get_logger("ricochet.settler")


def plan_acks(running: Collection[int], finished: Collection[int]) -> tuple[int | None, list[int]]:
    """(the tag to ack with multiple=True, or None; the tags to ack one by one).

    A multiple ack settles every unsettled delivery up to its tag, so it may only reach below
    the oldest delivery still running. A finished job above that one is acked on its own rather
    than kept waiting, so that a slow job does not hold the prefetch window shut.
    """
    oldest_running = min(running, default=None)
    below = [t for t in finished if oldest_running is None or t < oldest_running]
    above = sorted(t for t in finished if oldest_running is not None and t > oldest_running)
    if len(below) > 1:
        return max(below), above
    return None, sorted(below) + above


class Settler:
    """Settles the deliveries of one channel with publisher confirms, as their decision says.

    A delivery counts as running from its arrival (delivered) until it is settled; a multiple
    ack never reaches a running one, and one written with a nack goes after the nack.
    """

    def __init__(
        self,
        channel: AbstractChannel,
        frames: Frames,
        names: Names,
        frame_max: int,
        observers: Sequence[Observer] = (),
    ) -> None:
        self._channel = channel
        self._frames = frames
        # Copies to queues go straight to them: a confirm then means that very queue took it.
        self._default = channel.default_exchange
        self._exchanges: dict[str, AbstractExchange] = {}
        self._copying = OnePerMessageId()
        self._names = names
        self._frame_max = frame_max
        self._observers = observers
        self._running: set[int] = set()
        # Settled and not yet written: the deliveries to ack, and those to dead-letter in order.
        self._finished: set[int] = set()
        self._dead: list[int] = []
        self._flushing: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        """Whether the channel is gone: a delivery of it can no longer be settled."""
        return self._channel.is_closed

    def delivered(self, delivery: Delivery) -> None:
        """The delivery arrived: no multiple ack may reach it until it is settled."""
        self._running.add(delivery.delivery_tag)

    async def settle(
        self,
        delivery: Delivery,
        facts: Facts,
        decision: Settlement,
        failure: Failure | None = None,
        kind: str | None = None,
        *,
        seconds: float | None = None,
        result: Returned | None = None,
    ) -> None:
        """Carry out the decision, then tell the observers. An ack or a nack is written with
        the others of this loop turn, after the observers are
        told: if the channel closes first, the broker hands the delivery back and it runs again.
        A copy is confirmed before they are told: a channel that closes first settles nothing
        and tells nothing. kind: the job's type, for the journal;
        seconds, result: how long its handler ran and what it returned, for the journal."""
        match decision:
            case Ack() | Cancel():
                self._settle_soon(delivery, dead_letter=False)
            case Retry():
                self._settle_soon(delivery, dead_letter=True)  # the queue dead-letters it
            case Sanitize() | Line() | Hold() | RetryByCopy() | Delay():
                copy, key, exchange = self._copy(delivery, facts, decision, failure)
                size = header_frame_bytes(copy)
                if size > self._frame_max and isinstance(decision, Delay) and failure:
                    # The reason is only shown: the job goes without it rather than fail.
                    copy, key, exchange = self._copy(delivery, facts, decision, None)
                    size = header_frame_bytes(copy)
                if size > self._frame_max:
                    # The broker would close the connection on it, and hand the job round again.
                    too_large = CopyTooLarge(
                        f"its copy to publish again takes a frame of {size} bytes, and the "
                        f"broker's frame_max is {self._frame_max}: its headers are too large"
                    )
                    await self._fail(delivery, facts, FAIL_PERMANENT, Failure(too_large), kind)
                    return
                if not await self.copy_then_ack(delivery, copy, key, exchange=exchange):
                    return
            case Fail():
                await self._fail(delivery, facts, decision, failure, kind, seconds)
                return
            case _:
                assert_never(decision)
        event = Settled(delivery.message_id, facts, decision, failure, None, kind, seconds, result)
        self._tell(event)

    def _tell(self, event: Settled) -> None:
        for observer in self._observers:
            observer.settled(event)

    async def _fail(
        self,
        delivery: Delivery,
        facts: Facts,
        decision: Fail,
        failure: Failure | None,
        kind: str | None = None,
        seconds: float | None = None,
    ) -> None:
        """Publish the failed copy, then ack, then tell the observers with its log fields
        (nothing if the channel closed first)."""
        failed = failed_copy(
            delivery,
            facts,
            failure,
            decision.kind,
            queue=self._names.queue,
            frame_max=self._frame_max,
            now=dt.datetime.now(dt.UTC),
        )
        names = self._names
        if await self.copy_then_ack(delivery, failed.message, names.failed, notify=names.events):
            fields = failed.log_fields
            self._tell(
                Settled(delivery.message_id, facts, decision, failure, fields, kind, seconds)
            )

    def _copy(
        self,
        delivery: Delivery,
        facts: Facts,
        decision: Sanitize | Line | Hold | RetryByCopy | Delay,
        failure: Failure | None,
    ) -> tuple[aio_pika.Message, str, str]:
        """(copy, routing key, exchange) of a job published again: cleaned of a forged x-death
        back to its queue; or with the retries it made, to its key's lane by its key exchange
        (with the routing key it came with, which says where from: a lane's facts read it as
        the queue's), to the delays until it is due (its
        run-at, or a RetryLater), noting since when it waits and the failure's reason, or to the
        route of its tier (a retry after it came back from the delays, whose routing key does
        not lead there)."""
        names = self._names
        match decision:
            case Sanitize():
                # The broker must never dead-letter a forged x-death (RabbitMQ 3.x can crash the
                # queue or lose the message), so that job comes back as a clean first attempt.
                return counted_copy(delivery, 0), names.queue, ""
            case Line():
                copy = counted_copy(delivery, facts.attempt - 1)
                copy.headers[KEY] = facts.key  # one its type's key function gave, too
                return copy, delivery.routing_key, names.keys
            case Hold(job_type):  # keeps its routing key, as a Line
                return (
                    counted_copy(delivery, facts.attempt - 1),
                    delivery.routing_key,
                    names.limited(job_type),
                )
            case Delay(delay_ms, retries):
                reason = None if failure is None else failure.reason
                waiting = (int(time.time() * 1000), reason)
                exchange, routing_key = delay_route(delay_ms, names.queue)
                return counted_copy(delivery, retries, waiting), routing_key, exchange
            case RetryByCopy(tier):  # tier k takes the key of a job back from tier k - 1
                return counted_copy(delivery, tier), names.attempt_key(tier - 1), names.dlx
            case _:
                assert_never(decision)

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
        self._settle_soon(delivery, dead_letter=False)
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

    def drop(self, delivery: Delivery) -> None:
        """Ack a delivery that is no job (a probe, ricochet.broker.depth.queue_exists), telling
        no observer."""
        self._settle_soon(delivery, dead_letter=False)

    def _settle_soon(self, delivery: Delivery, dead_letter: bool) -> None:
        """Ack or dead-letter the delivery together with the others settled in this loop turn."""
        tag = delivery.delivery_tag
        self._running.discard(tag)
        if dead_letter:
            self._dead.append(tag)
        else:
            self._finished.add(tag)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Start the one flush of this channel, unless it runs: two at once could each plan a
        multiple ack that reaches a retry the other has taken to nack."""
        if self._flushing is None or self._flushing.done():
            # A context of its own: the lines it logs are no job's, whichever job started it.
            self._flushing = asyncio.get_running_loop().create_task(
                self._flush(), context=contextvars.Context()
            )

    async def drain(self) -> None:
        """Send every ack and nack still pending (before the channel closes)."""
        self._flush_soon()  # again after one that ended early, the channel closed
        while self._flushing is not None and not self._flushing.done():
            await asyncio.wait({self._flushing})

    async def _flush(self) -> None:
        while self._finished or self._dead:
            dead, self._dead = self._dead, []
            if not await self._settle(dead):
                return

    async def _settle(self, dead: list[int]) -> bool:
        """Write the nacks of dead, then the acks settled so far, none reaching a retry not yet
        nacked (those settled since); False if the channel closed first."""
        finished, self._finished = self._finished, set()
        multiple, singles = plan_acks(self._running.union(self._dead), finished)
        try:
            await self._frames.settle(dead, multiple, singles)
        except CONNECTION_ERRORS:
            log.warning(
                "jobs not settled: channel closed, the broker delivers them again",
                jobs=len(finished) + len(dead),
            )
            return False
        return True
