"""SyncClient: the Client for sync code (Django, Flask, scripts), shared by threads, safe to fork.

The async Client runs on an event loop in a daemon thread of its own, one per process: each
call queues its coroutine for that loop, to run in a copy of the caller's context (so a current
span is the publish's parent), and waits for the outcome. The loop is woken once
(call_soon_threadsafe) for all the calls queued while it was busy, and wakes each caller by
releasing a lock the caller waits on: with many threads enqueueing, one wake-up starts many
publishes. Threads share one connection, and their publishes pipeline on its channel. The loop
runs while nobody calls, so the connection's heartbeats go out and a close by the broker is
read when it comes. A forked child (gunicorn, uWSGI) never touches the parent's loop or
socket: it finds its pid changed and makes a loop and a connection of its own.
"""

import asyncio
import atexit
import collections
import contextvars
import datetime as dt
import functools
import os
import threading
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from ricochet.client.client import CONFIRM_TIMEOUT_S, CONNECT_TIMEOUT_S, Client
from ricochet.client.message import Delay
from ricochet.errors import ClientClosed
from ricochet.settings import load_client_settings

T = TypeVar("T")

# How long closing waits: the enqueues in flight are bounded by their own confirm timeout, and
# the broker's answer to the close comes at once or never.
CLOSE_TIMEOUT_S = CONFIRM_TIMEOUT_S + 10

# Every open SyncClient: closed at exit, and given fresh locks in a forked child.
_OPEN: "weakref.WeakSet[SyncClient]" = weakref.WeakSet()
# What a forked child inherited of its parent's clients (their loop and socket) is kept here,
# never used and never finalized: closing it would act on the parent's connection.
_INHERITED: list["_LoopThread"] = []


class _Call:
    """A coroutine handed to the loop thread, with its caller's context, and the caller's wait
    for its outcome: a lock taken when the call is made, which the loop thread releases when the
    coroutine is done. The loop thread never waits on a lock of a caller's: an interrupted
    caller (KeyboardInterrupt) leaves its call to run to its end, and its lock taken."""

    __slots__ = ("_context", "_coroutine", "_done", "_error", "_outcome")

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._coroutine = coroutine
        self._context = contextvars.copy_context()
        self._outcome: Any = None
        self._error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """In the loop thread."""
        task = loop.create_task(self._coroutine, context=self._context)
        task.add_done_callback(self._settle)

    def _settle(self, task: "asyncio.Task[Any]") -> None:
        if task.cancelled():  # the loop stopped under it
            self._error = ClientClosed("the client closed before the call ended")
        else:
            self._error = task.exception()
            self._outcome = None if self._error else task.result()
        self._done.release()

    def outcome(self) -> Any:
        """In the caller's thread: waits until the coroutine is done."""
        self._done.acquire()
        error, self._error = self._error, None
        if error is None:
            return self._outcome
        try:
            raise error
        finally:
            del error  # the traceback holds this frame: no cycle through it


class _LoopThread:
    """An event loop running in a daemon thread, with one Client on it."""

    def __init__(self, client: Client) -> None:
        self.pid = os.getpid()
        self.client = client
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._stopping = False
        self._queued: collections.deque[_Call] = collections.deque()
        self._woken = False  # a _start_queued is due on the loop
        self._thread = threading.Thread(target=self._run, name="ricochet-client", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.loop.run_forever()
        # What was handed over as the loop stopped is cancelled, so that no caller waits for
        # ever; then the loop closes in its own thread.
        left = asyncio.all_tasks(self.loop)
        if left:
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The coroutine's outcome, run on the loop; ClientClosed once stop() began.

        An interrupted caller (KeyboardInterrupt) leaves its call to run to its end on the loop:
        other calls may wait on its outcome inside the Client (an enqueue of the same message_id
        waits for its lock, close() for the enqueues in flight)."""
        call = _Call(coroutine)
        with self._lock:
            if self._stopping:
                coroutine.close()
                raise ClientClosed("the client is closed")
            self._queued.append(call)
            # Woken under the lock: a stop() after this call's queueing schedules the close
            # after this call's start.
            if not self._woken:
                self._woken = True
                try:
                    self.loop.call_soon_threadsafe(self._start_queued)
                except BaseException:  # Ctrl-C: maybe no wake is due; a second one is harmless
                    self._woken = False
                    raise
        outcome: T = call.outcome()
        return outcome

    def _start_queued(self) -> None:
        """In the loop thread: start every call queued. The flag goes down first, so a call
        queued after it wakes the loop again, and one queued before is started here."""
        self._woken = False
        while self._queued:
            self._queued.popleft().start(self.loop)

    def stop(self) -> None:
        """Close the client (its enqueues in flight settle first), then the loop and its
        thread; no call is taken after this began."""
        with self._lock:
            self._stopping = True
            closing = asyncio.run_coroutine_threadsafe(
                asyncio.wait_for(self.client.close(), CLOSE_TIMEOUT_S), self.loop
            )
        try:
            closing.result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(CLOSE_TIMEOUT_S)


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
        self._running: _LoopThread | None = None
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
        retry_delays_ms: Sequence[int] | None = None,
        delay: Delay | None = None,
        run_at: dt.datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        key: str | None = None,
    ) -> str:
        """Client.enqueue, waited for: returns the message_id once the broker confirmed it."""
        running = self._loop_thread()
        return running.run(
            running.client.enqueue(
                job_type,
                payload,
                message_id=message_id,
                max_retries=max_retries,
                retry_delays_ms=retry_delays_ms,
                delay=delay,
                run_at=run_at,
                headers=headers,
                content_type=content_type,
                queue=queue,
                priority=priority,
                key=key,
            )
        )

    def cancel(self, message_id: str, *, queue: str | None = None) -> None:
        """Client.cancel, waited for."""
        running = self._loop_thread()
        running.run(running.client.cancel(message_id, queue=queue))

    def close(self) -> None:
        """Wait until the jobs being enqueued are confirmed (or refused), then disconnect."""
        with self._lock:
            self._closed = True
            running, self._running = self._running, None
        _OPEN.discard(self)
        if running is not None and running.pid == os.getpid():
            running.stop()

    def _loop_thread(self) -> _LoopThread:
        """This process's loop thread, made at the first call and again after a fork."""
        running = self._running
        if running is not None and running.pid == os.getpid():
            return running
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            if self._running is None or self._running.pid != os.getpid():
                if self._running is not None:
                    _INHERITED.append(self._running)
                self._running = _LoopThread(self._client())
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
    """Once per process, at the first SyncClient: close them all at exit (their loop threads
    are daemons, stopped at exit without a word to the broker), and mind forks."""
    atexit.register(_close_all)
    os.register_at_fork(after_in_child=_after_fork_in_child)
