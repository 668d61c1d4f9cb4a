"""Leading the schedules of the worker's queues (SPEC 22) on the worker's own connection: no
process of its own. Of all the worker processes, the one whose connection holds a queue's lead
(broker/lead.py) enqueues that queue's occurrences; the others look for the lead every
LEAD_PROBE_S and take it once the broker has dropped it with the leader's connection.

A new leader reads the state its predecessor recorded (broker/schedule_store.py), then, in
rounds, enqueues what catch_up says and logs what it skips, through a Client (the application's
own publish path: persistent, confirmed, message_id `<name>@<time>`), and records the new state
after each. An occurrence enqueued by a leader that died before recording it is enqueued again
by the next, with the same message_id.

Neither the clock nor the recorded state is trusted: a recorded instant ahead of the clock (a
forged record, a leader whose clock ran ahead, this one's clock set back) counts as now; a clock
that jumps is seen, once per process (worker/clock.py), and what it jumped over is caught up like
a time with no worker; a round is at most WAKE_S away, so a clock set back never holds a schedule
longer; and one schedule's failure is logged while the others go on.
"""

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aio_pika.abc import AbstractChannel, AbstractConnection

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.connection import is_lost, lost_or_cancelled
from ricochet.broker.lead import holds_lead, lead_is_held, take_lead
from ricochet.broker.publish import confirming_channel
from ricochet.broker.schedule_store import CHECKPOINT_S, Entry, State, read_states, write_state
from ricochet.client.client import Client
from ricochet.log import get_logger
from ricochet.names import SHARED
from ricochet.observe.metrics import Metrics
from ricochet.schedules.catchup import Skipped, catch_up
from ricochet.schedules.schedule import Schedule
from ricochet.settings import Settings
from ricochet.worker.clock import Clock, now_ms

log = get_logger("ricochet.schedules")

# How often a process that does not lead a queue's schedules looks whether the lead is free
# (give or take half, so that processes started together do not all look at once): the
# takeover comes within this of the broker dropping the leader's connection.
LEAD_PROBE_S = 2.0
# After an enqueue the broker did not confirm, or a failure of the leader's own.
RETRY_S = 1.0
# Occurrences awaiting their confirms at once in a catch-up.
BATCH = 256
CHECKPOINT_MS = round(CHECKPOINT_S * 1000)
# The state of a schedule that no worker runs any more is forgotten this long after its last.
KEEP_MS = 31 * 86_400_000
# A leader reads its clock at least this often, whenever the next occurrence falls due.
WAKE_S = 2.0


class LeadLost(Exception):
    """The lead went to another connection, or was deleted, while this one led."""


def clamped(entry: Entry, now_ms: int) -> Entry:
    """An entry whose instants are at most now_ms: one recorded ahead of the clock counts as now."""
    last_ms = None if entry.last_ms is None else min(entry.last_ms, now_ms)
    return Entry(last_ms, min(entry.since_ms, now_ms))


def leading_state(recorded: State, schedules: Sequence[Schedule], led_ms: int) -> State:
    """What a leader that took the lead at led_ms starts from (pure): the recorded state; a
    schedule with none recorded (a new one) starts then; a recorded schedule this worker does
    not run (another version of the application may) is kept, until it is KEEP_MS old."""
    state = {
        name: entry
        for name, entry in recorded.items()
        if led_ms - max(entry.accounted_ms, entry.since_ms) < KEEP_MS
    }
    for schedule in schedules:
        state.setdefault(schedule.name, Entry(None, led_ms))
    return state


@dataclass(frozen=True)
class Round:
    """What one round of a leader does (see plan_round)."""

    state: State
    due: list[tuple[int, Schedule]]
    wake_ms: int | None
    skipped: list[tuple[Schedule, Skipped]]
    ahead: list[tuple[Schedule, Entry]]
    failed: list[tuple[Schedule, Exception]]


