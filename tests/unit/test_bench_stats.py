"""The benchmark's statistics: percentiles and paired ratios."""

import pytest

from bench.stats import median, paired_ratios, percentile


@pytest.mark.parametrize(
    ("values", "pct", "expected"),
    [
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),
        (list(map(float, range(101))), 99, 99.0),
        ([0.0, 10.0], 99, 9.9),
        ([-3.0, 7.0, 1.0], 50, 1.0),
    ],
)
def test_percentile_interpolates_between_closest_ranks(
    values: list[float], pct: float, expected: float
) -> None:
    """The pth percentile of unsorted values, interpolated linearly between ranks."""
    assert percentile(values, pct) == pytest.approx(expected)


@pytest.mark.parametrize(("values", "pct"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses_what_has_no_answer(values: list[float], pct: float) -> None:
    """No values, or a percentile outside 0-100, is an error rather than a made-up number."""
    with pytest.raises(ValueError, match="percentile"):
        percentile(values, pct)


def test_ratios_pair_each_repeat_with_its_own_baseline() -> None:
    """Each run is compared with the baseline measured next to it, not with their median."""
    assert paired_ratios([90.0, 45.0], [100.0, 50.0]) == [0.9, 0.9]
    assert median(paired_ratios([90.0, 45.0, 10.0], [100.0, 50.0, 100.0])) == 0.9
    with pytest.raises(ValueError, match="as many"):
        paired_ratios([1.0], [1.0, 2.0])
