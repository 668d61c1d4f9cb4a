"""The broker topology: the only module that spells queue names and x-* queue arguments."""

import asyncio
import functools
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

from ricochet.broker.amqp import COMMAND_INVALID, broker_version
from ricochet.broker.depth import KeptChannel, read_depth
from ricochet.broker.management import open_api, vhost
from ricochet.errors import ConfigError, ManagementUnavailable
from ricochet.settings import Settings

log = structlog.get_logger("ricochet.topology")

MAX_TIERS = 25  # the upper bound of RICOCHET_MAX_RETRIES: stale tiers are looked for up to here
EVENTS_MAX_LENGTH = 10_000
QUEUE_TYPE = "x-queue-type"
TTL = "x-message-ttl"  # a tier's delay
DELIVERY_LIMIT = "x-delivery-limit"
# What the management API says a quorum tier holds. `messages` counts ready and unacked jobs and
# those that expired but whose dead-letter its target has not confirmed yet (`messages_dlx`,
# at-least-once): a passive declare counts the ready ones only.
TIER_FIGURES = ("messages", "messages_ready", "messages_unacknowledged", "messages_dlx")
# A new queue's figures reach the API within two statistics intervals (5 s each by default).
FIGURES_WAIT_S = 15
# Jitter: each tier is this many queues ("lanes") with delays spread evenly over
# [d x (1 - jitter), d]; a random exchange puts each job in one of them.
LANES = 8
RANDOM_EXCHANGE = "x-random"  # the rabbitmq_random_exchange plugin, shipped with RabbitMQ
# The delays (schedules, RetryLater): level k waits 2^k units; a job's routing key spells its delay
# in binary, one level per digit, so any delay takes at most one queue per level.
DELAY_UNIT_MS = 100
DELAY_LEVELS = 25  # (2^25 - 1) x 100 ms: 38.8 days, beyond the longest schedule of 30 days
LONGEST_DELAY_MS = (2**DELAY_LEVELS - 1) * DELAY_UNIT_MS
# The cancel store: a stream every worker reads from its start. It keeps each cancel at least as
# long as the longest wait (a 30-day schedule) and a day more; older segments are dropped.
CANCELS_MAX_AGE = "31D"
CANCELS_MAX_AGE_S = 31 * 86_400
CANCELS_SEGMENT_BYTES = 1_000_000  # retention drops whole segments: small ones go on time


# The settings plan() reads: recorded in the broker by a declaration (broker/record.py), so
# that commands which only read the topology take them from there, not from their own settings.
PLAN_FIELDS = frozenset(
    {
        "queue_type",
        "max_retries",
        "retry_delay_ms",
        "retry_delay_multiplier",
        "retry_delay_max_ms",
        "retry_delays_ms",
        "retry_jitter",
    }
)


def tier_delays_ms(first_ms: int, multiplier: float, cap_ms: int, tiers: int) -> list[int]:
    """Delay of each retry tier k = 1..tiers: first * multiplier^(k-1), capped, whole ms."""
    return [round(min(first_ms * multiplier ** (k - 1), cap_ms)) for k in range(1, tiers + 1)]


def ladder_ms(settings: Settings) -> list[int]:
    """Each tier's delay: the explicit ladder when set, else the formula's."""
    if settings.retry_delays_ms is not None:
        return list(settings.retry_delays_ms)
    return tier_delays_ms(
        settings.retry_delay_ms,
        settings.retry_delay_multiplier,
        settings.retry_delay_max_ms,
        settings.max_retries,
    )


def lane_delays_ms(delay_ms: int, jitter: float) -> list[int]:
    """The delays of a jittered tier's lanes 1..LANES-1, evenly down to delay x (1 - jitter);
    the tier's own queue is the lane of the full delay."""
    step = delay_ms * jitter / (LANES - 1)
    return [round(delay_ms - i * step) for i in range(1, LANES)]


def delay_key(delay_ms: int, queue: str) -> str:
    """The routing key that holds a job for delay_ms (rounded up to a whole unit, never less)
    in the shared levels, then hands it to its queue: the units in binary, most significant
    level first, one word per level, then the queue's name (at most 50 + 200 bytes of 255)."""
    units = min(math.ceil(max(delay_ms, 0) / DELAY_UNIT_MS), 2**DELAY_LEVELS - 1)
    return ".".join(format(units, f"0{DELAY_LEVELS}b")) + "." + queue


