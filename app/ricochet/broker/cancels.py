"""The cancel store: one stream per vhost, ricochet.cancels, of cancels that name their queue,
and the waits of the client's jobs (ricochet.broker.cancel_log says how both decide a cancel).

A stream keeps its records for everyone who reads it, from any offset, for as long as its
retention says: a worker started after a cancel reads it too, and nothing but RabbitMQ keeps it.
A worker does not read it whole: it starts from the newest snapshot, the live cancels as of an
offset, kept in a register (ricochet.broker.register) that the workers write as they read on,
then reads the stream from that offset. A snapshot is taken only as far as the broker vouches
for it: written by the reader's own user, and of this stream as the broker numbers it.

An old per-queue store (Q.cancels, from an earlier ricochet) is read
too while it exists, never declared, and deleted once its newest cancel is past the kept time.
"""

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelClosed, ChannelInvalidStateError, ChannelNotFoundEntity

from ricochet.broker.amqp import Delivery
from ricochet.broker.cancel_log import (
    BEFORE_ALL,
    CancelLog,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
    snapshot_mismatch,
)
from ricochet.broker.plan import CANCELS_MAX_AGE_S
from ricochet.broker.publish import confirming_channel, publish_to_queue
from ricochet.broker.register import read_register, write_register
from ricochet.broker.stream_log import LogReader, id_at, tail
from ricochet.headers import INCARNATION, MOVED_FROM, RECORD_QUEUE
from ricochet.log import get_logger
from ricochet.names import SHARED, Names

log = get_logger("ricochet.cancels")

# A record's AMQP type: a cancel, or a wait of a client's job.
CANCEL = "cancel"
WAIT = "wait"
# Another reader holds the snapshot's register for a round trip, longer on a loaded broker or
# client: a reader that finds it empty looks again for this long before it reads the whole
# store (seconds to hours). It reads the store from its first record meanwhile, and stops
# looking once it has read it all: a start on a vhost with few cancels does not wait.
SNAPSHOT_PATIENCE_S = 2.0
# A worker takes no job until it has read the store up to its own marker; past this, it
# starts over on a new connection rather than wait on a store that does not answer.
CATCH_UP_TIMEOUT_S = 60.0
# A reader that has caught up writes a snapshot once it has read this many records past the last
# one it started from or wrote (and a random share of half as many more): a worker then starts
# by reading at most 1.5 times this many records (about half a second) after it.
SNAPSHOT_EVERY = 5_000
# ...and at once after a start that read this many without one.
SNAPSHOT_AFTER_START = 1_000
PRUNE_EVERY_S = 60.0


