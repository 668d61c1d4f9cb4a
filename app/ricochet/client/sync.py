"""SyncClient: the Client for sync code (Django, Flask, scripts), shared by threads, safe to fork.

The async Client runs on a private event loop, which the calling threads drive themselves:
a call that finds nobody driving the loop runs it in its own thread until its call is done
(no hand-off to another thread, no wake-up); a call made while another thread drives queues
for the running loop and waits. Threads share one connection, and their publishes pipeline on
its channel. A keeper thread drives the loop when followers' calls outlive their driver's, for
a caller that cannot drive (it runs an event loop of its own), and briefly while the client is
idle, so that the connection is looked after. A forked child (gunicorn, uWSGI) never touches
the parent's loop or socket: it finds its pid changed and makes a loop and a connection of its
own.
"""

import asyncio
import atexit
import contextvars
import datetime as dt
import enum
import functools
import os
import threading
import weakref
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from ricochet.client.client import CONFIRM_TIMEOUT_S, CONNECT_TIMEOUT_S, Client
from ricochet.client.message import Delay
from ricochet.settings import load_client_settings

T = TypeVar("T")

# How long closing waits: the enqueues in flight are bounded by their own confirm timeout, and
# the broker's answer to the close comes at once or never.
CLOSE_TIMEOUT_S = CONFIRM_TIMEOUT_S + 10
# While nobody calls, nobody runs the loop, and what the connection does on its own waits with
# it: aiormq's heartbeat task (it queues a heartbeat frame every heartbeat/2 s, 30 s at the
# default heartbeat of 60, and cancels the reader once no frame came in for 3 x (heartbeat + 1)
# s), and its reader, which reads the broker's frames and, at a Connection.Close or the end of
# the socket, closes the connection. So the keeper drives the loop for TICK_DRIVE_S after every
# TICK_S in which no call came and nobody drove it. That guarantees: the loop runs at least
# once in every 2 x TICK_S, by a call or by a tick, so a heartbeat goes out at most that late
# (RabbitMQ drops a client it has heard nothing from for about two heartbeat timeouts), the
# broker's heartbeats are read long before aiormq would call the connection stuck, and a
# connection the broker closed while the client was idle is found closed by the next enqueue,
# which connects again instead of publishing on it and being cut off (NotConfirmed). What it
# does not: a close that comes after the loop last ran before an enqueue is read by that
# enqueue, after its publish, as a close that races a publish is; a loop thread of its own
# read it at once, this widens that window to at most 2 x TICK_S.
TICK_S = 1.0
TICK_DRIVE_S = 0.01

# Every open SyncClient: closed at exit, and given fresh locks in a forked child.
_OPEN: "weakref.WeakSet[SyncClient]" = weakref.WeakSet()
# What a forked child inherited of its parent's clients (their loop, baton and socket) is kept
# here, never used and never finalized: closing it would act on the parent's connection.
_INHERITED: list["_PrivateLoop"] = []


class _Call:
    """A coroutine to run on the loop, in a copy of its caller's context (a current span is
    the publish's parent), and, when another thread drives the loop, the caller's wait for its
    outcome: a lock the caller holds until the loop releases it, the cheapest wake-up one
    thread can give another. Made before the baton's lock is taken: the less the lock holds,
    the less many threads queue for it."""

    __slots__ = ("_done", "context", "coroutine", "error", "outcome", "task")

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.coroutine = coroutine
        self.context = contextvars.copy_context()
        self.task: asyncio.Task[Any] | None = None  # held here: the loop holds its tasks weakly
        self.outcome: Any = None
        self.error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def settle(self, task: "asyncio.Task[Any]") -> None:
        """In the loop, when the coroutine is done."""
        if task.cancelled():
            self.error = asyncio.CancelledError()
        else:
            self.error = task.exception()
            self.outcome = None if self.error else task.result()
        self.task = None  # the error raised in the caller holds this call: no cycle through it
        self._done.release()

    def wait(self) -> Any:
        self._done.acquire()
        error, self.error = self.error, None
        if error is None:
            return self.outcome
        try:
            raise error
        finally:
            del error  # the traceback holds this frame: no cycle through it


