"""The journal: one stream per vhost, ricochet.journal, of every change of a job's state
(SPEC 26), written in batches on the log of SPEC 25 (broker/stream_log.py).

A process keeps the entries of its jobs in memory and writes those kept as one record every
WRITE_EVERY_S, on a confirming channel of its own: no job and no enqueue ever waits for the
journal. A started entry is held open until then: an attempt that ends first is written as its
end entry alone, whose time less its duration_s is when it started (a short job writes one
entry, not two). The record names the process that wrote it (app_id).

A record the broker does not confirm (the connection lost, the stream deleted, a
resource alarm past CONFIRM_TIMEOUT_S) is dropped and counted, and so are entries kept past
PENDING_MOST while the broker cannot be reached; a stream found deleted is declared again.

A record is a JSON array of entries, each [at_ms, event, queue, message_id, type, attempt,
detail]. The store takes what anyone the vhost lets in writes: read_entries keeps only what has
that shape, each field bounded, so a forged record shows a wrong line at worst, never stops a
reader.
"""

import asyncio
import contextlib
import datetime as dt
import json
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from ricochet.broker.amqp import CONNECTION_ERRORS, Delivery
from ricochet.broker.connection import is_lost
from ricochet.broker.plan import shared_plan
from ricochet.broker.publish import confirming_channel
from ricochet.broker.stream_log import read_up_to_now
from ricochet.log import get_logger
from ricochet.names import SHARED

log = get_logger("ricochet.journal")

RECORD = "journal"  # a record's type property: a batch of entries
# The process that writes a record (its app_id), which ran the attempts its entries start or end.
PROCESS = f"{socket.gethostname()}:{os.getpid()}"
# The entries whose attempt the record's process ran.
ATTEMPT_EVENTS = frozenset({"started", "succeeded", "retrying", "failed", "cancelled"})
EVENTS = frozenset(
    {
        "enqueued",
        "started",
        "succeeded",
        "retrying",
        "scheduled",
        "failed",
        "cancelled",
        "replayed",
        "discarded",
        "relaunched",
        "progress",
    }
)
# A process writes what it kept this often at most: a busy worker writes ten records a second,
# each of many entries, so that a reader reads few.
WRITE_EVERY_S = 0.1
# A record holds this many entries at most.
BATCH_MOST = 2000
# Entries kept while none can be written (the broker unreachable): past this, new ones are
# dropped and counted.
PENDING_MOST = 100_000
# A record the broker has not confirmed by then is counted dropped.
CONFIRM_TIMEOUT_S = 10.0
# A stop waits this long at most for the last write (a broker that does not answer holds it).
LAST_WRITE_S = 2.0
# Bounds on what a reader takes of a field: an id or a type is at most 255 bytes on the wire, a
# time past the year 8307 or an attempt past 2**31 is forged.
LATEST_AT_MS = 200_000_000_000_000
LARGEST_ATTEMPT = 2**31 - 1
TEXT_MOST = 1024
# A reader gives up on the rest after this long (what it read stands).
READ_TIMEOUT_S = 60.0


class Entry(NamedTuple):
    """One change of a job's state: when (epoch ms), what, the job, and the event's own fields
    (duration_s, result, due_at_ms, tier, reason, kind, process, progress)."""

    at_ms: int
    event: str
    queue: str
    message_id: str
    type: str | None
    attempt: int | None
    detail: dict[str, Any]


def now_ms() -> int:
    return int(time.time() * 1000)


def journal_record(entries: list[Entry]) -> aio_pika.Message:
    """One record of the stream holding a batch of entries."""
    body = json.dumps(entries, separators=(",", ":"), default=str).encode()
    return aio_pika.Message(
        body, type=RECORD, app_id=PROCESS, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
    )


def read_entries(body: bytes, process: str | None = None) -> list[Entry]:
    """The entries of a record's body that have an entry's shape (the rest is left out), those
    of an attempt naming the record's process."""
    try:
        rows = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past what a parser takes
        return []
    if not isinstance(rows, list):
        return []
    entries = [entry for entry in map(_entry, rows) if entry is not None]
    if process is not None and _text(process):
        process = sys.intern(process)
        for entry in entries:
            if entry.event in ATTEMPT_EVENTS:
                entry.detail["process"] = process
    return entries


def _entry(row: object) -> Entry | None:
    if not isinstance(row, list) or len(row) != len(Entry._fields):
        return None
    at_ms, event, queue, message_id, job_type, attempt, detail = row
    if (
        type(at_ms) is not int
        or not 0 <= at_ms <= LATEST_AT_MS
        or event not in EVENTS
        or not _text(queue)
        or not _text(message_id)
        or not (job_type is None or _text(job_type))
        or not (attempt is None or (type(attempt) is int and 0 <= attempt <= LARGEST_ATTEMPT))
        or not isinstance(detail, dict)
    ):
        return None
    # The few names that repeat through a journal are kept once (a reader may hold millions).
    kind = None if job_type is None else sys.intern(job_type)
    return Entry(at_ms, sys.intern(event), sys.intern(queue), message_id, kind, attempt, detail)


