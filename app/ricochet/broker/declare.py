"""Declaring a plan (broker/plan.py): applying, in order, the steps of its diff with a broker
that was not read first (broker/diff.py), and reading a refused declaration as the diff would."""

import asyncio
import time
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import replace
from types import TracebackType
from typing import Any, Self, assert_never

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelPreconditionFailed

from ricochet.broker.amqp import COMMAND_INVALID, broker_version
from ricochet.broker.depth import KeptChannel, exchange_exists, read_depth
from ricochet.broker.diff import (
    NOTHING_READ,
    REBUILD,
    TIER_FIGURES,
    Bind,
    Conflict,
    DeclareExchange,
    DeclareQueue,
    DelayDiffers,
    ExchangeDiffers,
    Kept,
    LimitNotLifted,
    RetireLanes,
    RetireTier,
    Step,
    Unbind,
    Unwanted,
    diff,
    failed_side,
    held_delay_ms,
    quorum_tier_kept,
    reconcile,
    seen_in_refusal,
    tier_routes,
)
from ricochet.broker.management import open_api, vhost
from ricochet.broker.plan import (
    DELIVERY_LIMIT,
    LANES,
    RANDOM_EXCHANGE,
    Binding,
    Exchange,
    Plan,
    QueueSpec,
    delivery_limit_policy_command,
    hold_binding,
    plan,
    tier_source,
)
from ricochet.broker.redeclaring import redeclaring
from ricochet.errors import ConfigError, ManagementUnavailable, TopologyConflict
from ricochet.log import get_logger
from ricochet.settings import Settings

log = get_logger("ricochet.topology")

# A new queue's figures reach the API within two statistics intervals (5 s each by default).
FIGURES_WAIT_S = 15


