"""`ricochet waiting`: the jobs RabbitMQ holds for a later attempt, read where they wait.

A scan reads the queues that hold waiting jobs (the levels of the shared delays, highest first,
then the queue's retry tiers and lanes, ricochet.ops.waits says what each holds) one at a time,
on a channel of its own, holding every message it reads unacked, and hands them all back with
one basic.nack(requeue=true) before it reads the next queue. It takes nothing: a scan killed or
cut off midway hands back what it held when the broker closes its channel. One scan reads a
vhost at a time (the lock of ricochet.ops.scan, on ricochet.waiting.scan): two side by side
would each be handed part of a queue.

A message held unacked does not expire, so a scan must not hold a job past the time it leaves
its queue. Each queue sends its messages on in the order they came (one TTL each), so the ones
it reads first leave first. Before the first message it holds would leave (RELEASE_AHEAD_S),
the scan stops consuming, hands back, by one nack, the messages it holds that leave within the
next RELEASE_SPAN_S, waits until they have left, and reads on. Where it knows a message's time
only as a lower bound (no record of ricochet's), the message is handed back as if it left then,
and when it comes back it is held again for REHOLD_S at most: such a job is late by that much at
worst. A job that moves down the levels while the scan reads them is read twice: the scan keeps
one row per job and attempt.

Handing a message back counts against a quorum queue's delivery limit (every return on RabbitMQ
3.10 to 4.2, a return by a closed channel on 4.3). ricochet lifts the limit on the tiers and the
levels it declares on RabbitMQ 4 (x-delivery-limit=-1); a scan reads the limit of each queue that
holds jobs through the management API before it reads it, as a scan of the failed queue does,
and refuses (DeliveryLimitRefusal, saying how to lift it) when a limit stands.
"""

import asyncio
import collections
import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from ricochet.broker.amqp import broker_version, requeue_all
from ricochet.broker.depth import KeptChannel, read_depth
from ricochet.broker.plan import Plan, delivery_limit_policy_command, plan
from ricochet.broker.record import declared_settings
from ricochet.broker.retries import read_retries
from ricochet.names import DELAY_LEVELS, SHARED, Names
from ricochet.ops.failed_queue import SHOWN_PROPERTIES, body_text, jsonable
from ricochet.ops.scan import (
    OTHER_READER_WAIT_S,
    PER_CONSUMER,
    DeliveryLimitRefusal,
    read_limits,
    scan_lock,
)
from ricochet.ops.waits import (
    Place,
    Shown,
    Waiting,
    copy_says,
    destination,
    level_place,
    next_attempt,
    read_waiting,
)
from ricochet.settings import Settings

log = structlog.get_logger("ricochet.waiting")

# A held message goes back this long before it leaves its queue (the broker's own latency, and
# clocks a little apart).
RELEASE_AHEAD_S = 0.3
# ... together with the others held that leave within this much after it: one stop of the
# consumers for all of them.
RELEASE_SPAN_S = 0.5
# A message handed back that came back (not yet gone: its time was a lower bound) is held this
# long at most before it goes back again.
REHOLD_S = 0.2
# How long after a job's time the scan waits for the broker to have sent it on.
EXPIRY_GRACE_S = 0.1
# Records of retries are read from this much before the longest tier's wait (clocks apart).
RECORDS_SLACK = dt.timedelta(seconds=60)
# With no delivery for this long, the scan asks the broker whether the queue holds more.
IDLE_S = 0.5

# What a scan makes a row from: the place, the message, now.
RowMaker = Callable[[Place, AbstractIncomingMessage, dt.datetime], Waiting | None]


@dataclass
class _Held:
    tag: int
    leaves_s: float  # epoch seconds
    key: tuple[object, ...]


def identity(message: AbstractIncomingMessage, attempt: int) -> tuple[object, ...]:
    """What tells one waiting job from another: its id and attempt (a message without an id by
    its body)."""
    return (message.message_id, attempt, None if message.message_id else hash(message.body))


