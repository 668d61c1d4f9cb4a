"""The monitor: logs every failed job and alerts on them, reading the failed-events queue.

It reads Q.failed.events, a second copy of each failure, so it never takes anything out of
Q.failed; the depths of Q.failed and the other queues it only reads with passive declares.
"""

import asyncio
import contextlib
import functools
import time

from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.connection import connection_name
from ricochet.broker.declare import declare_failed_side
from ricochet.broker.plan import EVENTS_MAX_LENGTH, Plan
from ricochet.broker.record import declared_settings
from ricochet.broker.register import amqp_user
from ricochet.delivery.failed import read_failure
from ricochet.log import get_logger
from ricochet.monitor.backlog import FailedBacklog, failed_at_s
from ricochet.monitor.console import Console
from ricochet.monitor.index import JobIndex
from ricochet.monitor.job_views import JobViews
from ricochet.monitor.relaunch import relaunch_every
from ricochet.names import Names
from ricochet.observe.alerts import (
    DepthWatch,
    ReasonLimiter,
    depth_alert,
    job_failed_alert,
    reason_key,
)
from ricochet.observe.metrics import Metrics
from ricochet.observe.webhook import Webhook
from ricochet.ops.status import StatusReader
from ricochet.service.process import Lifecycle, keep_connected, run_service
from ricochet.settings import Settings

log = get_logger("ricochet.monitor")

PREFETCH = 100
TICK_S = 0.5  # how often held-back alerts are looked at; the depth is read every interval


