"""What a process that becomes leader enqueues for a schedule, and what it only logs (pure).

Every occurrence missed since the last one enqueued that fell due once the process itself had
started is enqueued: a takeover by a process that was running skips nothing. Of the missed ones
that fell due before it started (a time with no worker at all), only the latest is enqueued,
and the others are skipped and logged.
"""

from dataclasses import dataclass

from ricochet.schedules.rules import Rule

# Skipped occurrences counted one by one at most: the log says "at least" beyond.
SKIPPED_COUNTED = 10_000


@dataclass(frozen=True)
class Skipped:
    """Missed occurrences a catch-up does not enqueue: how many (at most SKIPPED_COUNTED), the
    first and the last."""

    count: int
    first_ms: int
    last_ms: int


@dataclass(frozen=True)
class CatchUp:
    """The occurrences to enqueue now, in order, and those skipped, if any."""

    due: tuple[int, ...]
    skipped: Skipped | None = None


def catch_up(rule: Rule, accounted_ms: int, started_ms: int, now_ms: int) -> CatchUp:
    """The catch-up of a rule whose occurrences up to accounted_ms are accounted for (enqueued,
    or before the schedule was first run), for a leader started at started_ms, at now_ms."""
    latest_before_start = rule.at_or_before(started_ms - 1)
    due: list[int] = []
    if latest_before_start is not None and latest_before_start > accounted_ms:
        due.append(latest_before_start)
    at = rule.after(max(accounted_ms, started_ms - 1))
    while at is not None and at <= now_ms:
        due.append(at)
        at = rule.after(at)
    if latest_before_start is None or latest_before_start <= accounted_ms:
        return CatchUp(tuple(due))
    first = rule.after(accounted_ms)
    last = rule.at_or_before(latest_before_start - 1)
    if first is None or last is None or first >= latest_before_start:
        return CatchUp(tuple(due))
    count, at = 0, first
    while at is not None and at < latest_before_start and count < SKIPPED_COUNTED:
        count += 1
        at = rule.after(at)
    return CatchUp(tuple(due), Skipped(count, first, last))
