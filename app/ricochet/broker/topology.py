"""The broker topology: the only module that spells queue names and x-* queue arguments."""

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelPreconditionFailed

from ricochet.broker.amqp import broker_version
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


# The settings plan() reads: recorded in the broker by a declaration (broker/record.py), so
# that commands which only read the topology take them from there, not from their own settings.
PLAN_FIELDS = frozenset(
    {"queue_type", "max_retries", "retry_delay_ms", "retry_delay_multiplier", "retry_delay_max_ms"}
)


def tier_delays_ms(first_ms: int, multiplier: float, cap_ms: int, tiers: int) -> list[int]:
    """Delay of each retry tier k = 1..tiers: first * multiplier^(k-1), capped, whole ms."""
    return [round(min(first_ms * multiplier ** (k - 1), cap_ms)) for k in range(1, tiers + 1)]


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
    def events(self) -> str:
        return f"{self.queue}.failed.events"

    @property
    def record(self) -> str:
        """The queue holding the settings the topology was declared with (broker/record.py)."""
        return f"{self.queue}.topology"

    def tier(self, k: int) -> str:
        return f"{self.queue}.retry.{k}"

    def attempt_key(self, k: int) -> str:
        return f"{self.queue}.attempt.{k}"

    def is_attempt_key(self, routing_key: str) -> bool:
        """Whether a delivery's routing key says it came back from a retry tier."""
        prefix = f"{self.queue}.attempt."
        return routing_key.startswith(prefix) and routing_key[len(prefix) :].isdigit()


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
    exchanges: list[tuple[str, aio_pika.ExchangeType, dict[str, Any]]]
    queues: list[QueueSpec]
    bindings: list[Binding]
    tiers: list[QueueSpec] = field(default_factory=list)


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
    delays = tier_delays_ms(
        settings.retry_delay_ms,
        settings.retry_delay_multiplier,
        settings.retry_delay_max_ms,
        settings.max_retries,
    )
    tiers = [
        QueueSpec(
            n.tier(k),
            {
                **qtype,
                TTL: delay,
                "x-dead-letter-exchange": n.return_exchange,
                "x-dead-letter-routing-key": n.attempt_key(k),
                **dl,
            },
            delay_ms=delay,
        )
        for k, delay in enumerate(delays, start=1)
    ]
    r = settings.max_retries
    bindings = [
        Binding(n.return_exchange, n.queue),
        Binding(n.failed, n.failed),
        Binding(n.failed, n.events),
        Binding(n.dlx, n.failed, n.attempt_key(r), to_exchange=True),
        Binding(n.first_tier_exchange, n.tier(1))
        if r
        else Binding(n.first_tier_exchange, n.failed, to_exchange=True),
        *(Binding(n.dlx, n.tier(k), n.attempt_key(k - 1)) for k in range(2, r + 1)),
    ]
    return Plan(
        names=n,
        exchanges=[
            (n.dlx, aio_pika.ExchangeType.DIRECT, {"alternate-exchange": n.first_tier_exchange}),
            (n.first_tier_exchange, aio_pika.ExchangeType.FANOUT, {}),
            (n.return_exchange, aio_pika.ExchangeType.FANOUT, {}),
            (n.failed, aio_pika.ExchangeType.FANOUT, {}),
        ],
        queues=[
            QueueSpec(n.queue, {**qtype, "x-dead-letter-exchange": n.dlx, **dl, **unlimited}),
            QueueSpec(n.failed, {**qtype, **unlimited}),
            QueueSpec(n.events, {**qtype, "x-max-length": EVENTS_MAX_LENGTH, **unlimited}),
        ],
        bindings=bindings,
        tiers=tiers,
    )


def stale_tiers(p: Plan) -> dict[int, str]:
    """The tiers beyond the budget, by number, which an earlier max-retries may have left."""
    return {k: p.names.tier(k) for k in range(len(p.tiers) + 1, MAX_TIERS + 1)}


def stale_bindings(p: Plan) -> list[Binding]:
    """Bindings an earlier max-retries may have made that this plan must not keep."""
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
    # The hold goes first, right after the first-tier route is back (declare's order).
    return [hold_binding(n), *stale]


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
                if figures is None or TIER_FIGURES[0] in figures or time.monotonic() > deadline:
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

    async def unbind(self, b: Binding) -> None:
        """Remove a binding; one into a queue only if the queue exists (the broker would close
        the channel)."""
        if b.to_exchange:
            dest = await (await self.channel()).get_exchange(b.destination, ensure=False)
            await dest.unbind(b.source, routing_key=b.routing_key)
        elif await self.message_count(b.destination) is not None:
            await self.unbind_queue(b)

    async def unbind_queue(self, b: Binding) -> None:
        """Remove a binding into a queue known to exist."""
        queue = await (await self.channel()).get_queue(b.destination, ensure=False)
        await queue.unbind(b.source, routing_key=b.routing_key)


async def _unbind_tier_source(d: _Declarer, p: Plan, k: int) -> None:
    """Stop routing to tier k, which exists; tier 1's dead-letters are held on Q until the
    plan's bindings are back (a higher tier's fall through to tier 1 meanwhile)."""
    if k == 1:
        await d.bind(hold_binding(p.names))
    await d.unbind_queue(_tier_source(p, k))


def _tier_source(p: Plan, k: int) -> Binding:
    n = p.names
    return (
        Binding(n.dlx, n.tier(k), n.attempt_key(k - 1))
        if k > 1
        else Binding(n.first_tier_exchange, n.tier(1))
    )


async def _declare_tier(d: _Declarer, p: Plan, k: int, spec: QueueSpec) -> None:
    ch = await d.channel()
    try:
        await ch.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        return
    except ChannelPreconditionFailed as error:
        if TTL not in str(error):
            raise ConfigError(f"queue {spec.name!r} conflicts with the settings: {error}") from None
    # The delay changed. TTLs are fixed per queue (messages expire from the head only), so an
    # empty tier is redeclared; one that still holds jobs keeps its old delay until it drains.
    await _unbind_tier_source(d, p, k)
    kept = await d.delete_if_empty(spec.name)
    if kept is None:
        await (await d.channel()).declare_queue(spec.name, durable=True, arguments=spec.arguments)
        log.info("tier redeclared", queue=spec.name, delay_ms=spec.delay_ms)
    else:
        log.warning(
            "tier keeps its old delay until it drains",
            queue=spec.name,
            wanted_delay_ms=spec.delay_ms,
            messages=kept.messages,
            reason=kept.reason,
        )


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


async def declare(connection: AbstractConnection, settings: Settings) -> Plan:
    """Declare (idempotently) and reconcile the topology; ConfigError on a conflicting queue."""
    p = plan(settings, broker_version(connection))
    d = _Declarer(connection, settings, p.names)
    try:
        ch = await d.channel()
        for name, kind, arguments in p.exchanges:
            await ch.declare_exchange(name, kind, durable=True, arguments=arguments)
        for spec in p.queues:
            await d.queue(spec)
        for k, spec in enumerate(p.tiers, start=1):
            await _declare_tier(d, p, k, spec)
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
