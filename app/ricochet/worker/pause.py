"""Pausing on failure spikes (pure): when most jobs fail transiently, their dependency is
probably down, and retrying them only spends their budgets.

The clock is passed in, so every decision is a function of its inputs and is tested with tables.
"""

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class PausePolicy:
    """When to pause (RICOCHET_PAUSE_*); a failure ratio of 0 turns pausing off."""

    failure_ratio: float
    min_jobs: int
    window_s: float
    pause_s: float

    @property
    def enabled(self) -> bool:
        return self.failure_ratio > 0


class FailureWindow:
    """The jobs finished in the last window_s seconds, and which of them failed transiently."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._finished: deque[tuple[float, bool]] = deque()
        self._failed = 0

    def record(self, now: float, failed_transiently: bool) -> None:
        self._finished.append((now, failed_transiently))
        self._failed += failed_transiently
        self._forget_before(now - self._window_s)

    def counts(self, now: float) -> tuple[int, int]:
        """(jobs finished, jobs failed transiently) within the window ending now."""
        self._forget_before(now - self._window_s)
        return len(self._finished), self._failed

    def clear(self) -> None:
        """Start afresh (after a pause: the failures before it must not trigger the next)."""
        self._finished.clear()
        self._failed = 0

    def _forget_before(self, start: float) -> None:
        while self._finished and self._finished[0][0] < start:
            _, failed = self._finished.popleft()
            self._failed -= failed


def pause_ratio(policy: PausePolicy, finished: int, failed: int) -> float | None:
    """The share of failures to pause at, or None to keep taking jobs."""
    if not policy.enabled or finished < policy.min_jobs or finished == 0:
        return None
    ratio = failed / finished
    return ratio if ratio >= policy.failure_ratio else None
