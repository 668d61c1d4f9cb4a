"""Reconciling a plan with what the broker holds, stated once: the declare and doctor read it.

diff(plan, held) lists, in the order the declare applies them (broker/declare.py), the steps
that make the broker hold the plan: declare, bind, unbind, retire. It also lists the mismatches
that a declare cannot mend, which doctor names (ops/checks.py).

What the broker holds is known as far as it was read. doctor reads the management API, so its
diff holds only what is missing or differs. A declare reads nothing first: AMQP lists neither a
queue's arguments nor bindings. Its diff is every step, each applied whatever is there (a
declaration is idempotent). The broker refuses a declaration whose arguments differ; the
refusal says which one (seen_in_refusal), and reconcile() reads that as it reads doctor's view.
"""

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ricochet.broker.plan import (
    DELIVERY_LIMIT,
    QUEUE_TYPE,
    TTL,
    Binding,
    Exchange,
    Plan,
    QueueSpec,
    SharedPlan,
    hold_binding,
    return_route,
    stale_bindings,
    stale_lanes,
    stale_tiers,
    tier_source,
)
from ricochet.ladders import is_int
from ricochet.names import SHARED, return_key

# The queue figures that tell whether a waiting queue is empty, as the management API names them.
# `messages` counts ready and unacked jobs and those that expired but whose dead-letter its target
# has not confirmed yet (`messages_dlx`, at-least-once): a passive declare counts the ready ones.
TIER_FIGURES = ("messages", "messages_ready", "messages_unacknowledged", "messages_dlx")


@dataclass(frozen=True)
class QueueSeen:
    """A queue the broker holds: its type (None: not told), its arguments, the jobs it holds
    (None: not read), and the broker's words when it was seen in a refused declaration."""

    type: str | None
    arguments: Mapping[str, Any]
    messages: int | None = None
    refusal: str | None = None


@dataclass(frozen=True)
class ExchangeSeen:
    """An exchange the broker holds (its type None: not told)."""

    type: str | None
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Held:
    """What the broker holds of a plan's names: the queues and exchanges that exist and the
    bindings between them; None where it was not read."""

    queues: Mapping[str, QueueSeen] | None = None
    exchanges: Mapping[str, ExchangeSeen] | None = None
    bindings: Collection[Binding] | None = None


NOTHING_READ = Held()


@dataclass(frozen=True)
class Difference:
    """An argument that differs: None for the side that has none."""

    key: str
    actual: Any
    wanted: Any

    def __str__(self) -> str:
        if self.actual is None:
            return f"{self.key} missing (wants {self.wanted})"
        if self.wanted is None:
            return f"{self.key}={self.actual} (not wanted)"
        return f"{self.key}={self.actual} (wants {self.wanted})"


# The steps, each a small frozen type: the declare and doctor match on them exhaustively.


@dataclass(frozen=True)
class DeclareExchange:
    """Declare an exchange (missing, or not read)."""

    exchange: Exchange


@dataclass(frozen=True)
class DeclareQueue:
    """Declare a queue (missing, or not read). tier: the retry tier k of a queue that holds jobs
    for a time (the tier's own queue or one of its lanes), whose routing stops before its delay
    changes."""

    spec: QueueSpec
    tier: int | None = None


@dataclass(frozen=True)
class Bind:
    """Bind (missing, or not read)."""

    binding: Binding


@dataclass(frozen=True)
class Unbind:
    """Remove a binding that earlier settings made and this plan does not want (if there)."""

    binding: Binding


@dataclass(frozen=True)
class DelayDiffers:
    """A tier or lane that waits another delay. TTLs are fixed per queue (messages expire from
    the head only): once nothing is routed to it, an empty one is deleted and declared again;
    one that holds jobs keeps its old delay until it drains."""

    spec: QueueSpec
    tier: int
    seen: QueueSeen


@dataclass(frozen=True)
class LimitNotLifted:
    """A queue declared before ricochet lifted RabbitMQ 4's delivery limit: its arguments cannot
    change, so it is kept as it is and a policy lifts the limit."""

    spec: QueueSpec
    seen: QueueSeen


