"""The worker process: serve -> startup -> consume until stopped or disconnected -> shutdown."""

import asyncio
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection

from app.connection import CONNECTION_ERRORS, close_quietly, connect, frame_max
from app.consumer import Consumer
from app.handler import Invoker
from app.http import serve_http
from app.metrics import Metrics
from app.settings import Settings
from app.topology import declare

log = structlog.get_logger("ricochet.worker")
T = TypeVar("T")

# A broker that accepts connections but fails right after must not be hammered in a loop.
RECONNECT_PAUSE_S = 1.0


def connection_name(role: str, queue: str) -> str:
    """How the broker (and rabbitmqctl list_connections) shows this process."""
    return f"ricochet {role} {queue} {socket.gethostname()}:{os.getpid()}"


class Lifecycle:
    """Stop requests from signals: the first asks for a drain, the second forces the exit."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self.ready = False

    def request_stop(self, signame: str = "stop") -> None:
        if self.stopping.is_set():
            log.warning("second signal: exiting without waiting for jobs", signal=signame)
            self.forced.set()
        else:
            log.info("stopping: no new jobs, finishing the ones in flight", signal=signame)
            self.stopping.set()

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)

    def restore_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    async def serve_until_lost(
        self, connection: AbstractConnection, channel: AbstractChannel
    ) -> bool:
        """Report ready until a stop is requested (True) or the connection or channel dies."""
        lost = asyncio.Event()

        def on_close(*_: Any) -> None:
            lost.set()

        connection.close_callbacks.add(on_close)
        channel.close_callbacks.add(on_close)
        self.ready = True
        stop = asyncio.ensure_future(self.stopping.wait())
        gone = asyncio.ensure_future(lost.wait())
        await asyncio.wait({stop, gone}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        gone.cancel()
        self.ready = False
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


async def run_sessions(
    lifecycle: Lifecycle,
    settings: Settings,
    name: str,
    session: Callable[[AbstractConnection], Awaitable[None]],
) -> None:
    """Connect and run session(connection) until a stop is requested, starting over on a new
    connection whenever the broker drops one (at start it is awaited for connect_timeout_s)."""
    url = settings.amqp_url
    connection = await lifecycle.unless_stopped(connect(url, name, settings.connect_timeout_s))
    try:
        while connection is not None:
            try:
                await session(connection)
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

    async def serve(self) -> None:
        """Run until a stop is requested; raises BrokerUnavailable or ConfigError at start."""
        name = connection_name("worker", self._settings.queue)
        try:
            await run_sessions(self._lifecycle, self._settings, name, self._consume)
        finally:
            self._invoker.close()
        log.info("stopped")

    async def _consume(self, connection: AbstractConnection) -> None:
        """Declare, then consume until a stop is requested (drained here) or the connection dies."""
        plan = await declare(connection, self._settings)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.set_qos(prefetch_count=self._settings.prefetch)
        if self._consumer is None:
            self._consumer = Consumer(
                plan, self._settings.max_retries, self._invoker, self._metrics
            )
        await self._consumer.start(channel, frame_max(connection))
        log.info("consuming", queue=plan.names.queue, prefetch=self._settings.prefetch)
        if await self._lifecycle.serve_until_lost(connection, channel):
            await self._consumer.stop()
            await self._drain()  # while the connection is up, so finished jobs are acked
            await self._consumer.drain_acks()

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
    """Run a worker with signal handling and its HTTP endpoints until SIGTERM/SIGINT."""
    lifecycle = Lifecycle()
    lifecycle.install_signals()
    try:
        # HTTP first: /healthz answers (and /readyz says 503) while the broker is awaited.
        async with serve_http(settings.http_port, metrics.registry, lambda: lifecycle.ready):
            await Worker(settings, invoker, metrics, lifecycle).serve()
    finally:
        lifecycle.restore_signals()
