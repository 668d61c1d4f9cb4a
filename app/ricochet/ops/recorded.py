"""A retry tier's waiting jobs, listed from the records of their retries (pure), when the records
account for every job the tier holds.

A look that reads a tier has its queue deliver every job and take it back, beside expiring and
dead-lettering the jobs that fall due: at thousands a second on one queue process, that is what
makes the jobs falling due meanwhile late (docs/performance.md). Every retry into a tier is
recorded (ricochet.broker.retries) with when it went there, its tier and its type, and a job
stays in a tier for exactly its TTL: so a tier holds, at a moment, the jobs recorded into it a
TTL or less before. When those are as many as the broker says the tier holds, the look lists
them from their records and reads nothing of it.

The count is checked at the moment the broker gave the depth, with COUNT_SLACK_MS on either side
for what the clocks cannot settle (a job recorded a moment before its nack reached the tier,
clocks a little apart, a broker late to expire a job). Any other difference (a record lost with
its worker's connection, a job of an earlier ricochet, a record whose job never reached the tier,
a jittered tier, whose lane is the broker's choice) sends the look to read the tier, as it
always could.
"""

import datetime as dt
from collections.abc import Iterable

from ricochet.broker.retries import Retried
from ricochet.ops.waits import Place, Waiting

# Either side of the moment a tier's depth was read, a record may or may not be counted in it.
COUNT_SLACK_MS = 2_000

# (message_id, the failed attempt, what its record says): the records of one tier's retries.
TierRecords = Iterable[tuple[str, int, Retried]]


def listed_from_records(
    place: Place,
    queue: str,
    depth: int,
    counted_at_ms: int,
    records: TierRecords,
    now: dt.datetime,
) -> list[Waiting] | None:
    """The jobs of queue's tier `place` still waiting now, from the records of their retries
    into it; None when the records do not account for the depth the broker gave at
    counted_at_ms (the tier must be read)."""
    surely = maybe = 0
    rows = []
    now_ms = now.timestamp() * 1000
    for message_id, attempt, record in records:
        came_ms, leaves_ms = record.at_ms, record.at_ms + place.ttl_ms
        if came_ms > counted_at_ms + COUNT_SLACK_MS or leaves_ms < counted_at_ms - COUNT_SLACK_MS:
            continue  # not in the tier when it was counted, whatever the clocks
        if counted_at_ms - COUNT_SLACK_MS < came_ms or leaves_ms <= counted_at_ms + COUNT_SLACK_MS:
            maybe += 1
        else:
            surely += 1
        if leaves_ms > now_ms:
            due = dt.datetime.fromtimestamp(leaves_ms / 1000, dt.UTC)
            rows.append(
                Waiting(
                    message_id=message_id,
                    type=record.type,
                    queue=queue,
                    attempt=attempt + 1,
                    due_at=due,
                    reason=record.reason,
                    place=place.name,
                    leaves_at=due,
                    exact=True,
                )
            )
    if not surely <= depth <= surely + maybe:
        return None
    return rows
