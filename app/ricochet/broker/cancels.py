"""The cancel store: a stream queue of cancelled message_ids that every worker reads whole.

A stream keeps its records for everyone who reads it, from any offset, for as long as its
retention says: a worker started after a cancel reads it too, and nothing but RabbitMQ keeps it.
"""

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from aio_pika.exceptions import ChannelInvalidStateError

from ricochet.broker.amqp import Frames, epoch_s
from ricochet.broker.publish import confirming_channel, publish_to_queue
from ricochet.broker.topology import CANCELS_MAX_AGE_S, Names

log = structlog.get_logger("ricochet.cancels")

# A record's AMQP type: a cancel, or a reader's marker (how it knows it has read up to now).
CANCEL = "cancel"
MARKER = "marker"
# Records a reader has in flight; a stream consumer must ack, and a stream needs a prefetch.
READ_PREFETCH = 1000
# A worker takes no job until it has read the store up to its own marker; past this, it
# starts over on a new connection rather than wait on a store that does not answer.
CATCH_UP_TIMEOUT_S = 60.0


class CancelLog:
    """The message_ids cancelled within the kept time, oldest first: a cancel older than that
    cannot concern a job still waiting, so it is forgotten and memory stays bounded (pure).

    A cancel covers the job as it was published before it, not the id for good: a job published
    again with that id after the cancel (enqueued anew, or replayed) runs. Both times are AMQP
    timestamps, whole seconds, so a job published in the same second as the cancel is covered;
    a job without a timestamp (some producers send none) is covered whenever it was published.
    """

    def __init__(self, kept_s: float) -> None:
        self._kept_s = kept_s
        # message_id -> cancelled at (epoch seconds). An OrderedDict: taking its oldest is O(1),
        # where a dict's first item is found past the slots its deletions left behind.
        self._at: OrderedDict[str, float] = OrderedDict()

    def add(self, message_id: str, at_s: float, now_s: float) -> None:
        """Record a cancel, forgetting those past the kept time."""
        self.prune(now_s)
        if now_s - at_s < self._kept_s:
            self._at[message_id] = at_s
            self._at.move_to_end(message_id)  # a cancel made again: the order stays by time

    def prune(self, now_s: float) -> None:
        while self._at:
            message_id, at_s = next(iter(self._at.items()))
            if now_s - at_s < self._kept_s:
                break
            del self._at[message_id]

    def cancels(self, message_id: str | None, published_s: Callable[[], float | None]) -> bool:
        """Whether a recorded cancel covers this job; published_s is read only for an id that
        has one."""
        if message_id is None:
            return False
        at_s = self._at.get(message_id)
        if at_s is None:
            return False
        published = published_s()
        return published is None or published <= at_s

    def __len__(self) -> int:
        return len(self._at)


def record(kind: str, message_id: str) -> aio_pika.Message:
    """A record of the cancel store: a cancel of message_id, or a reader's marker."""
    return aio_pika.Message(
        b"",
        message_id=message_id,
        type=kind,
        timestamp=time.time(),
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


def cancel_record(message_id: str) -> aio_pika.Message:
    """The record that cancels a job, for the cancel store."""
    return record(CANCEL, message_id)


async def publish_cancel(connection: AbstractConnection, names: Names, message_id: str) -> None:
    """Record a cancel in the store, confirmed; MissingQueue when there is no store."""
    channel = await confirming_channel(connection)
    try:
        await publish_to_queue(channel, names.cancels, cancel_record(message_id))
    finally:
        await channel.close()


class CancelReader:
    """Follows the cancel store on a channel of its own, into one CancelLog kept across
    connections. It reads the store from its first record on every connection: a store
    deleted and declared again numbers its records from 0 again, so an offset kept from
    before could wait forever for a marker it has already passed."""

    def __init__(self, names: Names) -> None:
        self._names = names
        self.cancelled = CancelLog(CANCELS_MAX_AGE_S)
        self._marker: str | None = None
        self._caught_up = asyncio.Event()
        # Set when the reader's channel closes, or the broker cancels its consumer, under a live
        # connection: cancels stop arriving.
        self.lost = asyncio.Event()

    async def follow(self, connection: AbstractConnection) -> None:
        """Read every cancel recorded until now, then go on reading new ones as they come.

        A marker of its own, published first, tells when the reader has caught up: a job that
        comes due after this returns is checked against every cancel made before it.
        """
        self.lost.clear()
        self._caught_up.clear()
        self._marker = uuid.uuid4().hex
        channel = await confirming_channel(connection)
        await channel.set_qos(prefetch_count=READ_PREFETCH)
        await publish_to_queue(channel, self._names.cancels, record(MARKER, self._marker))
        queue = await channel.get_queue(self._names.cancels, ensure=False)
        await queue.consume(self._read, arguments={"x-stream-offset": "first"})
        channel.close_callbacks.add(self._closed)
        # The broker cancels a stream's consumer when the stream goes (deleted, its member lost).
        (await Frames.under(channel)).on_cancelled(self._closed)
        waits = {asyncio.ensure_future(e.wait()) for e in (self._caught_up, self.lost)}
        await asyncio.wait(waits, timeout=CATCH_UP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if not self._caught_up.is_set():
            await channel.close()
            raise ChannelInvalidStateError(
                "the cancel store could not be read up to now (its channel closed, or its "
                f"marker did not come back within {CATCH_UP_TIMEOUT_S:g} s)"
            )
        log.info("cancels read", cancelled=len(self.cancelled))

    def _closed(self, *_: Any) -> None:
        self.lost.set()

    async def _read(self, entry: AbstractIncomingMessage) -> None:
        if entry.type == CANCEL and entry.message_id:
            stamp = entry.timestamp
            at = epoch_s(stamp) if stamp else time.time()
            self.cancelled.add(entry.message_id, at, time.time())
        elif entry.type == MARKER and entry.message_id == self._marker:
            self._caught_up.set()
        await entry.ack()
