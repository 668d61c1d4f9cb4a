"""The parent of a worker's processes (RICOCHET_PROCESSES > 1), top-down: run_processes ->
start every process -> restart one that dies (with backoff on a crash loop), and kill one that
stops beating (wedged), until a stop -> pass the stop on and wait for every process to drain.

The parent consumes nothing: it serves the HTTP endpoints for all its processes (/metrics sums
them, /readyz is ready when every one consumes and beats, /healthz fails in a crash loop).
"""

import asyncio
import multiprocessing
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from prometheus_client.multiprocess import mark_process_dead

from ricochet.log import get_logger
from ricochet.observe.metrics import processes_registry
from ricochet.processes import child
from ricochet.processes.liveness import BEAT_S, Liveness, liveness
from ricochet.processes.restarts import Restarts
from ricochet.service.http import serve_http
from ricochet.service.process import Lifecycle, stop_signals
from ricochet.settings import Settings

log = get_logger("ricochet.processes")

# Each process a fresh interpreter: nothing of the parent's (its event loop, its threads, its
# open sockets) is copied into it, as a fork would.
CONTEXT = multiprocessing.get_context("spawn")
# Beyond the drain a process is given, how long the parent waits before it kills it.
DRAIN_GRACE_S = 10.0
# After a second signal, how long a process may take to close before the parent kills it.
FORCED_EXIT_S = 5.0


@dataclass
class Place:
    """One of the N places: the process running there now, if any, and its deaths."""

    index: int
    restarts: Restarts = field(default_factory=Restarts)
    process: BaseProcess | None = None
    orders: Connection | None = None
    started_at: float = 0.0
    # What the process last reported: why it does not consume; nothing while it does.
    unready: list[str] = field(default_factory=lambda: ["starting"])
    beat_at: float | None = None  # when its last beat came; None before its first
    longest_timeout_s: float = 0.0  # what its last beat said of its handlers

    def alive_for_s(self, now: float) -> float | None:
        return now - self.started_at if self.process is not None else None

    def liveness(self, now: float) -> Liveness:
        return liveness(self.beat_at, now, self.longest_timeout_s)

    def silence(self, now: float) -> list[str]:
        """Why the process counts as not ready for its beats: nothing while they come."""
        if self.beat_at is None or self.liveness(now) is Liveness.ALIVE:
            return []
        return [f"no beat for {now - self.beat_at:.0f} s"]


