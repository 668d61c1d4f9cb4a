"""The console's view of the failed queue: its copies grouped by failure reason (pure)."""

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from ricochet.delivery.failed import FailureInfo

# A group lists this many of its jobs; the rest are counted (and listed by `ricochet failed list`).
JOBS_SHOWN = 100


@dataclass
class ReasonGroup:
    """The copies that failed with one reason, in queue order (oldest first)."""

    reason: str
    count: int = 0
    types: set[str] = field(default_factory=set)
    newest_failed_at: str | None = None
    jobs: list[FailureInfo] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        """A stable id for links to the group: the same reason gives the same anchor."""
        return "g-" + hashlib.sha256(self.reason.encode()).hexdigest()[:12]

    @property
    def hidden(self) -> int:
        """Jobs of the group that the page does not list."""
        return self.count - len(self.jobs)


def group_by_reason(
    failures: Iterable[FailureInfo], jobs_shown: int = JOBS_SHOWN
) -> list[ReasonGroup]:
    """Groups by exact reason, the largest first (then the most recent); each lists at most
    jobs_shown of its jobs. failed_at values are ISO-8601 UTC, so they compare as text."""
    groups: dict[str, ReasonGroup] = {}
    for failure in failures:
        group = groups.setdefault(failure.reason, ReasonGroup(failure.reason))
        group.count += 1
        group.types.add(failure.type or "-")
        if failure.failed_at and (
            group.newest_failed_at is None or failure.failed_at > group.newest_failed_at
        ):
            group.newest_failed_at = failure.failed_at
        if len(group.jobs) < jobs_shown:
            group.jobs.append(failure)
    return sorted(groups.values(), key=lambda g: (-g.count, _descending(g.newest_failed_at)))


def _descending(text: str | None) -> tuple[int, ...]:
    """A sort key that puts later times first, and groups without a time last."""
    return tuple(-ord(c) for c in text) if text else (1,)
