"""The consumer: subscribes to the main queue, runs each delivery's job and settles it.

What happens to a delivery is ricochet.delivery.retry.decide's call, on the facts read once from its
headers; the consumer carries it out on the delivery's own subscription
(ricochet.worker.subscription).
"""

import asyncio
import datetime as dt
import time
from collections.abc import Callable

import structlog
from aio_pika.abc import AbstractChannel

from ricochet.broker.amqp import Delivery
from ricochet.broker.cancels import CancelLog
from ricochet.broker.topology import Plan, delay_key
from ricochet.delivery.failed import Failure, cleaned_copy, counted_copy, failed_copy
from ricochet.delivery.retry import (
    Action,
    Decision,
    Facts,
    Outcome,
    decide,
    job_type,
    read_facts,
    runs_alone,
)
from ricochet.errors import RetryLater
from ricochet.handlers.invoker import Invoker
from ricochet.handlers.job import bind_log_context, job_of
from ricochet.observe.metrics import Metrics, QueueMetrics
from ricochet.observe.spans import attempt_span, record_outcome, settle_span
from ricochet.worker.subscription import Gate, Subscription

log = structlog.get_logger("ricochet.consumer")


class Consumer:
    """Consumes the main queue, one subscription per channel, and settles every delivery once."""

    def __init__(
        self,
        plan: Plan,
        max_retries: int,
        prefetch: int,
        invoker: Invoker,
        metrics: Metrics,
        cancelled: CancelLog,
        ran: Callable[[Outcome], None] = lambda _: None,
    ):
        self._plan = plan
        self._cancelled = cancelled
        self._prefetch = prefetch  # the channel's QoS, as the worker sets it
        self._ran = ran  # told the outcome of every handler call
        self._queue = plan.names.queue
        self._max_retries = max_retries
        self._invoker = invoker
        self._metrics = QueueMetrics(metrics, self._queue)
        self.in_flight: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None
        self._gate = Gate()

    async def start(self, channel: AbstractChannel, frame_max: int) -> None:
        """Start taking jobs from the main queue on a channel opened with publisher confirms."""
        if self._subscription is not None:
            # The one of a lost connection must not subscribe on this channel too, nor run what
            # it held (the broker delivers those again).
            await self.stop()
        self._gate.open()
        self._subscription = await Subscription.open(
            channel, frame_max, self._prefetch, self.in_flight
        )
        self._subscription.subscribe(self._queue, self._spawn, self._runs_alone)

    @property
    def consuming(self) -> bool:
        """Whether deliveries are being taken (subscribed)."""
        return self._subscription is not None and self._subscription.consuming

    @property
    def recovering(self) -> bool:
        """Whether the jobs that came back redelivered are being run, before subscribing."""
        return self._subscription is not None and self._subscription.recovering

    @property
    def interrupted(self) -> asyncio.Event:
        """Set when deliveries stop on an open channel (the broker cancelled the consumer)."""
        assert self._subscription is not None
        return self._subscription.interrupted

    async def stop(self) -> None:
        """Stop taking deliveries; jobs in flight carry on, held ones go back on channel close."""
        self._gate.drop_held()
        if self._subscription is not None:
            await self._subscription.stop()

    async def pause(self) -> None:
        """Stop taking deliveries; those arriving meanwhile are held until resume()."""
        self._gate.close()
        if self._subscription is not None:
            await self._subscription.stop()

    def resume(self) -> None:
        """Take jobs again on the same channel (after a pause or the broker's cancel), the held
        deliveries first; every delivery is still settled on the channel it came on."""
        assert self._subscription is not None
        self._gate.open()
        self._subscription.subscribe(self._queue, self._spawn, self._runs_alone)

    async def drain_acks(self) -> None:
        """Send the acks of finished jobs still pending (before the channel closes)."""
        if self._subscription is not None:
            await self._subscription.acks.drain()

    def _runs_alone(self, delivery: Delivery) -> bool:
        return runs_alone(
            delivery.headers,
            redelivered=delivery.redelivered,
            from_tier=self._plan.names.is_attempt_key(delivery.routing_key),
            queue=self._queue,
        )

    def _spawn(self, subscription: Subscription, delivery: Delivery) -> asyncio.Task[None]:
        # Jobs run in tasks of their own, so closing a channel never cancels a handler.
        task = asyncio.get_running_loop().create_task(self._process(subscription, delivery))
        self.in_flight.add(task)
        self._metrics.in_flight.inc()
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._metrics.in_flight.dec()
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery not settled", exc_info=task.exception())

    async def _process(self, subscription: Subscription, delivery: Delivery) -> None:
        await self._gate.passed()
        kind = job_type(delivery.type, delivery.body)  # once: the budget and the Job both need it
        names = self._plan.names
        facts = read_facts(
            delivery.headers,
            redelivered=delivery.redelivered,
            routing_key=delivery.routing_key,
            from_tier=names.is_attempt_key(delivery.routing_key),
            queue=self._queue,
            max_retries=self._max_retries,
            type_max_retries=self._invoker.max_retries(kind),
            unreadable=delivery.unreadable is not None,
            key_tier=names.tier_of_key(delivery.routing_key),
            cancelled=delivery.message_id in self._cancelled,
            now=dt.datetime.now(dt.UTC),
        )
        original = names.published_key(facts.original_routing_key)
        if original != facts.original_routing_key:  # back from the delays
            facts = facts._replace(original_routing_key=original)
        decision = decide(facts, None)
        # Unreadable properties, a forged x-death or a poison job: no attempt.
        if decision.action is not Action.RUN:
            if decision.action is not Action.SANITIZE:  # a forged header is not the job's yet
                bind_log_context(job_of(delivery, facts, kind))
            await self._settle(subscription, delivery, facts, decision, None)
            return
        job = job_of(delivery, facts, kind)
        bind_log_context(job)
        with attempt_span(self._queue, job) as span:  # the attempt's span covers its settling
            started = time.perf_counter()
            outcome, error = await self._invoker(job)
            self._metrics.duration.observe(time.perf_counter() - started)
            self._ran(outcome)
            later_ms = round(error.after_s * 1000) if isinstance(error, RetryLater) else None
            decision = decide(facts, outcome, later_ms)
            failure = None if error is None else Failure(error)
            record_outcome(span, decision, failure)
            with settle_span(self._queue, span, decision):
                await self._settle(subscription, delivery, facts, decision, failure)

    async def _settle(
        self,
        subscription: Subscription,
        delivery: Delivery,
        facts: Facts,
        decision: Decision,
        failure: Failure | None,
    ) -> None:
        if decision.action is Action.ACK:
            subscription.ack(delivery)
            self._metrics.succeeded_on(facts.attempt)
            log.info("job succeeded")
        elif decision.action is Action.RETRY:
            assert failure is not None
            assert decision.tier is not None
            if await subscription.dead_letter(delivery):
                self._metrics.retried_in(decision.tier)
                tier = self._plan.tiers[decision.tier - 1]
                log.warning(
                    "job failed, retrying",
                    error=failure.reason,
                    tier=tier.name,
                    delay_ms=tier.delay_ms,
                )
        elif decision.action is Action.SANITIZE:
            # The broker must never dead-letter a forged x-death (RabbitMQ 3.x can crash the queue
            # or lose the message), so the job comes back as a clean first attempt instead.
            clean = cleaned_copy(delivery)
            if await subscription.copy_then_ack(delivery, clean, self._queue):
                log.warning("forged x-death header removed", message_id=delivery.message_id)
        elif decision.action is Action.CANCEL:
            subscription.ack(delivery)
            self._metrics.cancelled.inc()
            log.info("job cancelled", message_id=delivery.message_id)
        elif decision.action in (Action.DELAY, Action.RETRY_BY_COPY):
            await self._copy_on(subscription, delivery, facts, decision, failure)
        else:
            assert decision.kind is not None
            failed = failed_copy(
                delivery,
                facts,
                failure,
                decision.kind,
                queue=self._queue,
                frame_max=subscription.frame_max,
                now=dt.datetime.now(dt.UTC),
            )
            names = self._plan.names
            if await subscription.copy_then_ack(
                delivery, failed.message, names.failed, notify=names.events
            ):
                self._metrics.failed_as(decision.kind, facts.attempt)
                log.error("job failed", **failed.log_fields)

    async def _copy_on(
        self,
        subscription: Subscription,
        delivery: Delivery,
        facts: Facts,
        decision: Decision,
        failure: Failure | None,
    ) -> None:
        """Publish the job again, with the retries it made, then ack it: to the delays until it
        is due (its run-at, or a RetryLater), or to the route of its tier (a retry after it came
        back from the delays, whose routing key does not lead there)."""
        names = self._plan.names
        assert decision.retries is not None
        copy = counted_copy(delivery, decision.retries)
        if decision.action is Action.DELAY:
            assert decision.delay_ms is not None
            key, exchange = delay_key(decision.delay_ms), names.delay_entry
        else:
            assert decision.tier is not None
            key, exchange = names.attempt_key(decision.tier - 1), names.dlx
        if not await subscription.copy_then_ack(delivery, copy, key, exchange=exchange):
            return
        if decision.action is Action.RETRY_BY_COPY:
            assert failure is not None
            assert decision.tier is not None
            self._metrics.retried_in(decision.tier)
            tier = self._plan.tiers[decision.tier - 1]
            log.warning(
                "job failed, retrying", error=failure.reason, tier=tier.name, delay_ms=tier.delay_ms
            )
        elif failure is None:
            log.info("job scheduled", delay_ms=decision.delay_ms)
        else:
            self._metrics.retried_later(facts.attempt)
            log.warning(
                "job failed, retrying later", error=failure.reason, delay_ms=decision.delay_ms
            )
