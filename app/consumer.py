"""The consumer: the only place that settles a delivery (its acks go out through app.acks)."""

import asyncio
import datetime as dt
import time
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from aiormq import spec
from aiormq.abc import AbstractChannel as AMQPChannel
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import DeliveryError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from app.acks import Acks
from app.connection import CONNECTION_ERRORS
from app.delivery import Delivery
from app.errors import PoisonMessage
from app.failed import (
    copied_headers,
    copied_properties,
    failed_headers,
    failure_reason,
    fit_to_frame,
)
from app.handler import Invoker
from app.job import Job
from app.metrics import Metrics
from app.retry import (
    POISON_DELIVERIES,
    Action,
    Decision,
    FailureKind,
    death_is_forged,
    decide,
    is_poison,
    max_attempts,
    original_routing_key,
    retries_so_far,
)
from app.topology import Plan
from app.tracebacks import format_traceback

log = structlog.get_logger("ricochet.consumer")

# First pause before publishing again a copy the broker did not confirm; it doubles up to 30 s.
UNCONFIRMED_FIRST_WAIT_S = 0.5


def _log_unconfirmed(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    # The frame says why (a Basic.Return with its reply text, or a Basic.Nack), not the body.
    frame = getattr(error, "frame", None)
    log.error(
        "copy not confirmed, the job stays in the queue",
        broker_said=getattr(frame, "reply_text", None) or type(frame).__name__,
        attempt=state.attempt_number,
        next_try_s=round(state.upcoming_sleep, 2),
    )


class Consumer:
    """Consumes the main queue on one channel and settles every delivery exactly once."""

    def __init__(self, plan: Plan, max_retries: int, invoker: Invoker, metrics: Metrics):
        self._plan = plan
        self._names = plan.names
        self._max_retries = max_retries
        self._invoker = invoker
        self._metrics = metrics
        self.in_flight: set[asyncio.Task[None]] = set()
        self._channel: AbstractChannel | None = None
        self._amqp: AMQPChannel | None = None
        self._failed: AbstractExchange | None = None
        self._tag: str | None = None
        self._opening: asyncio.Task[None] | None = None
        self._frame_max = 0
        self._acks = Acks()
        # Prometheus children resolved once: labels() costs a lock and a lookup per call.
        self._in_flight = metrics.in_flight.labels(self._names.queue)
        self._duration = metrics.duration.labels(self._names.queue)
        self._succeeded = metrics.jobs.labels(self._names.queue, "succeeded")
        self._retried = metrics.jobs.labels(self._names.queue, "retried")
        self._failed_jobs = metrics.jobs.labels(self._names.queue, "failed")

    async def start(self, channel: AbstractChannel, frame_max: int) -> None:
        """Start taking jobs from the main queue on a channel opened with publisher confirms."""
        self._channel = channel
        self._frame_max = frame_max
        self._acks = Acks()  # delivery tags start again on every channel
        self._tag = None
        self._failed = await channel.get_exchange(self._names.failed, ensure=False)
        # Deliveries are taken from the AMQP channel under aio-pika's (see app.delivery).
        self._amqp = await channel.get_underlay_channel()
        if self._opening is not None:
            # One left from a lost connection must not subscribe on this channel too.
            self._opening.cancel()
        self._opening = asyncio.get_running_loop().create_task(self._redelivered_first(self._amqp))

    async def _redelivered_first(self, amqp: AMQPChannel) -> None:
        """Run the jobs that come back redelivered one at a time, then subscribe.

        A job redelivered after a crash may be the one that killed its worker. The broker counts
        a return against every delivery that was unacked at that moment, so with a full prefetch
        the jobs around a poison job would reach the poison limit with it. Taken one by one with
        basic.get, a redelivered job is the only delivery this worker holds while it runs.
        """
        queue = self._names.queue
        try:
            while isinstance((got := await amqp.basic_get(queue)).delivery, spec.Basic.GetOk):
                message = Delivery(got)
                job = self._spawn(message)
                if not message.redelivered:
                    break
                await asyncio.wait({job})  # never cancels the job when this task is cancelled
            self._tag = (await amqp.basic_consume(queue, self._on_delivery)).consumer_tag
        except CONNECTION_ERRORS as error:
            # The worker sees the channel close and starts over on a new connection.
            log.warning("consuming interrupted", error=str(error))

    async def stop(self) -> None:
        """Stop taking deliveries; jobs in flight carry on."""
        if self._opening is not None:
            self._opening.cancel()
        if self._amqp is None or self._tag is None or self._amqp.is_closed:
            return
        try:
            await self._amqp.basic_cancel(self._tag)
        except CONNECTION_ERRORS as error:
            log.warning("consumer cancel failed", error=str(error))

    async def drain_acks(self) -> None:
        """Send the acks of finished jobs still pending (before the channel closes)."""
        await self._acks.drain()

    async def _on_delivery(self, raw: DeliveredMessage) -> None:
        self._spawn(Delivery(raw))

    def _spawn(self, message: Delivery) -> asyncio.Task[None]:
        # Jobs run in tasks of their own, so closing a channel never cancels a handler.
        self._acks.delivered(message)
        task = asyncio.get_running_loop().create_task(self._process(message, self._acks))
        self.in_flight.add(task)
        self._in_flight.inc()
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._in_flight.dec()
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery not settled", exc_info=task.exception())

    async def _process(self, message: Delivery, acks: Acks) -> None:
        headers = message.headers
        if death_is_forged(headers):
            await self._sanitize(message, headers, acks)
            return
        attempt = retries_so_far(headers, self._names.queue) + 1
        job = Job(
            message.body,
            headers=headers,
            message_id=message.message_id,
            amqp_type=message.type,
            attempt=attempt,
            max_attempts=max_attempts(headers, self._max_retries),
            routing_key=message.routing_key,
            correlation_id=message.correlation_id,
            content_type=message.content_type,
        )
        # Each job runs in a task of its own, with its own copy of the context: binding here
        # tags every line logged for this job (an async handler's too) and leaks into no other.
        structlog.contextvars.bind_contextvars(
            message_id=job.message_id, type=job.type, attempt=attempt, max_attempts=job.max_attempts
        )
        if is_poison(headers, message.redelivered):
            poison = PoisonMessage(f"delivered more than {POISON_DELIVERIES} times without an ack")
            await self._fail(message, job, poison, FailureKind.POISON, acks)
            return
        started = time.perf_counter()
        outcome, error = await self._invoker(job)
        self._duration.observe(time.perf_counter() - started)
        await self._settle(message, job, decide(outcome, attempt, job.max_attempts), error, acks)

    async def _settle(
        self,
        message: Delivery,
        job: Job,
        decision: Decision,
        error: BaseException | None,
        acks: Acks,
    ) -> None:
        if decision.action is Action.ACK:
            acks.ack_soon(message)
            self._succeeded.inc()
            log.info("job succeeded")
        elif decision.action is Action.RETRY:
            await self._retry(message, job, error, acks)
        else:
            assert error is not None
            assert decision.kind is not None
            await self._fail(message, job, error, decision.kind, acks)

    async def _retry(self, message: Delivery, job: Job, error: Any, acks: Acks) -> None:
        tier = min(job.attempt, len(self._plan.tiers))
        spec = self._plan.tiers[tier - 1]
        try:
            await message.dead_letter()
        except CONNECTION_ERRORS:
            log.warning("job not settled: channel closed, the broker delivers it again")
            return
        finally:
            acks.release(message)  # only now, with the nack written, may a multiple ack pass it
        self._retried.inc()
        self._metrics.retries.labels(self._names.queue, str(tier)).inc()
        log.warning(
            "job failed, retrying",
            error=failure_reason(error),
            tier=spec.name,
            delay_ms=spec.delay_ms,
        )

    async def _fail(
        self,
        message: Delivery,
        job: Job,
        error: BaseException,
        kind: FailureKind,
        acks: Acks,
    ) -> None:
        # Formatted once for the header and the log: formatting parses source lines, and doing it
        # twice took a third of the failure path's time.
        formatted = format_traceback(error)
        headers = fit_to_frame(
            failed_headers(
                job.headers,
                error,
                kind,
                retry_count=job.attempt - 1,
                queue=self._names.queue,
                routing_key=original_routing_key(job.headers, self._names.queue, job.routing_key),
                now=dt.datetime.now(dt.UTC),
                formatted_traceback=formatted,
            ),
            self._frame_max,
        )
        copy = aio_pika.Message(
            message.body,
            headers=headers,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **copied_properties(message.decoded()),
        )
        assert self._failed is not None
        if not await self._publish_then_ack(message, self._failed, copy, self._names.failed, acks):
            return
        self._failed_jobs.inc()
        self._metrics.failed.labels(self._names.queue, str(kind)).inc()
        log.error(
            "job failed",
            kind=str(kind),
            error=headers["failed-reason"],
            exception=formatted.removesuffix("\n"),  # what exc_info=error would render
        )

    async def _sanitize(self, message: Delivery, headers: dict[str, Any], acks: Acks) -> None:
        # The broker must never dead-letter a forged x-death (RabbitMQ 3.x can crash the queue
        # or lose the message), so the job comes back as a clean first attempt instead.
        clean = aio_pika.Message(
            message.body,
            headers=copied_headers(headers),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **copied_properties(message.decoded()),
        )
        assert self._channel is not None
        if await self._publish_then_ack(
            message, self._channel.default_exchange, clean, self._names.queue, acks
        ):
            log.warning("forged x-death header removed", message_id=message.message_id)

    async def _publish_then_ack(
        self,
        message: Delivery,
        exchange: AbstractExchange,
        copy: aio_pika.Message,
        routing_key: str,
        acks: Acks,
    ) -> bool:
        """Publish with a confirm, then ack the original.

        A copy the broker returns (unroutable) or nacks is published again with backoff while
        the original stays unacked in the queue. It is not requeued: each requeue would raise
        its delivery count until the job looked like poison and lost its real reason.
        """
        try:
            try:
                await exchange.publish(copy, routing_key=routing_key, mandatory=True)
            except DeliveryError:
                # Rare, so the retry machinery (a third of a publish's cost) waits until needed.
                async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type(DeliveryError),
                    wait=wait_exponential_jitter(multiplier=UNCONFIRMED_FIRST_WAIT_S, max=30),
                    before_sleep=_log_unconfirmed,
                ):
                    with attempt:
                        await exchange.publish(copy, routing_key=routing_key, mandatory=True)
        except CONNECTION_ERRORS as error:
            # The channel is gone: the broker hands the original back by itself.
            log.warning(
                "copy not published: channel closed, the job stays in the queue", error=str(error)
            )
            return False
        acks.ack_soon(message)
        return True
