"""Handler timeouts with one timer for all attempts: each attempt still gets its own limit."""

import asyncio
import time

import pytest
from ricochet.handlers.deadline import Deadline, Deadlines


async def attempt(deadlines: Deadlines, work_s: float) -> str:
    """An attempt that works work_s: what came of it."""
    deadline = deadlines.start()
    try:
        with deadline:
            await asyncio.sleep(work_s)
    except TimeoutError:
        return "expired" if deadline.expired else "own timeout"
    return "done"


async def test_only_the_attempts_past_the_limit_expire() -> None:
    """Attempts side by side, started at different times: those that finish within the limit
    are untouched, the others end in TimeoutError."""
    deadlines = Deadlines(0.2)
    works = [0.01, 0.5, 0.05, 1.0, 0.1, 0.3, 0.0]
    runs = []
    for work_s in works:
        runs.append(asyncio.create_task(attempt(deadlines, work_s)))
        await asyncio.sleep(0.01)
    results = await asyncio.gather(*runs)
    assert results == ["expired" if w > 0.2 else "done" for w in works]


async def test_a_later_attempt_expires_on_its_own_time_after_the_oldest_ended() -> None:
    """The timer set for an attempt that ended early fires for nothing and waits for the next
    one: that one expires its limit after it started, neither then nor never."""
    deadlines = Deadlines(0.2)
    assert await attempt(deadlines, 0) == "done"  # the timer stays set for its deadline
    await asyncio.sleep(0.1)
    started = time.monotonic()
    assert await attempt(deadlines, 5) == "expired"
    assert 0.19 <= time.monotonic() - started < 0.5


async def test_the_handler_s_own_timeout_error_is_not_the_limit() -> None:
    """A TimeoutError the handler raises itself (a socket's, say) is its failure."""
    deadlines = Deadlines(5)
    deadline = deadlines.start()
    with pytest.raises(TimeoutError), deadline:
        raise TimeoutError("read timed out")
    assert deadline.expired is False


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    """The task cancelled by someone else (a shutdown) as its limit passes: the cancel wins,
    as with asyncio.timeout, and is not turned into a timeout."""
    deadlines = Deadlines(5)
    running: list[Deadline] = []
    started = asyncio.Event()

    async def run() -> None:
        with deadlines.start() as deadline:
            running.append(deadline)
            started.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(run())
    await started.wait()
    running[0].expire()  # the limit passes...
    task.cancel()  # ...as a shutdown cancels the task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert running[0].expired
