"""How a queue's topology is declared again: the backoff between tries, and when a conflict at
start stops the worker (SPEC 24)."""

import pytest
from ricochet.worker.redeclare import (
    CONFLICT_MAX_WAIT_S,
    FIRST_WAIT_S,
    GONE_MAX_WAIT_S,
    exits_at_start,
    wait_s,
)


@pytest.mark.parametrize(
    ("tries", "conflict", "expected_s"),
    [
        (1, False, FIRST_WAIT_S),
        (2, False, 2 * FIRST_WAIT_S),
        (3, False, 4 * FIRST_WAIT_S),
        (6, False, 3.2),
        (7, False, GONE_MAX_WAIT_S),  # capped: a queue gone comes back soon
        (50, False, GONE_MAX_WAIT_S),
        (1, True, FIRST_WAIT_S),  # a conflict mended at once is seen at once
        (3, True, 4 * FIRST_WAIT_S),
        (7, True, 6.4),  # beyond the cap of a queue gone: only an operator mends a conflict
        (9, True, 25.6),
        (10, True, CONFLICT_MAX_WAIT_S),
        (1000, True, CONFLICT_MAX_WAIT_S),
    ],
)
def test_the_wait_doubles_up_to_its_cap(tries: int, conflict: bool, expected_s: float) -> None:
    """From FIRST_WAIT_S, doubling at each failed try in a row, up to a few seconds for a queue
    gone or a channel lost, and up to CONFLICT_MAX_WAIT_S for a queue in conflict."""
    assert wait_s(tries, conflict) == pytest.approx(expected_s)


@pytest.mark.parametrize(
    ("first_start", "queues", "in_conflict", "exits"),
    [
        (True, 1, 1, True),  # a worker of one queue in conflict at start: exit 2, as before
        (True, 1, 0, False),
        (True, 2, 1, False),  # runs the queue it can, reports the other
        (True, 3, 2, False),
        (True, 2, 2, True),  # none it can run (a shared object in conflict, say)
        (False, 1, 1, False),  # once it has run, a connection again: it declares again
        (False, 2, 2, False),
    ],
)
def test_a_conflict_stops_the_worker_only_at_start_with_no_queue_to_run(
    first_start: bool, queues: int, in_conflict: int, exits: bool
) -> None:
    assert exits_at_start(first_start, queues, in_conflict) is exits