class _Driver(enum.Enum):
    """Who runs the loop now."""

    NOBODY = "nobody"  # the loop is not running: the next caller that can drives it
    CALLER = "caller"  # a calling thread runs it until its own call is done
    KEEPER = "keeper"  # the keeper thread runs it: for followers' calls, or a tick
    CLOSED = "closed"  # the client is closed: nobody runs it again


class _Role(enum.Enum):
    """What a call's caller does, as the baton decides."""

    DRIVE = "drive"  # run the loop in its own thread until the call is done
    FOLLOW = "follow"  # wait: the call is queued, and the loop is woken for the queue already
    WAKE = "wake"  # wake the loop for the queue (the first call queued since it took it), wait


class _Turn(enum.Enum):
    """What the keeper is woken for."""

    DRIVE = "drive"  # calls are queued or in flight, and nobody else drives
    TICK = "tick"  # the client was idle for a tick
    STOP = "stop"  # the client is closed


class _Baton:
    """Who drives the loop, decided under one lock, so that no call is stranded with nobody
    driving it.

    The invariant: while a follower's call is queued, or started and not settled, someone
    drives. A caller that finds nobody driving drives (unless it cannot: then the keeper does);
    one that finds a driver queues its call; a driver that stops (its own call done, or the
    keeper's calls) hands the loop to the keeper while any call is queued or in flight. Each is
    one step under the lock: a follower that queues just as the driver stops is either queued
    before the driver looks (the driver hands over) or finds nobody driving (and drives).

    It decides, and holds the queue; the loop is run by _PrivateLoop, which counts the calls in
    flight in it, where only the thread driving touches them: the loop takes no lock a call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keeper_wanted = threading.Condition(self._lock)
        self.driver = _Driver.NOBODY
        self._queued: list[_Call] = []  # followers' calls the loop has not started yet
        self._woken = False  # the loop is due to start the queued calls
        self._called = False  # a call came since the keeper last looked: no tick due
        self._closing = False

    def enter(self, call: _Call, can_drive: bool) -> _Role:
        """A call comes: its caller drives the loop, or it is queued for the driver."""
        with self._lock:
            if self.driver is _Driver.CLOSED:
                call.coroutine.close()
                raise RuntimeError("the client is closed")
            self._called = True
            if self.driver is _Driver.NOBODY and can_drive:
                self.driver = _Driver.CALLER
                return _Role.DRIVE
            self._queued.append(call)
            if self.driver is _Driver.NOBODY:
                self.driver = _Driver.KEEPER
                self._keeper_wanted.notify()
            wake, self._woken = not self._woken, True
            return _Role.WAKE if wake else _Role.FOLLOW

    def take_queued(self) -> list[_Call]:
        """In the loop: the calls to start."""
        with self._lock:
            calls, self._queued, self._woken = self._queued, [], False
        return calls

    def release(self, in_flight: int) -> bool:
        """The driver stops driving, with `in_flight` calls started in the loop and not settled:
        True when nobody needs to drive; False when calls are queued or in flight, and the
        keeper drives (on)."""
        with self._lock:
            if self._queued or in_flight:
                self.driver = _Driver.KEEPER
                self._keeper_wanted.notify()
                return False
            self.driver = _Driver.NOBODY
            if self._closing:
                self._keeper_wanted.notify()
            return True

    def keeper_turn(self, tick_s: float) -> _Turn:
        """In the keeper thread: wait until it must drive (handed the loop, or idle for a tick),
        or stop (the client closed and nobody drives)."""
        with self._lock:
            while True:
                if self.driver is _Driver.KEEPER:
                    return _Turn.DRIVE
                if self._closing and self.driver is _Driver.NOBODY:
                    self.driver = _Driver.CLOSED
                    return _Turn.STOP
                if not self._keeper_wanted.wait(tick_s):
                    if self.driver is _Driver.NOBODY and not self._called:
                        self.driver = _Driver.KEEPER
                        return _Turn.TICK
                    self._called = False

    def close(self) -> None:
        """No call comes after this one: the keeper stops once nobody drives."""
        with self._lock:
            self._closing = True
            self._keeper_wanted.notify()


class _PrivateLoop:
    """A private event loop with one Client on it, driven by the threads that call it (as
    _Baton decides), and a keeper thread for what they leave.

    A caller that drives pays no hand-off: the loop runs in its thread, and the publish waits
    for its confirm in its thread's poll. Followers' calls are queued, and the loop is woken
    once for all that queued while it was busy: with many threads enqueueing, one wake-up
    starts many publishes.
    """

    def __init__(self, client: Client) -> None:
        self.pid = os.getpid()
        self.client = client
        self.loop = asyncio.new_event_loop()
        self._baton = _Baton()
        self._in_flight = 0  # followers' tasks (and interrupted drivers') not settled yet
        self._keeper = threading.Thread(target=self._keep, name="ricochet-client", daemon=True)
        self._keeper.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The coroutine's outcome: driven here when nobody drives the loop (and this thread
        runs no loop of its own), else by the driver, waited for."""
        call = _Call(coroutine)
        role = self._baton.enter(call, asyncio._get_running_loop() is None)
        if role is _Role.DRIVE:
            outcome: T = self._drive(call)
            return outcome
        if role is _Role.WAKE:
            self.loop.call_soon_threadsafe(self._start_queued)
        outcome = call.wait()
        return outcome

    def _drive(self, call: _Call) -> Any:
        """Run the loop in this thread until the call is done (with whatever else it has to do
        meanwhile: followers' calls, the connection's frames)."""
        task: asyncio.Task[Any] | None = None
        try:
            task = self.loop.create_task(call.coroutine, context=call.context)
            task.add_done_callback(self._stop_for)
            self.loop.run_forever()
            return task.result()
        finally:
            self._stop_driving(task)
            del task  # the error's traceback holds this frame: no cycle through the task

    def _stop_for(self, task: "asyncio.Task[Any]") -> None:
        """The driving caller's task is done: its run of the loop ends. Not when the task raised
        KeyboardInterrupt itself: the run has ended already, raising it, and a stop left behind
        would end the next run (asyncio's run_until_complete skips it too)."""
        if task.cancelled() or not isinstance(task.exception(), KeyboardInterrupt | SystemExit):
            self.loop.stop()

    def _stop_driving(self, task: "asyncio.Task[Any] | None") -> None:
        """In a finally: the loop is never left marked as driven. A task not done (its caller
        was interrupted: KeyboardInterrupt) is adopted as in flight, and the keeper drives it to
        its end, because other callers wait on its outcome inside the Client: an enqueue of the
        same message_id waits for its lock, close() for the count of enqueues in flight."""
        if task is not None and not task.done():
            task.remove_done_callback(self._stop_for)
            task.add_done_callback(functools.partial(self._settle, None))
            self._in_flight += 1
        self._baton.release(self._in_flight)

    def _start_queued(self) -> None:
        calls = self._baton.take_queued()
        self._in_flight += len(calls)
        for call in calls:
            call.task = self.loop.create_task(call.coroutine, context=call.context)
            call.task.add_done_callback(functools.partial(self._settle, call))

    def _settle(self, call: _Call | None, task: "asyncio.Task[Any]") -> None:
        """In the loop, a task in flight is done: a follower's, or one its driver was
        interrupted out of (no one waits for that one; its error is taken, or asyncio would log
        it). The last one ends the keeper's run, which then hands the loop on or lets it be (the
        driver is read without the lock: only the keeper, driving now, changes it from KEEPER)."""
        if call is not None:
            call.settle(task)
        elif not task.cancelled():
            task.exception()
        self._in_flight -= 1
        if not self._in_flight and self._baton.driver is _Driver.KEEPER:
            self.loop.stop()

    def _keep(self) -> None:
        """The keeper thread: drives the loop while calls are in flight that nobody else drives,
        and for a tick when the client was idle; closes it at the end."""
        while (turn := self._baton.keeper_turn(TICK_S)) is not _Turn.STOP:
            if turn is _Turn.TICK:
                tick = self.loop.call_later(TICK_DRIVE_S, self.loop.stop)
                self.loop.run_forever()  # or until a follower that came meanwhile settles
                tick.cancel()
            while not self._baton.release(self._in_flight):
                self.loop.run_forever()  # until the last call in flight settles
        self.loop.close()

    async def _close_client(self) -> None:
        """Bounded: an enqueue without a confirm timeout may wait for ever."""
        await asyncio.wait_for(self.client.close(), CLOSE_TIMEOUT_S)

    def stop(self) -> None:
        """Close the client (its enqueues in flight settle first), then the loop: the keeper
        closes it once nobody drives, and no call drives it after."""
        try:
            self.run(self._close_client())
        finally:
            self._baton.close()
            self._keeper.join(CLOSE_TIMEOUT_S)


