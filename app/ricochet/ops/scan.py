"""Reading the failed queue: the one loop that failed list, show, discard, replay and the
console share.

A scan reads the copies Q.failed holds when it starts, once each, on a channel of its own in
AMQP transaction mode, and holds every copy it reads unacked. A copy leaves Q.failed only by
take(): its ack, with its replay's publish to Q when there is one, goes in a transaction that is
committed in batches. The broker applies a commit whole or not at all, and answers it only once
Q has confirmed the publishes, so a scan killed or cut off midway leaves each copy either in
Q.failed or (taken) out of it, its replay in Q: never in both, never in neither.

One scan reads a failed queue at a time: two side by side would each be handed part of it. A scan
first holds a lock that the broker keeps for it, an exclusive queue with an exclusive consumer
(basic.consume's exclusive flag on Q.failed itself would do on a classic queue, but quorum queues
ignore it), and gives it up only once the copies it read count as ready again, so the next scan
finds them all. A scan that does not get the lock, or finds another consumer of Q.failed, waits
for it (OTHER_READER_WAIT_S at most), then says why.

The copies a scan only read go back at its end with one basic.nack(requeue=true), which keeps
their order (on 3.10 and 4.0, as far as one consumer read them); if the process dies first, the
broker hands them back when the channel goes. Its consumers go first: a copy nacked while they
are there would be delivered to them again. Read copies are never rejected one by one: RabbitMQ
4.3 counts a basic.reject, and a return by a closed channel, in a quorum copy's
x-delivery-count, but not a basic.nack (3.10 and 4.0 count every return in it, 4.1 and 4.2 in
x-acquired-count, which their delivery limit reads).

So a read wears a quorum copy down towards the queue's delivery limit, where the broker drops it,
on every version before 4.3, and on 4.3 a read cut off does. A scan reads the limit (arguments
and policies, through the management API) before it reads a copy: before 4.3 it reads nothing
while a limit stands, since every read brings each copy it reads one return nearer (a scan that
read and then refused would too, so no margin keeps a console polled long enough safe); on
4.3 it refuses once a copy it reads is so near the limit that two cut-off reads would drop it,
handing every copy back by a nack, which costs them nothing. Either way it raises
DeliveryLimitRefusal, saying how to lift the limit. (4.x lifts it on Q.failed:
docs/reading-failed-queue.md.)
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractTransaction,
)
from aio_pika.exceptions import ChannelClosed
from yarl import URL

from ricochet.broker.amqp import CONNECTION_ERRORS, broker_version, requeue_all
from ricochet.broker.depth import Depth, read_depth
from ricochet.broker.management import api_url as management_api
from ricochet.broker.management import open_api, vhost
from ricochet.broker.plan import QUEUE_TYPE, delivery_limit_policy_command
from ricochet.delivery.failed import FailureInfo, read_failure
from ricochet.errors import ManagementUnavailable, MissingQueue, RicochetError
from ricochet.headers import DELIVERY_COUNT
from ricochet.ladders import is_int
from ricochet.log import get_logger
from ricochet.names import Names
from ricochet.ops.limits import DeliveryLimit, delivery_limit, with_current_policies
from ricochet.ops.selection import Outcome, Selection
from ricochet.service.process import stop_signals

log = get_logger("ricochet.scan")

# Copies taken per transaction at most; a batch is also committed when no copy came for
# COMMIT_IDLE_S, so that what a slow scan took becomes final soon.
COMMIT_EVERY = 500
COMMIT_IDLE_S = 0.1
# With no delivery for this long, the scan asks the broker whether any copy is still ready for it.
IDLE_S = 1.0
# How long a scan's end waits for the broker to count the copies it handed back.
RETURN_WAIT_S = 2.0
# A scan waits this long at most for another reader of Q.failed to hand its copies back.
OTHER_READER_WAIT_S = 30.0
# How often a scan asks again for the lock another scan holds.
LOCK_RETRY_S = 0.1
# How long a scan waits for the management API to say what delivery limit Q.failed has.
LIMIT_READ_S = 2.0
# ... and this much more for each further queue asked of in one session (a waiting scan's).
LIMIT_READ_EACH_S = 0.1
# The first RabbitMQ that does not count a basic.nack against a quorum queue's delivery limit.
NACK_FREE_FROM = (4, 3)
# The counted returns a copy must have to spare, before the delivery limit, for a scan on 4.3 to
# read it: one for this scan, should it be cut off, and one for the next, which then refuses it,
# should that be cut off too.
RETURNS_TO_SPARE = 2
# Unacked deliveries per consumer. A scan holds every copy it reads, and a quorum queue hands a
# consumer without a limit no more than 2,000, so a scan adds a consumer whenever less than one
# consumer's worth of room is left. Far larger credits make RabbitMQ 3.10's quorum queues read
# the whole batch at once, busy for minutes at 100,000 copies (docs/performance.md).
PER_CONSUMER = 2_000


class DeliveryLimitRefusal(RicochetError):
    """Raised when reading the failed queue could make the broker drop copies at its delivery
    limit: the scan read none, or handed back every copy it read."""


@dataclass(frozen=True)
class Copy:
    """One failed copy as a scan read it."""

    message: AbstractIncomingMessage
    failure: FailureInfo


class Scan:
    """The copies of Q.failed, read once each; see the module's docstring."""

    def __init__(
        self,
        channel: AbstractChannel,
        transaction: AbstractTransaction,
        names: Names,
        depth: int,
        on_taken: Callable[[list[Copy]], None],
        limit: DeliveryLimit | None = None,
    ) -> None:
        """limit: the delivery limit to refuse a copy near (a broker where a nack costs nothing)."""
        self.depth = depth
        self.read = 0
        self.taken = 0
        self._channel = channel
        self._tx = transaction
        self._names = names
        self._on_taken = on_taken
        self._limit = limit
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._pending: list[Copy] = []
        self._replays = 0  # publishes to Q in the current batch
        self._returned: list[str | None] = []
        self._consumers: list[str] = []
        self._queue: AbstractQueue | None = None
        channel.return_callbacks.add(self._on_return)

    async def subscribe(self, queue: AbstractQueue) -> None:
        """One more consumer of Q.failed, with room for PER_CONSUMER more copies."""
        self._queue = queue
        self._consumers.append(await queue.consume(self.receive, no_ack=False))

    async def _room(self) -> None:
        """Subscribe again once the copies read come within one consumer's worth of what the
        consumers may hold: counted by copies read, not received, so that no more than two
        consumers' worth waits unread in memory however fast the broker delivers."""
        while self._queue is not None and self.read + PER_CONSUMER > (
            len(self._consumers) * PER_CONSUMER
        ):
            await self.subscribe(self._queue)

    async def receive(self, message: AbstractIncomingMessage) -> None:
        """The consumer's callback: a delivery waits for copies() in the order it came."""
        await self._inbox.put(message)

    def _on_return(self, _: object, message: AbstractIncomingMessage) -> None:
        self._returned.append(message.message_id)

    async def copies(self) -> AsyncIterator[Copy]:
        """The copies Q.failed held at the start (fewer if someone else takes some meanwhile)."""
        while self.read < self.depth:
            await self._room()
            try:
                message = await asyncio.wait_for(
                    self._inbox.get(), COMMIT_IDLE_S if self._pending else IDLE_S
                )
            except TimeoutError:
                if self._pending:
                    await self.commit()  # the stream paused: what was taken becomes final now
                    continue
                left = await read_depth(self._channel, self._names.failed)
                if left is None or left.messages == 0:
                    return  # another reader or a purge took the rest
                if self._queue is not None:
                    await self.subscribe(self._queue)  # the broker holds back: more room
                continue
            self.read += 1
            headers = dict(message.headers or {})
            self._check(message.message_id, headers.get(DELIVERY_COUNT))
            yield Copy(
                message, read_failure(headers, message.message_id, message.type, message.body)
            )

    def _check(self, message_id: str | None, count: object) -> None:
        """Refuse a copy so near the delivery limit that it could not spare RETURNS_TO_SPARE
        more counted returns."""
        if self._limit is None or not is_int(count):
            return
        if self._limit.value - count < RETURNS_TO_SPARE:
            raise DeliveryLimitRefusal(
                f"{self._names.failed} has a delivery limit of {self._limit.value} "
                f"({self._limit.source}), and its copy {message_id!r} has been handed back "
                f"{count} times as the broker counts them ({DELIVERY_COUNT}): a read cut off "
                "before it hands the copy back could bring it to the limit, where the broker "
                "drops it. Every copy read was handed back; none was lost. "
                + _lift(self._names, self._limit)
            )

    async def take(self, copy: Copy, replay: aio_pika.Message | None = None) -> None:
        """Remove a copy from Q.failed (publishing replay to Q with it), in the current batch."""
        if replay is not None:
            await self._channel.default_exchange.publish(
                replay, routing_key=self._names.queue, mandatory=True
            )
            self._replays += 1
        await copy.message.ack()
        self._pending.append(copy)
        if len(self._pending) >= COMMIT_EVERY:
            await self.commit()

    async def commit(self) -> None:
        """Make the current batch final, then report it to on_taken."""
        if not self._pending:
            return
        # A publish to a queue that is gone would be returned while its copy's ack applies.
        if self._replays and await read_depth(self._channel, self._names.queue) is None:
            raise MissingQueue(self._names.queue)
        await self._tx.commit()
        batch, self._pending, self._replays = self._pending, [], 0
        self.taken += len(batch)
        if self._returned:
            returned, self._returned = self._returned, []
            raise RicochetError(
                f"{self._names.queue} refused {len(returned)} replayed jobs as they were "
                f"committed (deleted meanwhile?): {returned[:10]}"
            )
        self._on_taken(batch)

    async def finish(self) -> None:
        """Commit the last batch and hand back, in one nack, every copy only read."""
        await self.commit()
        await self._hand_back()

    async def abandon(self) -> None:
        """Undo the current batch (its acks and publishes) and hand back, in one nack, every copy
        read: by a nack, which RabbitMQ 4.3 does not count, rather than the channel's close."""
        await self._tx.rollback()
        self._pending, self._replays = [], 0
        await self._hand_back()

    async def _hand_back(self) -> None:
        # The consumers go first: the broker would deliver a nacked copy to them again.
        if self._queue is not None:
            for consumer in self._consumers:
                await self._queue.cancel(consumer)
        held = self.read - self.taken + self._inbox.qsize()
        await requeue_all(self._channel)
        await self._tx.commit()
        await self._returned_to_queue(held)

    async def _returned_to_queue(self, held: int) -> None:
        """Wait (a little at most) until the queue counts the copies handed back as ready again:
        a quorum queue applies the nack a moment after the commit, and a scan started meanwhile
        would take the failed queue for emptier than it is."""
        deadline = asyncio.get_running_loop().time() + RETURN_WAIT_S
        while held and asyncio.get_running_loop().time() < deadline:
            depth = await read_depth(self._channel, self._names.failed)
            if depth is None or depth.messages >= held:
                return
            await asyncio.sleep(0.01)