@dataclass(frozen=True)
class RetireTier:
    """Tier k, beyond the budget (if there): routing to it stops, and it goes once empty; its
    jobs come back to the main queue meanwhile. seen: None when not read."""

    tier: int
    name: str
    seen: QueueSeen | None = None


@dataclass(frozen=True)
class RetireLanes:
    """Tier k's lanes, which the plan no longer wants (if their exchange is there): unbound,
    each deleted once empty, their exchange once none holds jobs."""

    tier: int


# How a queue of another type or arguments is mended (RabbitMQ changes neither on a queue).
REBUILD = (
    "ricochet refuses to start on it: let it drain (or move its jobs away), delete it, "
    "then run `ricochet topology`"
)


@dataclass(frozen=True)
class Conflict:
    """A queue of another type or arguments than the plan's: only deleting it mends it."""

    spec: QueueSpec
    seen: QueueSeen
    differences: tuple[Difference, ...]


@dataclass(frozen=True)
class ExchangeDiffers:
    """An exchange of another type or arguments than the plan's: only deleting it mends it."""

    exchange: Exchange
    seen: ExchangeSeen
    differences: tuple[Difference, ...]

    def __str__(self) -> str:
        kind = self.exchange.kind
        wrong_type = [f"type {self.seen.type} (wants {kind})"] if self.seen.type != kind else []
        return ", ".join([*wrong_type, *(str(d) for d in self.differences)])


@dataclass(frozen=True)
class Unwanted:
    """A binding into or out of ricochet's objects that neither this plan nor earlier settings
    made: jobs also flow where ricochet does not send them. Not ricochet's to remove."""

    binding: Binding


Step = (
    DeclareExchange
    | DeclareQueue
    | Bind
    | Unbind
    | DelayDiffers
    | LimitNotLifted
    | RetireTier
    | RetireLanes
    | Conflict
    | ExchangeDiffers
    | Unwanted
)


def differences(wanted: Mapping[str, Any], actual: Mapping[str, Any]) -> tuple[Difference, ...]:
    """The arguments that differ, by name; the queue type is compared on its own (the broker
    reports it apart, whichever way it was declared)."""
    return tuple(
        Difference(key, actual.get(key), wanted.get(key))
        for key in sorted((set(wanted) | set(actual)) - {QUEUE_TYPE})
        if key not in actual or key not in wanted or actual[key] != wanted[key]
    )


def reconcile(step: DeclareQueue, seen: QueueSeen | None) -> Step | None:
    """What a planned queue needs, given what the broker holds of it (pure): the declaration
    when it is missing, nothing when it is as planned, else what differs."""
    if seen is None:
        return step
    spec = step.spec
    if seen.type != spec.arguments[QUEUE_TYPE]:
        return Conflict(
            spec, seen, (Difference(QUEUE_TYPE, seen.type, spec.arguments[QUEUE_TYPE]),)
        )
    wanted = dict(spec.arguments)
    unlifted = DELIVERY_LIMIT in wanted and DELIVERY_LIMIT not in seen.arguments
    if unlifted:
        del wanted[DELIVERY_LIMIT]
    found = differences(wanted, seen.arguments)
    if step.tier is not None and found and all(d.key == TTL for d in found):
        return DelayDiffers(spec, step.tier, seen)
    if found:
        return Conflict(spec, seen, found)
    if unlifted:
        return LimitNotLifted(spec, seen)
    return None


_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<key>[^']+)'.*current is (?:none|(?:the value )?'(?P<current>[^']*)')"
)


def seen_in_refusal(spec: QueueSpec, refusal: str) -> QueueSeen:
    """The queue as a refused declaration of spec shows it (pure): the broker names the first
    argument that differs and its current value (or none), as a string; what it does not name
    is taken as planned."""
    arguments = dict(spec.arguments)
    queue_type = arguments[QUEUE_TYPE]
    found = _INEQUIVALENT.search(refusal)
    if found is not None:
        key, current = found["key"], found["current"]
        if key == QUEUE_TYPE:
            queue_type = current
        elif current is None:
            arguments.pop(key, None)
        else:
            arguments[key] = current
    return QueueSeen(queue_type, arguments, refusal=refusal)


