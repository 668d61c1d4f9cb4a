"""The pause decision: a sliding window of finished jobs, a ratio and a minimum count."""

import pytest
from ricochet.delivery.retry import Outcome
from ricochet.worker.pause import FailureWindow, PausePolicy, PauseWatch, pause_ratio

POLICY = PausePolicy(failure_ratio=0.8, min_jobs=10, window_s=30, pause_s=30)


@pytest.mark.parametrize(
    ("policy", "finished", "failed", "ratio"),
    [
        (POLICY, 10, 8, 0.8),  # at the ratio, with the minimum of jobs: pause
        (POLICY, 20, 20, 1.0),
        (POLICY, 10, 7, None),  # below the ratio
        (POLICY, 9, 9, None),  # every job failed, but too few to tell
        (POLICY, 0, 0, None),
        (PausePolicy(0, 10, 30, 30), 50, 50, None),  # ratio 0: pausing is off
        (PausePolicy(1.0, 1, 30, 30), 1, 1, 1.0),  # one job, and it failed
        (PausePolicy(1.0, 1, 30, 30), 5, 4, None),
    ],
)
def test_pause_ratio(policy: PausePolicy, finished: int, failed: int, ratio: float | None) -> None:
    """Pause when at least min_jobs finished and the failed share reaches the ratio."""
    assert pause_ratio(policy, finished, failed) == ratio


@pytest.mark.parametrize(
    ("events", "now", "counts"),
    [
        ([], 0, (0, 0)),
        ([(0, True), (1, False), (2, True)], 2, (3, 2)),
        # Jobs finished more than 30 s before now have left the window.
        ([(0, True), (1, True), (40, False)], 40, (1, 0)),
        ([(0, True), (10, True), (20, False)], 35, (2, 1)),
        ([(0, True), (10, True)], 100, (0, 0)),
        ([(0, True)], 30, (1, 1)),  # exactly window_s old: still in it
    ],
)
def test_window_counts(
    events: list[tuple[float, bool]], now: float, counts: tuple[int, int]
) -> None:
    """The window counts the jobs finished within window_s of now, and the failed ones."""
    window = FailureWindow(30)
    for at, failed in events:
        window.record(at, failed)
    assert window.counts(now) == counts


def test_clear_forgets_every_job() -> None:
    """After a pause the window starts empty: the failures that caused it count no more."""
    window = FailureWindow(30)
    for at in range(20):
        window.record(at, True)
    window.clear()
    window.record(21, False)
    assert window.counts(21) == (1, 0)


@pytest.mark.parametrize(
    ("outcomes", "due"),
    [
        ([Outcome.TRANSIENT] * 4, True),
        ([Outcome.LATER] * 4, True),  # RetryLater fails transiently too (a 429, say)
        ([Outcome.TRANSIENT, Outcome.LATER, Outcome.SUCCEEDED, Outcome.SUCCEEDED], True),
        ([Outcome.PERMANENT] * 4, False),  # the job's own fault: its dependency may be fine
        ([Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.LATER], False),
    ],
)
def test_watch_asks_for_a_pause_when_most_calls_fail_transiently(
    outcomes: list[Outcome], due: bool
) -> None:
    """The watch counts transient failures (RetryLater among them) against every call, and
    asks for a pause once their share reaches the ratio over at least min_jobs calls."""
    watch = PauseWatch(PausePolicy(failure_ratio=0.5, min_jobs=4, window_s=60, pause_s=1))
    for outcome in outcomes:
        watch.attempted(outcome, 0.01)
    assert watch.due.is_set() is due
    watch.ended()
    assert not watch.due.is_set()
