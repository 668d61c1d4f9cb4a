"""One of the parent's worker processes: today's worker (run_worker), stopped by the parent's
orders instead of its own signals, telling the parent whether it consumes (and why not)."""

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection

import structlog

from ricochet.errors import ConfigError
from ricochet.handlers.invoker import Invoker, load_handler
from ricochet.log import configure_logging
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.worker import run_worker

log = structlog.get_logger("ricochet.processes")

# The exit code of invalid configuration (as `ricochet worker`'s): the parent stops with it
# rather than start the process again, which would fail the same way.
EXIT_CONFIG = 2
# How often a process tells its parent why it does not consume (only when that changed) and writes
# its state gauges for the parent's scrapes.
REPORT_S = 0.1
# The parent's orders.
DRAIN = "drain"
FORCE = "force"


def main(settings: Settings, orders: Connection) -> None:
    """A worker process's whole life (the target the parent starts); settings as the parent's,
    without the HTTP port, which the parent serves for all its processes."""
    # A terminal's Ctrl-C reaches the whole process group: the parent counts it, once, and
    # passes it on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(settings.log_level, settings.log_format, sys.stdout)
    metrics = Metrics(*settings.queue_names, shared=True)
    try:
        invoker = Invoker(load_handler(settings.handler), settings.handler_timeout_s)
        asyncio.run(run_worker(settings, invoker, metrics, lambda: parent_orders(orders, metrics)))
    except ConfigError as error:
        log.error("worker process stopped: invalid configuration", error=str(error))
        sys.exit(EXIT_CONFIG)


@contextlib.contextmanager
def parent_orders(orders: Connection, metrics: Metrics) -> Iterator[Lifecycle]:
    """A Lifecycle that the parent's orders stop (drain, then force), and SIGTERM or the
    parent's death drain: a signal sent to the whole group and passed on by the parent counts
    once. Meanwhile the process reports whether it consumes."""
    lifecycle = Lifecycle()
    loop = asyncio.get_running_loop()

    def read() -> None:
        try:
            order = orders.recv()
        except EOFError:
            # The parent is gone (killed, say): no process may go on consuming without it.
            loop.remove_reader(orders.fileno())
            log.warning("the parent process is gone: stopping")
            lifecycle.drain("parent gone")
            return
        if order == FORCE:
            lifecycle.force("parent: second signal")
        else:
            lifecycle.drain("parent")

    loop.add_reader(orders.fileno(), read)
    loop.add_signal_handler(signal.SIGTERM, lifecycle.drain, "SIGTERM")
    reporting = loop.create_task(_report(orders, lifecycle, metrics))
    try:
        yield lifecycle
    finally:
        reporting.cancel()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_reader(orders.fileno())


async def _report(orders: Connection, lifecycle: Lifecycle, metrics: Metrics) -> None:
    unready: list[str] | None = None
    while True:
        metrics.refresh()
        now = lifecycle.unready()  # why it does not consume; nothing while it does
        if now != unready:
            unready = now
            with contextlib.suppress(OSError):  # the parent is gone: read() stops the process
                orders.send(unready)
        await asyncio.sleep(REPORT_S)
