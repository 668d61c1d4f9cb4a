"""The threads sync handlers run in: a free one is reused, a call never waits behind a hung one."""

import threading
import time

from ricochet.handlers.threads import THREAD_NAME, HandlerThreads


def _ran_on(threads: HandlerThreads, release: threading.Event | None = None) -> str:
    """Run one call; return the name of the thread that ran it (once it ran)."""
    ran = threading.Event()
    name: list[str] = []

    def call() -> None:
        name.append(threading.current_thread().name)
        ran.set()
        if release is not None:
            release.wait(10)

    threads.run(call)
    assert ran.wait(5), "the call never ran"
    return name[0]


def _settled(threads: HandlerThreads, busy: int) -> bool:
    """Whether, within 5 s, exactly busy threads run a call."""
    for _ in range(500):
        if threads.busy == busy:
            return True
        time.sleep(0.01)
    return False


def test_a_free_thread_runs_the_next_call() -> None:
    threads = HandlerThreads()
    first = _ran_on(threads)
    assert _settled(threads, busy=0)
    assert [_ran_on(threads) for _ in range(5)] == [first] * 5
    assert first.startswith(THREAD_NAME)
    assert threading.current_thread().name != first


def test_a_call_never_waits_behind_a_hung_one() -> None:
    threads = HandlerThreads()
    release = threading.Event()
    hung = _ran_on(threads, release)
    try:
        other = _ran_on(threads)  # on a thread of its own, while the first still runs
        assert other != hung
        assert _settled(threads, busy=1)
    finally:
        release.set()
    assert _settled(threads, busy=0)
    # The two threads are free now: the next calls run on them, no third is started.
    names = {_ran_on(threads) for _ in range(10)}
    assert names <= {hung, other}


def test_busy_counts_the_calls_running() -> None:
    threads = HandlerThreads()
    release = threading.Event()
    try:
        for _ in range(3):
            _ran_on(threads, release)
        assert threads.busy == 3
    finally:
        release.set()
    assert _settled(threads, busy=0)
