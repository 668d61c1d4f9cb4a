"""Which finished deliveries one multiple ack may cover, and which are acked one by one."""

import pytest

from app.acks import plan_acks


@pytest.mark.parametrize(
    ("running", "finished", "multiple", "singles"),
    [
        (set(), [], None, []),
        (set(), [7], None, [7]),
        (set(), [3, 1, 2], 3, []),  # everything finished: one ack covers all
        ({5}, [1, 2, 3], 3, []),  # all below the oldest running delivery
        ({2}, [1, 3, 4], None, [1, 3, 4]),  # only one below it: single acks
        ({2, 9}, [1, 3, 4, 5], None, [1, 3, 4, 5]),
        ({4}, [1, 2, 3, 6, 5], 3, [5, 6]),  # those above a running one are acked singly
        ({1}, [2, 3], None, [2, 3]),  # a running (or not yet nacked) delivery is never covered
    ],
)
def test_plan_acks(
    running: set[int], finished: list[int], multiple: int | None, singles: list[int]
) -> None:
    """A multiple ack reaches exactly the finished deliveries below the oldest running one;
    every other finished delivery is acked on its own at once."""
    assert plan_acks(running, finished) == (multiple, singles)
