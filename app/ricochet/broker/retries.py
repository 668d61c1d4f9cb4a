"""The retries into a tier, recorded: one stream per vhost, ricochet.retries, of the reason and the
time of each failed attempt that a worker sends to a retry tier (SPEC 23).

A job goes to its tier by a nack (or a copy to the tier's route), and a nack carries nothing but
its delivery tag: the tier holds the job, never why it failed, and x-death keeps only the first
time it died, in whole seconds. So the worker writes a record ahead of the nack: the records
of the retries since its last entry (WRITE_EVERY_S at least before) as one entry of the stream,
on a channel of its own without confirms, then their nacks behind them on the same connection.
A worker killed or cut off after a nack has written its record, and one killed before leaves
the job where it was. Only a record lost on its own leaves a job in a tier without one: its
channel closed (logged, `retries not recorded`), or the stream deleted. A busy worker writes few
entries, each of many retries, so that a look reads few. `ricochet waiting` reads the records of
the jobs it finds in the tiers: by (queue, message_id, failed attempt), the reason, to the
millisecond when the job came in, the tier it went to and the job's type (so that a tier whose
records account for every job it holds is listed from them, without a read:
ricochet.ops.recorded).

The stream keeps RETRIES_MAX_AGE (longer than the longest tier, a day) and RETRIES_MAX_BYTES at
most, in small segments so that retention drops old ones on time: a record older than its job's
wait, or pushed out by a flood of retries, leaves that job's reason unknown (null).
"""

import asyncio
import datetime as dt
import json
import time
from collections.abc import Sequence
from contextvars import Context
from typing import NamedTuple

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractMessage,
)
from aio_pika.exceptions import ChannelNotFoundEntity

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.stream_log import LogReader
from ricochet.errors import MissingQueue
from ricochet.headers import (
    RECORD_AT_MS,
    RECORD_ATTEMPT,
    RECORD_QUEUE,
    RECORD_TIER,
    RECORD_TYPE,
)
from ricochet.log import get_logger
from ricochet.names import SHARED

log = get_logger("ricochet.retries")

RETRIES = "retries"  # a batch of records
RETRY = "retry"  # the one record of an earlier ricochet
# A worker writes an entry this often at most, each of the retries since the last: a busy one
# writes two hundred a second, each of many, so that a look reads few (an entry costs a reader
# about as much as a job in a tier). The nacks behind them wait that long at most.
WRITE_EVERY_S = 0.005
# An entry holds this many records at most (the retries of one write in more when they are more).
BATCH_MOST = 500
# A reader sends its marker this long after it was asked to read. A record goes ahead of its
# job's nack, but on another channel of the worker's connection, so another path through the
# broker: this leaves the record of a job counted just before time to be in the stream.
WRITTEN_WITHIN_S = 0.1
# A reader that has not read up to its marker by then gives up on the rest (the reasons stay
# unknown): looking must not hang on a slow store.
READ_TIMEOUT_S = 30.0


# A record's time past this (epoch ms, the year 8307) is forged: a date of it plus a tier's wait
# must stay within what a datetime holds.
LATEST_AT_MS = 200_000_000_000_000
# An attempt or a tier past this is forged (a number of thousands of digits would not print).
LARGEST_FIELD = 2**31 - 1
# A job's type longer than this is not recorded (an AMQP type property is at most 255 bytes; a
# JSON body's "type" field may be anything): its record then gives no tier either, and a look
# reads that tier to list it.
RECORD_TYPE_MOST = 255


class Retried(NamedTuple):
    """What the record of one retry says: the reason, when the job went to its tier (epoch ms),
    the tier (None: a record of an earlier ricochet, or of a job whose type it could not hold)
    and the job's type."""

    reason: str
    at_ms: int
    tier: int | None = None
    type: str | None = None


class Record(NamedTuple):
    """The record of a failed attempt of queue's job sent to a tier, as a batch carries it (a
    JSON array of these, in this order)."""

    queue: str
    message_id: str | None
    attempt: int
    at_ms: int
    tier: int | None
    type: str | None
    reason: str


def record_of(
    queue: str,
    message_id: str | None,
    attempt: int,
    reason: str,
    at_ms: int,
    tier: int | None = None,
    job_type: str | None = None,
) -> Record:
    """The record of a failed attempt of queue's job sent to a tier; one of a job without an id,
    or of a type too long to hold, names no tier: it says only that such a job waits."""
    listable = message_id is not None and (job_type is None or len(job_type) <= RECORD_TYPE_MOST)
    if tier is None or not listable:
        tier = job_type = None
    return Record(queue, message_id, attempt, at_ms, tier, job_type, reason)