class SyncClient:
    """The Client's methods without await: `SyncClient().enqueue("mail", {...})`.

    Connects at the first call, so one made at import time in a pre-forking server is safe.
    Share one instance between threads; close it (or use `with`) when done, or it is closed at
    exit.
    """

    def __init__(
        self,
        amqp_url: str | None = None,
        queue: str | None = None,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        confirm_timeout_s: float | None = CONFIRM_TIMEOUT_S,
    ) -> None:
        settings = load_client_settings(amqp_url, queue)
        self.amqp_url = settings.amqp_url
        self.queue = settings.queue
        self._client = functools.partial(
            Client,
            self.amqp_url,
            self.queue,
            connect_timeout_s=connect_timeout_s,
            confirm_timeout_s=confirm_timeout_s,
        )
        self._lock = threading.Lock()
        self._running: _PrivateLoop | None = None
        self._closed = False
        _watch_exit_and_forks()
        _OPEN.add(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def enqueue(
        self,
        job_type: str | None,
        payload: Any,
        *,
        message_id: str | None = None,
        max_retries: int | None = None,
        delay: Delay | None = None,
        run_at: dt.datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Client.enqueue, waited for: returns the message_id once the broker confirmed it."""
        running = self._private_loop()
        return running.run(
            running.client.enqueue(
                job_type,
                payload,
                message_id=message_id,
                max_retries=max_retries,
                delay=delay,
                run_at=run_at,
                headers=headers,
                content_type=content_type,
            )
        )

    def cancel(self, message_id: str) -> None:
        """Client.cancel, waited for."""
        running = self._private_loop()
        running.run(running.client.cancel(message_id))

    def close(self) -> None:
        """Wait until the jobs being enqueued are confirmed (or refused), then disconnect."""
        with self._lock:
            self._closed = True
            running, self._running = self._running, None
        _OPEN.discard(self)
        if running is not None and running.pid == os.getpid():
            running.stop()

    def _private_loop(self) -> _PrivateLoop:
        """This process's loop, made at the first call and again after a fork."""
        running = self._running
        if running is not None and running.pid == os.getpid():
            return running
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            if self._running is None or self._running.pid != os.getpid():
                if self._running is not None:
                    _INHERITED.append(self._running)
                self._running = _PrivateLoop(self._client())
            return self._running

    def _after_fork_in_child(self) -> None:
        # Another thread of the parent may have held the lock at the fork: the child has only
        # the forking thread, so nothing would ever release it.
        self._lock = threading.Lock()


def _close_all() -> None:
    for client in list(_OPEN):
        client.close()


def _after_fork_in_child() -> None:
    for client in list(_OPEN):
        client._after_fork_in_child()


@functools.cache
def _watch_exit_and_forks() -> None:
    """Once per process, at the first SyncClient: close them all at exit (their keeper threads
    are daemons, stopped at exit without a word to the broker), and mind forks."""
    atexit.register(_close_all)
    os.register_at_fork(after_in_child=_after_fork_in_child)
