"""One queue of the worker: its consumer, its pause window, its metrics, and a session on a
channel of its own, opened again whenever that channel alone is lost.

A worker serves every queue of RICOCHET_QUEUES on one connection; what one queue does (full,
paused, failing, deleted, in conflict) never holds another back.
"""

import asyncio
import contextlib

from aio_pika.abc import AbstractConnection

from ricochet.broker.amqp import CONNECTION_ERRORS, Frames, frame_max
from ricochet.broker.cancels import CancelReader
from ricochet.broker.connection import is_lost
from ricochet.broker.journal import Journal
from ricochet.broker.plan import Plan
from ricochet.broker.publish import confirming_channel
from ricochet.broker.register import amqp_user
from ricochet.delivery.events import Observer
from ricochet.errors import TopologyConflict
from ricochet.handlers.invoker import Invoker
from ricochet.log import get_logger
from ricochet.names import Names
from ricochet.observe.alerts import pause_alert
from ricochet.observe.joblog import JobLog
from ricochet.observe.journal import JournalWatch
from ricochet.observe.metrics import Metrics, QueueMetrics
from ricochet.observe.webhook import Webhook
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.applied import AppliedPlan
from ricochet.worker.consumer import Consumer
from ricochet.worker.lanes import KeyLanes
from ricochet.worker.pause import PausePolicy, PauseWatch
from ricochet.worker.rate_limits import RateLimits
from ricochet.worker.redeclare import Redeclare
from ricochet.worker.session import Session, State
from ricochet.worker.settler import Settler
from ricochet.worker.subscription import Subscription

log = get_logger("ricochet.worker")

# A queue whose channel keeps closing opens the next one after this long, while the worker's
# other queues go on (a queue in conflict is declared again with the backoff of redeclare.py).
REOPEN_PAUSE_S = 1.0


