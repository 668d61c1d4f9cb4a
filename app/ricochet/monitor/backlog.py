"""When the copies in the failed queue failed, known without reading the failed queue (pure).

The broker cannot show a message of a quorum queue without handing it out, and the monitor never
takes anything off the failed queue: it only reads its depth. But it reads every failure from
the events queue, in the order the copies entered the failed queue. Copies leave the failed
queue from its head (a replay, a shovel and rabbitmqadmin take the oldest first), so when it
holds `depth` copies they are the `depth` newest failures, and the oldest of them is the
depth-th newest failure the monitor saw.
"""

import datetime as dt
from collections import deque


def failed_at_s(header: str | None, now_s: float) -> float:
    """A failed-at header (ISO-8601) as Unix time; now_s when it is missing or not a time."""
    if header is None:
        return now_s
    try:
        at = dt.datetime.fromisoformat(header)
    except ValueError:
        return now_s
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return at.timestamp()


class FailedBacklog:
    """The failure times of the newest copies, in the order they entered the failed queue."""

    def __init__(self, started_s: float, remembered: int) -> None:
        self._started_s = started_s
        self._times: deque[float] = deque(maxlen=remembered)

    def failed(self, at_s: float) -> None:
        """One more copy entered the failed queue; it failed at at_s (Unix time)."""
        self._times.append(at_s)

    def oldest(self, depth: int) -> float | None:
        """When the oldest of the failed queue's `depth` copies failed; None when it is empty.

        With more copies than failures seen (the others failed before this process started, or
        beyond what it remembers), the answer is the latest time the oldest can have failed, so
        its age is at least now minus it: such copies failed before the oldest failure
        remembered, or before the start when there is none.
        """
        if depth <= 0:
            return None
        if depth <= len(self._times):
            return self._times[-depth]
        return self._times[0] if self._times else self._started_s
