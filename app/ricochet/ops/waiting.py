"""`ricochet waiting` and the console's /waiting: the jobs RabbitMQ holds for a later attempt
(SPEC 23, 26), listed from what was written down, never by reading the queues that hold them.

A job's latest entry in the journal says where it waits and until when: a worker's `retrying`
(its tier, or the delays, and the due time the broker applies), `scheduled`, a Client's
`enqueued` with a run-at. The list takes those still due, read from the monitor's index when it
is given, else from the journal read back over the longest wait a tier applies (LOOKBACK_SLACK
more, and LOOKBACK_LEAST at least). Beside them, the broker's depth of each place: the queue's
tiers (with their lanes) and the shared levels of the delays (every queue's jobs). What a place
holds beyond the jobs the journal puts there is counted as unrecorded, never hidden: a job whose
entry is older than the read, or was never written (a worker killed between its nack and its
entry, the journal off), or one another tool published there. A job a recorded cancel covers
(by time, as for a job of another producer: a cancel covers what was enqueued before it) is
marked cancelled: a worker acks it as such when it comes due.

`show` reads the job's message where it waits (ricochet.ops.waiting_scan): in the place its
journal names, or in every place when the journal does not know it.
"""

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

from aio_pika.abc import AbstractConnection

from ricochet.broker.cancel_log import CancelLog
from ricochet.broker.cancels import read_cancels
from ricochet.broker.journal import now_ms
from ricochet.broker.plan import Plan
from ricochet.broker.record import declared_plan
from ricochet.broker.register import amqp_user
from ricochet.names import SHARED
from ricochet.ops.jobs import JobHistory, read_jobs
from ricochet.ops.waiting_scan import Retried, depths, places, read_places
from ricochet.ops.waits import Listing, Place, Shown, Waiting, next_attempt
from ricochet.settings import Settings

# The journal is read back this much before the longest wait a tier applies (clocks apart, an
# entry written a moment after its nack), and never less than LOOKBACK_LEAST (the jobs due later
# in the delays that were sent there within it are listed; older ones are counted).
LOOKBACK_SLACK = dt.timedelta(seconds=60)
LOOKBACK_LEAST = dt.timedelta(hours=1)
# Where a job in the shared levels of the delays waits, whichever level holds it now.
DELAYS = f"{SHARED.delay(0)[:-1]}*"
# Jobs a list reads between two turns of the event loop.
CHUNK = 20_000


def place_of(job: JobHistory, plan: Plan) -> str:
    """Where the job waits, as the journal tells it: its tier, or the delays."""
    return DELAYS if job.tier is None else plan.names.tier(job.tier)


def enqueued_ms(job: JobHistory) -> int:
    """When the job was enqueued, as the journal tells it: its last `enqueued` entry (an id
    enqueued again is another job), else its first entry (a job of another producer appears from
    its first delivery)."""
    times = cast(list[int], job.events[::2])
    enqueued = [
        at for at, event in zip(times, job.events[1::2], strict=True) if event == "enqueued"
    ]
    return max(enqueued, default=min(times))


def waiting_row(job: JobHistory, plan: Plan, now: int, cancels: CancelLog) -> Waiting | None:
    """The job as a row of the list when the journal has it waiting at now (epoch ms)."""
    if job.now(now) != "waiting" or job.due_at_ms is None:
        return None
    due = dt.datetime.fromtimestamp(job.due_at_ms / 1000, dt.UTC)
    return Waiting(
        message_id=job.message_id,
        type=job.type,
        queue=job.queue,
        attempt=job.next_attempt,
        due_at=due,
        reason=job.reason,
        place=place_of(job, plan),
        leaves_at=due,
        exact=True,
        cancelled=cancels.covers(job.queue, job.message_id, None, lambda: enqueued_ms(job) / 1000),
    )


def named_places(plan: Plan) -> dict[str, str]:
    """The place a row names for each queue that holds the plan's waiting jobs: a tier for
    itself and its lanes (the levels of the delays are all DELAYS)."""
    return {
        spec.name: plan.names.tier(k)
        for k in range(1, len(plan.tiers) + 1)
        for spec in plan.waiting_of(k)
    }


def grouped_depths(held: Mapping[Place, int], plan: Plan) -> Counter[str]:
    """The broker's depths by the places rows name."""
    named = named_places(plan)
    grouped: Counter[str] = Counter()
    for place, messages in held.items():
        grouped[named.get(place.name, DELAYS)] += messages
    return grouped


def places_named(plan: Plan, place: str) -> list[Place]:
    """The queues that hold the jobs a row says wait in place (a tier and its lanes, or every
    level of the delays)."""
    named = named_places(plan)
    return [p for p in places(plan) if named.get(p.name, DELAYS) == place]


def unrecorded(held: Mapping[str, int], known: Counter[str]) -> dict[str, int]:
    """By place, the jobs the broker holds beyond those the journal puts there."""
    return {place: held[place] - known[place] for place in held if held[place] > known[place]}