def return_key(queue: str) -> str:
    """The shared return exchange's binding to a queue: a delay key of any units that ends in
    exactly the queue's name, word for word, so that `x` never takes `a.x`'s jobs."""
    return "*." * DELAY_LEVELS + queue


# A delay key: the levels' digits, then the queue's name (the per-queue levels of earlier
# versions spelled the digits alone).
_DELAY_KEY = re.compile(rf"[01](\.[01]){{{DELAY_LEVELS - 1}}}(\..+)?")


def is_delay_key(routing_key: str) -> bool:
    """Whether a delivery's routing key is one that spelled a wait in the delays."""
    return _DELAY_KEY.fullmatch(routing_key) is not None


def _level_pattern(k: int, digit: str) -> str:
    """The topic pattern of level k's digit in a delay key."""
    return "*." * (DELAY_LEVELS - 1 - k) + digit + ".#"


# What a vhost's ricochet queues share begins with this; no job queue may (SPEC 18).
SHARED_PREFIX = "ricochet."


@dataclass(frozen=True)
class SharedNames:
    """The objects declared once per virtual host and shared by every ricochet queue in it:
    the delays' levels, where a job whose queue is gone ends, and the cancel store."""

    def delay(self, k: int) -> str:
        """Level k of the delays: a topic exchange, and the queue of that name that waits 2^k
        units."""
        return f"{SHARED_PREFIX}delay.{k}"

    @property
    def delay_entry(self) -> str:
        """Where a job to delay is published, with delay_key as its routing key."""
        return self.delay(DELAY_LEVELS - 1)

    @property
    def return_exchange(self) -> str:
        """Where the lowest level passes a due job on, to its queue by the end of its key."""
        return f"{SHARED_PREFIX}return"

    @property
    def orphans(self) -> str:
        """The exchange (the return exchange's alternate) and queue of jobs whose queue is gone."""
        return f"{SHARED_PREFIX}orphans"

    @property
    def cancels(self) -> str:
        """The cancel store: a stream whose records name their queue."""
        return f"{SHARED_PREFIX}cancels"

    @property
    def cancels_snapshot(self) -> str:
        """The newest snapshot of the cancel store, where a starting worker begins to read it."""
        return f"{SHARED_PREFIX}cancels.snapshot"


SHARED = SharedNames()


@dataclass(frozen=True)
class Names:
    """Every name derives from the main queue's."""

    queue: str

    @property
    def dlx(self) -> str:
        return f"{self.queue}.dlx"

    @property
    def first_tier_exchange(self) -> str:
        return f"{self.queue}.dlx.first"

    @property
    def return_exchange(self) -> str:
        return f"{self.queue}.return"

    @property
    def failed(self) -> str:
        """The failed exchange, and the durable failed queue bound to it."""
        return f"{self.queue}.failed"

    @property
    def failed_scan(self) -> str:
        """The exclusive queue that a scan of the failed queue holds as its lock while it reads."""
        return f"{self.queue}.failed.scan"

    @property
    def events(self) -> str:
        return f"{self.queue}.failed.events"

    @property
    def record(self) -> str:
        """The queue holding the settings the topology was declared with (broker/record.py)."""
        return f"{self.queue}.topology"

    def tier(self, k: int) -> str:
        return f"{self.queue}.retry.{k}"

    def lanes(self, k: int) -> str:
        """The random exchange that spreads tier k's jobs over its lanes (with jitter)."""
        return f"{self.queue}.retry.{k}.lanes"

    def lane(self, k: int, i: int) -> str:
        """Lane i = 1..LANES-1 of tier k; lane 0 is the tier's own queue."""
        return f"{self.queue}.retry.{k}.lane.{i}"

    def delay(self, k: int) -> str:
        """Level k of the per-queue delays of earlier versions (retired once empty: the shared
        levels, SharedNames.delay, replace them)."""
        return f"{self.queue}.delay.{k}"

    @property
    def delay_entry(self) -> str:
        """Where an earlier version published a job to delay in the per-queue levels."""
        return self.delay(DELAY_LEVELS - 1)

    @property
    def cancels(self) -> str:
        """The per-queue cancel store of earlier versions, read until its cancels expire."""
        return f"{self.queue}.cancels"

    def published_key(self, routing_key: str) -> str:
        """The key a job was published with, as far as its own key tells: one back from the
        delays carries the key that spelled its wait, and jobs go to Q by its name."""
        return self.queue if is_delay_key(routing_key) else routing_key

    def attempt_key(self, k: int) -> str:
        return f"{self.queue}.attempt.{k}"

    def is_attempt_key(self, routing_key: str) -> bool:
        """Whether a delivery's routing key says it came back from a retry tier."""
        return self.tier_of_key(routing_key) is not None

    def tier_of_key(self, routing_key: str) -> int | None:
        """The k of a routing key Q.attempt.k (the tier a job came back from), else None."""
        prefix = f"{self.queue}.attempt."
        digits = routing_key[len(prefix) :]
        if routing_key.startswith(prefix) and digits.isascii() and digits.isdigit():
            return int(digits)
        return None


