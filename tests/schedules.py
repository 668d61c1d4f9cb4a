"""What the tests of recurring jobs share: the times occurrences are named for, the occurrences
tests.handlers:ticks ran, the leads the worker processes took, and state forged in the
schedules' store."""

import datetime as dt
import time
from collections.abc import Mapping
from pathlib import Path

from aio_pika.abc import AbstractConnection
from ricochet.broker.publish import confirming_channel
from ricochet.broker.schedule_store import Entry, write_state

from tests.support import journal, log_events

EVERY_S = 1


def now_ms() -> int:
    """The wall-clock time, in ms since the epoch."""
    return time.time_ns() // 1_000_000


def occurrence_ms(message_id: str) -> int:
    """The time a message_id `<name>@<ISO-8601 UTC>Z` names, in ms."""
    text = message_id.partition("@")[2]
    assert text.endswith("Z"), message_id
    assert len(text) == len("2026-11-26T18:15:00.000Z"), message_id
    when = dt.datetime.fromisoformat(text.removesuffix("Z") + "+00:00")
    return round(when.timestamp() * 1000)


def assert_unbroken(ids: list[str], period_ms: int) -> None:
    """Every occurrence from the first to the last, once each."""
    times = sorted({occurrence_ms(i) for i in ids})
    assert times == list(range(times[0], times[-1] + 1, period_ms)), times
    assert all(t % period_ms == 0 for t in times)


def ticked(journal_path: Path) -> list[tuple[str, int]]:
    """(message_id, when it ran, ms) of each occurrence tests.handlers:ticks ran, in order."""
    return [(m, at) for event, m, at in journal(journal_path) if event == "ran"]


def leads(*logs: Path) -> int:
    """How many times the processes writing these logs took the lead of their schedules."""
    return sum(
        line["event"] == "leading schedules"
        for log in logs
        if log.exists()
        for line in log_events(log.read_text())
    )


async def forge_state(
    connection: AbstractConnection, queue: str, last_ms: Mapping[str, int]
) -> None:
    """Write a state of queue's schedules to their store, as anyone who may publish in the vhost
    can: each schedule named says its last occurrence was at last_ms (whatever that is)."""
    channel = await confirming_channel(connection)
    await write_state(channel, queue, {name: Entry(ms, 0) for name, ms in last_ms.items()})
    await channel.close()