class QueueWorker:
    """Consumes one queue of the worker; the jobs of a lost session run on in its consumer."""

    def __init__(
        self,
        settings: Settings,
        invoker: Invoker,
        metrics: Metrics,
        lifecycle: Lifecycle,
        cancels: CancelReader,
        webhook: Webhook,
        journal: Journal,
    ) -> None:
        self.settings = settings  # the worker's, with this queue and its prefetch
        self._invoker = invoker
        self._metrics = QueueMetrics(metrics, settings.queue)
        self._lifecycle = lifecycle
        self._cancels = cancels
        self._webhook = webhook
        self._consumer: Consumer | None = None
        self._observers: list[Observer] = []
        self._session: Session | None = None
        self._applied = AppliedPlan(settings)
        self._journal = JournalWatch(
            journal, settings.queue, lambda: self._applied.plan, settings.result_max_bytes
        )
        self._redeclare = Redeclare(settings, lifecycle, self._applied.declare)
        self._lanes = KeyLanes(
            settings,
            lifecycle,
            self.consumer,
            lambda: self.observers,
            lambda: self.state is State.PAUSED,
        )
        self._rates = RateLimits(
            settings.queue,
            invoker.rate_limits(settings.rate_limits),
            metrics,
            amqp_user(settings.amqp_url),
        )
        metrics.key_lanes_busy_when(settings.queue, lambda: self._lanes.busy)
        self._watch = PauseWatch(
            PausePolicy(
                settings.pause_failure_ratio,
                settings.pause_min_jobs,
                settings.pause_window_s,
                settings.pause_s,
            )
        )
        metrics.worker_when(
            settings.queue,
            lambda: self.state is State.CONSUMING,
            lambda: self.state is State.PAUSED,
            lambda: self.state is State.RECOVERING,
        )

    @property
    def state(self) -> State:
        """What the queue worker does now: in conflict while its last declaration found the queue
        so, else its session's state, else connecting."""
        if self.conflict is not None:
            return State.CONFLICT
        return State.CONNECTING if self._session is None else self._session.state

    @property
    def conflict(self) -> TopologyConflict | None:
        """What keeps the queue's topology from being declared, while it does."""
        return self._applied.conflict

    @property
    def unready(self) -> str | None:
        """Why the queue is not consumed now, as /readyz names it; None while it is."""
        state = self.state
        if state is State.CONSUMING:
            return None
        why = f" ({self.conflict})" if self.conflict is not None else ""
        return f"{self.settings.queue}: {state.value}{why}"

    @property
    def observers(self) -> list[Observer]:
        """What the queue worker tells of every handler call and settled delivery (once it has a
        consumer): metrics, the job's log lines, the pause window, the journal."""
        return self._observers

    @property
    def in_flight(self) -> set[asyncio.Task[None]]:
        """The queue worker's jobs running now, on any of its channels."""
        return set() if self._consumer is None else self._consumer.in_flight

    def consumer(self) -> Consumer:
        """The queue worker's consumer, made once and kept from one session to the next (and for
        its key lanes): a lost session's jobs run on in it."""
        if self._consumer is None:
            self._observers = [
                self._metrics,
                JobLog(lambda: self._applied.plan),
                self._watch,
                self._journal,
            ]
            self._consumer = Consumer(
                Names(self.settings.queue),
                self.settings.max_retries,
                self.settings.retry_jitter,
                self._invoker,
                self._metrics,
                self._cancels,
                self._observers,
                self._journal,
                self._lanes.ensure,
                self._rates,
            )
        return self._consumer

    async def declare(self, connection: AbstractConnection) -> Plan | None:
        """Declare the queue's topology (and what every queue shares), and record it; None when
        the queue is in conflict (conflict says how)."""
        try:
            return await self._applied.declare(connection)
        except TopologyConflict:
            return None

    async def run(self, connection: AbstractConnection, declared: Plan | None) -> None:
        """Sessions on new channels of the connection until a stop was requested and drained,
        or the connection or the cancels are lost; the first on the topology just declared (or
        once a queue in conflict at start is declared), each next one after declaring it
        again. Meanwhile a tier kept at an older delay is declared again once empty."""
        loop = asyncio.get_running_loop()
        kept = loop.create_task(self._applied.declare_kept_once_empty(connection))
        self.consumer()  # before a lane's first job
        lanes = loop.create_task(self._lanes.run(connection))
        limits = loop.create_task(self._rates.run(connection))
        try:
            await self._sessions(connection, declared)
            if self._lifecycle.stopping.is_set() and not is_lost(connection):
                await asyncio.wait({lanes})  # their acks sent, as the sessions' were
        finally:
            for task in (kept, lanes, limits):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _sessions(self, connection: AbstractConnection, declared: Plan | None) -> None:
        plan = declared
        while True:
            if plan is None:
                plan = await self._redeclare.again(connection)
                if plan is None:  # a stop, or the connection closed
                    return
            try:
                await self._run_session(connection, plan)
            except CONNECTION_ERRORS as error:
                if is_lost(connection):
                    raise
                log.warning(
                    "queue not consumed: its channel failed, opening another",
                    queue=self.settings.queue,
                    error=str(error),
                )
            plan = None
            if (
                self._lifecycle.stopping.is_set()
                or is_lost(connection)
                or self._cancels.lost.is_set()
            ):
                return
            await self._lifecycle.unless_stopped(asyncio.sleep(REOPEN_PAUSE_S))

    async def _run_session(self, connection: AbstractConnection, plan: Plan) -> None:
        """Run a session on a new channel of the declared topology until it ends (a stop, or
        lost)."""
        settings = self.settings
        channel = await confirming_channel(connection)
        await channel.set_qos(prefetch_count=settings.prefetch)
        consumer = self.consumer()
        frames = await Frames.under(channel)
        settler = Settler(
            channel,
            frames,
            plan.names,
            frame_max(connection),
            self.observers,
        )
        subscription = Subscription(
            frames, settler, settings.queue, settings.prefetch, consumer.in_flight
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
            lambda: self._redeclare.again(connection),
        )
        try:
            await self._session.run()
        finally:
            self._session = None

    async def _alert(self, event: str, ratio: float) -> None:
        queue, pause_s = self.settings.queue, self._watch.policy.pause_s
        await self._webhook.send(pause_alert(event, queue, ratio, pause_s))