def _text(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= TEXT_MOST


def _uncounted(written: int, dropped: int) -> None:
    pass


class Journal:
    """Where a process keeps its entries until its writer sends them (run, on each connection
    in turn); count(written, dropped) is told of each record confirmed and of each drop."""

    def __init__(
        self, enabled: bool = True, count: Callable[[int, int], None] = _uncounted
    ) -> None:
        self.enabled = enabled
        # A deque: a sync handler's thread appends its progress while the writer takes.
        self._pending: deque[Entry] = deque()
        # Started entries held open until the next write, by their attempt's key: each made
        # only if it is written.
        self._open: dict[object, Callable[[], Entry]] = {}
        self._count = count

    def add(self, entry: Entry) -> None:
        """Keep an entry to write (from any thread: a list's append is atomic)."""
        if not self.enabled:
            return
        if len(self._pending) >= PENDING_MOST:
            self._count(0, 1)
            return
        self._pending.append(entry)

    def open(self, key: object, entry: Callable[[], Entry]) -> None:
        """Keep an attempt's started entry (made by entry()) open: written at the next write
        unless close(key) comes first."""
        if self.enabled:
            self._open[key] = entry

    def close(self, key: object) -> None:
        """The attempt of key ended: its started entry, if not written yet, never is."""
        self._open.pop(key, None)

    def take(self, most: int) -> list[Entry]:
        """The oldest entries kept, up to most, no longer kept (the started entries held open
        first join them)."""
        pending = self._pending
        if self._open:
            pending.extendleft(reversed([entry() for entry in self._open.values()]))
            self._open.clear()
        return [pending.popleft() for _ in range(min(most, len(pending)))]

    async def run(self, connection: AbstractConnection) -> None:
        """Write what is kept every WRITE_EVERY_S on a channel of the connection, until
        cancelled or the connection is lost. Cancelled, it writes what is kept first, for
        LAST_WRITE_S at most (its callers wait no longer either: a channel being opened or a
        publish being confirmed may not end at once when cancelled)."""
        if not self.enabled:
            return
        channel: AbstractChannel | None = None
        try:
            # Opened at once: a client closed right after its enqueues has only its last write
            # left to do then, not a channel to open first (a busy broker may take seconds).
            with contextlib.suppress(*CONNECTION_ERRORS):
                channel = await confirming_channel(connection)
            while not is_lost(connection):
                await asyncio.sleep(WRITE_EVERY_S)
                channel = await self._write(connection, channel)
        finally:
            last = asyncio.ensure_future(self._last_write(connection, channel))
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(last), LAST_WRITE_S)

    async def _last_write(
        self, connection: AbstractConnection, channel: AbstractChannel | None
    ) -> None:
        if not is_lost(connection):
            channel = await self._write(connection, channel)
        if channel is not None and not channel.is_closed:
            with contextlib.suppress(*CONNECTION_ERRORS):
                await channel.close()

    async def flush(self, connection: AbstractConnection) -> None:
        """Write what is kept now, on a channel of its own."""
        await self._last_write(connection, None)

    async def _write(
        self, connection: AbstractConnection, channel: AbstractChannel | None
    ) -> AbstractChannel | None:
        """Write every entry kept, BATCH_MOST a record; the channel to write on next."""
        while kept := self.take(BATCH_MOST):
            try:
                if channel is None or channel.is_closed:
                    channel = await confirming_channel(connection)
                await channel.default_exchange.publish(
                    journal_record(kept),
                    routing_key=SHARED.journal,
                    mandatory=True,
                    timeout=CONFIRM_TIMEOUT_S,
                )
                self._count(len(kept), 0)
            except aio_pika.exceptions.PublishError:  # no such stream: declared again
                self._drop(kept, "the journal stream is gone: declared again")
                await self._declare(connection)
            except (aio_pika.exceptions.DeliveryError, TimeoutError, *CONNECTION_ERRORS) as error:
                self._drop(kept, f"{type(error).__name__}: {error}")
                if is_lost(connection):
                    return None
        return channel

    def _drop(self, entries: list[Entry], why: str) -> None:
        self._count(0, len(entries))
        log.warning("journal entries dropped", entries=len(entries), error=why)

    async def _declare(self, connection: AbstractConnection) -> None:
        spec = shared_plan(None).journal
        try:
            channel = await connection.channel()
            try:
                await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
            finally:
                await channel.close()
        # Refused, say (declared otherwise by someone else): its entries go on being dropped.
        except Exception as error:
            why = f"{type(error).__name__}: {error}"
            log.warning("journal stream not declared again", error=why)


async def write_entries(connection: AbstractConnection, entries: list[Entry]) -> None:
    """Write these entries now, confirmed (a command's: replayed, discarded); what cannot be
    written is dropped with a warning, never failing the command."""
    journal = Journal()
    for entry in entries:
        journal.add(entry)
    await journal.flush(connection)


async def read_journal(
    connection: AbstractConnection,
    since: dt.datetime,
    read: Callable[[Entry, int], None],
    timeout_s: float = READ_TIMEOUT_S,
) -> int | None:
    """Hand each entry written since then to read() with its record's offset, up to now: the
    end's offset, or None when the stream did not answer within timeout_s."""

    def each(record: Delivery, offset: int) -> None:
        if record.type == RECORD:
            for entry in read_entries(record.body, record.app_id()):
                read(entry, offset)

    return await read_up_to_now(connection, SHARED.journal, each, since, timeout_s)
