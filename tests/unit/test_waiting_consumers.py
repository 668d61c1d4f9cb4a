"""How many consumers a read of waiting jobs takes on a queue
(ricochet.ops.waiting_scan.may_add_consumer)."""

from ricochet.ops.scan import PER_CONSUMER
from ricochet.ops.waiting_scan import SOON_MOST, SOON_S, may_add_consumer

NOW = 1_000_000.0
SOON = NOW + SOON_S / 2
LATE = NOW + SOON_S * 2
CAP = SOON_MOST // PER_CONSUMER + 1  # SOON_MOST, and one consumer's room beside it


def test_consumers_of_jobs_that_leave_soon_stop_at_the_cap() -> None:
    taken = [n for n in range(CAP + 3) if may_add_consumer(n, SOON, NOW)]
    assert max(taken) + 1 == CAP


def test_at_the_cap_no_consumer_is_added_however_little_they_hold() -> None:
    """What the consumers may hold counts: a queue slow to deliver leaves them holding little,
    and another consumer would let the scan hold past SOON_MOST once it delivers."""
    assert not may_add_consumer(CAP, SOON, NOW)


def test_jobs_that_leave_later_are_read_with_as_many_consumers_as_it_takes() -> None:
    assert may_add_consumer(CAP * 10, LATE, NOW)
