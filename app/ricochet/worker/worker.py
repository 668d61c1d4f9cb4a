"""The worker process: serve -> a session per connection (recover, consume, drain) -> shutdown."""

from collections.abc import Sequence

import structlog
from aio_pika.abc import AbstractConnection

from ricochet.broker.amqp import Frames, frame_max
from ricochet.broker.cancels import CancelReader
from ricochet.broker.connection import connection_name
from ricochet.broker.publish import confirming_channel
from ricochet.broker.record import declare_recorded
from ricochet.broker.topology import Plan
from ricochet.delivery.events import Observer
from ricochet.handlers.invoker import Invoker
from ricochet.observe.alerts import pause_alert
from ricochet.observe.joblog import JobLog
from ricochet.observe.metrics import Metrics, QueueMetrics
from ricochet.observe.webhook import Webhook
from ricochet.service.process import Lifecycle, keep_connected, run_service
from ricochet.settings import Settings
from ricochet.worker.consumer import Consumer
from ricochet.worker.pause import PausePolicy, PauseWatch
from ricochet.worker.session import Session, State
from ricochet.worker.settler import Settler
from ricochet.worker.subscription import Subscription

log = structlog.get_logger("ricochet.worker")


class Worker:
    """Consumes the main queue until stopped, a session per connection, reconnecting whenever
    the broker drops one; the jobs of a lost session run on."""

    def __init__(
        self, settings: Settings, invoker: Invoker, metrics: Metrics, lifecycle: Lifecycle
    ):
        self._settings = settings
        self._invoker = invoker
        self._metrics = QueueMetrics(metrics, settings.queue)
        self._lifecycle = lifecycle
        self._consumer: Consumer | None = None
        self._observers: list[Observer] = []
        self._session: Session | None = None
        self._cancels = CancelReader(settings.queue)
        self._watch = PauseWatch(
            PausePolicy(
                settings.pause_failure_ratio,
                settings.pause_min_jobs,
                settings.pause_window_s,
                settings.pause_s,
            )
        )
        self._webhook = Webhook(settings.alert_webhook_url, metrics)
        lifecycle.working = lambda: self.state is State.CONSUMING
        metrics.worker_when(
            lambda: self.state is State.CONSUMING,
            lambda: self.state is State.PAUSED,
            lambda: self.state is State.RECOVERING,
        )

    @property
    def state(self) -> State:
        """What the worker does now: its session's state, else connecting."""
        return State.CONNECTING if self._session is None else self._session.state

    async def serve(self) -> None:
        """Run until a stop is requested; raises BrokerUnavailable or ConfigError at start."""
        name = connection_name("worker", self._settings.queue)
        self._webhook.start()
        try:
            await keep_connected(self._lifecycle, self._settings, name, self._run_session)
        finally:
            await self._lifecycle.unless_forced(
                self._webhook.close(self._settings.shutdown_timeout_s)
            )
        log.info("stopped")

    def consumer(self, plan: Plan) -> Consumer:
        """The worker's consumer, made for the topology of its first session and kept for the
        next: a lost session's jobs run on in it."""
        if self._consumer is None:
            self._observers = [self._metrics, JobLog(plan.tiers), self._watch]
            self._consumer = Consumer(
                plan.names,
                self._settings.max_retries,
                self._invoker,
                self._metrics,
                self._cancels,
                self._observers,
            )
        return self._consumer

    @property
    def cancels(self) -> CancelReader:
        """The worker's reader of the cancel store."""
        return self._cancels

    @property
    def observers(self) -> Sequence[Observer]:
        """What the worker tells of every handler call and settled delivery (once it has a
        consumer): metrics, the job's log lines, the pause window."""
        return self._observers

    async def _run_session(self, connection: AbstractConnection) -> None:
        """Declare, then run a session on a new channel until it ends (a stop, or lost)."""
        settings = self._settings
        plan = await declare_recorded(connection, settings)
        await self._cancels.follow(connection)  # before any job: every cancel made until now
        channel = await confirming_channel(connection)
        await channel.set_qos(prefetch_count=settings.prefetch)
        consumer = self.consumer(plan)
        frames = await Frames.under(channel)
        settler = Settler(channel, frames, plan.names, frame_max(connection), self.observers)
        subscription = Subscription(
            frames,
            settler,
            settings.queue,
            settings.prefetch,
            consumer.in_flight,
        )
        self._session = Session(
            settings,
            self._lifecycle,
            connection,
            channel,
            subscription,
            consumer,
            self._watch,
            self._alert,
            self._cancels.lost,
        )
        try:
            await self._session.run()
        finally:
            self._session = None

    async def _alert(self, event: str, ratio: float) -> None:
        queue, pause_s = self._settings.queue, self._watch.policy.pause_s
        await self._webhook.send(pause_alert(event, queue, ratio, pause_s))


async def run_worker(settings: Settings, invoker: Invoker, metrics: Metrics) -> None:
    """Run a worker with its HTTP endpoints until SIGTERM/SIGINT."""
    await run_service(
        settings, metrics, lambda lifecycle: Worker(settings, invoker, metrics, lifecycle).serve()
    )
