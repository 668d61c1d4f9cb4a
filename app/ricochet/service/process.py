"""A service process (worker or monitor): stop signals, HTTP endpoints, a connection kept up.

A service reads top-down: run_service -> serve (the service's own) -> keep_connected ->
connected(connection) until a stop is requested or the connection is lost.
"""

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

from aio_pika.abc import AbstractChannel, AbstractConnection
from aiohttp import web

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.connection import close_quietly, connect
from ricochet.log import get_logger
from ricochet.observe.metrics import Metrics
from ricochet.service.http import serve_http
from ricochet.settings import Settings

log = get_logger("ricochet.service")
T = TypeVar("T")

# A broker that accepts connections but fails right after must not be hammered in a loop.
RECONNECT_PAUSE_S = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Lifecycle:
    """Stop requests: the first asks for a drain, the second forces the exit."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        # Sessions serving now (a worker runs one per queue on its connection).
        self._serving = 0
        # What keeps the service from its work once connected, each named (the worker: the
        # queues it does not consume, and why); nothing while it works.
        self.not_working: Callable[[], list[str]] = list

    @property
    def ready(self) -> bool:
        """What /readyz says: connected and doing the service's work."""
        return not self.unready()

    def unready(self) -> list[str]:
        """Why /readyz says 503, each reason named; none while ready."""
        reasons = self.not_working()
        return reasons if reasons or self._serving > 0 else ["not connected"]

    def request_stop(self, signame: str = "stop") -> None:
        """A stop signal: the first drains, the second forces the exit."""
        if self.stopping.is_set():
            self.force(signame)
        else:
            self.drain(signame)

    def drain(self, reason: str) -> None:
        """Stop taking work and finish what is in flight (a second call changes nothing)."""
        if not self.stopping.is_set():
            log.info("stopping: no new jobs, finishing the ones in flight", signal=reason)
            self.stopping.set()

    def force(self, reason: str) -> None:
        """Exit without waiting for the work in flight."""
        log.warning("second signal: exiting without waiting for jobs", signal=reason)
        self.stopping.set()
        self.forced.set()

    async def serve_until_lost(
        self,
        connection: AbstractConnection,
        channel: AbstractChannel,
        *interruptions: asyncio.Event,
    ) -> bool:
        """Report connected until a stop is requested (True), or the connection or channel dies
        or one of the interruptions is set (False)."""
        lost = asyncio.Event()

        def on_close(*_: Any) -> None:
            lost.set()

        connection.close_callbacks.add(on_close)
        channel.close_callbacks.add(on_close)
        self._serving += 1
        waits = {asyncio.ensure_future(self.stopping.wait()), asyncio.ensure_future(lost.wait())}
        waits.update(asyncio.ensure_future(event.wait()) for event in interruptions)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        self._serving -= 1
        return self.stopping.is_set() and not lost.is_set()

    async def unless_stopped(self, work: Awaitable[T]) -> T | None:
        """Await work, or give up on it (None) as soon as a stop is requested."""
        return await _unless(self.stopping, work)

    async def unless_forced(self, work: Awaitable[T]) -> T | None:
        """Await work, or give up on it (None) as soon as a second signal forces the exit."""
        return await _unless(self.forced, work)


async def _unless(event: asyncio.Event, work: Awaitable[T]) -> T | None:
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(event.wait())
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


# What stops a service: its own signals (stop_signals), or a parent's orders (a worker process).
Stops = Callable[[], contextlib.AbstractContextManager[Lifecycle]]


@contextlib.contextmanager
def stop_signals() -> Iterator[Lifecycle]:
    """A Lifecycle that SIGTERM and SIGINT ask to stop while the block runs."""
    lifecycle = Lifecycle()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, lifecycle.request_stop, sig.name)
    try:
        yield lifecycle
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def keep_connected(
    lifecycle: Lifecycle,
    settings: Settings,
    name: str,
    connected: Callable[[AbstractConnection], Awaitable[None]],
) -> None:
    """Connect and run connected(connection) until a stop is requested, starting over on a new
    connection whenever the broker drops one (at start it is awaited for connect_timeout_s)."""
    url = settings.amqp_url
    connection = await lifecycle.unless_stopped(connect(url, name, settings.connect_timeout_s))
    try:
        while connection is not None:
            try:
                # A second signal ends it wherever it waits: a declare the broker never answers,
                # say, which no first signal interrupts.
                await lifecycle.unless_forced(connected(connection))
            except CONNECTION_ERRORS as error:
                # The broker went away mid-declaration: the same as losing it later.
                log.warning("connection failed while starting", error=str(error))
            if lifecycle.stopping.is_set():
                break
            log.warning("connection lost, reconnecting")
            await close_quietly(connection)
            await lifecycle.unless_stopped(asyncio.sleep(RECONNECT_PAUSE_S))
            connection = await lifecycle.unless_stopped(connect(url, name, None))
    finally:
        if connection is not None:
            await close_quietly(connection)


async def run_service(
    settings: Settings,
    metrics: Metrics,
    serve: Callable[[Lifecycle], Awaitable[None]],
    pages: Iterable[web.AbstractRouteDef] = (),
    stops: Stops = stop_signals,
) -> None:
    """Run serve(lifecycle) with its HTTP endpoints (and pages) until SIGTERM/SIGINT (or what
    stops says)."""
    with stops() as lifecycle:
        metrics.ready_when(lambda: lifecycle.ready)
        # HTTP first: /healthz answers (and /readyz says 503) while the broker is awaited.
        async with serve_http(
            settings.http_host,
            settings.http_port,
            metrics.registry,
            lambda: lifecycle.ready,
            pages,
            unready=lifecycle.unready,
        ):
            await serve(lifecycle)
