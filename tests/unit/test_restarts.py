"""When the parent starts a dead worker process again, and when it is in a crash loop."""

import pytest
from ricochet.processes.restarts import CRASH_LOOP, MAX_WAIT_S, STABLE_S, Restarts


def after(*lives_s: float) -> Restarts:
    restarts = Restarts()
    for lived_s in lives_s:
        restarts = restarts.died(lived_s)
    return restarts


@pytest.mark.parametrize(
    ("lives_s", "wait_s"),
    [
        ((3600,), 0.0),  # a process killed after working a while: started again at once
        ((1,), 0.0),  # one quick death: at once too
        ((1, 1), 0.5),
        ((1, 1, 1), 1.0),
        ((1, 1, 1, 1), 2.0),
        ((1,) * 20, MAX_WAIT_S),  # capped
        ((1, 1, 1, STABLE_S), 0.0),  # a process that lived STABLE_S ends the loop
        ((1, 1, 1, STABLE_S, 1, 1), 0.5),
    ],
)
def test_wait_doubles_for_quick_deaths_in_a_row(lives_s: tuple[float, ...], wait_s: float) -> None:
    """No wait after one death; each quick death in a row doubles the wait, up to the cap."""
    assert after(*lives_s).wait_s == wait_s


@pytest.mark.parametrize(
    ("lives_s", "alive_for_s", "looping"),
    [
        ((1,) * (CRASH_LOOP - 1), None, False),
        ((1,) * CRASH_LOOP, None, True),  # waiting to start again
        ((1,) * CRASH_LOOP, 2.0, True),  # started again, not for long yet
        ((1,) * CRASH_LOOP, STABLE_S, False),  # the new one has lived STABLE_S
        ((1, 1, 1, 600), None, False),  # its last process lived long: not a loop
    ],
)
def test_crash_loop(lives_s: tuple[float, ...], alive_for_s: float | None, looping: bool) -> None:
    """CRASH_LOOP quick deaths in a row are a crash loop until a process lives STABLE_S."""
    assert after(*lives_s).crash_loop(alive_for_s) is looping