@asynccontextmanager
async def scanning(
    connection: AbstractConnection,
    names: Names,
    on_taken: Callable[[list[Copy]], None] = lambda _: None,
    *,
    management_url: str | None = None,
) -> AsyncIterator[Scan]:
    """A scan of Q.failed for the block; MissingQueue when there is no failed queue, and
    DeliveryLimitRefusal when its delivery limit makes reading it unsafe.

    When the block ends normally the last batch is committed and the copies only read are handed
    back; when it raises, nothing uncommitted applies and every copy is handed back. The delivery
    limit is read through the management API at management_url (None: where RabbitMQ serves it
    beside the connection's AMQP listener by default).
    """
    deadline = asyncio.get_running_loop().time() + OTHER_READER_WAIT_S
    held_by = "another scan (a failed list, replay or console page)"
    async with scan_lock(connection, names.failed_scan, names.failed, held_by, deadline):
        channel = await connection.channel(publisher_confirms=False)
        try:
            depth = await _alone(channel, names, deadline)
            version = broker_version(connection)
            limit = None
            if depth.messages:
                limit = await read_limit(connection, names.failed, management_url, version)
            if limit is not None and not _nack_free(version):
                raise DeliveryLimitRefusal(_every_read_counts(names, limit, version))
            transaction = channel.transaction()
            await transaction.select()
            scan = Scan(channel, transaction, names, depth.messages, on_taken, limit)
            await channel.set_qos(prefetch_count=PER_CONSUMER)
            await scan.subscribe(await channel.get_queue(names.failed, ensure=False))
            try:
                yield scan
            except Exception:
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await scan.abandon()
                raise
            await scan.finish()
        finally:
            if not channel.is_closed:
                await channel.close()