def rows_known(
    jobs: Iterable[JobHistory], plan: Plan, cancels: CancelLog, now: int
) -> tuple[list[Waiting], Counter[str]]:
    """The waiting jobs of the plan's queue among jobs, and how many waiting jobs the journal
    puts in each place (pure). The delays hold every queue's jobs: all those count there."""
    rows, known = [], Counter[str]()
    for job in jobs:
        row = waiting_row(job, plan, now, cancels)
        if row is None:
            continue
        if row.place == DELAYS or job.queue == plan.names.queue:
            known[row.place] += 1
        if job.queue == plan.names.queue:
            rows.append(row)
    return rows, known


async def listing(
    jobs: Sequence[JobHistory],
    plan: Plan,
    held: Mapping[Place, int],
    cancels: CancelLog,
    now: int,
) -> tuple[list[Waiting], dict[str, int]]:
    """The waiting jobs of the plan's queue, soonest due first, and the unrecorded ones by place:
    CHUNK jobs a turn of the event loop, so that a monitor's probes and its index's reader go on
    through an index of a million jobs (each chunk reads its jobs between two of the reader's
    turns, never while one changes)."""
    rows, known = [], Counter[str]()
    for start in range(0, len(jobs), CHUNK):
        more_rows, more_known = rows_known(jobs[start : start + CHUNK], plan, cancels, now)
        rows += more_rows
        known += more_known
        await asyncio.sleep(0)
    rows.sort(key=lambda row: row.due_at)
    return rows, unrecorded(grouped_depths(held, plan), known)


def lookback(plan: Plan) -> dt.timedelta:
    """How far back the journal is read for the jobs of the plan's queue."""
    longest = max(
        (plan.applied_delay_ms(spec) or 0 for spec in [*plan.tiers, *plan.lanes]), default=0
    )
    return max(dt.timedelta(milliseconds=longest) + LOOKBACK_SLACK, LOOKBACK_LEAST)


def _selected(
    rows: list[Waiting], job_type: str | None, message_id: str | None, limit: int | None
) -> list[Waiting]:
    chosen = [r for r in rows if job_type in (None, r.type) and message_id in (None, r.message_id)]
    return chosen if limit is None else chosen[:limit]


class Indexed(Protocol):
    """What the list reads of the monitor's index (ricochet.monitor.index.JobIndex)."""

    complete: bool

    def jobs(self) -> Iterable[JobHistory]: ...


async def list_waiting(
    connection: AbstractConnection,
    settings: Settings,
    *,
    job_type: str | None = None,
    message_id: str | None = None,
    limit: int | None = None,
    index: Indexed | None = None,
) -> Listing:
    """The waiting jobs of settings.queue that match, soonest due first (at most limit), from
    the monitor's index when given, else from the journal read back."""
    declared = await declared_plan(connection, settings)
    cancels = await read_cancels(connection, amqp_user(settings.amqp_url))
    # The journal, then at once the depths and the time: a job that came or left in between is
    # miscounted for that moment only.
    if index is None:
        since = dt.datetime.now(dt.UTC) - lookback(declared)
        read = await read_jobs(connection, since)
        jobs = list(read.jobs.values())
        said, complete = f"the journal since {since:%Y-%m-%d %H:%M:%S}Z", read.complete
    else:
        jobs, said, complete = list(index.jobs()), "the monitor's index", index.complete
    held = await depths(connection, places(declared))
    rows, counted = await listing(jobs, declared, held, cancels, now_ms())
    return Listing(_selected(rows, job_type, message_id, limit), counted, said, complete)


def _retried_from(job: JobHistory | None, queue: str) -> Retried:
    """What the journal says of a waiting message's last retry, by its headers: (when it came
    into its tier, the reason)."""

    def retried(
        message_id: str | None, headers: Mapping[str, Any]
    ) -> tuple[dt.datetime | None, str | None]:
        if job is None or message_id != job.message_id:
            return None, None
        failed = next_attempt(headers, queue) - 1
        for attempt in reversed(job.attempts):  # the latest run's, for a job run again
            if attempt.attempt == failed and attempt.outcome == "retrying" and attempt.ended_at_ms:
                return dt.datetime.fromtimestamp(attempt.ended_at_ms / 1000, dt.UTC), attempt.reason
        return None, None

    return retried


async def show_waiting(
    connection: AbstractConnection, settings: Settings, message_id: str
) -> list[Shown]:
    """Every waiting job of settings.queue with this message_id (usually one), soonest first:
    read where the journal says it waits, or everywhere when it does not know."""
    declared = await declared_plan(connection, settings)
    since = dt.datetime.now(dt.UTC) - lookback(declared)
    job = (await read_jobs(connection, since, message_id)).jobs.get((settings.queue, message_id))
    retried = _retried_from(job, settings.queue)
    # Where the journal says it waits; when not there (an entry lost, the id enqueued again),
    # everywhere.
    tries = [places(declared)]
    if job is not None and job.now(now_ms()) == "waiting":
        tries.insert(0, places_named(declared, place_of(job, declared)))
    found: list[Shown] = []
    for where in tries:
        found = await read_places(
            connection, declared, where, message_id, retried, management_url=settings.management_url
        )
        if found:
            break
    cancels = await read_cancels(connection, amqp_user(settings.amqp_url))
    enqueued = None if job is None else enqueued_ms(job) / 1000
    return [
        replace(
            shown,
            waiting=replace(
                shown.waiting,
                cancelled=cancels.covers(settings.queue, message_id, None, lambda: enqueued),
            ),
        )
        for shown in found
    ]