class _Declarer:
    """Applies a plan's steps on one connection, opening a fresh channel whenever the broker
    closes one; closed on leaving its `async with`."""

    def __init__(self, connection: AbstractConnection, settings: Settings, p: Plan) -> None:
        self._connection = connection
        self._settings = settings
        self._plan = p
        self._channel = KeptChannel(connection)
        # What the broker keeps with an older delay, as far as the steps applied tell.
        self.kept: dict[str, int | None] = dict(p.kept)
        # Whether a step stopped routing to a tier or lane whose delay changed.
        self.rerouted = False
        # The redeclare lock, taken at the first tier or lane whose delay changed and held until
        # the declarer closes: the routes restored after it are declared under it as well.
        self._lock = AsyncExitStack()
        self._locked: bool | None = None

    async def channel(self) -> AbstractChannel:
        return await self._channel.get()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self._lock.aclose()
        finally:
            await self._channel.close()

    async def hold_lock(self) -> bool:
        """Whether this declarer holds the queue's redeclare lock, taking it on the first call
        (False: another connection held it all the wait, and the declare goes on without it)."""
        if self._locked is None:
            self._locked = await self._lock.enter_async_context(
                redeclaring(self._connection, self._plan.names)
            )
        return self._locked

    async def apply(self, step: Step) -> None:
        match step:
            case DeclareExchange(exchange):
                await self.exchange(exchange)
            case DeclareQueue():
                await self.queue(step)
            case Bind(binding):
                await self.bind(binding)
            case Unbind(binding):
                await self.unbind(binding)
            case DelayDiffers():
                await self.redeclare_when_empty(step)
            case LimitNotLifted():
                await self.keep_delivery_limit(step)
            case RetireTier(k, name):
                await self.retire_tier(k, name)
            case RetireLanes(k):
                await self.retire_lanes(k)
            case Conflict() | ExchangeDiffers() | Unwanted():
                self.mismatch(step)
            case _:
                assert_never(step)

    @staticmethod
    def mismatch(step: Conflict | ExchangeDiffers | Unwanted) -> None:
        """What only an operator mends: the declare refuses to go on over an object that
        differs; a binding ricochet did not make is left where it is (doctor names it)."""
        match step:
            case Conflict(spec, seen, differences):
                why = seen.refusal or ", ".join(str(d) for d in differences)
                raise TopologyConflict(
                    f"queue {spec.name!r} conflicts with the settings: {why}; {REBUILD}"
                )
            case ExchangeDiffers(x):
                raise TopologyConflict(f"exchange {x.name!r} conflicts with the settings: {step}")
            case Unwanted():
                pass

    async def exchange(self, x: Exchange) -> None:
        try:
            await (await self.channel()).declare_exchange(
                x.name, x.kind, durable=True, arguments=x.arguments
            )
        except COMMAND_INVALID as error:
            if x.kind != RANDOM_EXCHANGE:
                raise
            raise ConfigError(
                f"RICOCHET_RETRY_JITTER needs the random exchange, which the broker lacks "
                f"({error}): enable it with `rabbitmq-plugins enable rabbitmq_random_exchange`, "
                "or set RICOCHET_RETRY_JITTER=0"
            ) from None

    async def queue(self, step: DeclareQueue) -> None:
        """Declare a queue; one the broker refuses is read as the diff reads what differs."""
        spec = step.spec
        try:
            await (await self.channel()).declare_queue(
                spec.name, durable=True, arguments=spec.arguments
            )
            self.kept.pop(spec.name, None)
            return
        except ChannelPreconditionFailed as error:
            seen = seen_in_refusal(spec, str(error))
        found = reconcile(step, seen)
        # A refusal whose words name nothing that differs is a conflict all the same.
        await self.apply(found if found is not None else Conflict(spec, seen, ()))

    async def keep_delivery_limit(self, step: LimitNotLifted) -> None:
        """Declared by an older ricochet, or on RabbitMQ 3: its arguments cannot change, so it is
        kept as it is and the operator lifts the limit with a policy (docs/deploying.md,
        Upgrading on RabbitMQ 4)."""
        spec = step.spec
        kept = {k: v for k, v in spec.arguments.items() if k != DELIVERY_LIMIT}
        await self.queue(DeclareQueue(replace(spec, arguments=kept)))
        log.warning(
            "queue keeps the broker's delivery limit: apply the delivery-limit policy",
            queue=spec.name,
            command=delivery_limit_policy_command(self._plan.names),
        )

    async def redeclare_when_empty(self, step: DelayDiffers) -> None:
        """Stop routing to a tier or lane whose delay changed; redeclare it if it is empty, else
        it keeps its old delay until it drains (a running worker looks again). One declarer at
        a time does it, each looking again first whether another did it meanwhile."""
        spec = step.spec
        if not await self.hold_lock():
            self._keep(step, Kept(None, "another declarer holds the lock"))
        elif await self.as_planned(spec):
            self.kept.pop(spec.name, None)
        else:
            await self._redeclare_when_empty(step)

    async def _redeclare_when_empty(self, step: DelayDiffers) -> None:
        spec, k = step.spec, step.tier
        n = self._plan.names
        what = "tier" if spec.name == n.tier(k) else "lane"
        self.rerouted = True
        if what == "tier":
            await self.stop_routing(k)
        else:
            # A random exchange picks among the lanes bound: one unbound is simply not picked.
            await self.unbind_queue(Binding(n.lanes(k), spec.name))
        kept = await self.delete_if_empty(spec.name)
        if kept is None:
            await (await self.channel()).declare_queue(
                spec.name, durable=True, arguments=spec.arguments
            )
            self.kept.pop(spec.name, None)
            log.info(f"{what} redeclared", queue=spec.name, delay_ms=spec.delay_ms)
        else:
            self._keep(step, kept)

    def _keep(self, step: DelayDiffers, kept: Kept) -> None:
        spec = step.spec
        what = "tier" if spec.name == self._plan.names.tier(step.tier) else "lane"
        self.kept[spec.name] = held_delay_ms(step.seen)
        log.warning(
            f"{what} keeps its old delay until it drains",
            queue=spec.name,
            delay_ms=self.kept[spec.name],
            wanted_delay_ms=spec.delay_ms,
            messages=kept.messages,
            reason=kept.reason,
        )

    async def as_planned(self, spec: QueueSpec) -> bool:
        """Whether the queue is declared as planned (another declarer did it), declaring it so
        if it is missing; False when the broker refuses (it differs still)."""
        try:
            await (await self.channel()).declare_queue(
                spec.name, durable=True, arguments=spec.arguments
            )
        except ChannelPreconditionFailed:
            return False
        return True

    async def stop_routing(self, k: int) -> None:
        """Stop routing to tier k's queue, which exists: straight from its source, or through
        its lanes' exchange. Tier 1's dead-letters are held on Q until the plan's bindings are
        back when nothing else takes them (a higher tier's fall through to tier 1 meanwhile)."""
        p = self._plan
        n = p.names
        if k == 1 and not p.jittered:
            await self.bind(hold_binding(n))
        await self.unbind_queue(tier_source(n, k, jittered=False))
        if await self.exchange_exists(n.lanes(k)):
            await self.unbind_queue(Binding(n.lanes(k), n.tier(k)))

    async def retire_tier(self, k: int, name: str) -> None:
        """Remove a tier beyond the budget once it is empty, if it is there."""
        if await self.message_count(name) is None:
            return
        await self.stop_routing(k)
        kept = await self.delete_if_empty(name)
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

    async def retire_lanes(self, k: int) -> None:
        """Unbind the lanes of a tier that no longer wants them (jitter off, a smaller budget)
        and remove the empty ones; the lanes' exchange stays while a lane still holds jobs, so
        that the next start finds them."""
        n = self._plan.names
        if not await self.exchange_exists(n.lanes(k)):
            return
        await self.unbind(tier_source(n, k, jittered=True))
        kept_any = False
        for i in range(1, LANES):
            name = n.lane(k, i)
            if await self.message_count(name) is None:
                continue
            await self.unbind_queue(Binding(n.lanes(k), name))
            kept = await self.delete_if_empty(name)
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
            await (await self.channel()).exchange_delete(n.lanes(k))

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
        # A missing one closes the channel: the next call opens another.
        return await exchange_exists(await self.channel(), name)

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


