"""The log: a stream that a store appends records to and reads from an offset up to now (SPEC 25).

Cancels, the schedules' state and the journal are kept this way, and read alike: a
consumer on a channel of the reader's own, from an offset, acking in batches (a stream consumer
must ack to be sent more), and a marker the reader appends once it has subscribed. When its own
marker comes back, the reader has read every record appended before it.

The broker numbers the records, and nobody else does: the offset a marker comes back with is
where the stream ended then. A checkpoint that claims an offset (the cancels' snapshot) is
checked against it (tail()), so that one claiming more than the stream holds is passed over at
once instead of waited on: a consumer from an offset past the end waits for it.
"""

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from ricochet.broker.amqp import Delivery, Frames
from ricochet.broker.publish import confirming_channel, publish_to_queue
from ricochet.headers import STREAM_OFFSET

MARKER = "marker"
# Records a reader has in flight (a stream consumer needs a prefetch); it acks them this many at
# a time (one basic.ack with multiple), not one frame a record.
READ_PREFETCH = 1000
ACK_EVERY = READ_PREFETCH // 4

# Where a reader starts: an offset, "first", "next", or the first record appended since then.
Start = int | str | dt.datetime
# What a reader does with each record but its own markers: the record and its offset.
Read = Callable[[Delivery, int], None]


class LogReader:
    """Reads one stream, from an offset, on a channel of its own, handing each record to read()
    until closed; lost is set when the channel closes or the broker cancels the consumer (the
    stream deleted, its member lost) while it reads."""

    def __init__(
        self,
        channel: AbstractChannel,
        frames: Frames,
        store: str,
        read: Read,
        lost: asyncio.Event | None = None,
    ) -> None:
        self._channel = channel
        self._frames = frames
        self._store = store
        self._read = read
        self._markers: dict[str, asyncio.Future[int]] = {}
        # The offset after the last record read.
        self.next_offset = 0
        self.lost = asyncio.Event() if lost is None else lost
        self._closing = False
        # The newest record read that has an id (a marker's, a job's): its offset and id, which
        # the broker has put at that offset of this stream, and a stream made anew, almost surely
        # not.
        self.last_read: tuple[int, str] | None = None

    @classmethod
    async def open(
        cls,
        connection: AbstractConnection,
        store: str,
        read: Read,
        start: Start,
        lost: asyncio.Event | None = None,
    ) -> "LogReader":
        """A reader of store from start, on a confirming channel of its own; lost (an event of
        the caller's, when given) is set when it is lost."""
        channel = await confirming_channel(connection)
        reader = cls(channel, await Frames.under(channel), store, read, lost)
        if isinstance(start, int):
            reader.next_offset = start
        try:
            await channel.set_qos(prefetch_count=READ_PREFETCH)
            reader._frames.on_cancelled(reader._lose)
            await reader._frames.consume(store, reader._deliver, {STREAM_OFFSET: start})
        except BaseException:
            await reader.close()
            raise
        channel.close_callbacks.add(reader._lose)
        return reader

    async def up_to_now(self, timeout_s: float) -> int | None:
        """Append a marker and wait until it is read: then every record appended before this
        call has been read. The marker's offset (where the stream ended), or None when the
        stream was lost or the marker did not come back within timeout_s."""
        if self.lost.is_set() or self._channel.is_closed:
            return None
        marker = uuid.uuid4().hex
        seen = self._markers[marker] = asyncio.get_running_loop().create_future()
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            message = aio_pika.Message(b"", message_id=marker, type=MARKER)
            await publish_to_queue(self._channel, self._store, message)
            await asyncio.wait({seen, lost}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            self._markers.pop(marker, None)
        return seen.result() if seen.done() and not seen.cancelled() else None

    async def close(self) -> None:
        """Stop reading: a wait for a marker ends (up_to_now() gives None)."""
        self._closing = True  # from now on: no frame may follow the channel's close
        self._channel.close_callbacks.discard(self._lose)
        self._end_waits()
        if not self._channel.is_closed:
            await self._channel.close()

    def _lose(self, *_: Any) -> None:
        self.lost.set()
        self._end_waits()

    def _end_waits(self) -> None:
        for marker in self._markers.values():
            if not marker.done():
                marker.cancel()

    def _deliver(self, entry: Delivery) -> None:
        if self._closing:  # an ack after the channel's close would close the connection
            return
        offset = entry.headers.get(STREAM_OFFSET)
        if not isinstance(offset, int):
            offset = self.next_offset
        self.next_offset = offset + 1
        if entry.message_id:
            self.last_read = (offset, entry.message_id)
        marker = self._markers.get(entry.message_id or "") if entry.type == MARKER else None
        if marker is not None:
            if not marker.done():
                marker.set_result(offset)
        else:
            self._read(entry, offset)
        # The channel's delivery tags count the records read: every ACK_EVERY-th acks them all.
        if entry.delivery_tag % ACK_EVERY == 0:
            acked = asyncio.ensure_future(self._frames.settle((), entry.delivery_tag, ()))
            acked.add_done_callback(_ack_ended)


async def read_up_to_now(
    connection: AbstractConnection, store: str, read: Read, start: Start, timeout_s: float
) -> int | None:
    """Read store from start up to now, handing each record to read(): the end's offset, or None
    when the store did not answer within timeout_s (what was read is read)."""
    reader = await LogReader.open(connection, store, read, start)
    try:
        return await reader.up_to_now(timeout_s)
    finally:
        await reader.close()


async def tail(connection: AbstractConnection, store: str, timeout_s: float) -> int | None:
    """The offset the broker gives a record appended now (a marker's), or None when the store
    did not answer: an offset past it is not one the store has reached."""
    return await read_up_to_now(connection, store, _skip, "next", timeout_s)


def _ack_ended(acked: "asyncio.Future[None]") -> None:
    """An ack that could not be written went with its channel: the reader is lost already."""
    if not acked.cancelled():
        acked.exception()


def _skip(entry: Delivery, offset: int) -> None:
    """What a look at the tail does with another's record appended meanwhile: nothing."""


async def id_at(
    connection: AbstractConnection, store: str, offset: int, timeout_s: float
) -> str | None:
    """The id of the record at offset of store, or None when it has none (or the store holds
    nothing from there within timeout_s)."""
    found: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def read(entry: Delivery, at: int) -> None:
        if not found.done():
            found.set_result(entry.message_id if at == offset else None)

    reader = await LogReader.open(connection, store, read, offset)
    try:
        return await asyncio.wait_for(found, timeout_s)
    except TimeoutError:
        return None
    finally:
        await reader.close()


async def read_between(
    connection: AbstractConnection, store: str, start: int, end: int, read: Read, timeout_s: float
) -> int | None:
    """Hand read() each record of store at offsets start to end - 1 (records before the store's
    first offset are gone): the first offset read, end when the store holds nothing in that
    range (its first offset is past it), or None when the range was not read within timeout_s;
    ConnectionError when the reader was lost (its channel closed, the store deleted)."""
    first: list[int] = []
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def each(record: Delivery, offset: int) -> None:
        if not first:
            first.append(offset)
        if offset >= end:
            if not done.done():
                done.set_result(True)
            return
        read(record, offset)
        if offset == end - 1 and not done.done():
            done.set_result(True)

    reader = await LogReader.open(connection, store, each, start)
    lost: asyncio.Future[bool] = asyncio.ensure_future(reader.lost.wait())
    try:
        await asyncio.wait({done, lost}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
        await reader.close()
    if not done.done():
        if reader.lost.is_set():
            raise ConnectionError(f"the reader of {store} was lost")
        return None
    return min(first[0], end)
