"""The consumer: the only place that acks, nacks or publishes on behalf of a delivery."""

import asyncio
import contextlib
import datetime as dt
import time
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage

from app.connection import CONNECTION_ERRORS
from app.errors import PoisonMessage
from app.failed import copied_properties, failed_headers, failure_reason, format_traceback
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

log = structlog.get_logger("ricochet.consumer")

# Pause before handing back a job whose failed copy was not confirmed, so a broken failed
# queue does not turn into a hot redelivery loop.
UNCONFIRMED_BACKOFF_S = 1.0


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
        self._failed: AbstractExchange | None = None
        self._tag: str | None = None

    async def start(self, channel: AbstractChannel) -> None:
        """Start consuming the main queue on a channel opened with publisher confirms."""
        self._channel = channel
        self._failed = await channel.get_exchange(self._names.failed, ensure=False)
        queue = await channel.get_queue(self._names.queue, ensure=False)
        self._tag = await queue.consume(self._on_message)

    async def stop(self) -> None:
        """Stop taking deliveries; jobs in flight carry on."""
        if self._channel is None or self._tag is None or self._channel.is_closed:
            return
        try:
            queue = await self._channel.get_queue(self._names.queue, ensure=False)
            await queue.cancel(self._tag)
        except CONNECTION_ERRORS as error:
            log.warning("consumer cancel failed", error=str(error))

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        # Jobs run in tasks of their own, so closing a channel never cancels a handler.
        task = asyncio.get_running_loop().create_task(self._process(message))
        self.in_flight.add(task)
        self._metrics.in_flight.labels(self._names.queue).inc()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._metrics.in_flight.labels(self._names.queue).dec()
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery not settled", exc_info=task.exception())

    async def _process(self, message: AbstractIncomingMessage) -> None:
        headers: dict[str, Any] = dict(message.headers or {})
        if death_is_forged(headers):
            await self._sanitize(message, headers)
            return
        attempt = retries_so_far(headers, self._names.queue) + 1
        job = Job(
            message.body,
            headers=headers,
            message_id=message.message_id,
            amqp_type=message.type,
            attempt=attempt,
            max_attempts=max_attempts(headers, self._max_retries),
            routing_key=message.routing_key or "",
            correlation_id=message.correlation_id,
            content_type=message.content_type,
        )
        with structlog.contextvars.bound_contextvars(
            message_id=job.message_id, type=job.type, attempt=attempt, max_attempts=job.max_attempts
        ):
            if is_poison(headers):
                poison = PoisonMessage(
                    f"delivered more than {POISON_DELIVERIES} times without an ack"
                )
                await self._fail(message, job, poison, FailureKind.POISON)
                return
            started = time.perf_counter()
            outcome, error = await self._invoker(job)
            self._metrics.duration.labels(self._names.queue).observe(time.perf_counter() - started)
            await self._settle(message, job, decide(outcome, attempt, job.max_attempts), error)

    async def _settle(
        self,
        message: AbstractIncomingMessage,
        job: Job,
        decision: Decision,
        error: BaseException | None,
    ) -> None:
        if decision.action is Action.ACK:
            if await self._ack(message):
                self._metrics.jobs.labels(self._names.queue, "succeeded").inc()
                log.info("job succeeded")
        elif decision.action is Action.RETRY:
            await self._retry(message, job, error)
        else:
            assert error is not None
            assert decision.kind is not None
            await self._fail(message, job, error, decision.kind)

    async def _retry(self, message: AbstractIncomingMessage, job: Job, error: Any) -> None:
        tier = min(job.attempt, len(self._plan.tiers))
        spec = self._plan.tiers[tier - 1]
        try:
            await message.nack(requeue=False)
        except CONNECTION_ERRORS:
            log.warning("job not settled: channel closed, the broker delivers it again")
            return
        self._metrics.jobs.labels(self._names.queue, "retried").inc()
        self._metrics.retries.labels(self._names.queue, str(tier)).inc()
        log.warning(
            "job failed, retrying",
            error=failure_reason(error),
            tier=spec.name,
            delay_ms=spec.delay_ms,
        )

    async def _fail(
        self, message: AbstractIncomingMessage, job: Job, error: BaseException, kind: FailureKind
    ) -> None:
        # Formatted once for the header and the log: formatting parses source lines, and doing it
        # twice took a third of the failure path's time.
        formatted = format_traceback(error)
        headers = failed_headers(
            job.headers,
            error,
            kind,
            retry_count=job.attempt - 1,
            queue=self._names.queue,
            routing_key=original_routing_key(job.headers, self._names.queue, job.routing_key),
            now=dt.datetime.now(dt.UTC),
            formatted_traceback=formatted,
        )
        copy = aio_pika.Message(
            message.body,
            headers=headers,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **copied_properties(message),
        )
        assert self._failed is not None
        if not await self._publish_then_ack(message, self._failed, copy, self._names.failed):
            return
        self._metrics.jobs.labels(self._names.queue, "failed").inc()
        self._metrics.failed.labels(self._names.queue, str(kind)).inc()
        log.error(
            "job failed",
            kind=str(kind),
            error=headers["failed-reason"],
            exception=formatted.removesuffix("\n"),  # what exc_info=error would render
        )

    async def _sanitize(self, message: AbstractIncomingMessage, headers: dict[str, Any]) -> None:
        # The broker must never dead-letter a forged x-death (RabbitMQ 3.x can crash the queue
        # or lose the message), so the job comes back as a clean first attempt instead.
        clean = aio_pika.Message(
            message.body,
            headers={k: v for k, v in headers.items() if k != "x-death"},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **copied_properties(message),
        )
        assert self._channel is not None
        if await self._publish_then_ack(
            message, self._channel.default_exchange, clean, self._names.queue
        ):
            log.warning("forged x-death header removed", message_id=message.message_id)

    async def _publish_then_ack(
        self,
        message: AbstractIncomingMessage,
        exchange: AbstractExchange,
        copy: aio_pika.Message,
        routing_key: str,
    ) -> bool:
        """Publish with a confirm, then ack; hand the original back if the confirm fails."""
        try:
            await exchange.publish(copy, routing_key=routing_key, mandatory=True)
        except CONNECTION_ERRORS as error:
            log.error("copy not confirmed, the job stays in the queue", error=str(error))
            await asyncio.sleep(UNCONFIRMED_BACKOFF_S)
            # If the channel is gone, the broker hands the job back by itself.
            with contextlib.suppress(*CONNECTION_ERRORS):
                await message.nack(requeue=True)
            return False
        return await self._ack(message)

    @staticmethod
    async def _ack(message: AbstractIncomingMessage) -> bool:
        try:
            await message.ack()
        except CONNECTION_ERRORS:
            log.warning("job not acked: channel closed, the broker delivers it again")
            return False
        return True
