"""The async Client: an application's jobs put in the main queue, each one confirmed."""

import asyncio
import contextlib
import datetime as dt
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, cast

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import DeliveryError, PublishError

from ricochet.broker.amqp import CONNECTION_ERRORS, Properties, Publisher, frame_max, refusal
from ricochet.broker.cancels import cancel_record, wait_record
from ricochet.broker.connection import close_quietly, connect, connection_name
from ricochet.broker.journal import LAST_WRITE_S, Entry, Journal, now_ms
from ricochet.broker.publish import OnePerMessageId, confirming_channel
from ricochet.client.message import Delay, cancelled_id, check_frame, job_message, target_queue
from ricochet.client.route import Routes, to_the_delays
from ricochet.delivery.retry import parse_run_at
from ricochet.errors import (
    BrokerUnavailable,
    ClientClosed,
    ConfigError,
    MissingQueue,
    NotConfirmed,
    TopologyConflict,
)
from ricochet.headers import FRESH_ID, INCARNATION, KEY, RUN_AT
from ricochet.log import redact
from ricochet.names import SHARED
from ricochet.settings import load_client_settings
from ricochet.tracing import publish_span

# An application waits on enqueue: it is told soon that the broker cannot be reached, rather
# than the minute a starting worker waits.
CONNECT_TIMEOUT_S = 10.0
# A broker on a memory or disk alarm holds publishes unconfirmed for as long as the alarm lasts.
CONFIRM_TIMEOUT_S = 30.0
# Publishes awaiting their confirm on the client's channel at once; more callers wait their turn.
MAX_UNCONFIRMED = 256


@dataclass(frozen=True)
class _Publish:
    """A publish as its errors name it: what it was, what it did, how to make it again."""

    subject: str
    done: str
    again: str


def enqueued_entry(
    queue: str, job_id: str, job_type: str | None, headers: Mapping[str, Any]
) -> Entry:
    """The journal's entry of a job the broker confirmed; one due later says when."""
    detail: dict[str, Any] = {}
    run_at = parse_run_at(headers.get(RUN_AT))
    if run_at is not None:
        detail["due_at_ms"] = int(run_at.timestamp() * 1000)
    return Entry(now_ms(), "enqueued", queue, job_id, job_type, None, detail)


def _enqueuing(job_id: str) -> _Publish:
    return _Publish(f"job {job_id!r}", "enqueued", "enqueue it again with the same message_id")


def _cancelling(job_id: str) -> _Publish:
    return _Publish(
        f"the cancel of job {job_id!r}", "recorded", "cancel it again (a cancel made twice is one)"
    )


