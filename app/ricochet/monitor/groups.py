"""The console's view of the failed queue: its copies grouped by failure reason, and the groups
cut into pages (pure)."""

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from ricochet.delivery.failed import REASON_MAX_CHARS, FailureInfo
from ricochet.ops.waits import Waiting

# A page lists at most this many jobs, of at most this many groups. With the console's templates
# clipping what they show of each value, that keeps a page under 1 MB whatever the jobs carry
# (tests/unit/test_console_pages.py renders the worst case).
JOBS_PER_PAGE = 200
GROUPS_PER_PAGE = 20
# The table at the head of a page lists this many reasons, from the page's first on: a group
# larger than a page fills it alone, and the table still shows what else failed.
REASONS_LISTED = 25


@dataclass
class ReasonGroup:
    """The copies that failed with one reason, in queue order (oldest first)."""

    reason: str
    count: int = 0
    types: set[str] = field(default_factory=set)
    newest_failed_at: str | None = None
    jobs: list[FailureInfo] = field(default_factory=list)
    page: int = 1  # the page its jobs start on

    @property
    def anchor(self) -> str:
        """A stable id for links to the group: the same reason gives the same anchor."""
        return "g-" + hashlib.sha256(self.reason.encode()).hexdigest()[:12]

    @property
    def too_long(self) -> bool:
        """A reason longer than ricochet writes (from a copy another client made): a page shows
        it clipped and carries it in no form."""
        return len(self.reason) > REASON_MAX_CHARS


def group_by_reason(failures: Iterable[FailureInfo]) -> list[ReasonGroup]:
    """Groups by exact reason, the largest first (then the most recent). failed_at values are
    ISO-8601 UTC, so they compare as text."""
    groups: dict[str, ReasonGroup] = {}
    for failure in failures:
        group = groups.setdefault(failure.reason, ReasonGroup(failure.reason))
        group.count += 1
        group.types.add(failure.type or "-")
        if failure.failed_at and (
            group.newest_failed_at is None or failure.failed_at > group.newest_failed_at
        ):
            group.newest_failed_at = failure.failed_at
        group.jobs.append(failure)
    return sorted(groups.values(), key=lambda g: (-g.count, _descending(g.newest_failed_at)))


def _descending(text: str | None) -> tuple[int, ...]:
    """A sort key that puts later times first, and groups without a time last."""
    return tuple(-ord(c) for c in text) if text else (1,)


@dataclass(frozen=True)
class Part:
    """The jobs of a group that one page lists: group.jobs[start:stop]."""

    group: ReasonGroup
    start: int
    stop: int

    @property
    def jobs(self) -> list[FailureInfo]:
        return self.group.jobs[self.start : self.stop]

    @property
    def cut(self) -> bool:
        """Whether other pages list some of the group's jobs."""
        return self.stop - self.start < self.group.count


@dataclass(frozen=True)
class Page:
    """One page of the list: its number (from 1), the parts of groups it lists, the positions
    of its first and last job among all the pages' (from 1), and of its first group."""

    number: int
    parts: list[Part]
    first_job: int
    last_job: int
    first_group: int


@dataclass(frozen=True)
class Listing:
    """The failed queue as the console lists it: the groups, and the pages they fill (one, empty,
    for an empty queue)."""

    groups: list[ReasonGroup]
    pages: list[Page]

    @property
    def total(self) -> int:
        return sum(g.count for g in self.groups)

    def reasons_from(self, page: Page, listed: int = REASONS_LISTED) -> list[ReasonGroup]:
        """The groups of this page and of the pages after it, at most listed of them."""
        return self.groups[page.first_group : page.first_group + listed]


def listing(
    failures: Iterable[FailureInfo],
    jobs_per_page: int = JOBS_PER_PAGE,
    groups_per_page: int = GROUPS_PER_PAGE,
) -> Listing:
    """The groups of these failures, cut into pages in order: a page ends when it lists
    jobs_per_page jobs or groups_per_page groups, and a group too large for what is left of a
    page goes on over the next ones, so the pages list every job once."""
    groups = group_by_reason(failures)
    pages: list[Page] = []
    parts: list[Part] = []
    listed = 0  # jobs on the pages so far, the current one included
    on_page = 0
    first_group = 0  # the index of the current page's first group
    for index, group in enumerate(groups):
        start = 0
        while start < group.count:
            if on_page == jobs_per_page or len(parts) == groups_per_page:
                first_job = listed - on_page + 1
                pages.append(Page(len(pages) + 1, parts, first_job, listed, first_group))
                parts, on_page, first_group = [], 0, index
            if start == 0:
                group.page = len(pages) + 1
            stop = min(group.count, start + jobs_per_page - on_page)
            parts.append(Part(group, start, stop))
            on_page += stop - start
            listed += stop - start
            start = stop
    pages.append(Page(len(pages) + 1, parts, listed - on_page + 1, listed, first_group))
    return Listing(groups, pages)


# The waiting page lists at most this many jobs (the soonest due), of at most this many reasons:
# under 1 MB whatever they carry, as a page of failed jobs.
WAITING_SHOWN = 200
WAITING_REASONS = 20


@dataclass
class WaitingGroup:
    """The waiting jobs whose last failure had one reason (None: scheduled, no failure), the
    soonest due first, and how many of them there are in all."""

    reason: str | None
    count: int = 0
    types: set[str] = field(default_factory=set)
    jobs: list[Waiting] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        text = "" if self.reason is None else self.reason
        return "w-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def waiting_groups(rows: Iterable[Waiting]) -> list[WaitingGroup]:
    """The waiting jobs grouped by the reason of their last failure, the largest group first;
    the page's first WAITING_SHOWN jobs (soonest due) in the first WAITING_REASONS groups."""
    groups: dict[str | None, WaitingGroup] = {}
    shown = 0
    for row in sorted(rows, key=lambda r: r.due_at):
        group = groups.setdefault(row.reason, WaitingGroup(row.reason))
        group.count += 1
        if row.type is not None:
            group.types.add(row.type)
        if shown < WAITING_SHOWN:
            group.jobs.append(row)
            shown += 1
    ordered = sorted(groups.values(), key=lambda g: -g.count)
    return ordered[:WAITING_REASONS]