@asynccontextmanager
async def scan_lock(
    connection: AbstractConnection, lock: str, reading: str, held_by: str, deadline: float
) -> AsyncIterator[None]:
    """Hold a scan's lock (the queue named lock) for the block, waiting for another scan of
    reading (held_by, in words) to give it up, until deadline. An exclusive queue keeps out
    other connections (RESOURCE_LOCKED), and an exclusive consumer on it other channels of the
    same connection (ACCESS_REFUSED); the broker drops both when the connection goes, so a scan
    killed holds nothing."""
    loop = asyncio.get_running_loop()
    said = False
    while True:
        channel = await connection.channel(publisher_confirms=False)
        try:
            queue = await channel.declare_queue(
                lock,
                exclusive=True,
                auto_delete=True,
                arguments={QUEUE_TYPE: "classic"},
            )
            await queue.consume(_ignore, no_ack=True, exclusive=True)
            break
        except ChannelClosed as refused:  # the broker closed the channel: another scan has it
            if loop.time() >= deadline:
                raise RicochetError(
                    f"{reading} is still being read by {held_by} after "
                    f"{OTHER_READER_WAIT_S:g} s: what it holds cannot all be seen until it hands "
                    f"it back; try again then (the broker said: {refused})"
                ) from None
            if not said:
                log.info("waiting for another scan", queue=reading)
                said = True
            await asyncio.sleep(LOCK_RETRY_S)
    try:
        yield
    finally:
        if not channel.is_closed:
            await channel.close()  # its consumer goes, and the queue with it (auto-delete)