@dataclass(frozen=True)
class QueueSpec:
    """A queue to declare; delay_ms is set for retry tiers."""

    name: str
    arguments: dict[str, Any]
    delay_ms: int | None = None


@dataclass(frozen=True)
class Binding:
    """source exchange -> destination queue (or exchange) with a routing key."""

    source: str
    destination: str
    routing_key: str = ""
    to_exchange: bool = False


@dataclass(frozen=True)
class Plan:
    """Everything ricochet declares for one set of settings."""

    names: Names
    exchanges: list[tuple[str, str, dict[str, Any]]]  # name, type, arguments
    queues: list[QueueSpec]
    bindings: list[Binding]
    tiers: list[QueueSpec] = field(default_factory=list)
    # The lanes of jittered tiers (none without jitter), tier by tier.
    lanes: list[QueueSpec] = field(default_factory=list)
    # What every ricochet queue of the vhost shares (SPEC 18), the same whatever the settings:
    # the levels of the delays (schedules, RetryLater), the queue of orphaned jobs, the cancel
    # store and its snapshot, with their exchanges and bindings.
    delays: list[QueueSpec] = field(default_factory=list)
    orphans: QueueSpec | None = None
    cancel_store: QueueSpec | None = None
    cancel_snapshot: QueueSpec | None = None
    shared_exchanges: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    shared_bindings: list[Binding] = field(default_factory=list)

    @property
    def declared_queues(self) -> list[QueueSpec]:
        """Every queue but the tiers and lanes (whose delays may differ from the settings')."""
        return [*self.queues, *self.shared_queues]

    @property
    def shared_queues(self) -> list[QueueSpec]:
        """The levels of the delays, the orphans' queue, the cancel store and its snapshot."""
        single = (self.orphans, self.cancel_store, self.cancel_snapshot)
        return [*self.delays, *(spec for spec in single if spec is not None)]

    @property
    def jittered(self) -> bool:
        return bool(self.lanes)

    def lanes_of(self, k: int) -> list[QueueSpec]:
        """Tier k's lanes 1..LANES-1 (none without jitter)."""
        return self.lanes[(k - 1) * (LANES - 1) : k * (LANES - 1)]


