"""What `ricochet schedules` and the console's /schedules show: each schedule of the handler's
Router with its rule, its next occurrence and the last one its queue's leader enqueued (read
from the schedules' store)."""

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from aio_pika.abc import AbstractConnection

from ricochet.broker.schedule_store import State, read_states
from ricochet.schedules.rules import Every, utc_text
from ricochet.schedules.schedule import Schedule


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as the command prints it; times ISO-8601 UTC, or None."""

    name: str
    job_type: str
    queue: str
    rule: str | int | float
    timezone: str
    next_at: str | None
    last_at: str | None

    def as_dict(self) -> dict[str, object]:
        """The JSON object of `ricochet schedules --json`: SPEC 22's keys."""
        shown = asdict(self)
        del shown["queue"]
        return shown


def schedule_rows(
    schedules: Sequence[Schedule],
    default_queue: str,
    states: Mapping[str, State],
    now_ms: int,
) -> list[ScheduleRow]:
    """The rows (pure): rule is the cron text, or the period in seconds."""
    rows = []
    for schedule in schedules:
        queue = schedule.queue or default_queue
        entry = states.get(queue, {}).get(schedule.name)
        upcoming = schedule.rule.after(now_ms)
        rule = schedule.rule
        rows.append(
            ScheduleRow(
                schedule.name,
                schedule.job_type,
                queue,
                _seconds(rule.period_ms) if isinstance(rule, Every) else rule.expression,
                schedule.timezone,
                None if upcoming is None else utc_text(upcoming),
                None if entry is None or entry.last_ms is None else utc_text(entry.last_ms),
            )
        )
    return rows


def _seconds(period_ms: int) -> int | float:
    return period_ms // 1000 if period_ms % 1000 == 0 else period_ms / 1000


async def read_schedules(
    connection: AbstractConnection, schedules: Sequence[Schedule], default_queue: str, now_ms: int
) -> list[ScheduleRow]:
    """The rows, with each queue's state as its leader last recorded it."""
    queues = {schedule.queue or default_queue for schedule in schedules}
    states = await read_states(connection, queues) if queues else {}
    return schedule_rows(schedules, default_queue, states, now_ms)