def plan_round(schedules: Sequence[Schedule], state: State, seen_ms: int, now_ms: int) -> Round:
    """A round at now_ms, for a leader that has seen its clock run since seen_ms (pure): the
    state with each entry ahead of the clock clamped (ahead: those entries as they were), the
    occurrences due in order, what catch_up skips, and when the next occurrence falls due. A
    schedule whose rule raises is left out of the round (failed) and starts afresh."""
    kept_state = dict(state)
    due: list[tuple[int, Schedule]] = []
    upcoming: list[int] = []
    skipped: list[tuple[Schedule, Skipped]] = []
    ahead: list[tuple[Schedule, Entry]] = []
    failed: list[tuple[Schedule, Exception]] = []
    for schedule in schedules:
        entry = state[schedule.name]
        kept = clamped(entry, now_ms)
        if kept != entry:
            ahead.append((schedule, entry))
        try:
            caught = catch_up(schedule.rule, kept.accounted_ms, seen_ms, now_ms)
        except Exception as error:  # one schedule's failure is not the others'
            failed.append((schedule, error))
            kept_state[schedule.name] = Entry(None, now_ms + 1)
            continue
        kept_state[schedule.name] = kept
        due.extend((at, schedule) for at in caught.due)
        if caught.skipped is not None:
            skipped.append((schedule, caught.skipped))
        if caught.next_ms is not None:
            upcoming.append(caught.next_ms)
    due.sort(key=lambda d: d[0])
    return Round(kept_state, due, min(upcoming, default=None), skipped, ahead, failed)


def sleep_s(wake_ms: int | None, now_ms: int) -> float:
    """How long a leader sleeps until its next round: until wake_ms, at most WAKE_S."""
    if wake_ms is None:
        return WAKE_S
    return min(max(0.0, (wake_ms - now_ms) / 1000), WAKE_S)