def retry_records(records: Sequence[Record]) -> aio_pika.Message:
    """One entry of the stream holding a batch of records."""
    body = json.dumps(records, separators=(",", ":")).encode()
    return aio_pika.Message(body, type=RETRIES, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


def read_records(entry: AbstractMessage, queue: str) -> list[tuple[str, int, Retried]]:
    """(message_id, the failed attempt, what the record says) of each record of a retry of
    queue's job an entry of the stream holds (a job without an id: "", and no tier): a batch,
    or the one record of an earlier ricochet. What is not one is left out: the store takes what
    anyone the vhost lets in writes."""
    if entry.type == RETRY:
        headers = entry.headers or {}
        if headers.get(RECORD_QUEUE) != queue:
            return []
        one = _retried(
            entry.message_id,
            headers.get(RECORD_ATTEMPT),
            headers.get(RECORD_AT_MS),
            headers.get(RECORD_TIER),
            headers.get(RECORD_TYPE),
            entry.body.decode("utf-8", "replace"),
        )
        return [one] if one is not None else []
    if entry.type != RETRIES:
        return []
    try:
        rows = json.loads(entry.body)
    except (ValueError, RecursionError):  # not JSON, or nested past what a parser takes
        return []
    if not isinstance(rows, list):
        return []
    read = []
    for row in rows:
        if isinstance(row, list) and len(row) == len(Record._fields) and row[0] == queue:
            one = _retried(row[1], row[2], row[3], row[4], row[5], row[6])
            if one is not None:
                read.append(one)
    return read


def _retried(
    message_id: object,
    attempt: object,
    at_ms: object,
    tier: object,
    job_type: object,
    reason: object,
) -> tuple[str, int, Retried] | None:
    """One record's fields, as read: None for a forged id, attempt, time or reason; a tier and
    type only for a job with an id, as written."""
    if (
        not (message_id is None or isinstance(message_id, str))
        or type(attempt) is not int
        or not 0 <= attempt <= LARGEST_FIELD
        or type(at_ms) is not int
        or not 0 <= at_ms <= LATEST_AT_MS
        or not isinstance(reason, str)
    ):
        return None
    if not isinstance(message_id, str) or not message_id:
        return "", attempt, Retried(reason, at_ms)
    if (
        type(tier) is not int
        or not 0 <= tier <= LARGEST_FIELD
        or not (job_type is None or isinstance(job_type, str))
    ):
        return message_id, attempt, Retried(reason, at_ms)
    return message_id, attempt, Retried(reason, at_ms, tier, job_type)


class RetryLog:
    """Where a worker's settlers record their retries: each kept until a settler writes those
    kept as one entry, ahead of their nacks, on one channel of the connection without confirms,
    opened at its first entry and again after it was lost."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None
        self._pending: list[Record] = []
        self._writing = asyncio.Lock()
        self._written_at = -WRITE_EVERY_S  # the event loop's time of the last write

    def record(
        self,
        queue: str,
        message_id: str | None,
        attempt: int,
        reason: str,
        tier: int,
        job_type: str | None,
    ) -> None:
        """Keep the record of a failed attempt of queue's job that goes to a tier, to write with
        the others kept before the job goes there."""
        at_ms = int(time.time() * 1000)
        self._pending.append(record_of(queue, message_id, attempt, reason, at_ms, tier, job_type))

    async def write(self) -> None:
        """Write every record kept, returning once they are written to the connection: a nack or
        a copy sent after that reaches the broker behind them. One entry for all those kept
        (BATCH_MOST at most), WRITE_EVERY_S after the last one at the soonest, so that the
        retries meanwhile make one; a write under way is awaited first, so that the records it
        took are written too."""
        loop = asyncio.get_running_loop()
        async with self._writing:
            if not self._pending:
                return
            await asyncio.sleep(self._written_at + WRITE_EVERY_S - loop.time())
            kept, self._pending = self._pending, []
            # In a task and a context of their own: a caller cancelled meanwhile (a job's task,
            # at a stop) still has the records it took written, and what it logs is no job's.
            writing = loop.create_task(self._write(kept), context=Context())
            await asyncio.shield(writing)
            self._written_at = loop.time()

    async def _write(self, kept: list[Record]) -> None:
        try:
            if self._channel is None or self._channel.is_closed:
                self._channel = await self._connection.channel(publisher_confirms=False)
            # Without confirms: written once sent; the nacks behind them wait for no broker.
            for start in range(0, len(kept), BATCH_MOST):
                batch = retry_records(kept[start : start + BATCH_MOST])
                await self._channel.default_exchange.publish(batch, routing_key=SHARED.retries)
        except CONNECTION_ERRORS as error:
            log.warning(
                "retries not recorded: their reasons stay unknown",
                retries=len(kept),
                error=str(error),
            )


async def read_retries(
    connection: AbstractConnection, since: dt.datetime, queue: str
) -> dict[tuple[str, int], Retried]:
    """What the records say by (message_id, failed attempt) of queue's retries recorded since
    then (the newest of one recorded twice); the stream is read up to now (a marker)."""
    found: dict[tuple[str, int], Retried] = {}

    def read(entry: AbstractIncomingMessage, _: int) -> None:
        for message_id, attempt, retried in read_records(entry, queue):
            found[message_id, attempt] = retried

    reader: LogReader | None = None
    try:
        reader = await LogReader.open(connection, SHARED.retries, read, since)
        await asyncio.sleep(WRITTEN_WITHIN_S)
        if await reader.up_to_now(READ_TIMEOUT_S) is None:
            log.warning("retries not read to the end: some reasons stay unknown", read=len(found))
    except (ChannelNotFoundEntity, MissingQueue):
        log.warning("no record of the retries yet (no worker of this version ran): no reasons")
    finally:
        if reader is not None:
            await reader.close()
    return found
