"""When a schedule's occurrences fall (pure). Instants are whole milliseconds since the Unix
epoch, in UTC.

`every` falls on the multiples of its period since the epoch, whatever the zone. `cron` falls on
the zone's wall clock: cronsim matches the five fields against wall-clock times without a zone,
and zoneinfo places each match in time. A wall-clock time that the zone skips that day (the
hour clocks jump forward) has no instant and is skipped; one that it lives twice (the hour
clocks fall back) is taken once, the first time, as fold=0 reads it.
"""

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

UTC = dt.UTC
MS = 1000
# No zone has ever shifted its clock by more than this at once (Samoa skipped a whole day in
# 2011): a reverse search starts this far ahead on the wall clock so that no match is missed.
LARGEST_SHIFT = dt.timedelta(days=1, hours=1)
CRON_FIELDS = 5


def utc_text(at_ms: int) -> str:
    """An instant as ISO-8601 UTC with milliseconds and Z (2026-11-26T18:15:00.000Z)."""
    when = dt.datetime.fromtimestamp(at_ms / MS, UTC)
    return when.isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"


@dataclass(frozen=True)
class Every:
    """Occurrences on the multiples of period_ms since the epoch."""

    period_ms: int

    @property
    def text(self) -> str:
        """The period in seconds, as `ricochet schedules` shows the rule."""
        seconds = self.period_ms / MS
        return f"{seconds:g}" if seconds != int(seconds) else str(int(seconds))

    def after(self, at_ms: int) -> int | None:
        """The first occurrence strictly after at_ms."""
        return (at_ms // self.period_ms + 1) * self.period_ms

    def at_or_before(self, at_ms: int) -> int | None:
        """The latest occurrence at or before at_ms."""
        return at_ms // self.period_ms * self.period_ms


@dataclass(frozen=True)
class Cron:
    """Occurrences where a five-field cron expression matches the zone's wall clock."""

    expression: str
    zone: ZoneInfo

    @property
    def text(self) -> str:
        return self.expression

    def after(self, at_ms: int) -> int | None:
        """The first occurrence strictly after at_ms; None when none comes within cronsim's
        horizon (50 years)."""
        # Wall-clock matches place in time in their own order, so the first placed after at_ms
        # is the answer. Starting from at_ms's own wall-clock time may first give matches of an
        # hour lived twice that were placed before at_ms: they are passed over.
        for wall in CronSim(self.expression, _wall(at_ms, self.zone)):
            placed = _instant(wall, self.zone)
            if placed is not None and placed > at_ms:
                return placed
        return None

    def at_or_before(self, at_ms: int) -> int | None:
        """The latest occurrence at or before at_ms; None when none is within 50 years."""
        start = _wall(at_ms, self.zone) + LARGEST_SHIFT
        for wall in CronSim(self.expression, start, reverse=True):
            placed = _instant(wall, self.zone)
            if placed is not None and placed <= at_ms:
                return placed
        return None


Rule = Every | Cron


def _wall(at_ms: int, zone: ZoneInfo) -> dt.datetime:
    """The zone's wall-clock time at an instant, without the zone (seconds: cron has no finer
    field)."""
    local = dt.datetime.fromtimestamp(at_ms // MS, zone)
    return local.replace(tzinfo=None)


def _instant(wall: dt.datetime, zone: ZoneInfo) -> int | None:
    """The instant a wall-clock time stands for in the zone: the first of two (fold=0), or
    None when the zone skips it."""
    placed = wall.replace(tzinfo=zone, fold=0)
    if placed.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return int(placed.timestamp()) * MS


def cron_rule(expression: str, zone: ZoneInfo) -> Cron:
    """A Cron rule; ValueError saying what is wrong with the expression."""
    if not isinstance(expression, str) or len(expression.split()) != CRON_FIELDS:
        raise ValueError(
            f"cron={expression!r} is invalid: five fields are allowed (minute hour "
            "day-of-month month day-of-week)"
        )
    try:
        CronSim(expression, dt.datetime(2000, 1, 1))
    except CronSimError as error:
        raise ValueError(f"cron={expression!r} is invalid: {error}") from None
    return Cron(" ".join(expression.split()), zone)
