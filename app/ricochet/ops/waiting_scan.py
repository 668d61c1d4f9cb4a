"""A waiting job read where it waits, to show it whole (`ricochet waiting show`): the queues that
may hold it are read one at a time, on a channel of their own, holding every message read unacked,
and handing them all back (basic.nack, requeue=true) before the next is read. It takes
nothing: a read killed or cut off midway hands back what it held when the broker closes its
channel. One read goes on in a vhost at a time (the lock of ricochet.ops.scan, on
ricochet.waiting.scan): two side by side would each be handed part of a queue. The list of the
waiting jobs reads none of this (ricochet.ops.waiting): it reads the journal.

A message held unacked does not expire, so a read must not hold a job past the time it leaves
its queue. It reads on while it holds what it read (of the jobs that leave soon, no more than
the queue has time to hand out beside sending them on: SOON_MOST), and hands each message back
just after that time (EXPIRY_GRACE_S): the queue, which checks its head for messages past their
TTL before it sends anything, sends it on at once, as it would have, and never to the read
again. Where it knows a message's time only as a lower bound (no entry of the journal), the
message may come back: it is held again for REHOLD_S at most, so such a job is late by that much
at worst. What the read still holds when it has read the queue goes back before its time, once
its consumers are gone: a nack each, in the order the queue sent it, which is the order its jobs
leave (PlaceScan._hand_back_the_rest says why). A job that moves down the levels while they are
read is read twice: one row per job and attempt is kept.

Handing a message back counts against a quorum queue's delivery limit (every return on RabbitMQ
3.10 to 4.2, a return by a closed channel on 4.3). ricochet lifts the limit on the tiers and the
levels it declares on RabbitMQ 4 (x-delivery-limit=-1); a read asks the limit of each queue it
would read through the management API first, as a read of the failed queue does, and refuses
(DeliveryLimitRefusal, saying how to lift it) when a limit stands that a job could reach
(ricochet.ops.limits: a million or more is none, which is what RabbitMQ 3 needs to hand a job
back at its queue's head).
"""

import asyncio
import collections
import datetime as dt
import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from ricochet.broker.amqp import broker_version
from ricochet.broker.depth import KeptChannel, read_depth
from ricochet.broker.plan import Plan, delivery_limit_policy_command
from ricochet.names import DELAY_LEVELS, SHARED, Names
from ricochet.ops.failed_queue import printable
from ricochet.ops.hand_back import nacks
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
    read_waiting,
)

# A held message goes back this long after it leaves its queue (its time is the journal's entry,
# taken a moment before the broker took the job; clocks a little apart): the broker sends it on.
EXPIRY_GRACE_S = 0.05
# What has come due goes back together, once the first of it has waited this long: one nack, one
# command of the queue's, for many.
HAND_BACK_EVERY_S = 0.05
# A message handed back that came back (not yet gone: its time was a lower bound) is held this
# long at most before it goes back again.
REHOLD_S = 0.1
# With no delivery for this long, the scan asks the broker whether the queue holds more (at most
# once in as long).
IDLE_S = 0.5
# A queue process that sends jobs on by the thousand a second, and hands a scan each job it
# holds, falls behind with both (RabbitMQ 3.10: 2 s late at 3,300 jobs a second, a scan holding
# 37,000): the scan holds no more than SOON_MOST of those that leave within SOON_S, and reads on
# as they leave. Jobs that wait longer it reads as fast as the queue hands them
# (docs/performance.md, `ricochet waiting` over 100,000 jobs, for the figures of each cap).
SOON_S = 10.0
SOON_MOST = 6_000

# What a scan makes of a message: the waiting job it stands for, and whether the scan lists it
# (a level holds other queues' jobs too); from the place, the message, now.
RowMaker = Callable[[Place, AbstractIncomingMessage, dt.datetime], tuple[Waiting, bool]]


@dataclass(order=True)
class _Held:
    back_s: float  # when it goes back, epoch seconds
    tag: int
    key: tuple[object, ...] = field(compare=False)
    # Its place in the queue's order (which is the order its jobs leave): when it was first read.
    order: int = field(compare=False)


