"""What a leader enqueues for a schedule, and what it only logs (pure, the clocks passed in).

Every occurrence missed since the last one enqueued that fell due while the process itself saw
its clock run (since it started, or since its clock last jumped) is enqueued: a takeover by a
process that was running skips nothing. Of the missed ones that fell due before (a time with no
worker at all, or one a clock jumped over), only the latest is enqueued, and the others are
skipped and logged. So a clock set forward by an hour enqueues one occurrence, not an hour's.

A clock jumps when the wall clock moves other than the monotonic one between two readings, by
more than the slewing of a clock kept in time explains (NTP slews by at most 500 ppm).
"""

from dataclasses import dataclass

from ricochet.schedules.rules import Rule

# Skipped occurrences counted one by one at most: the log says "at least" beyond.
SKIPPED_COUNTED = 10_000
# A wall clock that moves this much, plus SLEW_PER of the time elapsed, other than the monotonic
# clock has jumped.
JUMP_MS = 1000
SLEW_PER = 1000


@dataclass(frozen=True)
class Reading:
    """The wall clock (ms since the epoch) and the monotonic clock (ms), read together."""

    wall_ms: int
    mono_ms: int


def drift_ms(previous: Reading, current: Reading) -> int:
    """How far the wall clock moved other than the monotonic one between readings (ahead: > 0)."""
    return (current.wall_ms - previous.wall_ms) - (current.mono_ms - previous.mono_ms)


def jumped(previous: Reading, current: Reading) -> bool:
    """Whether the wall clock was set forward or back (or the machine slept) between readings."""
    elapsed_ms = current.mono_ms - previous.mono_ms
    return abs(drift_ms(previous, current)) > JUMP_MS + abs(elapsed_ms) // SLEW_PER


@dataclass(frozen=True)
class Skipped:
    """Missed occurrences a catch-up does not enqueue: how many (at most SKIPPED_COUNTED), the
    first and the last."""

    count: int
    first_ms: int
    last_ms: int


@dataclass(frozen=True)
class CatchUp:
    """The occurrences to enqueue now, in order, the next one after them (None when the rule has
    no more), and those skipped, if any."""

    due: tuple[int, ...]
    next_ms: int | None
    skipped: Skipped | None = None


def catch_up(rule: Rule, accounted_ms: int, seen_ms: int, now_ms: int) -> CatchUp:
    """The catch-up of a rule whose occurrences up to accounted_ms are accounted for (enqueued,
    or before the schedule was first run), for a leader that has seen its clock run since
    seen_ms, at now_ms."""
    latest_before_start = rule.at_or_before(seen_ms - 1)
    due: list[int] = []
    if latest_before_start is not None and latest_before_start > accounted_ms:
        due.append(latest_before_start)
    next_ms = rule.after(max(accounted_ms, seen_ms - 1))
    while next_ms is not None and next_ms <= now_ms:
        due.append(next_ms)
        next_ms = rule.after(next_ms)
    if latest_before_start is None or latest_before_start <= accounted_ms:
        return CatchUp(tuple(due), next_ms)
    first = rule.after(accounted_ms)
    last = rule.at_or_before(latest_before_start - 1)
    if first is None or last is None or first >= latest_before_start:
        return CatchUp(tuple(due), next_ms)
    count = 0
    at: int | None = first
    while at is not None and at < latest_before_start and count < SKIPPED_COUNTED:
        count += 1
        at = rule.after(at)
    return CatchUp(tuple(due), next_ms, Skipped(count, first, last))