async def declare(connection: AbstractConnection, settings: Settings) -> Plan:
    """Declare (idempotently) and reconcile the topology; TopologyConflict on a conflicting
    queue or exchange."""
    p = plan(settings, broker_version(connection))
    return await _declare_planned(connection, settings, p, diff(p, NOTHING_READ))


async def declare_tier_again(
    connection: AbstractConnection, settings: Settings, p: Plan, k: int
) -> Plan:
    """Declare tier k of a declared plan again, its queue and lanes as a start does: one the
    broker keeps with an older delay is unbound and, if empty, deleted and declared with the
    planned one (if it holds jobs, it stays as it is), then routed to again. Return the plan with
    what the broker keeps now."""
    async with _Declarer(connection, settings, p) as d:
        for spec in p.waiting_of(k):
            await d.apply(DeclareQueue(spec, tier=k))
        if d.rerouted:
            for step in tier_routes(p, k):
                await d.apply(step)
    return p.keeping(d.kept)


async def declare_failed_side(connection: AbstractConnection, settings: Settings) -> Plan:
    """Declare only the failed exchange, the failed and events queues and their bindings (the
    monitor's part, which the retry settings do not shape); return the whole plan."""
    p = plan(settings, broker_version(connection))
    return await _declare_planned(connection, settings, p, failed_side(p, NOTHING_READ))


async def _declare_planned(
    connection: AbstractConnection, settings: Settings, p: Plan, steps: Iterable[Step]
) -> Plan:
    """Apply the steps of plan p in order; return p with what the broker keeps now."""
    async with _Declarer(connection, settings, p) as d:
        for step in steps:
            await d.apply(step)
    return p.keeping(d.kept)
