"""Who drives the SyncClient's loop: the calling thread when nobody else does, else the driver,
and the keeper thread for what drivers leave; no call stranded. No broker: the coroutines run
on the loop are the tests' own."""

import asyncio
import contextvars
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from ricochet.client.client import Client
from ricochet.client.sync import _Baton, _Call, _Driver, _PrivateLoop, _Role, _Turn

from tests.support import AMQP_URL

REQUEST = contextvars.ContextVar("request", default="none")


@pytest.fixture
def private_loop() -> Iterator[_PrivateLoop]:
    """A private loop whose client never connects (stop() closes it all the same)."""
    running = _PrivateLoop(Client(AMQP_URL, "unit"))
    yield running
    if running._keeper.is_alive():
        running.stop()


async def ident() -> int:
    await asyncio.sleep(0)
    return threading.get_ident()


def keeper_ident(running: _PrivateLoop) -> int | None:
    return running._keeper.ident


def test_a_caller_alone_drives_the_loop_in_its_own_thread(private_loop: _PrivateLoop) -> None:
    """No hand-off: each call runs in the thread that makes it, one thread after another."""
    assert [private_loop.run(ident()) for _ in range(3)] == [threading.get_ident()] * 3
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(lambda: (threading.get_ident(), private_loop.run(ident()))).result()
    assert other[0] == other[1] != threading.get_ident()
    assert driver(private_loop._baton) is _Driver.NOBODY


async def test_a_caller_running_a_loop_of_its_own_follows(private_loop: _PrivateLoop) -> None:
    """Called from async code, the call cannot drive: the keeper drives it, and it is waited for."""
    assert private_loop.run(ident()) == keeper_ident(private_loop)


async def test_calls_run_in_their_callers_context(private_loop: _PrivateLoop) -> None:
    """A driven call and a followed one both see the caller's context variables (a current span
    is their publish's parent)."""

    async def request() -> str:
        return REQUEST.get()

    REQUEST.set("followed")
    assert private_loop.run(request()) == "followed"  # this thread runs a loop: it follows

    def driven() -> str:
        REQUEST.set("driven")
        return private_loop.run(request())

    assert await asyncio.to_thread(driven) == "driven"


def test_errors_reach_the_caller_driven_or_followed(private_loop: _PrivateLoop) -> None:
    async def fail() -> None:
        raise LookupError("no such job")

    with pytest.raises(LookupError, match="no such job"):
        private_loop.run(fail())

    async def follow() -> None:
        private_loop.run(fail())

    with pytest.raises(LookupError, match="no such job"):
        asyncio.run(follow())


def test_many_threads_each_call_settled_once(private_loop: _PrivateLoop) -> None:
    """32 threads, 200 calls each of 0-2 loop turns: drivers finish while followers queue, over
    and over. Every call returns its own value, none hangs, and the loop is left undriven."""

    async def echo(value: int, turns: int) -> tuple[int, int]:
        for _ in range(turns):
            await asyncio.sleep(0)
        return value, threading.get_ident()

    def caller(thread: int) -> list[tuple[int, bool]]:
        rng = random.Random(thread)
        calls = [private_loop.run(echo(thread * 1000 + n, rng.randrange(3))) for n in range(200)]
        return [(value, ran_in == threading.get_ident()) for value, ran_in in calls]

    with ThreadPoolExecutor(32) as pool:
        done = [pool.submit(caller, t) for t in range(32)]
        results = [r for f in done for r in f.result(timeout=60)]
    assert sorted(value for value, _ in results) == [
        t * 1000 + n for t in range(32) for n in range(200)
    ]
    driven = sum(own for _, own in results)
    assert 0 < driven < len(results)  # some calls drove the loop, some followed
    wait_until(lambda: driver(private_loop._baton) is _Driver.NOBODY)
    assert private_loop._in_flight == 0


def test_an_interrupted_driver_leaves_its_call_to_the_keeper(private_loop: _PrivateLoop) -> None:
    """KeyboardInterrupt while a caller drives: the loop is not left marked driven, the call goes
    on under the keeper (what waits on its outcome gets it), and the next call drives again."""
    release: asyncio.Event | None = None
    outcomes: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    async def publish() -> str:
        nonlocal release
        release = asyncio.Event()
        asyncio.get_running_loop().call_soon(interrupt)
        await release.wait()
        outcomes.append("confirmed")
        return "confirmed"

    with pytest.raises(KeyboardInterrupt):
        private_loop.run(publish())
    assert driver(private_loop._baton) is _Driver.KEEPER
    assert private_loop._in_flight == 1

    async def confirm() -> int:
        assert release is not None
        release.set()
        return threading.get_ident()

    assert private_loop.run(confirm()) == keeper_ident(private_loop)  # followed: the keeper drives
    wait_until(lambda: outcomes == ["confirmed"])
    wait_until(lambda: driver(private_loop._baton) is _Driver.NOBODY)
    assert private_loop.run(ident()) == threading.get_ident()


