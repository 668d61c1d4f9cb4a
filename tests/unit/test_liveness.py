"""Whether the parent counts a worker process alive, late (not ready) or wedged (to be killed),
from its last beat, the time, and the longest its handlers may run."""

import pytest
from ricochet.processes.liveness import LATE_S, WEDGED_AFTER_S, Liveness, liveness

NOW = 1000.0


@pytest.mark.parametrize(
    ("silent_s", "longest_timeout_s", "expected"),
    [
        (None, 2.0, Liveness.ALIVE),  # no beat yet: its handler is still being imported
        (0.0, 2.0, Liveness.ALIVE),
        (LATE_S, 2.0, Liveness.ALIVE),
        (LATE_S + 0.1, 2.0, Liveness.LATE),  # beats missed: not ready
        (2.0 + WEDGED_AFTER_S, 2.0, Liveness.LATE),
        (2.0 + WEDGED_AFTER_S + 0.1, 2.0, Liveness.WEDGED),
        (200.0, 300.0, Liveness.LATE),  # a handler may hold the loop for its whole timeout
        (300.0 + WEDGED_AFTER_S + 0.1, 300.0, Liveness.WEDGED),
        (WEDGED_AFTER_S + 0.6, 0.5, Liveness.WEDGED),
        (-5.0, 2.0, Liveness.ALIVE),  # a beat stamped after now (clocks read in two places)
    ],
)
def test_liveness(silent_s: float | None, longest_timeout_s: float, expected: Liveness) -> None:
    """Late after LATE_S without a beat; wedged once the longest handler timeout has passed,
    and WEDGED_AFTER_S more, so that the parent sees it within that timeout + 10 s."""
    last_beat_s = None if silent_s is None else NOW - silent_s
    assert liveness(last_beat_s, NOW, longest_timeout_s) is expected
