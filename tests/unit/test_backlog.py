"""The oldest failed copy's failure time, known from the failures seen and the queue's depth."""

import pytest
from ricochet.monitor.backlog import FailedBacklog, failed_at_s

STARTED_S = 1000.0


# (failure times seen in order, depth of the failed queue) -> when its oldest copy failed
@pytest.mark.parametrize(
    ("seen", "depth", "expected"),
    [
        pytest.param([], 0, None, id="empty queue"),
        pytest.param([1100.0, 1200.0], 0, None, id="all copies gone"),
        pytest.param([1100.0, 1200.0, 1300.0], 3, 1100.0, id="every copy still there"),
        pytest.param([1100.0, 1200.0, 1300.0], 1, 1300.0, id="oldest two taken from the head"),
        pytest.param([1100.0, 1200.0], 5, 1100.0, id="older copies than seen: bound by oldest"),
        pytest.param([], 2, STARTED_S, id="none seen: copies failed before the start"),
    ],
)
def test_oldest(seen: list[float], depth: int, expected: float | None) -> None:
    """The depth-th newest failure seen is the oldest copy; with more copies, a bound."""
    backlog = FailedBacklog(STARTED_S, remembered=10)
    for at_s in seen:
        backlog.failed(at_s)
    assert backlog.oldest(depth) == expected


def test_oldest_remembers_a_bounded_number() -> None:
    """Beyond what it remembers, the oldest failure it still knows bounds the answer."""
    backlog = FailedBacklog(STARTED_S, remembered=2)
    for at_s in (1100.0, 1200.0, 1300.0):
        backlog.failed(at_s)
    assert backlog.oldest(2) == 1200.0
    assert backlog.oldest(3) == 1200.0


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param("2024-01-01T00:00:10+00:00", 1704067210.0, id="as the worker writes it"),
        pytest.param("2024-01-01T01:00:10+01:00", 1704067210.0, id="another offset"),
        pytest.param("2024-01-01T00:00:10", 1704067210.0, id="no offset: UTC"),
        pytest.param("yesterday", 5.0, id="not a time: now"),
        pytest.param(None, 5.0, id="missing: now"),
    ],
)
def test_failed_at_s(header: str | None, expected: float) -> None:
    """The failed-at header in Unix seconds, falling back to the time it was read."""
    assert failed_at_s(header, now_s=5.0) == expected