class ScheduleLeader:
    """Leads, or waits to lead, the schedules of the worker's queues, on each connection the
    worker runs a session on. A schedule of a queue the worker does not consume is left to the
    workers of that queue."""

    def __init__(
        self,
        settings: Settings,
        schedules: Sequence[Schedule],
        queues: Sequence[str],
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self.clock = Clock()  # the process's: a connection lost and made again keeps it
        self._by_queue: dict[str, list[Schedule]] = {}
        self._elsewhere: list[Schedule] = []
        for schedule in schedules:
            queue = schedule.queue or settings.queue
            if queue in queues:
                self._by_queue.setdefault(queue, []).append(schedule)
            else:
                self._elsewhere.append(schedule)

    @contextlib.asynccontextmanager
    async def running(self, connection: AbstractConnection) -> AsyncIterator[None]:
        """Lead, or wait to lead, on this connection for as long as the block runs."""
        for schedule in self._elsewhere:
            log.info(
                "schedule left to the workers of its queue",
                schedule=schedule.name,
                queue=schedule.queue,
            )
        self._elsewhere = []
        tasks = [
            asyncio.get_running_loop().create_task(
                _QueueLead(self, connection, queue, schedules).run()
            )
            for queue, schedules in self._by_queue.items()
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task


class _QueueLead:
    """One queue's schedules on one connection: wait for the lead, then lead until the
    connection goes (or the worker's session ends)."""

    def __init__(
        self,
        leader: ScheduleLeader,
        connection: AbstractConnection,
        queue: str,
        schedules: list[Schedule],
    ) -> None:
        self._settings = leader._settings
        self._metrics = leader._metrics
        self._clock = leader.clock
        self._connection = connection
        self._queue = queue
        self._lead_queue = SHARED.schedules_lead(queue)
        self._schedules = schedules
        self._holding = False
        self._state: State = {}
        self._written_ms = 0

    async def run(self) -> None:
        """Lead; start over after a failure while the connection lives."""
        leading = self._metrics.schedules_leading.labels(queue=self._queue)
        while not lost_or_cancelled(self._connection):
            try:
                channel = await confirming_channel(self._connection)
                try:
                    await self._lead(channel)
                finally:
                    leading.set(0)
                    if not channel.is_closed:
                        await channel.close()
            except CONNECTION_ERRORS as error:
                if is_lost(self._connection):
                    return  # the worker connects again, and a new session starts over
                log.warning("schedules: channel lost, starting over", error=str(error))
            except LeadLost:
                log.warning("schedules: lead lost, waiting to lead again", queue=self._queue)
            except Exception:  # the leader's own failure must not stop the worker
                log.exception("schedules: leading failed, starting over", queue=self._queue)
            await asyncio.sleep(RETRY_S)

    async def _lead(self, channel: AbstractChannel) -> None:
        while not self._holding:
            self._clock.now_ms()  # read while waiting too: a jump is seen when it comes
            if not await lead_is_held(channel, self._lead_queue):
                self._holding = await take_lead(self._connection, self._lead_queue)
            if not self._holding:
                await asyncio.sleep(LEAD_PROBE_S * (0.5 + random.random()))
        self._metrics.schedules_leading.labels(queue=self._queue).set(1)
        log.info(
            "leading schedules", queue=self._queue, schedules=[s.name for s in self._schedules]
        )
        settings = self._settings
        async with Client(
            settings.amqp_url, self._queue, connect_timeout_s=settings.connect_timeout_s
        ) as client:
            recorded = await read_states(self._connection, [self._queue])
            self._state = leading_state(
                recorded.get(self._queue, {}), self._schedules, self._clock.now_ms()
            )
            await self._record(channel)  # a new schedule's start, before anything else
            await self._follow(client, channel)

    async def _follow(self, client: Client, channel: AbstractChannel) -> None:
        while True:
            now = self._clock.now_ms()
            round_ = plan_round(self._schedules, self._state, self._clock.seen_ms, now)
            self._state = round_.state
            self._report(round_, now)
            if round_.due:
                await self._enqueue(client, channel, round_.due)
            elif not 0 <= now - self._written_ms < CHECKPOINT_MS:
                await self._record(channel)
            await asyncio.sleep(sleep_s(round_.wake_ms, self._clock.now_ms()))

    def _report(self, round_: Round, now: int) -> None:
        """Log what a round clamped, skipped and failed."""
        for schedule, entry in round_.ahead:
            log.warning(
                "schedule state ahead of the clock: counted as now",
                queue=self._queue,
                schedule=schedule.name,
                recorded_last=entry.last_ms,
                recorded_since=entry.since_ms,
                now=now,
            )
        for schedule, skipped in round_.skipped:
            log.warning(
                "schedule occurrences skipped: no worker ran, or the clock jumped, when they "
                "fell due",
                queue=self._queue,
                schedule=schedule.name,
                skipped=skipped.count,
                first=schedule.occurrence_id(skipped.first_ms),
                last=schedule.occurrence_id(skipped.last_ms),
            )
        for schedule, error in round_.failed:
            log.error(
                "schedule failed: it starts afresh, the others go on",
                queue=self._queue,
                schedule=schedule.name,
                error=f"{type(error).__name__}: {error}",
            )

    async def _enqueue(
        self, client: Client, channel: AbstractChannel, due: list[tuple[int, Schedule]]
    ) -> None:
        """Enqueue the occurrences, BATCH at a time, and record how far each schedule got: a
        schedule stops at its first occurrence the broker did not confirm, which the next round
        (after RETRY_S) finds due again, while the other schedules go on.

        Each batch goes out once the broker has said the lead is still this connection's: the
        enqueues take the Client's connection, which outlives a closed lead."""
        for start in range(0, len(due), BATCH):
            batch = due[start : start + BATCH]
            if not await holds_lead(channel, self._lead_queue):
                self._holding = False
                raise LeadLost
            results = await asyncio.gather(
                *(
                    client.enqueue(
                        s.job_type,
                        s.payload,
                        message_id=s.occurrence_id(at),
                        priority=s.priority,
                    )
                    for at, s in batch
                ),
                return_exceptions=True,
            )
            stopped: set[str] = set()
            for (at, schedule), result in zip(batch, results, strict=True):
                if schedule.name in stopped:
                    continue
                if isinstance(result, BaseException):
                    stopped.add(schedule.name)
                    log.warning(
                        "schedule occurrence not enqueued, trying again",
                        queue=self._queue,
                        schedule=schedule.name,
                        message_id=schedule.occurrence_id(at),
                        type=schedule.job_type,
                        error=f"{type(result).__name__}: {result}",
                    )
                    continue
                self._occurred(schedule, at)
            await self._record(channel)
            if stopped:
                await asyncio.sleep(RETRY_S)
                return

    def _occurred(self, schedule: Schedule, at_ms: int) -> None:
        entry = self._state[schedule.name]
        self._state[schedule.name] = Entry(at_ms, entry.since_ms)
        self._metrics.occurrences.labels(queue=self._queue, schedule=schedule.name).inc()
        log.info(
            "schedule occurrence enqueued",
            queue=self._queue,
            schedule=schedule.name,
            message_id=schedule.occurrence_id(at_ms),
            type=schedule.job_type,
            late_ms=now_ms() - at_ms,
        )

    async def _record(self, channel: AbstractChannel) -> None:
        await write_state(channel, self._queue, self._state)
        self._written_ms = now_ms()
