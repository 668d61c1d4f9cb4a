"""Handler timeouts: one timer for all of a worker's attempts, where asyncio.timeout makes one
an attempt.

Every attempt of a worker has the same time limit, so their deadlines fall in the order they
started: the oldest attempt still running is always the next one due, and one timer for it is
enough. asyncio.timeout schedules and cancels a timer of its own for each attempt (a heap push
of a TimerHandle that compares in Python, and a cancelled one left in the heap), an eighth of
what the worker spent on a job of its own besides the handler. What happens at the deadline is
asyncio.timeout's: the attempt's task is cancelled, and the CancelledError it raises leaves the
attempt as TimeoutError, unless the task was also cancelled from elsewhere (a shutdown).
"""

import asyncio
from collections import OrderedDict
from types import TracebackType


class Deadline:
    """One attempt's limit: a context manager around the attempt, entered once."""

    __slots__ = ("_cancelling", "_deadlines", "_task", "at", "expired")

    def __init__(self, deadlines: "Deadlines", task: asyncio.Task[object], at: float) -> None:
        self._deadlines = deadlines
        self._task = task
        self._cancelling = task.cancelling()  # cancels already asked of the task before it
        self.at = at
        self.expired = False

    def __enter__(self) -> "Deadline":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._deadlines.ended(self)
        # An expired attempt takes back the cancel it was sent (uncancel, whatever it raised),
        # and turns the CancelledError into TimeoutError unless others cancelled the task too.
        if (
            self.expired
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    def expire(self) -> None:
        self.expired = True
        self._task.cancel()


class Deadlines:
    """The deadlines of the attempts running now, each timeout_s after it started, with one
    timer for the oldest."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s  # every attempt's limit
        # Running attempts, oldest first. An OrderedDict: removing any one and reading the
        # oldest are both O(1).
        self._running: OrderedDict[Deadline, None] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> Deadline:
        """The deadline of an attempt that starts now in the current task."""
        task = asyncio.current_task()
        assert task is not None, "an attempt runs in a task"
        loop = asyncio.get_running_loop()
        deadline = Deadline(self, task, loop.time() + self.timeout_s)
        self._running[deadline] = None
        if self._timer is None:
            self._timer = loop.call_at(deadline.at, self._expire)
        return deadline

    def ended(self, deadline: Deadline) -> None:
        self._running.pop(deadline, None)

    def _expire(self) -> None:
        """Cancel the attempts that are due, then wait for the oldest of the others (the timer
        may fire for an attempt that has ended: then it waits for the next)."""
        loop = asyncio.get_running_loop()
        self._timer = None
        now = loop.time()
        while self._running:
            oldest = next(iter(self._running))
            if oldest.at > now:
                self._timer = loop.call_at(oldest.at, self._expire)
                return
            del self._running[oldest]
            oldest.expire()