def record(
    kind: str, message_id: str, headers: dict[str, Any] | None = None, at_s: float | None = None
) -> aio_pika.Message:
    """A record of the cancel store, a cancel or a wait, made now (or at at_s)."""
    return aio_pika.Message(
        b"",
        message_id=message_id,
        type=kind,
        headers=headers,
        timestamp=time.time() if at_s is None else at_s,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


def cancel_record(queue: str, message_id: str) -> aio_pika.Message:
    """The record that cancels queue's job message_id."""
    return record(CANCEL, message_id, {RECORD_QUEUE: queue})


def moved_cancel_record(queue: str, message_id: str, store: str, at_s: float) -> aio_pika.Message:
    """A cancel made at at_s in an earlier ricochet's per-queue store, moved to the shared one by
    `ricochet migrate`: read as made before every record there."""
    return record(CANCEL, message_id, {RECORD_QUEUE: queue, MOVED_FROM: store}, at_s)


def wait_record(queue: str, message_id: str, token: str) -> aio_pika.Message:
    """The record that the client's job (queue, message_id, token) is enqueued: written
    before it, so that a cancel made once the enqueue returned comes after it in the store."""
    return record(WAIT, message_id, {RECORD_QUEUE: queue, INCARNATION: token})


async def publish_cancel(connection: AbstractConnection, names: Names, *message_ids: str) -> None:
    """Record a cancel of each of names.queue's jobs message_ids in the store, side by side on one
    channel, confirmed; MissingQueue when there is no store."""
    channel = await confirming_channel(connection)
    try:
        await asyncio.gather(
            *(
                publish_to_queue(channel, SHARED.cancels, cancel_record(names.queue, message_id))
                for message_id in message_ids
            )
        )
    finally:
        await channel.close()


class OldStore:
    """An old per-queue store's cancels, read into a CancelLog (a worker's, while the store
    exists; `ricochet migrate`'s, to move them): each made before every shared record."""

    def __init__(self, log: CancelLog, queue: str) -> None:
        self._log = log
        self._queue = queue
        self.reader: LogReader | None = None

    def read(self, entry: Delivery, _: int) -> None:
        if entry.type == CANCEL and entry.message_id:
            now = time.time()
            at = _stamp(entry, now)
            self._log.add_cancel(
                self._queue, entry.message_id, offset=BEFORE_ALL, at_s=at, now_s=now
            )


def _snapshot_every() -> int:
    """Records between two snapshots of a reader that has caught up: SNAPSHOT_EVERY and a random
    share of half as many more, so that workers started together do not all write at once."""
    return int(SNAPSHOT_EVERY * (1 + random.random() / 2))


def _stamp(entry: Delivery, now_s: float) -> float:
    """A cancel's time: its publisher's stamp, or now when it has none."""
    stamp = entry.published_s()
    return now_s if stamp is None else stamp


class CancelReader:
    """Follows the cancel store (a log: ricochet.broker.stream_log) into one CancelLog, loaded
    again from the newest snapshot on every connection."""

    def __init__(self, user: str, *queues: str, writes: bool = True) -> None:
        # Snapshots are taken only from this user (the broker vouches for it), and written as it
        # unless the reader only looks (writes=False).
        self._user = user
        self._writes = writes
        # The queues whose old per-queue stores (Q.cancels) are read while they exist.
        self._queues = queues
        self.cancelled = CancelLog(CANCELS_MAX_AGE_S)
        self._channel: AbstractChannel | None = None  # where snapshots are written
        self._reader: LogReader | None = None
        self._since_snapshot = 0
        self._snapshot_after = SNAPSHOT_EVERY
        self._caught_up = False
        self._wrote_since_start = False
        self._legacy_next: dict[str, int] = {}
        self._legacy: dict[str, OldStore] = {}
        self._writing: asyncio.Task[None] | None = None
        self._pruned_at = 0.0
        # Set when a reader's channel closes, or the broker cancels its consumer, under a live
        # connection: cancels stop arriving.
        self.lost = asyncio.Event()
        # Told of each cancel as it is read (queue, message_id): the jobs running now may be
        # among those it covers.
        self._listeners: list[Callable[[str, str], None]] = []

    def on_cancel(self, listener: Callable[[str, str], None]) -> None:
        """Call listener(queue, message_id) for every cancel read from the stream from now on."""
        self._listeners.append(listener)

    async def follow(self, connection: AbstractConnection, *, old_stores: bool = True) -> None:
        """Read every cancel recorded until now (the newest snapshot, then the stream from its
        offset, then, unless `ricochet migrate` has moved them, the old per-queue stores), then
        go on reading new ones as they come.

        A marker of its own tells when the reader has caught up: a job that comes due after
        this returns is checked against every cancel made before it.
        """
        self.lost.clear()
        self.cancelled.clear()
        self._caught_up = False
        self._wrote_since_start = False
        self._channel = await confirming_channel(connection)
        self._reader = None
        self._since_snapshot = 0
        self._legacy_next = {}
        self._legacy = {}  # the old stores' readers of the last connection are gone with it

        caught_up: asyncio.Future[int | None] | None = None

        async def read_from(start: int | str) -> None:
            nonlocal caught_up
            self._reader = await LogReader.open(
                connection, SHARED.cancels, self._read, start, self.lost
            )
            caught_up = asyncio.ensure_future(self._reader.up_to_now(CATCH_UP_TIMEOUT_S))

        # A look takes the register as it finds it: no worker's start is waiting on it. A start
        # that finds it empty reads the store from its first record while it looks again: it
        # drops what it read if a snapshot turns up, and stops looking once it has read it all
        # or written a snapshot of its own (which the next look would find, and start over).
        patience_s = SNAPSHOT_PATIENCE_S if self._writes else 0.0
        snapshot = await read_snapshot(
            self._channel,
            self._user,
            patience_s,
            functools.partial(read_from, "first"),
            lambda: self._wrote_since_start or (caught_up is not None and caught_up.done()),
        )
        snapshot = await self._checked(connection, snapshot)
        if snapshot is not None:
            if self._reader is not None and caught_up is not None:
                await self._reader.close()  # which ends its wait for its marker
                self._reader = None  # no snapshot of what it read may be written from now on
                await asyncio.wait({caught_up})
                if not caught_up.cancelled():
                    caught_up.exception()  # its channel may have closed under it: no matter
                self.cancelled.clear()
                self.lost.clear()
                self._since_snapshot = 0
            self.cancelled.load(snapshot, time.time())
            self._legacy_next = dict(snapshot.legacy)
            await read_from(snapshot.next_offset)
        elif self._reader is None:
            await read_from("first")
        assert self._reader is not None
        assert caught_up is not None
        if await caught_up is None:
            await self._reader.close()
            raise ChannelInvalidStateError(
                "the cancel store could not be read up to now (its channel closed, or its "
                f"marker did not come back within {CATCH_UP_TIMEOUT_S:g} s)"
            )
        self._caught_up = True
        self._snapshot_after = min(self._snapshot_after, _snapshot_every())
        for queue_name in self._queues if old_stores else ():
            await self._follow_legacy(connection, queue_name)
        log.info(
            "cancels read",
            cancelled=len(self.cancelled),
            snapshot=None if snapshot is None else snapshot.next_offset,
            read=self._since_snapshot,
        )
        if self._writes and (snapshot is None or self._since_snapshot >= SNAPSHOT_AFTER_START):
            # After the one being written, if any: the next start reads from here. A start that
            # found none (a new vhost, or one passed over) writes one however little it read, so
            # that the next does not wait for it.
            pending = self._writing
            self._writing = asyncio.get_running_loop().create_task(self._after(pending))

    async def _checked(
        self, connection: AbstractConnection, snapshot: Snapshot | None
    ) -> Snapshot | None:
        """The snapshot, if it is one of this store as the broker numbers it: of an offset the
        stream has reached (a reader from one ahead would wait for it), holding no cancel at or
        past it, and whose anchor (a record read before that offset) is at its offset still
        (not so in a store deleted and declared again, which numbers its records anew)."""
        if snapshot is None:
            return None
        end = await tail(connection, SHARED.cancels, CATCH_UP_TIMEOUT_S)
        if end is None:
            raise ChannelInvalidStateError("the cancel store did not answer")
        reason = snapshot_mismatch(snapshot, end)
        if reason is None and snapshot.anchor is not None:
            at, record_id = snapshot.anchor
            if await id_at(connection, SHARED.cancels, at, CATCH_UP_TIMEOUT_S) != record_id:
                reason = "its anchor is not in the store"
        if reason is not None:
            log.warning(
                "cancels snapshot does not match the store: the store is read from its start",
                reason=reason,
                snapshot=snapshot.next_offset,
                store_end=end,
            )
            return None
        return snapshot

    async def close(self) -> None:
        """Stop reading (the channels of a look's reader, on a connection that stays open)."""
        if self._reader is not None:
            await self._reader.close()
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()

    @property
    def snapshot_pending(self) -> bool:
        """Whether a snapshot is being written."""
        return self._writing is not None and not self._writing.done()

    async def current(self) -> None:
        """Return once every record written to the store before this call has been read
        (a marker's round trip): asked before a job of the client is dropped as cancelled, so
        that a wait recorded by another process is not missed."""
        if self._reader is None or await self._reader.up_to_now(CATCH_UP_TIMEOUT_S) is None:
            raise ChannelInvalidStateError("the cancel store is not being read")

    async def _follow_legacy(self, connection: AbstractConnection, queue: str) -> None:
        """Read the queue's old per-queue store when it exists (without declaring it), or
        delete it once it holds no cancel within the kept time and nobody else reads it."""
        name = Names(queue).cancels
        legacy = OldStore(self.cancelled, queue)
        start = self._legacy_next.get(queue, "first")
        try:
            # Lost on its own: deleted (by `ricochet migrate`, once its cancels are moved), it
            # takes nothing this reader holds, and the shared store reads on.
            reader = await LogReader.open(connection, name, legacy.read, start)
        except ChannelNotFoundEntity:
            return  # none
        legacy.reader = reader
        if await reader.up_to_now(CATCH_UP_TIMEOUT_S) is None:
            await reader.close()
            raise ChannelInvalidStateError(f"the old cancel store {name} could not be read")
        self._legacy[queue] = legacy
        entries = self.cancelled.entries()
        if any(of == queue and offset == BEFORE_ALL for of, _, offset, _ in entries):
            return
        await reader.close()
        del self._legacy[queue]
        self._legacy_next.pop(queue, None)
        channel = await connection.channel(publisher_confirms=True)
        try:
            await channel.queue_delete(name, if_unused=True)
        except ChannelClosed as error:  # read by a worker of an earlier ricochet: kept
            log.info("old cancel store kept: still in use", store=name, reason=str(error))
            return
        log.info("old cancel store deleted: its cancels are past the kept time", store=name)
        await channel.close()

    def _read(self, entry: Delivery, offset: int) -> None:
        queue = entry.headers.get(RECORD_QUEUE)
        if entry.type == CANCEL and entry.message_id and isinstance(queue, str):
            now = time.time()
            at = _stamp(entry, now)
            if MOVED_FROM in entry.headers:  # made in an earlier ricochet's store: before all
                offset = BEFORE_ALL
            self.cancelled.add_cancel(queue, entry.message_id, offset=offset, at_s=at, now_s=now)
            for listener in self._listeners:
                listener(queue, entry.message_id)
        elif entry.type == WAIT and entry.message_id and isinstance(queue, str):
            token = entry.headers.get(INCARNATION)
            if isinstance(token, str):
                self.cancelled.add_wait(queue, entry.message_id, token, offset=offset)
        self._since_snapshot += 1
        now = time.monotonic()
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self.cancelled.prune(time.time())
        if self._since_snapshot >= self._snapshot_after:
            self._write_snapshot()

    async def _after(self, pending: "asyncio.Task[None] | None") -> None:
        if pending is not None:
            await asyncio.wait({pending})
        self._writing = None
        self._write_snapshot()
        if self._writing is not None:
            await self._writing

    def _write_snapshot(self) -> None:
        """Write a snapshot of the log as read so far, in a task of its own (one at a time)."""
        if not self._writes or (self._writing is not None and not self._writing.done()):
            return
        self._since_snapshot = 0
        every = _snapshot_every()
        # While it catches up, a reader writes one each time its log has about doubled: one
        # killed meanwhile leaves at least half of what it read, and writing them all costs about
        # twice the last one instead of one per 5,000 records (1.4 s of 8.4 at 100,000).
        self._snapshot_after = every if self._caught_up else max(every, len(self.cancelled))
        legacy = dict(self._legacy_next)
        for queue, store in self._legacy.items():
            if store.reader is not None:
                legacy[queue] = store.reader.next_offset
        reader = self._reader
        if reader is None:
            return
        copied = self.cancelled.copy()
        self._wrote_since_start = True
        self._writing = asyncio.get_running_loop().create_task(
            self._publish_snapshot(copied, reader.next_offset, legacy, reader.last_read)
        )

    async def _publish_snapshot(
        self,
        copied: CancelLog,
        next_offset: int,
        legacy: dict[str, int],
        anchor: tuple[int, str] | None,
    ) -> None:
        channel = self._channel
        try:
            # Built and encoded off the loop: a second for 500,000 cancels.
            data = await asyncio.to_thread(_encoded, copied, next_offset, legacy, anchor)
            if channel is None or channel.is_closed:
                return
            await write_register(channel, SHARED.cancels_snapshot, data, writer=self._user)
            log.info("cancels snapshot written", cancels=len(copied), bytes=len(data))
        except Exception as error:  # a snapshot is an optimisation: the next reader writes one
            log.warning("cancels snapshot not written", error=f"{type(error).__name__}: {error}")


async def read_cancels(connection: AbstractConnection, user: str) -> CancelLog:
    """Every cancel recorded until now, read as a worker reads them at its start (from user's
    newest snapshot), for a look: it writes no snapshot and reads no old per-queue store. A
    vhost whose store no worker has declared yet holds none."""
    reader = CancelReader(user, writes=False)
    try:
        await reader.follow(connection, old_stores=False)
    except ChannelNotFoundEntity:
        return CancelLog(CANCELS_MAX_AGE_S)
    finally:
        await reader.close()
    return reader.cancelled


def _encoded(
    copied: CancelLog, next_offset: int, legacy: dict[str, int], anchor: tuple[int, str] | None
) -> bytes:
    return encode_snapshot(
        Snapshot(copied.entries(), copied.wait_entries(), next_offset, legacy, anchor)
    )


async def read_snapshot(
    channel: AbstractChannel,
    user: str,
    patience_s: float = SNAPSHOT_PATIENCE_S,
    on_empty: Callable[[], Awaitable[object]] | None = None,
    needless: Callable[[], bool] | None = None,
) -> Snapshot | None:
    """The newest snapshot written by user, left in its register; None when there is none or it
    cannot be read (said in a warning: anyone who may publish in the vhost can write one).

    Workers started together (a deploy, a broker restart) all find it: each holds it for a round
    trip only, and one that finds the register empty looks again for patience_s (having awaited
    on_empty, when given), or until needless() says it has no more use for one.
    """
    body = await read_register(
        channel,
        SHARED.cancels_snapshot,
        patience_s,
        writer=user,
        on_empty=on_empty,
        needless=needless,
    )
    if body is None:
        return None
    snapshot = await asyncio.to_thread(decode_snapshot, body)
    if snapshot is None:
        log.warning(
            "cancels snapshot unreadable: the store is read from its start", bytes=len(body)
        )
    return snapshot