class PlaceScan:
    """Reads one queue of waiting jobs: every message once, each held no later than it leaves."""

    def __init__(self, channel: AbstractChannel, place: Place, depth: int, make: RowMaker):
        self._channel = channel
        self._place = place
        self._depth = depth
        self._make = make
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._consumers: list[str] = []
        self._held: collections.deque[_Held] = collections.deque()
        # Handed back and not seen since: a delivery of one of them is no new job.
        self._released: collections.Counter[tuple[object, ...]] = collections.Counter()
        self.rows: list[Waiting] = []
        self.seen = 0  # messages read once (those handed back and seen again not counted)
        self.latest_release_s = 0.0  # for the figures: how close to leaving a job was handed back

    async def read(self) -> list[Waiting]:
        """Its jobs, each read once (fewer if they leave meanwhile); every message goes back."""
        try:
            await self._subscribe()
            while self.seen < self._depth:
                await self._room()
                wait_s = IDLE_S
                if self._held:
                    wait_s = max(0.0, min(wait_s, self._release_at() - time.time()))
                try:
                    message = await asyncio.wait_for(self._inbox.get(), wait_s)
                except TimeoutError:
                    if self._held and time.time() >= self._release_at():
                        await self._release()
                        continue
                    left = await read_depth(self._channel, self._place.name)
                    if left is None or left.messages == 0:
                        break
                    await self._subscribe()  # the broker holds back: more room
                    continue
                self._take(message)
                if time.time() >= self._release_at():
                    await self._release()
        finally:
            await self._stop_consuming()
            await requeue_all(self._channel)
        return self.rows

    def _release_at(self) -> float:
        return self._held[0].leaves_s - RELEASE_AHEAD_S

    def _take(self, message: AbstractIncomingMessage) -> None:
        now = time.time()
        row = self._make(self._place, message, dt.datetime.fromtimestamp(now, dt.UTC))
        attempt = row.attempt if row is not None else 0
        key = identity(message, attempt)
        if self._released[key]:
            self._released[key] -= 1
            leaves_s = now + REHOLD_S  # back again: it had not left, so it leaves any moment
        else:
            self.seen += 1
            if row is not None:
                self.rows.append(row)
            leaves_s = row.leaves_at.timestamp() if row is not None else now + REHOLD_S
        assert message.delivery_tag is not None
        self._held.append(_Held(message.delivery_tag, leaves_s, key))

    async def _release(self) -> None:
        """Hand back, in one nack, the held messages that leave soon; wait until they have
        left (what arrived meanwhile is read first: it is held too)."""
        await self._stop_consuming()
        while not self._inbox.empty():
            self._take(self._inbox.get_nowait())
        cut = time.time() + RELEASE_AHEAD_S + RELEASE_SPAN_S
        last: _Held | None = None
        while self._held and self._held[0].leaves_s <= cut:
            last = self._held.popleft()
            self._released[last.key] += 1
        if last is None:
            return
        underlay = await self._channel.get_underlay_channel()
        await underlay.basic_nack(delivery_tag=last.tag, multiple=True, requeue=True)
        self.latest_release_s = max(self.latest_release_s, time.time() - last.leaves_s)
        await asyncio.sleep(max(0.0, last.leaves_s - time.time()) + EXPIRY_GRACE_S)
        await self._subscribe()

    async def _subscribe(self) -> None:
        queue = await self._channel.get_queue(self._place.name, ensure=False)
        self._consumers.append(await queue.consume(self._inbox.put, no_ack=False))

    async def _room(self) -> None:
        """Another consumer once the messages held come within one consumer's worth of what the
        consumers may hold (a quorum queue hands one consumer PER_CONSUMER at most)."""
        while self._consumers and len(self._held) + PER_CONSUMER > (
            len(self._consumers) * PER_CONSUMER
        ):
            await self._subscribe()

    async def _stop_consuming(self) -> None:
        if not self._consumers or self._channel.is_closed:
            return
        queue = await self._channel.get_queue(self._place.name, ensure=False)
        for tag in self._consumers:
            await queue.cancel(tag)
        self._consumers = []


def places(plan: Plan) -> list[Place]:
    """Where the jobs of the plan's queue may wait: the levels of the delays, highest first (a
    job moves down them, so it is read twice at worst, never missed), then its tiers and
    lanes."""
    levels = [level_place(k) for k in reversed(range(DELAY_LEVELS))]
    tiers = [Place(spec.name, spec.delay_ms or 0) for spec in [*plan.tiers, *plan.lanes]]
    return [*levels, *tiers]


async def _holding(connection: AbstractConnection, where: list[Place]) -> dict[Place, int]:
    """The places that hold messages now, with how many (a missing one holds none)."""
    kept = KeptChannel(connection)
    try:
        depths = {}
        for place in where:
            depth = await read_depth(await kept.get(), place.name)
            if depth is not None and depth.messages:
                depths[place] = depth.messages
        return depths
    finally:
        await kept.close()


async def _check_limits(
    connection: AbstractConnection,
    names: Names,
    holding: list[Place],
    management_url: str | None,
) -> None:
    """Refuse before reading anything when a queue that holds jobs keeps a delivery limit."""
    version = broker_version(connection)
    limits = await read_limits(
        connection, [place.name for place in holding], management_url, version
    )
    limited = [(name, limit) for name, limit in limits.items() if limit is not None]
    if limited:
        said = "; ".join(f"{name}: {limit.value} ({limit.source})" for name, limit in limited)
        raise DeliveryLimitRefusal(
            f"queues that hold waiting jobs keep a delivery limit ({said}): each look hands "
            "their jobs back, which the broker counts, and a job at the limit would be sent on "
            "early or dropped, so none was read. Lift it: "
            f"`{delivery_limit_policy_command(names)}` for the tiers; the levels "
            f"({SHARED.delay(0)} ..) are declared without one by ricochet on RabbitMQ 4"
        )


