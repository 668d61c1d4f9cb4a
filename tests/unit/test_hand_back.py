"""In what nacks a scan hands back what it holds (ricochet.ops.hand_back)."""

from ricochet.ops.hand_back import nacks


def test_deliveries_below_every_one_still_held_go_back_in_one_multiple_nack() -> None:
    assert nacks([3, 1, 2], kept_below=7) == [(3, True)]


def test_with_nothing_else_held_every_delivery_goes_back_in_one_nack() -> None:
    assert nacks([9, 4, 12], kept_below=None) == [(12, True)]


def test_a_delivery_above_one_still_held_goes_back_alone() -> None:
    """A multiple nack up to 15 would hand back 5, which the scan still holds."""
    assert nacks([2, 15, 3, 21], kept_below=5) == [(3, True), (15, False), (21, False)]


def test_with_every_delivery_above_one_held_each_goes_back_alone() -> None:
    assert nacks([8, 6], kept_below=2) == [(6, False), (8, False)]


def test_nothing_to_hand_back_sends_no_nack() -> None:
    assert nacks([], kept_below=None) == []
