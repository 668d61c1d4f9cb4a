"""The SyncClient's loop thread: every call handed to it from any thread, in the caller's
context, waited for; none lost when its caller is interrupted or the loop stops. No broker: the
coroutines run on the loop are the tests' own."""

import asyncio
import contextvars
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from ricochet.client.client import Client
from ricochet.client.sync import _LoopThread
from ricochet.errors import ClientClosed

from tests.support import AMQP_URL

REQUEST = contextvars.ContextVar("request", default="none")


@pytest.fixture
def loop_thread() -> Iterator[_LoopThread]:
    """A loop thread whose client never connects (stop() closes it all the same)."""
    running = _LoopThread(Client(AMQP_URL, "unit"))
    yield running
    if not running.loop.is_closed():
        running.stop()


async def ident() -> int:
    await asyncio.sleep(0)
    return threading.get_ident()


def test_calls_from_many_threads_each_get_their_own_outcome(loop_thread: _LoopThread) -> None:
    """32 threads, 100 calls each of 0-2 loop turns: every call returns its own value, all of
    them run on the one loop thread, none hangs."""

    async def echo(value: int) -> tuple[int, int]:
        for _ in range(value % 3):
            await asyncio.sleep(0)
        return value, threading.get_ident()

    def caller(thread: int) -> list[tuple[int, int]]:
        return [loop_thread.run(echo(thread * 1000 + n)) for n in range(100)]

    with ThreadPoolExecutor(32) as pool:
        done = [pool.submit(caller, t) for t in range(32)]
        results = [r for f in done for r in f.result(timeout=60)]
    assert sorted(value for value, _ in results) == [
        t * 1000 + n for t in range(32) for n in range(100)
    ]
    assert {ran_in for _, ran_in in results} == {loop_thread._thread.ident}


async def test_calls_run_in_their_callers_context(loop_thread: _LoopThread) -> None:
    """A call sees its caller's context variables (a current span is its publish's parent),
    from a plain thread and from one that runs an event loop of its own."""

    async def request() -> str:
        return REQUEST.get()

    REQUEST.set("from async code")
    assert loop_thread.run(request()) == "from async code"

    def from_a_thread() -> str:
        REQUEST.set("from a thread")
        return loop_thread.run(request())

    assert await asyncio.to_thread(from_a_thread) == "from a thread"


def test_errors_reach_the_caller(loop_thread: _LoopThread) -> None:
    async def fail() -> None:
        raise LookupError("no such job")

    with pytest.raises(LookupError, match="no such job"):
        loop_thread.run(fail())


def test_an_interrupted_caller_leaves_its_call_to_run_to_its_end(loop_thread: _LoopThread) -> None:
    """KeyboardInterrupt while a caller waits: the caller gets it, and its call goes on on the
    loop (what waits on its outcome inside the Client gets it); the next call is served."""
    started = threading.Event()
    release = asyncio.Event()
    outcomes: list[str] = []

    async def publish() -> None:
        started.set()
        await release.wait()
        outcomes.append("confirmed")

    async def confirm() -> None:
        release.set()

    def interrupt() -> None:  # Ctrl-C: SIGINT, which wakes the waiting thread
        started.wait(5)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        loop_thread.run(publish())
    interrupter.join()
    loop_thread.run(confirm())
    wait_until(lambda: outcomes == ["confirmed"])


def test_a_caller_interrupted_as_it_wakes_the_loop_leaves_it_wakeable(
    loop_thread: _LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands as a caller hands the loop its wake-up: the caller gets it, and the next
    call wakes the loop and is served (with the interrupted one, left to run to its end)."""
    hand_over = loop_thread.loop.call_soon_threadsafe
    interrupted: list[str] = []

    def interrupt(*args: Any) -> Any:
        monkeypatch.setattr(loop_thread.loop, "call_soon_threadsafe", hand_over)
        raise KeyboardInterrupt

    async def note(what: str) -> str:
        interrupted.append(what)
        return what

    monkeypatch.setattr(loop_thread.loop, "call_soon_threadsafe", interrupt)
    with pytest.raises(KeyboardInterrupt):
        loop_thread.run(note("interrupted"))
    assert loop_thread.run(note("next")) == "next"
    assert interrupted == ["interrupted", "next"]


def test_the_loop_runs_while_nobody_calls(loop_thread: _LoopThread) -> None:
    """Nobody calls, yet the loop's timers run (the connection's heartbeats are one)."""
    fired: list[int] = []

    async def schedule() -> None:
        asyncio.get_running_loop().call_later(0.2, lambda: fired.append(threading.get_ident()))

    loop_thread.run(schedule())
    wait_until(lambda: fired, timeout_s=5)
    assert fired == [loop_thread._thread.ident]


def test_after_stop_no_call_is_taken(loop_thread: _LoopThread) -> None:
    """stop() closes the client, then the loop and its thread; a call after it raises
    ClientClosed (a RuntimeError, as before there was a class of its own)."""
    loop_thread.run(ident())
    loop_thread.stop()
    assert not loop_thread._thread.is_alive()
    assert loop_thread.loop.is_closed()
    with pytest.raises(ClientClosed, match="closed"):
        loop_thread.run(ident())
    assert issubclass(ClientClosed, RuntimeError)


def test_calls_racing_the_stop_each_end(loop_thread: _LoopThread) -> None:
    """Threads calling on while the loop stops: each call returns, or raises ClientClosed; none
    waits for ever."""
    outcomes: list[str] = []

    def caller() -> None:
        while True:
            try:
                loop_thread.run(ident())
            except ClientClosed:
                outcomes.append("closed")
                return

    with ThreadPoolExecutor(8) as pool:
        callers = [pool.submit(caller) for _ in range(8)]
        time.sleep(0.1)
        loop_thread.stop()
        for each in callers:
            each.result(timeout=10)
    assert outcomes == ["closed"] * 8


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
