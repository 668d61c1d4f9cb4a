"""The status table points to the way of reading failure reasons when Q.failed is not empty."""

import pytest
from ricochet.ops.report import QueueStatus, status_table


@pytest.mark.parametrize(("failed", "hint"), [(0, False), (None, False), (3, True)])
def test_status_hint(failed: int | None, hint: bool) -> None:
    """Only a non-empty failed queue adds the replay --dry-run --group-by reason hint."""
    rows = [
        QueueStatus("jobs", "main", None, 1, 2),
        QueueStatus("jobs.failed", "failed", None, failed, 0),
    ]
    text = status_table(rows)
    assert ("ricochet replay --dry-run --group-by reason" in text) is hint
    if hint:
        assert text.endswith(
            "3 failed jobs: 'ricochet replay --dry-run --group-by reason' "
            "counts them by reason without moving any"
        )