async def _ignore(_: AbstractIncomingMessage) -> None:
    """The lock's consumer: nothing is published to the lock, and nothing it gets matters."""


async def _alone(channel: AbstractChannel, names: Names, deadline: float) -> Depth:
    """Q.failed's depth once no other reader holds copies of it. Other scans wait for the lock;
    a consumer of another kind (of your own, or a scan of an older ricochet) holds every copy it
    read unacked, which the depth leaves out: a scan that started beside it would find the queue
    emptier than it is, and miss copies."""
    loop = asyncio.get_running_loop()
    said = False
    while True:
        depth = await read_depth(channel, names.failed)
        if depth is None:
            raise MissingQueue(names.failed)
        if depth.consumers == 0:
            return depth
        if loop.time() >= deadline:
            raise RicochetError(
                f"{names.failed} is still being read by {depth.consumers} other consumer(s) "
                f"after {OTHER_READER_WAIT_S:g} s (a consumer of your own, or an older ricochet's "
                "failed list, replay or console page): its copies cannot all be seen until they "
                "are handed back; try again then"
            )
        if not said:
            log.info("waiting for another reader", queue=names.failed, consumers=depth.consumers)
            said = True
        await asyncio.sleep(0.1)


def management_url_beside(amqp_url: URL) -> str:
    """Where RabbitMQ serves the management API beside an AMQP listener by default: the same host,
    the AMQP port plus 10,000 (15672 beside 5672, and over HTTPS 15671 beside 5671)."""
    tls = amqp_url.scheme == "amqps"
    port = amqp_url.explicit_port or (5671 if tls else 5672)
    api = URL.build(scheme="https" if tls else "http", host=amqp_url.host or "", port=port + 10_000)
    return f"{api}/"


async def read_limit(
    connection: AbstractConnection,
    queue_name: str,
    management_url: str | None,
    version: tuple[int, ...] | None,
) -> DeliveryLimit | None:
    """A queue's delivery limit, from the management API; None when it has none, or when the API
    cannot say (logged: a scan then reads as if there were none)."""
    limits = await read_limits(connection, [queue_name], management_url, version)
    return limits[queue_name]


async def read_limits(
    connection: AbstractConnection,
    queue_names: list[str],
    management_url: str | None,
    version: tuple[int, ...] | None,
) -> dict[str, DeliveryLimit | None]:
    """The delivery limit of each queue, read in one session of the management API (see
    read_limit)."""
    assert connection.transport is not None
    amqp_url = connection.transport.connection.url
    api_url = management_url or management_url_beside(amqp_url)
    found: dict[str, DeliveryLimit | None] = dict.fromkeys(queue_names)
    limit_s = LIMIT_READ_S + LIMIT_READ_EACH_S * len(queue_names)
    try:
        async with asyncio.timeout(limit_s), open_api(api_url, str(amqp_url)) as api:
            vh = vhost(str(amqp_url))
            queues = {name: await api.queue(vh, name, LIMIT_COLUMNS) for name in queue_names}
            for name in [name for name, queue in queues.items() if queue is None]:
                log.warning(
                    "delivery limit unknown: the management API has no such queue",
                    queue=name,
                    api=management_api(api_url),
                )
            held = {name: queue for name, queue in queues.items() if queue is not None}
            current = await with_current_policies(api, vh, held)
    except (ManagementUnavailable, TimeoutError) as error:
        log.warning(
            "delivery limit unknown: reading as if there were none",
            queues=queue_names,
            error=str(error) or f"no answer within {limit_s:g} s",
        )
        return dict.fromkeys(queue_names)
    return found | {name: delivery_limit(queue, version) for name, queue in current.items()}