class Client:
    """Enqueues jobs: `async with Client() as client: await client.enqueue("mail", {...})`.

    One connection and one channel with publisher confirms, opened at `async with` (or at the
    first enqueue) and opened again after the broker dropped them. Concurrent enqueues share
    the channel, their confirms pipelined. Not for use across threads or event loops: that is
    SyncClient's job.
    """

    def __init__(
        self,
        amqp_url: str | None = None,
        queue: str | None = None,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        confirm_timeout_s: float | None = CONFIRM_TIMEOUT_S,
    ) -> None:
        settings = load_client_settings(amqp_url, queue)
        self.amqp_url = settings.amqp_url
        self.queue = settings.queue
        self._key_lanes = settings.key_lanes
        self._connect_timeout_s = connect_timeout_s
        self._confirm_timeout_s = confirm_timeout_s
        self._connection: AbstractConnection | None = None
        # The aio_pika channel is only kept open (it closes itself when collected).
        self._channel: AbstractChannel | None = None
        self._publisher: Publisher | None = None
        self._frame_max = 0  # the connection's, read when it opens
        self._opening = asyncio.Lock()
        self._unconfirmed = asyncio.Semaphore(MAX_UNCONFIRMED)
        self._one_per_id = OnePerMessageId()
        self._routes = Routes()
        self._enqueuing = 0
        self._settled = asyncio.Event()
        self._closed = False
        # The enqueued entries of the journal, written in the background on the connection.
        self._journal = Journal(settings.journal == "on")
        self._writing: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Self:
        if self._closed:
            raise ClientClosed("the client is closed")
        await self._open_channel()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def enqueue(
        self,
        job_type: str | None,
        payload: Any,
        *,
        message_id: str | None = None,
        max_retries: int | None = None,
        retry_delays_ms: Sequence[int] | None = None,
        delay: Delay | None = None,
        run_at: dt.datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        key: str | None = None,
    ) -> str:
        """Publish one persistent job to the queue (the client's, unless given another) and
        return its message_id once the broker has confirmed it. A job due later goes straight
        to the vhost's shared delays, as a worker would send it there (ricochet.client.route).

        retry_delays_ms is the job's own ladder (ricochet.exponential, linear, fixed make one):
        it beats its type's and the worker's, and its length is the job's retry budget (which
        max_retries may lower). priority (0-9, higher first; 4 when not given) orders the job
        among those waiting in the queue's backlog, as far as the broker applies it
        (docs/enqueueing.md#priority); its retries and replays keep it. key (a str of at most
        255 bytes): no two jobs of one key run at once on any worker, and they start in the
        order they were enqueued (docs/enqueueing.md#one-job-per-key-at-a-time).

        InvalidJob (nothing sent) for an argument out of bounds, or headers too large for the
        connection's frame; BrokerUnavailable when the broker cannot be reached; NotConfirmed
        when the broker refused the job or did not confirm it (see its message for whether it
        may be in the queue all the same).
        """
        message = job_message(
            job_type,
            payload,
            now=dt.datetime.now(dt.UTC),
            message_id=message_id,
            max_retries=max_retries,
            retry_delays_ms=retry_delays_ms,
            delay=delay,
            run_at=run_at,
            headers=headers,
            content_type=content_type,
            priority=priority,
            key=key,
        )
        target = self.queue if queue is None else target_queue(queue)
        if self._closed:
            raise ClientClosed("the client is closed")
        body, properties = message
        job_id = str(properties.message_id)
        # job_message gives every job a headers dict of its own.
        headers = cast(dict[str, Any], properties.headers)
        # Which enqueue of its id this is: a cancel covers this job only if it comes after its
        # wait in the store (ricochet.broker.cancel_log). An id made up here needs no token.
        token = f"{random.getrandbits(64):016x}" if message_id else FRESH_ID
        headers[INCARNATION] = token
        # Timed before its publish: a worker's entries of the job come after.
        entry = enqueued_entry(target, job_id, job_type, headers) if self._journal.enabled else None
        self._enqueuing += 1
        try:
            with publish_span(target, job_id, headers):
                channel = await self._open_channel()
                via = await self._route(target, job_id, headers)
                # Checked once the span's and the wait's headers are in, against this
                # connection's frame: a header frame too large would make the broker close the
                # connection, and cut off every other enqueue in flight on it.
                check_frame(properties.headers, self._frame_max)
                # A generated id is unique: no other publish in flight can share it.
                alone = self._one_per_id.alone(job_id) if message_id else contextlib.nullcontext()
                async with self._unconfirmed, alone:
                    if not message_id:
                        await self._publish(
                            channel, body, properties, target, job_id, _enqueuing, via
                        )
                        if entry is not None:
                            self._journal.add(entry)
                        return job_id
                    # A job of a given id waits from now (in the backlog, or for its schedule):
                    # its wait goes in the store first, on this channel, so that a worker that
                    # sees the job can read its wait, and a cancel made once enqueue returned
                    # comes after it (ricochet.broker.cancel_log). The job's publish follows
                    # without waiting for the wait's confirm; both are confirmed on return.
                    noting = asyncio.ensure_future(self._note_wait(channel, target, job_id, token))
                    await asyncio.sleep(0)  # its publish takes the channel first
                    try:
                        await self._publish(
                            channel, body, properties, target, job_id, _enqueuing, via
                        )
                    finally:
                        await asyncio.wait({noting})
                    noting.result()
        finally:
            self._enqueuing -= 1
            if not self._enqueuing:
                self._settled.set()
        if entry is not None:
            self._journal.add(entry)
        return job_id

    async def cancel(self, message_id: str, *, queue: str | None = None) -> None:
        """Cancel a job: one that waits (scheduled, between retries, or after a RetryLater) or is
        still in the queue never runs (again); one running sees job.cancelled (its handler is
        interrupted if it asked to be). An unknown or finished job is left as it is.

        The cancel names the client's queue (unless given another): a job of another queue with
        the same message_id is left as it is. A job enqueued through a client after this
        returned runs.

        Returns once the broker has confirmed the cancel in the vhost's cancel store;
        InvalidJob (nothing sent) for a message_id no job can have (empty, not a string, over
        255 bytes in UTF-8); BrokerUnavailable or NotConfirmed as for enqueue (a cancel made
        twice is one cancel).
        """
        message_id = cancelled_id(message_id)
        target = self.queue if queue is None else target_queue(queue)
        if self._closed:
            raise ClientClosed("the client is closed")
        self._enqueuing += 1
        try:
            channel = await self._open_channel()
            record = cancel_record(target, message_id)
            async with self._unconfirmed, self._one_per_id.alone(message_id):
                await self._publish(
                    channel,
                    record.body,
                    record.properties,
                    SHARED.cancels,
                    message_id,
                    _cancelling,
                )
        finally:
            self._enqueuing -= 1
            if not self._enqueuing:
                self._settled.set()

    async def _route(
        self, queue: str, job_id: str, headers: dict[str, Any]
    ) -> tuple[str, str] | None:
        """(exchange, routing key) of a job due later whose queue the shared delays route back
        to, its headers noting its wait, or of a job with a key due now when its queue has key
        lanes; None for a job that goes to its queue (a worker sends it on from there).
        NotConfirmed when the queue does not exist, as its publish would be returned; nothing is
        sent either way."""
        if RUN_AT not in headers and KEY not in headers:
            return None
        connection = self._connection
        assert connection is not None  # opened before, kept while an enqueue runs
        try:
            if RUN_AT in headers and await self._routes.through_levels(connection, queue):
                due_later = to_the_delays(headers, queue, dt.datetime.now(dt.UTC))
                if due_later is not None or KEY not in headers:
                    return due_later
            if KEY not in headers:
                return None
            return await self._routes.to_lanes(connection, self.amqp_url, queue, self._key_lanes)
        except (MissingQueue, ConfigError, TopologyConflict) as why:
            raise NotConfirmed(f"job {job_id!r} was not enqueued: {why}") from None
        except CONNECTION_ERRORS as error:
            raise BrokerUnavailable(
                f"job {job_id!r} was not enqueued: the connection was lost"
                f" ({type(error).__name__}: {redact(str(error))})"
            ) from None

    async def _note_wait(self, channel: Publisher, queue: str, job_id: str, token: str) -> None:
        """The wait of a job of a given id, in the cancel store. With no store there is no cancel
        to come before it: the wait goes without mandatory, and a broker with no store drops it.
        A mandatory one would come back, and the client library matches a return to its publish
        by message_id, which the job's publish in flight shares: the job would be taken for
        returned, though in its queue."""
        record = wait_record(queue, job_id, token)
        try:
            await channel.publish(
                record.body,
                record.properties,
                SHARED.cancels,
                self._confirm_timeout_s,
                mandatory=False,
            )
        except (DeliveryError, TimeoutError, *CONNECTION_ERRORS) as error:
            raise self._not_confirmed(error, SHARED.cancels, _enqueuing(job_id)) from None

    async def close(self) -> None:
        """Wait until the jobs being enqueued are confirmed (or refused), then disconnect."""
        self._closed = True
        while self._enqueuing:
            self._settled.clear()
            await self._settled.wait()
        if self._writing is not None:  # what it kept is written first, for a moment at most
            self._writing.cancel()
            await asyncio.wait({self._writing}, timeout=LAST_WRITE_S)
        if self._connection is not None:
            await close_quietly(self._connection)
        self._connection = self._channel = self._publisher = None

    async def _open_channel(self) -> Publisher:
        """The confirming channel, opened (with the connection, if that was lost too) when there
        is none; concurrent callers wait for one opening. The AMQP channel under it is what
        publishes (broker/amqp.py's Publisher): aio_pika's publish only builds a message's
        properties and calls it."""
        if self._publisher is not None and not self._publisher.is_closed:
            return self._publisher
        async with self._opening:
            if self._publisher is None or self._publisher.is_closed:
                if self._connection is None or not self._connection.connected.is_set():
                    if self._connection is not None:  # lost: closed by the broker, or dropped
                        await close_quietly(self._connection)
                    self._connection = await connect(
                        self.amqp_url,
                        connection_name("client", self.queue),
                        self._connect_timeout_s,
                    )
                    self._frame_max = frame_max(self._connection)
                    self._writing = asyncio.ensure_future(self._journal.run(self._connection))
                self._channel = await confirming_channel(self._connection)
                self._publisher = await Publisher.under(self._channel)
            return self._publisher

    async def _publish(
        self,
        channel: Publisher,
        body: bytes,
        properties: Properties,
        queue: str,
        job_id: str,
        publishing: Callable[[str], _Publish],
        via: tuple[str, str] | None = None,
    ) -> None:
        """One publish, mandatory and confirmed, never repeated: a second could enqueue the job
        twice. `publishing` names it for the errors, only when there is one. To the queue, or
        via (exchange, routing key) on its way there."""
        exchange, routing_key = via or ("", queue)
        try:
            await channel.publish(body, properties, routing_key, self._confirm_timeout_s, exchange)
        except (PublishError, DeliveryError, TimeoutError, *CONNECTION_ERRORS) as error:
            raise self._not_confirmed(error, queue, publishing(job_id)) from None

    def _not_confirmed(self, error: BaseException, queue: str, what: _Publish) -> NotConfirmed:
        if isinstance(error, PublishError):
            return NotConfirmed(f"{what.subject} was not {what.done}: {MissingQueue(queue)}")
        if isinstance(error, DeliveryError):
            return NotConfirmed(
                f"{what.subject} was not {what.done}: the broker refused it ({refusal(error)})"
            )
        if isinstance(error, TimeoutError):
            return NotConfirmed(
                f"{what.subject}: the broker did not confirm it within {self._confirm_timeout_s:g}"
                f" s (is it blocking publishers on a resource alarm?); it may be {what.done} yet:"
                f" {what.again} if it must not be lost"
            )
        return NotConfirmed(
            f"{what.subject}: the connection was lost before the broker confirmed it"
            f" ({type(error).__name__}: {redact(str(error))}); it may be {what.done}:"
            f" {what.again}"
        )