def held_delay_ms(seen: QueueSeen) -> int | None:
    """The delay a queue seen with another one holds its jobs (pure): its x-message-ttl, which a
    refused declaration spells as a string, the management API as a number; None when it has
    none, or one that is no whole number of milliseconds."""
    value = seen.arguments.get(TTL)
    if is_int(value):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


@dataclass(frozen=True)
class Kept:
    """Why a waiting queue that a start wanted gone was kept: the jobs it holds (None when not
    known)."""

    messages: int | None
    reason: str


def quorum_tier_kept(figures: Mapping[str, Any] | None) -> Kept | None:
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


def planned_queues(p: Plan) -> list[QueueSpec]:
    """Every queue of the plan: the consumed ones, the tiers and their lanes, the delays' levels,
    the orphans and the cancel store."""
    return [*p.queues, *p.tiers, *p.lanes, *p.shared.queues]


def queue_names(p: Plan) -> list[str]:
    """Every queue the diff reads: the plan's and the stale tiers."""
    return [spec.name for spec in planned_queues(p)] + [*stale_tiers(p).values()]


def planned_exchanges(p: Plan) -> list[Exchange]:
    """The queue's exchanges and those its vhost's ricochet queues share."""
    return [*p.exchanges, *p.shared.exchanges]


def exchange_names(p: Plan) -> list[str]:
    return [x.name for x in planned_exchanges(p)]


def planned_bindings(p: Plan) -> list[Binding]:
    return [*p.bindings, *p.shared.bindings]


def diff(p: Plan, held: Held) -> list[Step]:
    """The steps that make the broker hold the plan, and what differs beyond them (pure): the
    shared part first (the queue's binding from the shared return exchange needs it), then the
    queue's own."""
    return [*diff_shared(p.shared, held), *diff_own(p, held)]


def diff_shared(shared: SharedPlan, held: Held) -> list[Step]:
    """The steps of the part every ricochet queue of the vhost shares: the same for them all, so
    declared once for several queues."""
    return [
        *_exchanges(shared.exchanges, held),
        *_queues([DeclareQueue(spec) for spec in shared.queues], held),
        *_binds(shared.bindings, held),
    ]


def diff_own(p: Plan, held: Held) -> list[Step]:
    """The steps of a queue's own part, in the order that keeps every job routed while earlier
    settings' tiers, lanes and bindings are retired."""
    n = p.names
    waiting = [
        DeclareQueue(spec, tier=k) for k in range(1, len(p.tiers) + 1) for spec in p.waiting_of(k)
    ]
    # Stale bindings go before new ones: a key with no binding falls through to tier 1, while
    # a key bound twice for a moment would copy the job. The first-tier exchange is an
    # exception: with no binding it drops the dead-letter, so its new route goes first (a
    # dead-letter in that instant may go both ways: a retried job alerted as failed). The
    # return route is the other: with no binding it would drop a job back from a tier, while
    # bound both ways for a moment it takes the job to Q once (the broker routes a message to a
    # queue once, however many routes lead there).
    first = [b for b in p.bindings if b.source == n.first_tier_exchange]
    first += return_route(n)
    return [
        *_exchanges(p.exchanges, held),
        *_queues([DeclareQueue(spec) for spec in p.queues], held),
        *_queues(waiting, held),
        *_retired_tiers(p, held),
        *_binds(first, held),
        *_unbinds(p, held),
        *(RetireLanes(k) for k in stale_lanes(p) if _may_hold(held.exchanges, n.lanes(k))),
        *_binds([b for b in p.bindings if b not in first], held),
        *_unwanted(p, held),
    ]


def _may_hold(seen: Mapping[str, Any] | None, name: str) -> bool:
    """Whether the broker may hold the object: it does, or it was not read."""
    return seen is None or name in seen


