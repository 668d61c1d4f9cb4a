"""The monitor: logs every failed job and alerts on them, reading the failed-events queue.

It reads Q.failed.events, a second copy of each failure, so it never takes anything out of
Q.failed; the depth of Q.failed it only reads with passive declares.
"""

import asyncio
import contextlib

import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from app.alerts import DepthWatch, ReasonLimiter, depth_alert, job_failed_alert
from app.connection import CONNECTION_ERRORS
from app.failed import read_failure
from app.http import serve_http
from app.metrics import Metrics
from app.settings import Settings
from app.topology import Names, declare
from app.webhook import Webhook
from app.worker import Lifecycle, connection_name, run_sessions

log = structlog.get_logger("ricochet.monitor")

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

    async def serve(self) -> None:
        """Run until a stop is requested; raises BrokerUnavailable or ConfigError at start."""
        self._webhook.start()
        try:
            name = connection_name("monitor", self._settings.queue)
            await run_sessions(self.lifecycle, self._settings, name, self._watch)
        finally:
            await self.lifecycle.unless_forced(
                self._webhook.close(self._settings.shutdown_timeout_s)
            )
        log.info("stopped")

    async def _watch(self, connection: AbstractConnection) -> None:
        """Declare, then consume the events until a stop is requested or the connection dies."""
        await declare(connection, self._settings)
        channel = await connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=PREFETCH)
        events = await channel.get_queue(self._names.events, ensure=False)
        await events.consume(self._on_event)
        ticker = asyncio.get_running_loop().create_task(self._tick(connection))
        log.info("monitoring", queue=self._names.events, failed_queue=self._names.failed)
        try:
            await self.lifecycle.serve_until_lost(connection, channel)
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _on_event(self, message: AbstractIncomingMessage) -> None:
        failure = read_failure(
            dict(message.headers or {}), message.message_id, message.type, message.body
        )
        # The log line comes first and does not depend on the webhook.
        log.error("job failed", queue=self._names.queue, **failure.as_dict())
        suppressed = self._limiter.offer(failure, asyncio.get_running_loop().time())
        if suppressed is not None:
            self._webhook.send(job_failed_alert(self._names.queue, failure, suppressed))
        try:
            await message.ack()
        except CONNECTION_ERRORS:
            log.warning("event not acked: channel closed, the broker delivers it again")

    async def _tick(self, connection: AbstractConnection) -> None:
        """Send held-back alerts when due, and read the failed queue's depth every interval."""
        loop = asyncio.get_running_loop()
        channel: AbstractChannel | None = None
        next_depth_check = loop.time()
        while True:
            now = loop.time()
            for failure, suppressed in self._limiter.due(now):
                self._webhook.send(job_failed_alert(self._names.queue, failure, suppressed))
            if now >= next_depth_check:
                next_depth_check = now + self._settings.alert_interval_s
                channel = await self._check_depth(connection, channel)
            await asyncio.sleep(TICK_S)

    async def _check_depth(
        self, connection: AbstractConnection, channel: AbstractChannel | None
    ) -> AbstractChannel | None:
        """Read the failed queue's depth and alert on a crossing; returns the channel to reuse."""
        try:
            if channel is None or channel.is_closed:
                channel = await connection.channel(publisher_confirms=False)
            declared = await channel.declare_queue(self._names.failed, passive=True)
        except CONNECTION_ERRORS as error:
            log.warning("failed queue depth unknown", queue=self._names.failed, error=str(error))
            return None
        depth = declared.declaration_result.message_count or 0
        event = self._depth.observe(depth)
        if event is not None:
            self._alert_depth(event, depth)
        return channel

    def _alert_depth(self, event: str, depth: int) -> None:
        threshold = self._depth.threshold
        log.warning(event, queue=self._names.failed, depth=depth, threshold=threshold)
        self._webhook.send(depth_alert(event, self._names.queue, depth, threshold))


async def run_monitor(settings: Settings, metrics: Metrics) -> None:
    """Run the monitor with signal handling and its HTTP endpoints until SIGTERM/SIGINT."""
    lifecycle = Lifecycle()
    lifecycle.install_signals()
    try:
        async with serve_http(settings.http_port, metrics.registry, lambda: lifecycle.ready):
            await Monitor(
                settings, metrics, lifecycle, Webhook(settings.alert_webhook_url, metrics)
            ).serve()
    finally:
        lifecycle.restore_signals()