def _dead_lettering(queue_type: str) -> dict[str, Any]:
    # Quorum queues can dead-letter at-least-once, which requires reject-publish overflow.
    if queue_type == "quorum":
        return {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    return {}


def _no_delivery_limit(queue_type: str, broker_version: tuple[int, ...] | None) -> dict[str, Any]:
    # RabbitMQ 4.0 gives quorum queues a delivery limit of 20, and 4.0 counts a job's rejections
    # from earlier tiers too: a failed copy handed back 20 times would be dropped, a job retried
    # often would be dead-lettered by the broker, not ricochet. -1 lifts it on the queues that
    # have consumers (tiers have none); 3.x has no limit and reads -1 as 0, so it gets none.
    if queue_type == "quorum" and broker_version is not None and broker_version >= (4, 0):
        return {DELIVERY_LIMIT: -1}
    return {}


def plan(settings: Settings, broker_version: tuple[int, ...] | None = None) -> Plan:
    """The declarations and bindings for these settings on a broker of this version (pure;
    None when the version is not known)."""
    n = Names(settings.queue)
    qtype = {QUEUE_TYPE: settings.queue_type}
    dl = _dead_lettering(settings.queue_type)
    unlimited = _no_delivery_limit(settings.queue_type, broker_version)
    delays = ladder_ms(settings)
    r = len(delays)

    def waits(name: str, delay: int, k: int) -> QueueSpec:
        """A queue of tier k that holds each job for delay ms, then sends it back to Q."""
        arguments = {
            **qtype,
            TTL: delay,
            "x-dead-letter-exchange": n.return_exchange,
            "x-dead-letter-routing-key": n.attempt_key(k),
            **dl,
        }
        return QueueSpec(name, arguments, delay_ms=delay)

    tiers = [waits(n.tier(k), delay, k) for k, delay in enumerate(delays, start=1)]
    jitter = settings.retry_jitter
    lane_specs = [
        waits(n.lane(k, i), lane_delay, k)
        for k, delay in enumerate(delays, start=1)
        if jitter > 0
        for i, lane_delay in enumerate(lane_delays_ms(delay, jitter), start=1)
    ]
    bindings = [
        Binding(n.return_exchange, n.queue),
        Binding(n.failed, n.failed),
        Binding(n.failed, n.events),
        Binding(n.dlx, n.failed, n.attempt_key(r), to_exchange=True),
        *(tier_source(n, k, jittered=jitter > 0) for k in range(1, r + 1)),
        *([] if r else [Binding(n.first_tier_exchange, n.failed, to_exchange=True)]),
        *(Binding(n.lanes(k), lane) for k in range(1, r + 1) if jitter > 0 for lane in lanes(n, k)),
        Binding(SHARED.return_exchange, n.queue, return_key(n.queue)),
    ]
    return Plan(
        names=n,
        exchanges=[
            (
                n.dlx,
                aio_pika.ExchangeType.DIRECT.value,
                {"alternate-exchange": n.first_tier_exchange},
            ),
            (n.first_tier_exchange, aio_pika.ExchangeType.FANOUT.value, {}),
            (n.return_exchange, aio_pika.ExchangeType.FANOUT.value, {}),
            (n.failed, aio_pika.ExchangeType.FANOUT.value, {}),
            *((n.lanes(k), RANDOM_EXCHANGE, {}) for k in range(1, r + 1) if jitter > 0),
        ],
        queues=[
            QueueSpec(n.queue, {**qtype, "x-dead-letter-exchange": n.dlx, **dl, **unlimited}),
            QueueSpec(n.failed, {**qtype, **unlimited}),
            QueueSpec(n.events, {**qtype, "x-max-length": EVENTS_MAX_LENGTH, **unlimited}),
        ],
        bindings=bindings,
        tiers=tiers,
        lanes=lane_specs,
        **shared_plan(broker_version),
    )


def shared_plan(broker_version: tuple[int, ...] | None) -> dict[str, Any]:
    """The plan's shared part (Plan's fields): quorum queues whatever the settings, whose
    dead-lettering is at-least-once, with no delivery limit, so that workers of any settings
    declare them alike. A due job whose queue is gone (no binding for its key) goes from the
    return exchange to its alternate, the orphans, rather than wait in the broker's
    dead-letter worker, which would hold back the lowest level for every queue."""
    quorum = {QUEUE_TYPE: "quorum"}
    unlimited = _no_delivery_limit("quorum", broker_version)
    dl = _dead_lettering("quorum")
    topic = aio_pika.ExchangeType.TOPIC.value
    return {
        "delays": [
            QueueSpec(
                SHARED.delay(k),
                {
                    **quorum,
                    TTL: 2**k * DELAY_UNIT_MS,
                    # No routing key of its own: the job keeps its delay key to the end.
                    "x-dead-letter-exchange": _level_below(SHARED, k),
                    **dl,
                    **unlimited,
                },
            )
            for k in range(DELAY_LEVELS)
        ],
        "orphans": QueueSpec(SHARED.orphans, {**quorum, **unlimited}),
        # Kept past the longest wait, in small segments: retention drops whole segments.
        "cancel_store": QueueSpec(
            SHARED.cancels,
            {
                QUEUE_TYPE: "stream",
                "x-max-age": CANCELS_MAX_AGE,
                "x-stream-max-segment-size-bytes": CANCELS_SEGMENT_BYTES,
            },
        ),
        # The last message written, read by a get and a requeue: no delivery limit to drop it.
        "cancel_snapshot": QueueSpec(
            SHARED.cancels_snapshot,
            {**quorum, "x-max-length": 1, "x-overflow": "drop-head", **unlimited},
        ),
        "shared_exchanges": [
            *((SHARED.delay(k), topic, {}) for k in range(DELAY_LEVELS)),
            (SHARED.return_exchange, topic, {"alternate-exchange": SHARED.orphans}),
            (SHARED.orphans, aio_pika.ExchangeType.FANOUT.value, {}),
        ],
        "shared_bindings": [*delay_bindings(SHARED), Binding(SHARED.orphans, SHARED.orphans)],
    }


Levels = Names | SharedNames


def _level_below(n: Levels, k: int) -> str:
    """Where level k of the delays passes a job on: the level below, and from level 0 to the
    return exchange (a queue's own, for the per-queue levels of earlier versions)."""
    return n.delay(k - 1) if k else n.return_exchange


def delay_bindings(n: Levels) -> list[Binding]:
    """Each level of the delays waits (its queue) on a 1 digit and passes a 0 on to the level
    below at once."""
    return [
        binding
        for k in range(DELAY_LEVELS)
        for binding in (
            Binding(n.delay(k), n.delay(k), _level_pattern(k, "1")),
            Binding(n.delay(k), _level_below(n, k), _level_pattern(k, "0"), to_exchange=True),
        )
    ]


def tier_source(n: Names, k: int, *, jittered: bool) -> Binding:
    """The binding that routes tier k's jobs: a fresh job's dead-letter through the first-tier
    exchange, one back from tier k-1 by its key; into the tier's queue, or its lanes."""
    destination = n.lanes(k) if jittered else n.tier(k)
    if k == 1:
        return Binding(n.first_tier_exchange, destination, to_exchange=jittered)
    return Binding(n.dlx, destination, n.attempt_key(k - 1), to_exchange=jittered)


def lanes(n: Names, k: int) -> list[str]:
    """The queues a jittered tier k spreads its jobs over: its own (the full delay) first."""
    return [n.tier(k), *(n.lane(k, i) for i in range(1, LANES))]


def stale_tiers(p: Plan) -> dict[int, str]:
    """The tiers beyond the budget, by number, which an earlier max-retries may have left."""
    return {k: p.names.tier(k) for k in range(len(p.tiers) + 1, MAX_TIERS + 1)}


def stale_bindings(p: Plan) -> list[Binding]:
    """Bindings an earlier max-retries or jitter may have made that this plan must not keep
    (those into a random exchange of lanes go with their lanes, see stale_lanes)."""
    n, r = p.names, len(p.tiers)
    stale = [
        Binding(n.dlx, n.failed, n.attempt_key(j), to_exchange=True)
        for j in range(MAX_TIERS + 1)
        if j != r
    ]
    stale.append(
        Binding(n.first_tier_exchange, n.failed, to_exchange=True)
        if r
        else Binding(n.first_tier_exchange, n.tier(1))
    )
    if p.jittered:  # the tiers' queues are fed through their lanes' exchanges now
        stale.extend(tier_source(n, k, jittered=False) for k in range(1, r + 1))
    # The hold goes first, right after the first-tier route is back (declare's order).
    return [hold_binding(n), *stale]


def stale_lanes(p: Plan) -> list[int]:
    """The tiers whose lanes an earlier jitter or budget may have left: all but the plan's."""
    wanted = range(1, len(p.tiers) + 1) if p.jittered else range(0)
    return [k for k in range(1, MAX_TIERS + 1) if k not in wanted]


def hold_binding(n: Names) -> Binding:
    """Where first dead-letters go while a start rebinds tier 1: straight back to Q, the
    attempt counted, rather than nowhere."""
    return Binding(n.first_tier_exchange, n.queue)


def _declared_before_delivery_limit(spec: QueueSpec, error: str) -> bool:
    return (
        DELIVERY_LIMIT in spec.arguments
        and f"'{DELIVERY_LIMIT}'" in error
        and ("current is none" in error)
    )


def delivery_limit_policy_command(names: Names) -> str:
    """The rabbitmqctl command that lifts RabbitMQ 4's delivery limit on the queues ricochet
    consumes from, for queues declared before ricochet set it (their arguments cannot change)."""
    queues = "|".join(re.escape(q) for q in (names.queue, names.failed, names.events))
    return (
        f"rabbitmqctl set_policy --apply-to queues --priority 10 "
        f"'{names.queue}.no-delivery-limit' '^({queues})$' '{{\"delivery-limit\": -1}}'"
    )


@dataclass(frozen=True)
class Kept:
    """Why a tier that a start wanted gone was kept: the jobs it holds (None when not known)."""

    messages: int | None
    reason: str


def quorum_tier_kept(figures: dict[str, Any] | None) -> Kept | None:
    """Whether the management API's figures show an unbound quorum tier empty (None: it may go)
    or why it stays (pure). Whatever is not known keeps it: deleting loses what it holds."""
    if figures is None:
        return Kept(None, "the management API does not list it")
    counts = [figures.get(f) for f in TIER_FIGURES]
    if not all(isinstance(c, int) for c in counts):
        return Kept(None, "the management API has no figures for it yet")
    total, ready, unacked, dead_lettering = counts
    if not any(counts):
        return None
    return Kept(
        total,
        f"{ready} ready, {unacked} unacked, {dead_lettering} expired whose dead-letter the "
        "broker has not delivered yet",
    )


class _Declarer:
    """Declares a plan on one connection, opening a fresh channel whenever the broker closes one."""

    def __init__(self, connection: AbstractConnection, settings: Settings, names: Names) -> None:
        self._settings = settings
        self._names = names
        self._channel = KeptChannel(connection)

    async def channel(self) -> AbstractChannel:
        return await self._channel.get()

    async def close(self) -> None:
        await self._channel.close()

    async def queue(self, spec: QueueSpec) -> None:
        ch = await self.channel()
        try:
            await ch.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        except ChannelPreconditionFailed as error:
            if not _declared_before_delivery_limit(spec, str(error)):
                raise ConfigError(
                    f"queue {spec.name!r} conflicts with the settings: {error}"
                ) from None
            # Declared by an older ricochet, or on RabbitMQ 3: its arguments cannot change, so it
            # is kept as it is and the operator lifts the limit with a policy (README, Upgrading).
            kept = {k: v for k, v in spec.arguments.items() if k != DELIVERY_LIMIT}
            await (await self.channel()).declare_queue(spec.name, durable=True, arguments=kept)
            log.warning(
                "queue keeps the broker's delivery limit: apply the delivery-limit policy",
                queue=spec.name,
                command=delivery_limit_policy_command(self._names),
            )

    async def message_count(self, name: str) -> int | None:
        """Depth of a queue, or None when it does not exist."""
        depth = await read_depth(await self.channel(), name)
        return None if depth is None else depth.messages

    async def delete_if_empty(self, name: str) -> Kept | None:
        """Delete a tier that exists, is unbound and holds nothing; else say why it stays."""
        ch = await self.channel()
        if self._settings.queue_type == "classic":
            try:
                await ch.queue_delete(name, if_empty=True)
            except ChannelPreconditionFailed:
                return Kept(await self.message_count(name), "it holds jobs")
            return None
        # Quorum queues refuse if-empty. The tier is unbound, so nothing new arrives; the ready
        # count is read now, after the unbinding, and the API tells the rest.
        ready = await self.message_count(name)
        if ready:
            return Kept(ready, f"{ready} ready")
        try:
            kept = quorum_tier_kept(await self._figures(name))
        except ManagementUnavailable as error:
            kept = Kept(None, str(error))
        if kept is None:
            await (await self.channel()).queue_delete(name)
        return kept

    async def _figures(self, name: str) -> dict[str, Any] | None:
        """The management API's figures for a queue, waiting for a new queue's to appear."""
        s = self._settings
        deadline = time.monotonic() + FIGURES_WAIT_S
        async with open_api(s.management_url, s.amqp_url) as api:
            while True:
                figures = await api.queue(vhost(s.amqp_url), name, ",".join(TIER_FIGURES))
                known = figures is not None and all(f in figures for f in TIER_FIGURES)
                if figures is None or known or time.monotonic() > deadline:
                    return figures
                await asyncio.sleep(0.5)

    async def bind(self, b: Binding) -> None:
        ch = await self.channel()
        if b.to_exchange:
            dest = await ch.get_exchange(b.destination, ensure=False)
            await dest.bind(b.source, routing_key=b.routing_key)
        else:
            queue = await ch.get_queue(b.destination, ensure=False)
            await queue.bind(b.source, routing_key=b.routing_key)

    async def exchange_exists(self, name: str) -> bool:
        try:
            await (await self.channel()).get_exchange(name, ensure=True)
        except ChannelNotFoundEntity:
            return False  # the broker closed the channel: the next call opens another
        return True

    async def unbind(self, b: Binding) -> None:
        """Remove a binding, only if its destination exists (the broker would close the
        channel)."""
        if b.to_exchange:
            if await self.exchange_exists(b.destination):
                dest = await (await self.channel()).get_exchange(b.destination, ensure=False)
                await dest.unbind(b.source, routing_key=b.routing_key)
        elif await self.message_count(b.destination) is not None:
            await self.unbind_queue(b)

    async def unbind_queue(self, b: Binding) -> None:
        """Remove a binding into a queue known to exist."""
        queue = await (await self.channel()).get_queue(b.destination, ensure=False)
        await queue.unbind(b.source, routing_key=b.routing_key)


async def _unbind_tier_source(d: _Declarer, p: Plan, k: int) -> None:
    """Stop routing to tier k's queue, which exists: straight from its source, or through its
    lanes' exchange. Tier 1's dead-letters are held on Q until the plan's bindings are back
    when nothing else takes them (a higher tier's fall through to tier 1 meanwhile)."""
    n = p.names
    if k == 1 and not p.jittered:
        await d.bind(hold_binding(n))
    await d.unbind_queue(tier_source(n, k, jittered=False))
    if await d.exchange_exists(n.lanes(k)):
        await d.unbind_queue(Binding(n.lanes(k), n.tier(k)))


async def _declare_waiting(
    d: _Declarer, spec: QueueSpec, unbind: Callable[[], Awaitable[None]], what: str
) -> None:
    """Declare a tier or a lane; unbind() stops routing to it before a delay change."""
    ch = await d.channel()
    try:
        await ch.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        return
    except ChannelPreconditionFailed as error:
        if TTL not in str(error):
            raise ConfigError(f"queue {spec.name!r} conflicts with the settings: {error}") from None
    # The delay changed. TTLs are fixed per queue (messages expire from the head only), so an
    # empty tier is redeclared; one that still holds jobs keeps its old delay until it drains.
    await unbind()
    kept = await d.delete_if_empty(spec.name)
    if kept is None:
        await (await d.channel()).declare_queue(spec.name, durable=True, arguments=spec.arguments)
        log.info(f"{what} redeclared", queue=spec.name, delay_ms=spec.delay_ms)
    else:
        log.warning(
            f"{what} keeps its old delay until it drains",
            queue=spec.name,
            wanted_delay_ms=spec.delay_ms,
            messages=kept.messages,
            reason=kept.reason,
        )


async def _declare_tiers(d: _Declarer, p: Plan) -> None:
    n = p.names
    for k, spec in enumerate(p.tiers, start=1):
        await _declare_waiting(d, spec, functools.partial(_unbind_tier_source, d, p, k), "tier")
        for lane in p.lanes_of(k):
            # A random exchange picks among the lanes bound: one unbound is simply not picked.
            unbind = functools.partial(d.unbind_queue, Binding(n.lanes(k), lane.name))
            await _declare_waiting(d, lane, unbind, "lane")


async def _retire_stale_tiers(d: _Declarer, p: Plan) -> None:
    for k, name in stale_tiers(p).items():
        if await d.message_count(name) is None:
            continue
        await _unbind_tier_source(d, p, k)
        kept = await d.delete_if_empty(name)
        if kept is None:
            log.info("stale tier removed", queue=name)
        else:
            # Its jobs come back to the main queue when their TTL ends; the next start removes it.
            log.warning(
                "stale tier still holds jobs",
                queue=name,
                messages=kept.messages,
                reason=kept.reason,
            )


async def _retire_stale_lanes(d: _Declarer, p: Plan) -> None:
    """Unbind the lanes of tiers that no longer want them (jitter off, a smaller budget) and
    remove the empty ones; the lanes' exchange stays while a lane still holds jobs, so that the
    next start finds them."""
    n = p.names
    for k in stale_lanes(p):
        if not await d.exchange_exists(n.lanes(k)):
            continue
        await d.unbind(tier_source(n, k, jittered=True))
        kept_any = False
        for i in range(1, LANES):
            name = n.lane(k, i)
            if await d.message_count(name) is None:
                continue
            await d.unbind_queue(Binding(n.lanes(k), name))
            kept = await d.delete_if_empty(name)
            if kept is None:
                log.info("stale lane removed", queue=name)
            else:
                kept_any = True
                log.warning(
                    "stale lane still holds jobs",
                    queue=name,
                    messages=kept.messages,
                    reason=kept.reason,
                )
        if not kept_any:
            await (await d.channel()).exchange_delete(n.lanes(k))


async def _declare_exchange(d: _Declarer, name: str, kind: str, arguments: dict[str, Any]) -> None:
    try:
        await (await d.channel()).declare_exchange(name, kind, durable=True, arguments=arguments)
    except COMMAND_INVALID as error:
        if kind != RANDOM_EXCHANGE:
            raise
        raise ConfigError(
            f"RICOCHET_RETRY_JITTER needs the random exchange, which the broker lacks ({error}): "
            "enable it with `rabbitmq-plugins enable rabbitmq_random_exchange`, or set "
            "RICOCHET_RETRY_JITTER=0"
        ) from None


async def declare(connection: AbstractConnection, settings: Settings) -> Plan:
    """Declare (idempotently) and reconcile the topology; ConfigError on a conflicting queue."""
    p = plan(settings, broker_version(connection))
    d = _Declarer(connection, settings, p.names)
    try:
        # The shared part first: the per-queue binding from the return exchange needs it.
        for name, kind, arguments in [*p.shared_exchanges, *p.exchanges]:
            await _declare_exchange(d, name, kind, arguments)
        for spec in p.declared_queues:
            await d.queue(spec)
        for b in p.shared_bindings:
            await d.bind(b)
        await _declare_tiers(d, p)
        await _retire_stale_tiers(d, p)
        # Stale bindings go before new ones: a key with no binding falls through to tier 1,
        # while a key bound twice for a moment would copy the job. The first-tier exchange is
        # the exception: with no binding it drops the dead-letter, so its new route goes first
        # (a dead-letter in that instant may go both ways: a retried job alerted as failed).
        first = [b for b in p.bindings if b.source == p.names.first_tier_exchange]
        for b in first:
            await d.bind(b)
        for b in stale_bindings(p):
            await d.unbind(b)
        await _retire_stale_lanes(d, p)
        for b in p.bindings:
            if b not in first:
                await d.bind(b)
    finally:
        await d.close()
    return p


async def declare_failed_side(connection: AbstractConnection, settings: Settings) -> Plan:
    """Declare only the failed exchange, the failed and events queues and their bindings (the
    monitor's part, which the retry settings do not shape); return the whole plan."""
    p = plan(settings, broker_version(connection))
    d = _Declarer(connection, settings, p.names)
    try:
        ch = await d.channel()
        for name, kind, arguments in p.exchanges:
            if name == p.names.failed:
                await ch.declare_exchange(name, kind, durable=True, arguments=arguments)
        for spec in p.queues:
            if spec.name in (p.names.failed, p.names.events):
                await d.queue(spec)
        for b in p.bindings:
            if b.source == p.names.failed:
                await d.bind(b)
    finally:
        await d.close()
    return p
