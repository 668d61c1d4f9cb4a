"""A retry tier's waiting jobs, listed from the records of their retries (pure), when the records
account for every job the tier holds.

A look that reads a tier has its queue deliver every job and take it back, beside expiring and
dead-lettering the jobs that fall due: at thousands a second on one queue process, that is what
makes the jobs falling due meanwhile late (docs/performance.md). Every retry into a tier is
recorded (ricochet.broker.retries) with when it went there, its tier and its type, and a job
stays in a tier for exactly its TTL: so a tier holds, at a moment, the jobs recorded into it a
TTL or less before. When those are as many as the broker says the tier holds, the look lists
them from their records and reads nothing of it.

The count comes first, and the records are read up to a marker sent after it: the records of the
jobs it took in are all read, however many retries come in while they are (the records of those
that came after it are read too, and left out). A record near the count's moment may or may not be
in it: coming in within ARRIVING_MS before it (its nack a moment behind the record), or leaving
within LEAVING_MS before it (a broker late to expire it), each with SKEW_MS after it for clocks
apart. So the records account for the tier when the depth is no less than the records surely in it
and no more than those with the ones near the moment. Any other difference reads the tier: a job
without a record (a record lost, a job of an earlier ricochet, one published there by hand) or a
record without its job (its nack lost). A jittered tier (its lane is the broker's choice, which no
record knows) and every tier of a queue whose records in the window include one that names no tier
(an earlier ricochet's, a job's without an id or with a type too long to record) are always read.

What the count cannot tell: as many jobs without a record as there are records near its moment
whose jobs had already left (or not yet come). While jobs leave a tier continuously, a job
published there by hand, or one whose record was lost on its own, can go unlisted that way, never
lost or delayed; with no job leaving near the count, the look reads the tier and lists it. A
worker killed or cut off leaves no such job: it writes a retry's record ahead of its nack.
"""

import datetime as dt
from collections.abc import Iterable

from ricochet.broker.retries import Retried
from ricochet.ops.waits import Place, Waiting

# Around the moment a tier's depth was read, what a record cannot settle: a job recorded a
# moment before its nack reached the tier, clocks apart (the worker's, the look's), a broker
# late to expire a job.
ARRIVING_MS = 1_000
LEAVING_MS = 1_000
SKEW_MS = 500

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
        if came_ms > counted_at_ms + SKEW_MS or leaves_ms <= counted_at_ms - LEAVING_MS:
            continue  # it came after the count, or had left before it
        if came_ms > counted_at_ms - ARRIVING_MS or leaves_ms <= counted_at_ms + SKEW_MS:
            maybe += 1  # coming in or leaving as the broker counted: counted or not
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
    return rows if surely <= depth <= surely + maybe else None