# What the management API must say of Q.failed for its delivery limit.
LIMIT_COLUMNS = "name,type,arguments,policy,operator_policy,effective_policy_definition"


def _nack_free(version: tuple[int, ...] | None) -> bool:
    """Whether the broker hands a copy back by basic.nack without counting it against the
    delivery limit."""
    return version is not None and version >= NACK_FREE_FROM


def _version_text(version: tuple[int, ...] | None) -> str:
    return "this RabbitMQ" if version is None else "RabbitMQ " + ".".join(map(str, version))


def _every_read_counts(names: Names, limit: DeliveryLimit, version: tuple[int, ...] | None) -> str:
    """Why a scan reads nothing of a failed queue with a delivery limit, on a broker that counts
    every copy a read hands back against it."""
    return (
        f"{names.failed} has a delivery limit of {limit.value} ({limit.source}), and "
        f"{_version_text(version)} counts every copy a read hands back against it: each read "
        "(a failed list, show, discard or replay, a console page) brings every copy it reads "
        "one step nearer to being dropped, so none is read while the limit stands. "
        + _lift(names, limit, rabbitmq_3=version is not None and version < (4, 0))
    )


def _lift(names: Names, limit: DeliveryLimit, *, rabbitmq_3: bool = False) -> str:
    """How to lift the failed queue's delivery limit."""
    if limit.set_by == "argument":
        return (
            f"A policy cannot lift a queue's own argument: once {names.failed} is drained "
            "(replay or discard its copies by other means), delete it and run `ricochet topology`."
        )
    if rabbitmq_3:
        return (
            "RabbitMQ 3 has no value that lifts a delivery limit: remove delivery-limit from "
            f"{limit.source}, or narrow its pattern so that it skips {names.failed}."
        )
    command = f"`{delivery_limit_policy_command(names)}`"
    if limit.set_by == "policy":
        return (
            f"Remove delivery-limit from {limit.source}, or lift it with a policy of a higher "
            f"priority than that one: {command}."
        )
    return f"Lift it: {command}."


@dataclass(frozen=True)
class Removal:
    """What taking a selected copy means: the event logged for it, and the job it puts back in
    the main queue (none: the copy is discarded)."""

    event: str
    replay: Callable[[Copy], aio_pika.Message] | None = None


async def select(
    connection: AbstractConnection,
    names: Names,
    selection: Selection,
    *,
    removal: Removal | None = None,
    limit: int | None = None,
    stop: asyncio.Event | None = None,
    management_url: str | None = None,
) -> Outcome:
    """The copies that match (at most limit), removed as removal says (none: only read).

    Each removal is logged, with the copy's message_id, type and reason (never its body), once
    its batch is committed. Stops early, committing what it took, when stop is set. The
    management API at management_url tells the failed queue's delivery limit (see scanning).
    """
    removed: list[FailureInfo] = []

    def log_removed(batch: list[Copy]) -> None:
        assert removal is not None
        for copy in batch:
            f = copy.failure
            log.info(removal.event, message_id=f.message_id, type=f.type, reason=f.reason)
            removed.append(f)

    async with scanning(connection, names, log_removed, management_url=management_url) as scan:
        outcome = Outcome(depth=scan.depth)
        matched = 0
        async for copy in scan.copies():
            if stop is not None and stop.is_set():
                outcome.interrupted = True
                break
            if not selection.matches(copy.failure):
                continue  # handed back at the end of the scan
            if removal is None:
                outcome.selected.append(copy.failure)
            else:
                await scan.take(copy, removal.replay(copy) if removal.replay else None)
            matched += 1
            if limit is not None and matched >= limit:
                break
    if removal is not None:
        outcome.selected = removed
    return outcome


async def under_signals(
    work: Callable[[asyncio.Event], Awaitable[Outcome]], names: Names, what: str
) -> Outcome:
    """work(stop) under Ctrl-C: a first signal sets stop, so it ends after the copy in hand and
    commits what it took; a second abandons it, and what it had not committed stays put."""
    with stop_signals() as lifecycle:
        outcome = await lifecycle.unless_forced(work(lifecycle.stopping))
    if outcome is None:
        raise RicochetError(
            f"{what} abandoned by a second signal: the copies taken since its last commit are "
            f"back in {names.failed}, none was lost or doubled"
        )
    return outcome
