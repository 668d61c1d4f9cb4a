"""Pausing on failure spikes: when most jobs fail transiently, their dependency is probably
down, and retrying them only spends their budgets.

The decision is pure: the clock is passed in, so it is a function of its inputs and is tested
with tables. PauseWatch observes the worker's handler calls and asks for the pause.
"""

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from ricochet.delivery.events import Settled
from ricochet.delivery.retry import Outcome


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


class PauseWatch:
    """Counts every handler call in the window, and sets `due` when too many failed."""

    def __init__(self, policy: PausePolicy) -> None:
        self.policy = policy
        self._failures = FailureWindow(policy.window_s)
        self.due = asyncio.Event()  # set from the request until the pause ends
        self.ratio = 0.0  # the share of failures that asked for it

    def attempted(self, outcome: Outcome, seconds: float) -> None:
        if not self.policy.enabled:
            return
        now = time.monotonic()
        # A RetryLater is a transient failure too: a dependency that answers "not now" (a 429).
        self._failures.record(now, outcome is Outcome.TRANSIENT or outcome is Outcome.LATER)
        if self.due.is_set():
            return
        ratio = pause_ratio(self.policy, *self._failures.counts(now))
        if ratio is not None:
            self.ratio = ratio
            self.due.set()

    def settled(self, event: Settled) -> None:
        pass  # what counts is how the handler call ended

    def ended(self) -> None:
        """The pause is over: the failures before it must not trigger the next."""
        self.due.clear()
        self._failures.clear()