def may_add_consumer(consumers: int, newest_back_s: float, now: float) -> bool:
    """Whether a scan with this many consumers may take another (pure): not while they may
    already hold SOON_MOST (another consumer's room beside it) of jobs that all leave within
    SOON_S (the newest read, which goes back at newest_back_s, leaves last). It counts what they
    may hold, not what they hold: a queue slow to deliver (a loaded broker) adds no consumer past
    the cap."""
    return consumers * PER_CONSUMER <= SOON_MOST or newest_back_s > now + SOON_S


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
        self._held: list[_Held] = []  # a heap: the soonest to go back first
        # The delivery tags held, lowest first (a heap; those handed back are dropped lazily).
        self._tags: list[int] = []
        self._holding: set[int] = set()
        # Handed back and not seen since: a delivery of one of them is no new job.
        self._released: collections.Counter[tuple[object, ...]] = collections.Counter()
        self._order: dict[tuple[object, ...], int] = {}  # of each job read: _Held.order
        self._last_delivery_s = time.time()
        self._asked_s = 0.0  # when the scan last asked the broker what the queue holds
        self._newest_back_s = 0.0  # when the job read last goes back (a queue's are in order)
        self.rows: list[Waiting] = []
        self.seen = 0  # messages read once (those handed back and seen again not counted)

    async def read(self) -> list[Waiting]:
        """Its jobs, each read once (fewer if they leave meanwhile); every message goes back."""
        try:
            await self._subscribe()
            while self.seen < self._depth:
                await self._room()
                wait_s = IDLE_S
                if self._held:
                    wait_s = max(0.0, min(wait_s, self._next_hand_back_s() - time.time()))
                try:
                    message = await asyncio.wait_for(self._inbox.get(), wait_s)
                except TimeoutError:
                    if await self._read_all():
                        break
                    continue
                self._take(message)
                while not self._inbox.empty():  # all that came meanwhile, for one look at the time
                    self._take(self._inbox.get_nowait())
                await self._hand_back_due()
        finally:
            if not self._channel.is_closed:
                await self._stop_consuming()
                while not self._inbox.empty():
                    self._take(self._inbox.get_nowait())
                await self._hand_back_the_rest()
        return self.rows

    async def _read_all(self) -> bool:
        """With no delivery for a while: whether the queue holds no more to read (but what this
        scan holds, and hands back as it leaves); if it does, the broker holds back for room."""
        await self._hand_back_due()
        now = time.time()
        if now - self._last_delivery_s < IDLE_S or now - self._asked_s < IDLE_S:
            return False
        left = await read_depth(self._channel, self._place.name)
        self._asked_s = time.time()
        if left is None or left.messages == 0:
            return True
        if self._may_grow():
            await self._subscribe()
        return False

    def _take(self, message: AbstractIncomingMessage) -> None:
        now = self._last_delivery_s = time.time()
        row, listed = self._make(self._place, message, dt.datetime.fromtimestamp(now, dt.UTC))
        key = identity(message, row.attempt)
        if self._released[key]:
            self._released[key] -= 1
            back_s = now + REHOLD_S  # back again: it had not left, so it leaves any moment
        else:
            self._order.setdefault(key, self.seen)
            self.seen += 1
            if listed:
                self.rows.append(row)
            back_s = self._newest_back_s = row.leaves_at.timestamp() + EXPIRY_GRACE_S
        assert message.delivery_tag is not None
        heapq.heappush(self._held, _Held(back_s, message.delivery_tag, key, self._order[key]))
        heapq.heappush(self._tags, message.delivery_tag)
        self._holding.add(message.delivery_tag)

    def _next_hand_back_s(self) -> float:
        return self._held[0].back_s + HAND_BACK_EVERY_S

    async def _hand_back_due(self) -> bool:
        """Hand back the held messages whose time has come, once the first has waited
        HAND_BACK_EVERY_S; whether there were any."""
        now = time.time()
        if not self._held or now < self._next_hand_back_s():
            return False
        due = []
        while self._held and self._held[0].back_s <= now:
            due.append(heapq.heappop(self._held))
        if due:
            await self._hand_back(due)
        return bool(due)

    async def _hand_back(self, held: list[_Held]) -> None:
        for one in held:
            self._holding.discard(one.tag)
            self._released[one.key] += 1
        while self._tags and self._tags[0] not in self._holding:
            heapq.heappop(self._tags)
        underlay = await self._channel.get_underlay_channel()
        kept_below = self._tags[0] if self._tags else None
        for tag, multiple in nacks((one.tag for one in held), kept_below):
            await underlay.basic_nack(delivery_tag=tag, multiple=multiple, requeue=True)

    async def _hand_back_the_rest(self) -> None:
        """Hand back all it holds, its consumers gone: a nack each, in the queue's order. Only a
        TTL takes a job off the queue's head now, so a job that leaves later, handed back ahead
        of one that is due, keeps that one there until it leaves itself. One nack for many hands
        them back consumer by consumer (on RabbitMQ 3.10, past 32, in no order); and what a read
        knows of a tier's times is mostly a bound (it reads the journal of the job it shows
        only), alike for many jobs, which cannot order them either."""
        underlay = await self._channel.get_underlay_channel()
        in_order = sorted(self._held, key=lambda held: held.order)
        for n, one in enumerate(in_order, 1):
            # Queued for the connection's writer, which keeps their order; the last one waits
            # until it (and so every one before it) is written.
            last = n == len(in_order)
            await underlay.basic_nack(delivery_tag=one.tag, requeue=True, wait=last)
        self._held = []

    async def _subscribe(self) -> None:
        queue = await self._channel.get_queue(self._place.name, ensure=False)
        self._consumers.append(await queue.consume(self._inbox.put, no_ack=False))

    async def _room(self) -> None:
        """Another consumer once the messages held come within one consumer's worth of what the
        consumers may hold (a quorum queue hands one consumer PER_CONSUMER at most)."""
        while (
            self._consumers
            and len(self._held) + PER_CONSUMER > len(self._consumers) * PER_CONSUMER
            and self._may_grow()
        ):
            await self._subscribe()

    def _may_grow(self) -> bool:
        return may_add_consumer(len(self._consumers), self._newest_back_s, time.time())

    async def _stop_consuming(self) -> None:
        """Cancel the consumers, handing back what falls due meanwhile (a cancel is a round trip
        through the queue's log)."""
        queue = await self._channel.get_queue(self._place.name, ensure=False)
        for tag in self._consumers:
            await queue.cancel(tag)
            await self._hand_back_due()
        self._consumers = []


