"""The worker process: serve -> startup -> consume until stopped or disconnected -> shutdown."""

import asyncio
import contextlib
import time

import structlog
from aio_pika.abc import AbstractConnection
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from ricochet.broker.amqp import CONNECTION_ERRORS, frame_max
from ricochet.broker.cancels import CancelReader
from ricochet.broker.connection import connection_name
from ricochet.broker.publish import confirming_channel
from ricochet.broker.record import declare_recorded
from ricochet.broker.topology import Names
from ricochet.delivery.retry import Outcome
from ricochet.handlers.invoker import Invoker
from ricochet.observe.alerts import PAUSED, RESUMED, pause_alert
from ricochet.observe.metrics import Metrics
from ricochet.observe.webhook import Webhook
from ricochet.service.process import Lifecycle, keep_connected, run_service
from ricochet.settings import Settings
from ricochet.worker.consumer import Consumer
from ricochet.worker.pause import FailureWindow, PausePolicy, pause_ratio

log = structlog.get_logger("ricochet.worker")

# A queue that keeps going away (a quorum queue without a leader) is declared again this often.
RESUBSCRIBE_MAX_WAIT_S = 5.0


class Worker:
    """Consumes the main queue until stopped, reconnecting whenever the broker drops it."""

    def __init__(
        self, settings: Settings, invoker: Invoker, metrics: Metrics, lifecycle: Lifecycle
    ):
        self._settings = settings
        self._invoker = invoker
        self._metrics = metrics
        self._lifecycle = lifecycle
        self._consumer: Consumer | None = None
        self._cancels = CancelReader(Names(settings.queue))
        self._policy = PausePolicy(
            settings.pause_failure_ratio,
            settings.pause_min_jobs,
            settings.pause_window_s,
            settings.pause_s,
        )
        self._failures = FailureWindow(self._policy.window_s)
        self._pause_due = asyncio.Event()
        self._pause_ratio = 0.0
        self._paused = False
        self._webhook = Webhook(settings.alert_webhook_url, metrics)
        lifecycle.working = self.consuming
        metrics.worker_when(self.consuming, lambda: self._paused, self.recovering)

    def consuming(self) -> bool:
        """Whether the worker takes jobs now (what /readyz and ricochet_worker_consuming say)."""
        return self._consumer is not None and self._consumer.consuming

    def recovering(self) -> bool:
        """Whether it runs the jobs that came back redelivered before taking others (not ready)."""
        return self._consumer is not None and self._consumer.recovering

    async def serve(self) -> None:
        """Run until a stop is requested; raises BrokerUnavailable or ConfigError at start."""
        name = connection_name("worker", self._settings.queue)
        self._webhook.start()
        try:
            await keep_connected(self._lifecycle, self._settings, name, self._consume)
        finally:
            await self._lifecycle.unless_forced(
                self._webhook.close(self._settings.shutdown_timeout_s)
            )
        log.info("stopped")

    async def _consume(self, connection: AbstractConnection) -> None:
        """Declare, then consume until a stop is requested (drained here) or the connection dies."""
        plan = await declare_recorded(connection, self._settings)
        await self._cancels.follow(connection)  # before any job: every cancel made until now
        channel = await confirming_channel(connection)
        await channel.set_qos(prefetch_count=self._settings.prefetch)
        if self._consumer is None:
            self._consumer = Consumer(
                plan,
                self._settings.max_retries,
                self._settings.prefetch,
                self._invoker,
                self._metrics,
                self._cancels.cancelled,
                self._ran,
            )
        consumer = self._consumer
        await consumer.start(channel, frame_max(connection))
        log.info("consuming", queue=plan.names.queue, prefetch=self._settings.prefetch)
        interruptions = (consumer.interrupted, self._pause_due, self._cancels.lost)
        while not await self._lifecycle.serve_until_lost(connection, channel, *interruptions):
            if channel.is_closed or connection.is_closed or self._cancels.lost.is_set():
                # Lost (cancels too: a due job must not run unchecked): keep_connected starts
                # over on a new connection.
                return
            if self._pause_due.is_set():
                resumed = await self._pause(consumer)
            else:
                resumed = await self._lifecycle.unless_stopped(self._declare_again(connection))
            if resumed is None:
                break  # a stop was requested: drain as usual
            if not resumed or channel.is_closed:
                return
            consumer.resume()
            log.info("consuming again", queue=plan.names.queue)
        await consumer.stop()
        await self._drain()  # while the connection is up, so finished jobs are acked
        await consumer.drain_acks()

    def _ran(self, outcome: Outcome) -> None:
        """Count a handler call in the window; ask for a pause when too many failed."""
        if not self._policy.enabled:
            return
        now = time.monotonic()
        self._failures.record(now, outcome is Outcome.TRANSIENT)
        if self._pause_due.is_set():  # set from the request until the pause ends
            return
        ratio = pause_ratio(self._policy, *self._failures.counts(now))
        if ratio is not None:
            self._pause_ratio = ratio
            self._pause_due.set()

    async def _pause(self, consumer: Consumer) -> bool | None:
        """Take no job for pause_s (jobs running carry on): True then, or None if a stop was
        requested meanwhile, as unless_stopped answers."""
        self._paused = True
        await consumer.pause()
        log.warning(
            "worker paused: most jobs fail transiently",
            failure_ratio=round(self._pause_ratio, 3),
            pause_s=self._policy.pause_s,
        )
        await self._alert(PAUSED)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._lifecycle.stopping.wait(), self._policy.pause_s)
        self._paused = False
        self._pause_due.clear()
        self._failures.clear()
        if self._lifecycle.stopping.is_set():
            return None
        log.info("worker resumed", pause_s=self._policy.pause_s)
        await self._alert(RESUMED)
        return True

    async def _alert(self, event: str) -> None:
        ratio = round(self._pause_ratio, 3)
        alert = pause_alert(event, self._settings.queue, ratio, self._policy.pause_s)
        await self._webhook.send(alert)

    async def _declare_again(self, connection: AbstractConnection) -> bool:
        """Declare the topology again (the queue may be gone), with backoff; True when done,
        False if the connection closed meanwhile."""
        log.warning("not consuming: declaring the topology again before subscribing again")
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(CONNECTION_ERRORS),
            wait=wait_exponential_jitter(multiplier=0.1, max=RESUBSCRIBE_MAX_WAIT_S, jitter=0.1),
            before_sleep=lambda state: log.warning(
                "declaring again failed, retrying",
                error=str(state.outcome.exception() if state.outcome else None),
            ),
        )
        async for attempt in retrying:
            with attempt:
                if connection.is_closed:
                    return False
                await declare_recorded(connection, self._settings)
        return True

    async def _drain(self) -> None:
        """Let jobs in flight finish within the shutdown timeout (or until a second signal)."""
        pending = self._consumer.in_flight if self._consumer else set()
        if not pending:
            return
        log.info("draining", jobs=len(pending), timeout_s=self._settings.shutdown_timeout_s)
        forced = asyncio.ensure_future(self._lifecycle.forced.wait())
        done = asyncio.ensure_future(asyncio.wait(set(pending)))
        await asyncio.wait(
            {forced, done},
            timeout=self._settings.shutdown_timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        forced.cancel()
        done.cancel()
        if pending:
            log.warning("jobs unfinished at shutdown go back to the queue", jobs=len(pending))
            for task in list(pending):
                task.cancel()


async def run_worker(settings: Settings, invoker: Invoker, metrics: Metrics) -> None:
    """Run a worker with its HTTP endpoints until SIGTERM/SIGINT."""
    await run_service(
        settings, metrics, lambda lifecycle: Worker(settings, invoker, metrics, lifecycle).serve()
    )