def _exchanges(exchanges: list[Exchange], held: Held) -> list[Step]:
    steps: list[Step] = []
    for x in exchanges:
        seen = None if held.exchanges is None else held.exchanges.get(x.name)
        if seen is None:
            steps.append(DeclareExchange(x))
            continue
        found = differences(x.arguments, seen.arguments)
        if found or seen.type != x.kind:
            steps.append(ExchangeDiffers(x, seen, found))
    return steps


def _queues(declarations: list[DeclareQueue], held: Held) -> list[Step]:
    if held.queues is None:
        return list(declarations)
    found = (reconcile(d, held.queues.get(d.spec.name)) for d in declarations)
    return [step for step in found if step is not None]


def _binds(bindings: list[Binding], held: Held) -> list[Step]:
    return [Bind(b) for b in bindings if held.bindings is None or b not in held.bindings]


def _retired_tiers(p: Plan, held: Held) -> list[Step]:
    queues = held.queues
    return [
        RetireTier(k, name, None if queues is None else queues[name])
        for k, name in stale_tiers(p).items()
        if _may_hold(queues, name)
    ]


def _unbinds(p: Plan, held: Held) -> list[Step]:
    """The stale bindings; when the bindings were read, those there, and those into stale tiers
    (which go with their tier)."""
    if held.bindings is None:
        return [Unbind(b) for b in stale_bindings(p)]
    stale = set(stale_bindings(p))
    retired = set(stale_tiers(p).values())
    return [
        Unbind(b)
        for b in held.bindings
        if b.source != "" and (b in stale or b.destination in retired)
    ]


def tier_routes(p: Plan, k: int) -> list[Step]:
    """The steps that route tier k's jobs into its queue and lanes again, after a declare of the
    tier alone stopped routing to them (its delay changed): diff_own's bindings into them, then
    the hold on Q goes, as in diff_own's order (pure)."""
    n = p.names
    queues = {spec.name for spec in p.waiting_of(k)}
    source = tier_source(n, k, jittered=p.jittered)
    binds: list[Step] = [Bind(b) for b in p.bindings if b == source or b.destination in queues]
    hold: list[Step] = [Unbind(hold_binding(n))] if k == 1 and not p.jittered else []
    return [*binds, *hold]


def failed_side(p: Plan, held: Held) -> list[Step]:
    """diff_own's steps for the failed exchange, the failed and events queues and their
    bindings alone: the monitor's part, which the retry settings do not shape (pure)."""
    n = p.names
    steps: list[Step] = []
    for step in diff_own(p, held):
        match step:
            case DeclareExchange(x) if x.name == n.failed:
                steps.append(step)
            case DeclareQueue(spec) if spec.name in (n.failed, n.events):
                steps.append(step)
            case Bind(b) if b.source == n.failed:
                steps.append(step)
    return steps


def _unwanted(p: Plan, held: Held) -> list[Step]:
    """The bindings read that lead out of the plan's exchanges, or into its exchanges and queues
    other than the main one (publishers may bind their own exchanges to that), unless the plan
    wants them, earlier settings made them, or another ricochet queue of the vhost declares
    them on the shared return exchange."""
    if held.bindings is None:
        return []
    wanted = set(planned_bindings(p))
    stale = set(stale_bindings(p))
    retired = set(stale_tiers(p).values())
    exchanges = set(exchange_names(p))
    queues = set(queue_names(p)) - {p.names.queue}
    return [
        Unwanted(b)
        for b in held.bindings
        if b.source != ""  # the default exchange's implicit binding
        and b not in wanted
        and b not in stale
        and b.destination not in retired
        and not _another_queues_return(p, b)
        and (b.source in exchanges or b.destination in (exchanges if b.to_exchange else queues))
    ]


def _another_queues_return(p: Plan, b: Binding) -> bool:
    """A binding from the shared return exchange to another ricochet queue: that queue's own."""
    return (
        b.source == SHARED.return_exchange
        and b.destination != p.names.queue
        and b.routing_key == return_key(b.destination)
    )
