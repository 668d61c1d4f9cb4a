"""The process's clock as its schedule leaders read it: the wall clock, and since when the process
has seen it run without a jump (schedules/catchup.py). One per process, kept across connections
and shared by every queue's lead, so that a jump is seen, and logged, once."""

import time

from ricochet.log import get_logger
from ricochet.schedules.catchup import Reading, drift_ms, jumped

log = get_logger("ricochet.schedules")


def reading() -> Reading:
    """The wall clock and the monotonic clock, now."""
    return Reading(time.time_ns() // 1_000_000, time.monotonic_ns() // 1_000_000)


def now_ms() -> int:
    """The wall clock, in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class Clock:
    """The wall clock, read from the process's start on: seen_ms is when the process started, or
    when its clock last jumped."""

    def __init__(self) -> None:
        self._previous = reading()
        self.seen_ms = self._previous.wall_ms

    def now_ms(self) -> int:
        """The wall clock, now; seen_ms from now on if it jumped since the last reading."""
        current = reading()
        if jumped(self._previous, current):
            log.warning(
                "the clock jumped: what it jumped over is caught up like a time with no worker",
                jumped_ms=drift_ms(self._previous, current),
            )
            self.seen_ms = current.wall_ms
        self._previous = current
        return current.wall_ms
