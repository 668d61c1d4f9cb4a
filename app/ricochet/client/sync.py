"""SyncClient: the Client for sync code (Django, Flask, scripts), shared by threads, safe to fork.

The async Client runs on a private event loop in a daemon thread; each call is handed to it
and waited for, so threads share one connection and their publishes pipeline on its channel.
A forked child (gunicorn, uWSGI) never touches the parent's loop or socket: it finds its pid
changed and starts a loop and a connection of its own.
"""

import asyncio
import atexit
import datetime as dt
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

# How long closing waits for the loop thread: the enqueues in flight are bounded by their own
# confirm timeout, and the broker's answer to the close comes at once or never.
CLOSE_TIMEOUT_S = CONFIRM_TIMEOUT_S + 10

# Every open SyncClient: closed at exit, and given fresh locks in a forked child.
_OPEN: "weakref.WeakSet[SyncClient]" = weakref.WeakSet()
# What a forked child inherited of its parent's clients (their loop, thread object and socket)
# is kept here, never used and never finalized: closing it would act on the parent's connection.
_INHERITED: list["_LoopThread"] = []


class _Call:
    """A coroutine handed to the loop thread, and the caller's wait for its outcome: a lock the
    caller holds until the loop releases it, the cheapest wake-up one thread can give another."""

    __slots__ = ("_done", "coroutine", "error", "outcome", "task")

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.coroutine = coroutine
        self.task: asyncio.Task[Any] | None = None  # held here: the loop holds its tasks weakly
        self.outcome: Any = None
        self.error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def settle(self, task: "asyncio.Task[Any]") -> None:
        """In the loop thread, when the coroutine is done."""
        if task.cancelled():
            self.error = asyncio.CancelledError()
        else:
            self.error = task.exception()
            self.outcome = None if self.error else task.result()
        self.task = None  # the error raised in the caller holds this call: no cycle through it
        self._done.release()

    def fail(self, error: BaseException) -> None:
        """When the coroutine could not be started (the loop is closed, say)."""
        self.coroutine.close()
        self.error = error
        self._done.release()

    def wait(self, timeout_s: float | None) -> Any:
        if not self._done.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise TimeoutError(f"no answer within {timeout_s:g} s")
        error, self.error = self.error, None
        if error is None:
            return self.outcome
        try:
            raise error
        finally:
            del error  # the traceback holds this frame: no cycle through it


class _LoopThread:
    """A private event loop running in a daemon thread, with one Client on it.

    Calls are queued, and the loop is woken once for all that queued while it was busy: with
    many threads enqueueing, one wake-up starts many publishes.
    """

    def __init__(self, client: Client) -> None:
        self.pid = os.getpid()
        self.client = client
        self.loop = asyncio.new_event_loop()
        self._queued: list[_Call] = []
        self._queue_lock = threading.Lock()
        self._woken = False  # a _start_queued is due on the loop
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="ricochet-client", daemon=True
        )
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        call = _Call(coroutine)
        with self._queue_lock:
            self._queued.append(call)
            wake, self._woken = not self._woken, True
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._start_queued)
            except BaseException as error:  # the loop is closed: fail what waits for it
                for queued in self._take_queued():
                    queued.fail(error)
        outcome: T = call.wait(timeout_s)
        return outcome

    def _take_queued(self) -> list[_Call]:
        with self._queue_lock:
            calls, self._queued, self._woken = self._queued, [], False
        return calls

    def _start_queued(self) -> None:
        for call in self._take_queued():
            try:
                call.task = self.loop.create_task(call.coroutine)
            except BaseException as error:
                call.fail(error)
            else:
                call.task.add_done_callback(call.settle)

    def stop(self) -> None:
        """Close the client (its enqueues in flight settle first), then end the thread."""
        try:
            self.run(self.client.close(), CLOSE_TIMEOUT_S)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(CLOSE_TIMEOUT_S)
            if not self.thread.is_alive():
                self.loop.close()


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
        delay: Delay | None = None,
        run_at: dt.datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Client.enqueue, waited for: returns the message_id once the broker confirmed it."""
        running = self._loop_thread()
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
        running = self._loop_thread()
        running.run(running.client.cancel(message_id))

    def close(self) -> None:
        """Wait until the jobs being enqueued are confirmed (or refused), then disconnect."""
        with self._lock:
            self._closed = True
            running, self._running = self._running, None
        _OPEN.discard(self)
        if running is not None and running.pid == os.getpid():
            running.stop()

    def _loop_thread(self) -> _LoopThread:
        """This process's loop thread, started at the first call and again after a fork."""
        running = self._running
        if running is not None and running.pid == os.getpid():
            return running
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
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
