"""The retries into a tier, recorded: one stream per vhost, ricochet.retries, of the reason and the
time of each failed attempt that a worker sends to a retry tier (SPEC 23).

A job goes to its tier by a nack (or a copy to the tier's route), and a nack carries nothing but
its delivery tag: the tier holds the job, never why it failed, and x-death keeps only the first
time it died, in whole seconds. So the worker appends a record beside the nack, on a channel of
its own without confirms (a record lost with a connection costs `ricochet waiting` a reason,
never a job), and `ricochet waiting` reads the records of the jobs it finds in the tiers: by
(queue, message_id, failed attempt), the reason, to the millisecond when the job came in, the
tier it went to and the job's type (so that a tier whose records account for every job it holds
is listed from them, without a read: ricochet.ops.recorded).

The stream keeps RETRIES_MAX_AGE (longer than the longest tier, a day) and RETRIES_MAX_BYTES at
most, in small segments so that retention drops old ones on time: a record older than its job's
wait, or pushed out by a flood of retries, leaves that job's reason unknown (null).
"""

import asyncio
import datetime as dt
import time
import uuid
from typing import Any, NamedTuple

import aio_pika
import structlog
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractMessage,
)
from aio_pika.exceptions import ChannelNotFoundEntity

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.publish import publish_to_queue
from ricochet.errors import MissingQueue
from ricochet.headers import (
    RECORD_AT_MS,
    RECORD_ATTEMPT,
    RECORD_QUEUE,
    RECORD_TIER,
    RECORD_TYPE,
    STREAM_OFFSET,
)
from ricochet.names import SHARED

log = structlog.get_logger("ricochet.retries")

RETRY = "retry"
MARKER = "marker"
# Records a reader has in flight (a stream consumer needs a prefetch); it acks them this many
# at a time (one basic.ack with multiple), not one frame a record.
READ_PREFETCH = 1000
ACK_EVERY = READ_PREFETCH // 4
# A reader that has not read up to its marker by then gives up on the rest (the reasons stay
# unknown): looking must not hang on a slow store.
READ_TIMEOUT_S = 30.0


# A record's time past this (epoch ms, the year 8307) is forged: a date of it plus a tier's wait
# must stay within what a datetime holds.
LATEST_AT_MS = 200_000_000_000_000
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


def retry_record(
    queue: str,
    message_id: str | None,
    attempt: int,
    reason: str,
    at_ms: int,
    tier: int | None = None,
    job_type: str | None = None,
) -> aio_pika.Message:
    """The record of a failed attempt of queue's job sent to a tier: its reason as the body."""
    headers: dict[str, Any] = {RECORD_QUEUE: queue, RECORD_ATTEMPT: attempt, RECORD_AT_MS: at_ms}
    listable = message_id is not None and (job_type is None or len(job_type) <= RECORD_TYPE_MOST)
    if tier is not None and listable:
        headers[RECORD_TIER] = tier
        if job_type is not None:
            headers[RECORD_TYPE] = job_type
    return aio_pika.Message(
        reason.encode(),
        message_id=message_id,
        type=RETRY,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=headers,
    )


def read_record(entry: AbstractMessage, queue: str) -> tuple[str, int, Retried] | None:
    """(message_id, the failed attempt, what the record says) of the record of a retry of
    queue's job (a job without an id: "", and no tier); None for what is not one (the store
    takes what anyone the vhost lets in writes)."""
    headers = entry.headers or {}
    attempt, at_ms = headers.get(RECORD_ATTEMPT), headers.get(RECORD_AT_MS)
    if (
        entry.type != RETRY
        or headers.get(RECORD_QUEUE) != queue
        or type(attempt) is not int
        or type(at_ms) is not int
        or not 0 <= at_ms <= LATEST_AT_MS
    ):
        return None
    tier, job_type = headers.get(RECORD_TIER), headers.get(RECORD_TYPE)
    if (
        type(tier) is not int
        or not (job_type is None or isinstance(job_type, str))
        or not entry.message_id
    ):
        tier = job_type = None
    retried = Retried(entry.body.decode("utf-8", "replace"), at_ms, tier, job_type)
    return entry.message_id or "", attempt, retried


class RetryLog:
    """Where a worker's settlers record their retries: one channel of the connection, without
    confirms, opened at its first record and again after it was lost."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None
        self._opening = asyncio.Lock()

    async def record(
        self,
        queue: str,
        message_id: str | None,
        attempt: int,
        reason: str,
        tier: int,
        job_type: str | None,
    ) -> None:
        """Append the record of a failed attempt of queue's job that goes to a tier (one of a
        job without an id says only that such a job waits there: a look then reads the tiers)."""
        at_ms = int(time.time() * 1000)
        record = retry_record(queue, message_id, attempt, reason, at_ms, tier, job_type)
        try:
            channel = await self._open()
            # Without confirms: published once written, and the nack beside it waits for nothing.
            await channel.default_exchange.publish(record, routing_key=SHARED.retries)
        except CONNECTION_ERRORS as error:
            log.warning("retry not recorded: its reason stays unknown", error=str(error))

    async def _open(self) -> AbstractChannel:
        if self._channel is not None and not self._channel.is_closed:
            return self._channel
        async with self._opening:
            if self._channel is None or self._channel.is_closed:
                self._channel = await self._connection.channel(publisher_confirms=False)
            return self._channel


async def read_retries(
    connection: AbstractConnection, since: dt.datetime, queue: str
) -> dict[tuple[str, int], Retried]:
    """What the records say by (message_id, failed attempt) of queue's retries recorded since
    then (the newest of one recorded twice); the stream is read up to a marker of the reader's
    own."""
    found: dict[tuple[str, int], Retried] = {}
    channel = await connection.channel(publisher_confirms=True)
    marker = uuid.uuid4().hex
    seen = asyncio.get_running_loop().create_future()

    async def read(entry: AbstractIncomingMessage) -> None:
        if seen.done():  # read to the end, or given up: no frame may follow the channel's close
            return
        record = read_record(entry, queue)
        if record is not None:
            message_id, attempt, retried = record
            found[message_id, attempt] = retried
        elif entry.type == MARKER and entry.message_id == marker:
            seen.set_result(None)
            return
        # The channel's delivery tags count the records read: every ACK_EVERY-th acks them all.
        if entry.delivery_tag is not None and entry.delivery_tag % ACK_EVERY == 0:
            await entry.ack(multiple=True)

    try:
        await channel.set_qos(prefetch_count=READ_PREFETCH)
        store = await channel.get_queue(SHARED.retries, ensure=False)
        await store.consume(read, arguments={STREAM_OFFSET: since})
        await publish_to_queue(
            channel, SHARED.retries, aio_pika.Message(b"", message_id=marker, type=MARKER)
        )
        try:
            await asyncio.wait_for(asyncio.shield(seen), READ_TIMEOUT_S)
        except TimeoutError:
            log.warning("retries not read to the end: some reasons stay unknown", read=len(found))
    except (ChannelNotFoundEntity, MissingQueue):
        log.warning("no record of the retries yet (no worker of this version ran): no reasons")
    finally:
        if not seen.done():
            seen.set_result(None)
        if not channel.is_closed:
            await channel.close()
    return found
