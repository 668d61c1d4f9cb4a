"""Alert decisions (pure): which failures to alert on, and when the failed queue crosses its line.

The clock is passed in, so every decision is a function of its inputs and is tested with tables.
"""

import re
from dataclasses import dataclass
from typing import Any

from ricochet.delivery.failed import FailureInfo

JOB_FAILED = "job.failed"
THRESHOLD = "failed_queue.threshold"
RECOVERED = "failed_queue.recovered"
PAUSED = "worker.paused"
RESUMED = "worker.resumed"

# What varies between failures of one cause: UUIDs, hex ids with a digit, and numbers.
_VARYING = re.compile(
    r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|\b(?=[0-9a-z]*\d)[0-9a-z]{6,}\b|\d+",
    re.IGNORECASE,
)


def reason_key(reason: str) -> str:
    """The failure reason with its ids and numbers masked: what the rate limit counts by."""
    return _VARYING.sub("#", reason)


def job_failed_alert(queue: str, failure: FailureInfo, suppressed: int) -> dict[str, Any]:
    """The webhook body for one failed job."""
    return {"event": JOB_FAILED, "queue": queue, **failure.as_dict(), "suppressed": suppressed}


def depth_alert(event: str, queue: str, depth: int, threshold: int) -> dict[str, Any]:
    """The webhook body for the failed queue crossing its threshold (either way)."""
    return {"event": event, "queue": queue, "depth": depth, "threshold": threshold}


def pause_alert(event: str, queue: str, failure_ratio: float, pause_s: float) -> dict[str, Any]:
    """The webhook body for a worker pausing on a failure spike, or taking jobs again."""
    return {"event": event, "queue": queue, "failure_ratio": failure_ratio, "pause_s": pause_s}


@dataclass
class _Slot:
    sent_at: float
    suppressed: int = 0
    latest: FailureInfo | None = None


class ReasonLimiter:
    """At most one job.failed alert per failure reason per interval; the rest are counted.

    Failures are offered with the reason_key() of their reason, so "order 17 not found" and
    "order 18 not found" are one reason: an id in the message would otherwise let every failure
    through. The caller keeps the key, as the monitor does to find the event it holds back.

    A burst is reported on both edges: its first failure at once, and (once the interval has
    passed) its latest failure with the count of those not alerted, so no burst goes unreported.
    """

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._slots: dict[str, _Slot] = {}

    def offer(self, key: str, failure: FailureInfo, now: float) -> int | None:
        """The suppressed count to alert this failure (of reason_key() key) with, or None to
        hold it back."""
        slot = self._slots.get(key)
        if slot is None or now - slot.sent_at >= self._interval_s:
            self._slots[key] = _Slot(now)
            return slot.suppressed if slot else 0
        slot.suppressed += 1
        slot.latest = failure
        return None

    def due(self, now: float) -> list[tuple[str, FailureInfo, int]]:
        """Held-back failures whose interval has passed: (key, latest failure, others
        suppressed)."""
        out = []
        for key, slot in list(self._slots.items()):
            if now - slot.sent_at < self._interval_s:
                continue
            if slot.latest is None:
                del self._slots[key]  # quiet for a whole interval: forget the reason
            else:
                out.append((key, slot.latest, slot.suppressed - 1))
                self._slots[key] = _Slot(now)
        return out


class DepthWatch:
    """Raises the threshold alert once when the depth reaches it, and once when it falls below."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._above = False

    def observe(self, depth: int, held: bool = False) -> str | None:
        """THRESHOLD or RECOVERED when this depth crosses the line, else None.

        held: whether a reader holds copies of the queue (a failed list, a replay, a console
        page), which the depth, counting ready copies only, leaves out: it can then say the
        queue reached the line, but not that it fell below it.
        """
        if not self._above and depth >= self.threshold:
            self._above = True
            return THRESHOLD
        if self._above and depth < self.threshold and not held:
            self._above = False
            return RECOVERED
        return None