class Parent:
    """Keeps N worker processes running until a stop, and says how they are."""

    def __init__(self, settings: Settings, count: int, folder: str, lifecycle: Lifecycle) -> None:
        # The processes serve no HTTP: the parent does, for all of them.
        self._settings = settings.model_copy(update={"http_port": 0})
        self._folder = folder
        self._lifecycle = lifecycle
        self._places = [Place(i) for i in range(count)]
        self._exited = asyncio.Event()
        self.exit_code = 0
        self.registry, self._restarted = processes_registry(
            settings.queue_names, folder, lambda: self.ready, lambda: self.alive
        )

    @property
    def alive(self) -> int:
        return sum(place.process is not None for place in self._places)

    @property
    def ready(self) -> bool:
        """Every process runs, consumes and beats."""
        return not self._lifecycle.stopping.is_set() and not self.unready

    @property
    def unready(self) -> list[str]:
        """Why not every process consumes and beats, each reason named after its process."""
        now = time.monotonic()
        return [
            f"process {p.index}: {why}"
            for p in self._places
            for why in [*p.unready, *p.silence(now)]
        ]

    @property
    def healthy(self) -> bool:
        """No place is in a crash loop."""
        now = time.monotonic()
        return not any(p.restarts.crash_loop(p.alive_for_s(now)) for p in self._places)

    async def run(self) -> int:
        """Run the processes until a stop, then drain them; the exit code."""
        log.info("starting worker processes", processes=len(self._places))
        for place in self._places:
            self._start(place)
        watching = asyncio.ensure_future(self._watch())
        await self._lifecycle.stopping.wait()
        watching.cancel()
        self._order(child.DRAIN)
        if not self.alive:  # every place was waiting to start again
            self._exited.set()
        drain_s = self._settings.shutdown_timeout_s + DRAIN_GRACE_S
        forced = asyncio.ensure_future(self._lifecycle.forced.wait())
        exited = asyncio.ensure_future(self._exited.wait())
        await asyncio.wait({forced, exited}, timeout=drain_s, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if not self._exited.is_set():
            self._order(child.FORCE)
            await asyncio.wait({exited}, timeout=FORCED_EXIT_S)
        exited.cancel()
        self._kill_the_rest()
        log.info("stopped")
        return self.exit_code

    def _start(self, place: Place) -> None:
        if self._lifecycle.stopping.is_set():
            return
        ours, theirs = CONTEXT.Pipe()
        process = CONTEXT.Process(
            target=child.main,
            args=(self._settings, theirs),
            name=f"ricochet-worker-{place.index}",
        )
        process.start()
        theirs.close()  # the process's end is its own: its closing is how it sees the parent go
        place.process, place.orders, place.unready = process, ours, ["starting"]
        place.started_at, place.beat_at = time.monotonic(), None
        loop = asyncio.get_running_loop()
        loop.add_reader(ours.fileno(), self._read_report, place)
        loop.add_reader(process.sentinel, self._ended, place)
        log.info("worker process started", process=place.index, child_pid=process.pid)

    def _read_report(self, place: Place) -> None:
        assert place.orders is not None
        try:
            beat: child.Beat = place.orders.recv()
        except EOFError:  # the process ended: _ended says how
            asyncio.get_running_loop().remove_reader(place.orders.fileno())
            place.unready = ["ended"]
            return
        place.unready, place.longest_timeout_s = beat
        place.beat_at = time.monotonic()

    async def _watch(self) -> None:
        """Kill each process that stopped beating: its place starts another, as after any
        death, and its jobs go back to their queue."""
        while True:
            await asyncio.sleep(BEAT_S)
            now = time.monotonic()
            for place in self._places:
                if place.process is not None and place.liveness(now) is Liveness.WEDGED:
                    assert place.beat_at is not None
                    log.error(
                        "worker process stopped making progress: killing it",
                        process=place.index,
                        child_pid=place.process.pid,
                        silent_s=round(now - place.beat_at, 3),
                        longest_timeout_s=place.longest_timeout_s,
                    )
                    place.process.kill()
                    place.unready, place.beat_at = ["killed"], None  # until _ended hears of it

    def _ended(self, place: Place) -> None:
        process, orders = place.process, place.orders
        assert process is not None
        assert orders is not None
        loop = asyncio.get_running_loop()
        loop.remove_reader(process.sentinel)
        loop.remove_reader(orders.fileno())
        orders.close()
        process.join()
        code = process.exitcode
        assert code is not None
        assert process.pid is not None
        # Its live gauges go; its counts stay.
        mark_process_dead(process.pid, self._folder)  # type: ignore[no-untyped-call]
        lived_s = time.monotonic() - place.started_at
        place.process, place.orders, place.unready = None, None, ["ended"]
        if self._lifecycle.stopping.is_set():
            log.info("worker process exited", process=place.index, child_pid=process.pid)
            if not self.alive:
                self._exited.set()
            return
        if code == child.EXIT_CONFIG:
            log.error(
                "worker process stopped on invalid configuration: stopping",
                process=place.index,
                child_pid=process.pid,
            )
            self.exit_code = child.EXIT_CONFIG
            self._lifecycle.drain("invalid configuration")
            return
        place.restarts = place.restarts.died(lived_s)
        wait_s = place.restarts.wait_s
        log.warning(
            "worker process died, starting another",
            process=place.index,
            child_pid=process.pid,
            exit_code=code,
            signal=_signal_name(code),
            lived_s=round(lived_s, 3),
            restart_in_s=wait_s,
            crash_loop=place.restarts.crash_loop(None),
        )
        self._restarted.inc()
        loop.call_later(wait_s, self._start, place)

    def _order(self, order: str) -> None:
        for place in self._places:
            if place.orders is not None:
                try:
                    place.orders.send(order)
                except OSError:  # it is ending: _ended hears of it
                    continue

    def _kill_the_rest(self) -> None:
        for place in self._places:
            if place.process is not None and place.process.is_alive():
                log.warning("worker process did not stop in time: killing it", process=place.index)
                place.process.kill()
                place.process.join()


def _signal_name(exit_code: int) -> str | None:
    """The signal that ended a process (multiprocessing's exit code -N), if one did."""
    try:
        return signal.Signals(-exit_code).name if exit_code < 0 else None
    except ValueError:
        return str(-exit_code)


def run_processes(settings: Settings, count: int) -> int:
    """Run `ricochet worker` as a parent of count worker processes until SIGTERM/SIGINT; the
    exit code."""
    return asyncio.run(_serve(settings, count))


async def _serve(settings: Settings, count: int) -> int:
    with tempfile.TemporaryDirectory(prefix="ricochet-metrics-") as folder:
        # The processes inherit it, and so write their metrics there from their start; the
        # parent's own prometheus_client was imported without it, so its metrics stay its own.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        with stop_signals() as lifecycle:
            parent = Parent(settings, count, folder, lifecycle)
            async with serve_http(
                settings.http_host,
                settings.http_port,
                parent.registry,
                lambda: parent.ready,
                healthy=lambda: parent.healthy,
                unready=lambda: parent.unready,
            ):
                return await parent.run()