async def scan_waiting(
    connection: AbstractConnection,
    plan: Plan,
    message_id: str | None = None,
    *,
    management_url: str | None = None,
    found: Callable[[Waiting, AbstractIncomingMessage], None] = lambda *_: None,
) -> list[Waiting]:
    """The waiting jobs of the plan's queue (of one message_id, when given), soonest due first;
    found(row, message) is told of each as it is read."""
    deadline = asyncio.get_running_loop().time() + OTHER_READER_WAIT_S
    held_by = "another `ricochet waiting` (or a console page)"
    async with scan_lock(connection, SHARED.waiting_scan, "the waiting jobs", held_by, deadline):
        depths = await _holding(connection, places(plan))
        await _check_limits(connection, plan.names, list(depths), management_url)
        tiers = [place for place in depths if place.level is None]
        records: Records = {}
        if tiers:
            # A job waits in a tier no longer than its TTL: its retry was recorded since.
            longest = dt.timedelta(milliseconds=max(place.ttl_ms for place in tiers))
            since = dt.datetime.now(dt.UTC) - longest - RECORDS_SLACK
            records = await read_retries(connection, since, plan.names.queue)
        make = row_maker(plan.names.queue, message_id, records, found)
        rows: dict[tuple[object, ...], Waiting] = {}
        channel = await connection.channel(publisher_confirms=False)
        try:
            await channel.set_qos(prefetch_count=PER_CONSUMER)
            for place, depth in depths.items():
                for row in await PlaceScan(channel, place, depth, make).read():
                    rows.setdefault((row.queue, row.message_id, row.attempt), row)
        finally:
            if not channel.is_closed:
                await channel.close()
    return sorted(rows.values(), key=lambda row: row.due_at)


# (message_id, failed attempt) -> (reason, when it was sent to its tier, epoch ms)
Records = Mapping[tuple[str, int], tuple[str, int]]


def row_maker(
    queue: str,
    message_id: str | None,
    records: Records,
    found: Callable[[Waiting, AbstractIncomingMessage], None],
) -> RowMaker:
    """Rows of queue's jobs (a level's jobs of other queues are left out), of one message_id
    when given: a tier's job with the record of its retry, a level's with what its copy says."""

    def make(place: Place, message: AbstractIncomingMessage, now: dt.datetime) -> Waiting | None:
        routing_key = message.routing_key or ""
        if place.level is not None and destination(routing_key) != queue:
            return None
        if message_id is not None and message.message_id != message_id:
            return None
        headers = dict(message.headers or {})
        came_at = due_at = reason = None
        if place.level is None:
            came_at, reason = _recorded(records, message.message_id, headers, queue)
        else:
            due_at, reason = copy_says(headers, routing_key)
        row = read_waiting(
            place,
            queue,
            message_id=message.message_id,
            amqp_type=message.type,
            body=message.body,
            headers=headers,
            routing_key=routing_key,
            timestamp=message.timestamp,
            came_at=came_at,
            due_at=due_at,
            reason=reason,
            now=now,
        )
        found(row, message)
        return row

    return make


def _recorded(
    records: Records, message_id: str | None, headers: Mapping[str, Any], queue: str
) -> tuple[dt.datetime | None, str | None]:
    """(when it came into its tier, the reason) of a tier's job, from the record of its retry."""
    if message_id is None:
        return None, None
    record = records.get((message_id, next_attempt(headers, queue) - 1))
    if record is None:
        return None, None
    reason, at_ms = record
    return dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC), reason


def _selected(rows: list[Waiting], job_type: str | None, limit: int | None) -> list[Waiting]:
    chosen = [r for r in rows if job_type is None or r.type == job_type]
    return chosen if limit is None else chosen[:limit]


async def list_waiting(
    connection: AbstractConnection,
    settings: Settings,
    *,
    job_type: str | None = None,
    message_id: str | None = None,
    limit: int | None = None,
) -> list[Waiting]:
    """The waiting jobs of settings.queue that match, soonest due first (at most limit)."""
    declared = plan(await declared_settings(connection, settings))
    rows = await scan_waiting(
        connection, declared, message_id, management_url=settings.management_url
    )
    return _selected(rows, job_type, limit)


async def show_waiting(
    connection: AbstractConnection, settings: Settings, message_id: str
) -> list[Shown]:
    """Every waiting job of settings.queue with this message_id (usually one), soonest first."""
    declared = plan(await declared_settings(connection, settings))
    messages: dict[tuple[object, ...], AbstractIncomingMessage] = {}

    def keep(row: Waiting, message: AbstractIncomingMessage) -> None:
        messages.setdefault((row.queue, row.message_id, row.attempt), message)

    rows = await scan_waiting(
        connection, declared, message_id, management_url=settings.management_url, found=keep
    )
    return [_shown(row, messages[row.queue, row.message_id, row.attempt]) for row in rows]


def _shown(row: Waiting, message: AbstractIncomingMessage) -> Shown:
    properties = {
        name: jsonable(getattr(message, name))
        for name in SHOWN_PROPERTIES
        if getattr(message, name, None) is not None
    }
    body, encoding = body_text(message.body)
    return Shown(row, properties, jsonable(dict(message.headers or {})), body, encoding)