def places(plan: Plan) -> list[Place]:
    """Where the jobs of the plan's queue may wait: the levels of the delays, highest first (a
    job moves down them, so it is read twice at worst, never missed), then its tiers and
    lanes, each with the delay the broker applies to it."""
    levels = [level_place(k) for k in reversed(range(DELAY_LEVELS))]
    tiers = [
        Place(spec.name, plan.applied_delay_ms(spec) or 0) for spec in [*plan.tiers, *plan.lanes]
    ]
    return [*levels, *tiers]


async def depths(connection: AbstractConnection, where: list[Place]) -> dict[Place, int]:
    """The places that hold messages now, with how many (a missing one holds none)."""
    kept = KeptChannel(connection)
    try:
        held = {}
        for place in where:
            depth = await read_depth(await kept.get(), place.name)
            if depth is not None and depth.messages:
                held[place] = depth.messages
        return held
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


# What the journal says of a waiting job's last retry, from its message's id and headers:
# (when it came into its tier, the reason).
Retried = Callable[[str | None, Mapping[str, Any]], tuple[dt.datetime | None, str | None]]


async def read_places(
    connection: AbstractConnection,
    plan: Plan,
    where: list[Place],
    message_id: str,
    retried: Retried,
    *,
    management_url: str | None = None,
) -> list[Shown]:
    """The jobs of the plan's queue with this message_id that wait in where, soonest due first,
    each with its message, read as the module says."""
    deadline = asyncio.get_running_loop().time() + OTHER_READER_WAIT_S
    held_by = "another `ricochet waiting show`"
    found: dict[tuple[object, ...], Shown] = {}

    def keep(row: Waiting, message: AbstractIncomingMessage) -> None:
        found.setdefault((row.queue, row.message_id, row.attempt), Shown(row, *printable(message)))

    async with scan_lock(connection, SHARED.waiting_scan, "the waiting jobs", held_by, deadline):
        holding = await depths(connection, where)
        await _check_limits(connection, plan.names, list(holding), management_url)
        make = row_maker(plan.names.queue, message_id, retried, keep)
        channel = await connection.channel(publisher_confirms=False)
        try:
            await channel.set_qos(prefetch_count=PER_CONSUMER)
            for place, messages in holding.items():
                await PlaceScan(channel, place, messages, make).read()
        finally:
            if not channel.is_closed:
                await channel.close()
    return sorted(found.values(), key=lambda shown: shown.waiting.due_at)


def row_maker(
    queue: str,
    message_id: str,
    retried: Retried,
    found: Callable[[Waiting, AbstractIncomingMessage], None],
) -> RowMaker:
    """The job of each message, found when it is queue's (a level holds other queues' jobs too)
    of message_id: a tier's job with what the journal says of its retry, a level's with what its
    copy says. Jobs not found are made all the same: the read hands them back too."""

    def make(
        place: Place, message: AbstractIncomingMessage, now: dt.datetime
    ) -> tuple[Waiting, bool]:
        routing_key = message.routing_key or ""
        own = queue if place.level is None else destination(routing_key) or ""
        headers = dict(message.headers or {})
        came_at = due_at = reason = None
        if place.level is None:
            came_at, reason = retried(message.message_id, headers)
        else:
            due_at, reason = copy_says(headers, routing_key)
        row = read_waiting(
            place,
            own,
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
        listed = own == queue and message.message_id == message_id
        if listed:
            found(row, message)
        return row, listed

    return make
