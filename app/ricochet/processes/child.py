"""One of the parent's worker processes: today's worker (run_worker), stopped by the parent's
orders instead of its own signals, telling the parent in a beat from its event loop whether
it consumes (and why not)."""

import asyncio
import contextlib
import functools
import math
import signal
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import NamedTuple

from ricochet.errors import ConfigError
from ricochet.handlers.invoker import Invoker, load_handler
from ricochet.log import configure_logging, get_logger
from ricochet.observe.metrics import Metrics
from ricochet.processes.liveness import BEAT_S
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.worker import run_worker

log = get_logger("ricochet.processes")

# The exit code of invalid configuration (as `ricochet worker`'s): the parent stops with it
# rather than start the process again, which would fail the same way.
EXIT_CONFIG = 2
# How often a process writes its state gauges for the parent's scrapes, and tells its parent
# why it does not consume if that changed (else in its beat, every BEAT_S).
REPORT_S = 0.1
# The parent's orders.
DRAIN = "drain"
FORCE = "force"


class Beat(NamedTuple):
    """What a process tells its parent from its event loop: why it does not consume (nothing
    while it does), and the longest its handlers may keep that loop from running (the parent's
    measure of a wedged process)."""

    unready: list[str]
    longest_timeout_s: float


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
        stops = functools.partial(parent_orders, orders, metrics, invoker.longest_timeout_s)
        asyncio.run(run_worker(settings, invoker, metrics, stops))
    except ConfigError as error:
        log.error("worker process stopped: invalid configuration", error=str(error))
        sys.exit(EXIT_CONFIG)


@contextlib.contextmanager
def parent_orders(
    orders: Connection, metrics: Metrics, longest_timeout_s: float
) -> Iterator[Lifecycle]:
    """A Lifecycle that the parent's orders stop (drain, then force), and SIGTERM or the
    parent's death drain: a signal sent to the whole group and passed on by the parent counts
    once. Meanwhile the process beats."""
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
    reporting = loop.create_task(_report(orders, lifecycle, metrics, longest_timeout_s))
    try:
        yield lifecycle
    finally:
        reporting.cancel()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_reader(orders.fileno())


async def _report(
    orders: Connection, lifecycle: Lifecycle, metrics: Metrics, longest_timeout_s: float
) -> None:
    unready: list[str] | None = None
    beat_at = -math.inf
    while True:
        metrics.refresh()
        now = time.monotonic()
        reasons = lifecycle.unready()  # why it does not consume; nothing while it does
        if reasons != unready or now - beat_at >= BEAT_S:
            unready, beat_at = reasons, now
            with contextlib.suppress(OSError):  # the parent is gone: read() stops the process
                orders.send(Beat(unready, longest_timeout_s))
        await asyncio.sleep(REPORT_S)