class Monitor:
    """Consumes the failed-events queue until stopped, reconnecting when the broker drops it."""

    def __init__(
        self, settings: Settings, metrics: Metrics, lifecycle: Lifecycle, webhook: Webhook
    ) -> None:
        self._settings = settings
        self._names = Names(settings.queue)
        self.metrics = metrics
        self.lifecycle = lifecycle
        self._webhook = webhook
        self._limiter = ReasonLimiter(settings.alert_interval_s)
        self._depth = DepthWatch(settings.alert_failed_threshold)
        self._backlog = FailedBacklog(time.time(), EVENTS_MAX_LENGTH)
        # The latest held-back event of each reason, unacked until its alert goes out.
        self._held: dict[str, AbstractIncomingMessage] = {}

    async def serve(self) -> None:
        """Run until a stop is requested; raises BrokerUnavailable or ConfigError at start."""
        self._webhook.start()
        try:
            name = connection_name("monitor", self._settings.queue)
            await keep_connected(self.lifecycle, self._settings, name, self._watch)
        finally:
            await self.lifecycle.unless_forced(
                self._webhook.close(self._settings.shutdown_timeout_s)
            )
        log.info("stopped")

    async def _watch(self, connection: AbstractConnection) -> None:
        """Declare the failed side, then consume the events until a stop is requested or the
        connection dies. The tiers are the worker's: read from the broker, never declared here."""
        settings = await declared_settings(connection, self._settings)
        plan = await declare_failed_side(connection, settings)
        self._held.clear()  # of a closed channel: the broker delivers them again
        channel = await connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=PREFETCH)
        events = await channel.get_queue(self._names.events, ensure=False)
        await events.consume(self._on_event)
        # The ticker ends on this flag as well as on its cancellation: a cancel that lands in a
        # broker call may come out of aiormq as a closed channel, which the ticker lives through.
        done = asyncio.Event()
        ticker = asyncio.get_running_loop().create_task(self._tick(connection, plan, done))
        tasks = [ticker]
        if self._settings.relaunch_interval_s:
            relaunch = relaunch_every(connection, self._names, self._settings, self.metrics, done)
            tasks.append(asyncio.get_running_loop().create_task(relaunch))
        log.info("monitoring", queue=self._names.events, failed_queue=self._names.failed)
        try:
            await self.lifecycle.serve_until_lost(connection, channel)
        finally:
            done.set()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _on_event(self, message: AbstractIncomingMessage) -> None:
        failure = read_failure(
            dict(message.headers or {}), message.message_id, message.type, message.body
        )
        # The log line comes first and does not depend on the webhook.
        log.error("job failed", queue=self._names.queue, **failure.as_dict())
        self._backlog.failed(failed_at_s(failure.failed_at, time.time()))
        key = reason_key(failure.reason)
        suppressed = self._limiter.offer(key, failure, asyncio.get_running_loop().time())
        # An event is acked once its alert is out of the webhook's hands, so a crash before
        # that leaves it to the broker to deliver again. A held-back one waits for the alert
        # that counts it; when a later one of its reason takes its place, only its count
        # (kept in memory) is at stake, and it is acked.
        earlier = self._held.pop(key, None)
        if suppressed is None:
            self._held[key] = message
            await _ack(earlier)
        else:
            alert = job_failed_alert(self._names.queue, failure, suppressed)
            await self._webhook.send(alert, functools.partial(_ack, message, earlier))

    async def _tick(self, connection: AbstractConnection, plan: Plan, done: asyncio.Event) -> None:
        """Send held-back alerts when due, and read the failed queue's depth every interval,
        until done is set."""
        loop = asyncio.get_running_loop()
        next_depth_check = loop.time()
        # One channel for every depth check, which goes with the connection.
        status = StatusReader(connection, amqp_user(self._settings.amqp_url))
        while not done.is_set():
            now = loop.time()
            for key, failure, suppressed in self._limiter.due(now):
                held = self._held.pop(key, None)
                alert = job_failed_alert(self._names.queue, failure, suppressed)
                await self._webhook.send(alert, functools.partial(_ack, held))
            if now >= next_depth_check:
                next_depth_check = now + self._settings.alert_interval_s
                await self._check_depth(status, plan)
            await asyncio.sleep(TICK_S)

    async def _check_depth(self, status: StatusReader, plan: Plan) -> None:
        """Read every queue's depth into the metrics, and alert on a failed-queue crossing."""
        try:
            queues = await status.read(plan)
        except CONNECTION_ERRORS as error:
            log.warning("queue depths unknown", queue=self._names.queue, error=str(error))
            return
        for queue in queues:
            self.metrics.observe_queue(
                self._names.queue, queue.role, queue.messages, queue.consumers
            )
        failed = next(q for q in queues if q.name == self._names.failed)
        depth = failed.messages
        if depth is None:
            log.warning("failed queue depth unknown", queue=self._names.failed, error="no queue")
            return
        # The monitor never consumes the failed queue: a consumer of it is a reader holding copies.
        held = bool(failed.consumers)
        if not held:
            self.metrics.observe_failed_oldest(self._names.queue, self._backlog.oldest(depth))
        event = self._depth.observe(depth, held)
        if event is not None:
            threshold = self._depth.threshold
            log.warning(event, queue=self._names.failed, depth=depth, threshold=threshold)
            await self._webhook.send(depth_alert(event, self._names.queue, depth, threshold))


async def _ack(*messages: AbstractIncomingMessage | None) -> None:
    for message in messages:
        if message is None:
            continue
        try:
            await message.ack()
        except CONNECTION_ERRORS:
            log.warning("event not acked: channel closed, the broker delivers it again")


async def run_monitor(settings: Settings, metrics: Metrics) -> None:
    """Run the monitor of every queue of the worker (RICOCHET_QUEUES), with its HTTP endpoints,
    the failed-jobs console and the journal's index and views, until SIGTERM/SIGINT."""

    index = JobIndex()

    async def serve(lifecycle: Lifecycle) -> None:
        monitors = [
            Monitor(each, metrics, lifecycle, Webhook(each.alert_webhook_url, metrics))
            for each in settings.per_queue()
        ]
        await asyncio.gather(
            *(monitor.serve() for monitor in monitors), index.serve(settings, lifecycle)
        )

    console = Console(settings, index)
    pages = [*console.routes(), *JobViews(console, index).routes()]
    await run_service(settings, metrics, serve, pages)