def test_the_keeper_ticks_while_the_client_is_idle(private_loop: _PrivateLoop) -> None:
    """Nobody calls, yet the loop's timers run (aiormq's heartbeats are one), in the keeper."""
    fired: list[int] = []

    async def schedule() -> None:
        asyncio.get_running_loop().call_later(0.2, lambda: fired.append(threading.get_ident()))

    private_loop.run(schedule())
    wait_until(lambda: fired, timeout_s=5)
    assert fired == [keeper_ident(private_loop)]


def test_after_stop_no_call_drives_the_loop(private_loop: _PrivateLoop) -> None:
    private_loop.run(ident())
    private_loop.stop()
    assert not private_loop._keeper.is_alive()
    assert private_loop.loop.is_closed()
    with pytest.raises(RuntimeError, match="closed"):
        private_loop.run(ident())


@pytest.fixture
def coroutine() -> Iterator[Callable[[], Coroutine[Any, Any, int]]]:
    """Coroutines to hand the baton, which never runs them: closed after the test."""
    made: list[Coroutine[Any, Any, int]] = []

    def make() -> Coroutine[Any, Any, int]:
        made.append(ident())
        return made[-1]

    yield make
    for each in made:
        each.close()


Make = Callable[[], Coroutine[Any, Any, int]]


class TestBaton:
    """The decisions alone, in the orders a race can put them in."""

    def test_a_follower_queued_before_the_driver_finishes_is_handed_on(
        self, coroutine: Make
    ) -> None:
        baton = _Baton()
        assert baton.enter(_Call(coroutine()), can_drive=True) is _Role.DRIVE
        call = _Call(coroutine())
        assert baton.enter(call, can_drive=True) is _Role.WAKE
        assert baton.release(0) is False  # a call queued: the keeper drives on
        assert driver(baton) is _Driver.KEEPER
        assert baton.keeper_turn(0) is _Turn.DRIVE
        assert baton.take_queued() == [call]
        assert baton.release(1) is False  # started, not settled
        assert baton.release(0) is True
        assert driver(baton) is _Driver.NOBODY

    def test_a_follower_that_comes_after_the_driver_finished_drives(self, coroutine: Make) -> None:
        baton = _Baton()
        assert baton.enter(_Call(coroutine()), can_drive=True) is _Role.DRIVE
        assert baton.release(0) is True
        assert baton.enter(_Call(coroutine()), can_drive=True) is _Role.DRIVE
        assert driver(baton) is _Driver.CALLER

    def test_followers_wake_the_loop_once_a_batch(self, coroutine: Make) -> None:
        baton = _Baton()
        baton.enter(_Call(coroutine()), can_drive=True)
        roles = [baton.enter(_Call(coroutine()), can_drive=True) for _ in range(3)]
        assert roles == [_Role.WAKE, _Role.FOLLOW, _Role.FOLLOW]
        baton.take_queued()
        assert baton.enter(_Call(coroutine()), can_drive=True) is _Role.WAKE

    def test_a_caller_that_cannot_drive_wants_the_keeper(self, coroutine: Make) -> None:
        baton = _Baton()
        assert baton.enter(_Call(coroutine()), can_drive=False) is _Role.WAKE
        assert driver(baton) is _Driver.KEEPER
        assert baton.keeper_turn(0) is _Turn.DRIVE

    def test_the_keeper_ticks_only_after_an_idle_tick(self, coroutine: Make) -> None:
        baton = _Baton()
        assert baton.keeper_turn(0.01) is _Turn.TICK
        assert baton.release(0) is True
        baton.enter(_Call(coroutine()), can_drive=True)
        baton.release(0)
        started = time.monotonic()
        assert baton.keeper_turn(0.05) is _Turn.TICK  # the tick with a call in it is skipped
        assert time.monotonic() - started >= 0.1

    def test_the_keeper_stops_once_nobody_drives_and_no_call_after(self, coroutine: Make) -> None:
        baton = _Baton()
        baton.enter(_Call(coroutine()), can_drive=True)
        baton.close()
        with ThreadPoolExecutor(1) as pool:
            stopping = pool.submit(baton.keeper_turn, 10)
            time.sleep(0.05)
            assert not stopping.done()  # a caller still drives
            baton.release(0)
            assert stopping.result(timeout=5) is _Turn.STOP
        with pytest.raises(RuntimeError, match="closed"):
            baton.enter(_Call(coroutine()), can_drive=True)


def driver(baton: _Baton) -> _Driver:
    """Who drives now (a call, so that the type checker does not take it as fixed)."""
    return baton.driver


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
