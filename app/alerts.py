"""Alert decisions (pure): which failures to alert on, and when the failed queue crosses its line.

The clock is passed in, so every decision is a function of its inputs and is tested with tables.
"""

from dataclasses import dataclass
from typing import Any

from app.failed import FailureInfo

JOB_FAILED = "job.failed"
THRESHOLD = "failed_queue.threshold"
RECOVERED = "failed_queue.recovered"


def job_failed_alert(queue: str, failure: FailureInfo, suppressed: int) -> dict[str, Any]:
    """The webhook body for one failed job."""
    return {"event": JOB_FAILED, "queue": queue, **failure.as_dict(), "suppressed": suppressed}


def depth_alert(event: str, queue: str, depth: int, threshold: int) -> dict[str, Any]:
    """The webhook body for the failed queue crossing its threshold (either way)."""
    return {"event": event, "queue": queue, "depth": depth, "threshold": threshold}


@dataclass
class _Slot:
    sent_at: float
    suppressed: int = 0
    latest: FailureInfo | None = None


class ReasonLimiter:
    """At most one job.failed alert per failure reason per interval; the rest are counted.

    A burst is reported on both edges: its first failure at once, and (once the interval has
    passed) its latest failure with the count of those not alerted, so no burst goes unreported.
    """

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._slots: dict[str, _Slot] = {}

    def offer(self, failure: FailureInfo, now: float) -> int | None:
        """The suppressed count to alert this failure with, or None to hold it back."""
        slot = self._slots.get(failure.reason)
        if slot is None or now - slot.sent_at >= self._interval_s:
            self._slots[failure.reason] = _Slot(now)
            return slot.suppressed if slot else 0
        slot.suppressed += 1
        slot.latest = failure
        return None

    def due(self, now: float) -> list[tuple[FailureInfo, int]]:
        """Held-back failures whose interval has passed: (latest failure, others suppressed)."""
        out = []
        for reason, slot in list(self._slots.items()):
            if now - slot.sent_at < self._interval_s:
                continue
            if slot.latest is None:
                del self._slots[reason]  # quiet for a whole interval: forget the reason
            else:
                out.append((slot.latest, slot.suppressed - 1))
                self._slots[reason] = _Slot(now)
        return out


class DepthWatch:
    """Raises the threshold alert once when the depth reaches it, and once when it falls below."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._above = False

    def observe(self, depth: int) -> str | None:
        """THRESHOLD or RECOVERED when this depth crosses the line, else None."""
        if not self._above and depth >= self.threshold:
            self._above = True
            return THRESHOLD
        if self._above and depth < self.threshold:
            self._above = False
            return RECOVERED
        return None
