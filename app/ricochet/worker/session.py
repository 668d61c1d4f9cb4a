"""One channel's session, top-down: recover and consume, pause or subscribe again when asked,
drain at a stop. Its state is the worker's: /readyz, the ricochet_worker_* gauges and the pause
read it."""

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractChannel, AbstractConnection

from ricochet.broker.connection import is_lost
from ricochet.broker.plan import Plan
from ricochet.log import get_logger
from ricochet.observe.alerts import PAUSED, RESUMED
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.consumer import Consumer
from ricochet.worker.pause import PauseWatch
from ricochet.worker.subscription import Subscription

log = get_logger("ricochet.worker")


class State(enum.Enum):
    """What the worker is doing."""

    CONNECTING = "connecting"  # no channel yet, or it was lost
    RECOVERING = "recovering"  # running the jobs that came back redelivered, before subscribing
    CONSUMING = "consuming"
    PAUSED = "paused"  # most jobs failed transiently: taking none for a while
    RESUBSCRIBING = "resubscribing"  # the broker cancelled the consumer: declaring again
    # The queue was declared (by someone else) with other arguments: declaring it again, with
    # backoff, until it is deleted.
    CONFLICT = "conflict"
    DRAINING = "draining"  # a stop was requested: letting the jobs in flight finish


class Session:
    """A channel with publisher confirms, its subscription, and what the worker does on it."""

    def __init__(
        self,
        settings: Settings,
        lifecycle: Lifecycle,
        connection: AbstractConnection,
        channel: AbstractChannel,
        subscription: Subscription,
        consumer: Consumer,
        watch: PauseWatch,
        alert: Callable[[str, float], Awaitable[None]],
        cancels_lost: asyncio.Event,
        declare_again: Callable[[], Awaitable[Plan | None]],
    ) -> None:
        self._settings = settings
        self._lifecycle = lifecycle
        self._connection = connection
        self._channel = channel
        self._subscription = subscription
        self._consumer = consumer
        self._watch = watch
        self._alert = alert
        self._cancels_lost = cancels_lost
        self._declare_again = declare_again
        self._state = State.RECOVERING
        self._opening: asyncio.Task[None] | None = None

    @property
    def state(self) -> State:
        """The session's state, as of now: a channel closed, or a consumer the broker cancelled,
        show at once, before the session has woken up to them."""
        if self._channel.is_closed:
            return State.CONNECTING
        if self._state is State.CONSUMING and not self._subscription.consuming:
            return State.RESUBSCRIBING
        return self._state

    async def run(self) -> None:
        """Consume until a stop is requested (then drain), or until the channel, the connection
        or the cancels are lost (then return at once: the worker connects again)."""
        try:
            self._open()
            log.info("consuming", queue=self._settings.queue, prefetch=self._settings.prefetch)
            while not await self._serve():
                if self._lost():
                    return
                if self._watch.due.is_set():
                    resumed = await self._pause()
                else:
                    resumed = await self._subscribe_again()
                if resumed is None:
                    break  # a stop was requested: drain as usual
                if not resumed or self._channel.is_closed:
                    return
                self._open()
                log.info("consuming again", queue=self._settings.queue)
            await self._drain()
        finally:
            self._stop_opening()

    def _open(self) -> None:
        self._state = State.RECOVERING
        self._subscription.interrupted.clear()  # now: the loop waits on it next
        self._opening = asyncio.get_running_loop().create_task(self._recover_then_consume())

    async def _recover_then_consume(self) -> None:
        consumer = self._consumer
        if await self._subscription.open(consumer.intake, consumer.spawn):
            self._state = State.CONSUMING

    def _stop_opening(self) -> None:
        if self._opening is not None:
            self._opening.cancel()

    async def _serve(self) -> bool:
        """Report connected until a stop is requested (True), or the session is interrupted or
        lost (False)."""
        return await self._lifecycle.serve_until_lost(
            self._connection,
            self._channel,
            self._subscription.interrupted,
            self._watch.due,
            self._cancels_lost,
        )

    def _lost(self) -> bool:
        # The cancels too: a due job must not run unchecked.
        return self._channel.is_closed or is_lost(self._connection) or self._cancels_lost.is_set()

    async def _pause(self) -> bool | None:
        """Take no job for pause_s (jobs running carry on): True then, or None if a stop was
        requested meanwhile, as unless_stopped answers."""
        self._state = State.PAUSED
        self._stop_opening()
        await self._subscription.hold()
        pause_s, ratio = self._watch.policy.pause_s, round(self._watch.ratio, 3)
        log.warning(
            "worker paused: most jobs fail transiently",
            queue=self._settings.queue,
            failure_ratio=ratio,
            pause_s=pause_s,
        )
        await self._alert(PAUSED, ratio)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._lifecycle.stopping.wait(), pause_s)
        self._watch.ended()
        if self._lifecycle.stopping.is_set():
            return None
        log.info("worker resumed", queue=self._settings.queue, pause_s=pause_s)
        await self._alert(RESUMED, ratio)
        return True

    async def _subscribe_again(self) -> bool | None:
        """Declare the topology again (the queue may be gone, or in conflict), with backoff: True
        when done, False if the connection closed meanwhile, None if a stop was requested."""
        self._state = State.RESUBSCRIBING
        log.warning(
            "not consuming: declaring the topology again before subscribing again",
            queue=self._settings.queue,
        )
        if await self._declare_again() is not None:
            return True
        return None if self._lifecycle.stopping.is_set() else False

    async def _drain(self) -> None:
        """Take no more jobs; let those in flight finish within the shutdown timeout (or until a
        second signal), then send their acks while the connection is up."""
        self._state = State.DRAINING
        self._stop_opening()
        await self._subscription.stop()
        pending = self._consumer.in_flight
        if pending:
            timeout_s = self._settings.shutdown_timeout_s
            log.info("draining", jobs=len(pending), timeout_s=timeout_s)
            forced = asyncio.ensure_future(self._lifecycle.forced.wait())
            done = asyncio.ensure_future(asyncio.wait(set(pending)))
            await asyncio.wait(
                {forced, done}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            forced.cancel()
            done.cancel()
            if pending:
                log.warning("jobs unfinished at shutdown go back to the queue", jobs=len(pending))
                for task in list(pending):
                    task.cancel()
        await self._subscription.settler.drain()
