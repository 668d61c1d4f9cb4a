"""The worker process: serve -> a connection at a time -> a queue worker per queue on it
(recover, consume, drain) -> shutdown."""

import asyncio

from aio_pika.abc import AbstractConnection

from ricochet import priority
from ricochet.broker.amqp import broker_version
from ricochet.broker.cancels import CancelReader
from ricochet.broker.connection import connection_name
from ricochet.broker.journal import LAST_WRITE_S, Journal
from ricochet.broker.legacy import is_migrated
from ricochet.broker.register import amqp_user
from ricochet.handlers.invoker import Invoker
from ricochet.log import get_logger
from ricochet.observe.metrics import Metrics
from ricochet.observe.webhook import Webhook
from ricochet.service.process import (
    Lifecycle,
    Stops,
    keep_connected,
    run_service,
    stop_signals,
)
from ricochet.settings import Settings
from ricochet.worker.leader import ScheduleLeader
from ricochet.worker.queue_worker import QueueWorker
from ricochet.worker.redeclare import exits_at_start

log = get_logger("ricochet.worker")


class Worker:
    """Consumes every queue of the worker (RICOCHET_QUEUES) until stopped, each on a channel of
    its own of one connection, reconnecting whenever the broker drops it; the jobs of a lost
    session run on."""

    def __init__(
        self, settings: Settings, invoker: Invoker, metrics: Metrics, lifecycle: Lifecycle
    ):
        self._settings = settings
        self._lifecycle = lifecycle
        each = settings.per_queue()
        self.cancels = CancelReader(amqp_user(settings.amqp_url), *settings.queue_names)
        self._webhook = Webhook(settings.alert_webhook_url, metrics)
        self.journal = Journal(settings.journal == "on", metrics.journal_counted)
        self.queues = [
            QueueWorker(
                queue, invoker, metrics, lifecycle, self.cancels, self._webhook, self.journal
            )
            for queue in each
        ]
        self._leader = ScheduleLeader(settings, invoker.schedules, settings.queue_names, metrics)
        self._started = False  # it has consumed on a connection
        lifecycle.not_working = self.not_consuming

    def not_consuming(self) -> list[str]:
        """Each queue not consumed now, and why (/readyz names them)."""
        return [why for why in (queue.unready for queue in self.queues) if why is not None]

    async def serve(self) -> None:
        """Run until a stop is requested; raises BrokerUnavailable or ConfigError at start (a
        TopologyConflict when no queue can be declared)."""
        queues = [queue.settings.queue for queue in self.queues]
        shown = queues[0] if len(queues) == 1 else f"{queues[0]} (+{len(queues) - 1} queues)"
        name = connection_name("worker", shown)
        self._webhook.start()
        try:
            await keep_connected(self._lifecycle, self._settings, name, self._run_connection)
        finally:
            await self._lifecycle.unless_forced(
                self._webhook.close(self._settings.shutdown_timeout_s)
            )
        log.info("stopped")

    async def _run_connection(self, connection: AbstractConnection) -> None:
        """Declare every queue, read the cancels, then consume every queue on the connection
        until each has ended (a stop, or the connection lost); a queue in conflict is declared
        again with backoff while the others are consumed."""
        # Declared first: the shared part holds the cancel store the reader starts from.
        declared = [await queue.declare(connection) for queue in self.queues]
        conflicts = [queue.conflict for queue in self.queues if queue.conflict is not None]
        if exits_at_start(not self._started, len(self.queues), len(conflicts)):
            raise conflicts[0]
        if not self._started:
            say_priority(self._settings, broker_version(connection))
        self._started = True
        # Before any job: every cancel made until now, those of earlier versions' stores too
        # until `ricochet migrate` has moved them.
        await self.cancels.follow(connection, old_stores=not await is_migrated(connection))
        runs = [
            asyncio.ensure_future(queue.run(connection, plan))
            for queue, plan in zip(self.queues, declared, strict=True)
        ]
        writing = asyncio.ensure_future(self.journal.run(connection))
        try:
            async with self._leader.running(connection):
                await asyncio.gather(*runs)
        finally:
            for run in runs:
                run.cancel()
            # What it kept is written first, for a moment at most: a stop never waits on it.
            writing.cancel()
            await asyncio.wait({writing}, timeout=LAST_WRITE_S)


def say_priority(settings: Settings, version: tuple[int, ...] | None) -> None:
    """Say once, at the first start, when the broker does not order the queues' backlogs by
    priority (ricochet.priority)."""
    how = priority.honouring(settings.queue_type, settings.max_priority, version)
    if how is priority.Honouring.NONE:
        log.info(
            "priority not applied",
            queue_type=settings.queue_type,
            detail=priority.said(how, settings.queue_type, settings.max_priority),
        )


async def run_worker(
    settings: Settings, invoker: Invoker, metrics: Metrics, stops: Stops = stop_signals
) -> None:
    """Run a worker with its HTTP endpoints until SIGTERM/SIGINT (or what stops says)."""
    await run_service(
        settings,
        metrics,
        lambda lifecycle: Worker(settings, invoker, metrics, lifecycle).serve(),
        stops=stops,
    )
