"""The topology as data: every exchange, queue (with its x-* arguments) and binding ricochet
declares for a set of settings, before any I/O. The only module that spells x-* arguments.

A plan is a queue's own part (its main, failed and events queues, its retry tiers and their
lanes) and the shared part (shared_plan: the delays' levels, the orphans, the cancel store),
which is the same for every ricochet queue of a virtual host. What earlier settings may have
left that this plan does not want (stale tiers, lanes and bindings) is named here too.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import aio_pika

from ricochet.headers import KEY
from ricochet.ladders import growing
from ricochet.names import DELAY_LEVELS, DELAY_UNIT_MS, SHARED, Names, SharedNames, return_key
from ricochet.settings import Settings

MAX_TIERS = 25  # the upper bound of RICOCHET_MAX_RETRIES: stale tiers are looked for up to here
EVENTS_MAX_LENGTH = 10_000
QUEUE_TYPE = "x-queue-type"
TTL = "x-message-ttl"  # a tier's delay
DELIVERY_LIMIT = "x-delivery-limit"
MAX_PRIORITY = "x-max-priority"  # a classic queue's priorities (ricochet.priority)
# Jitter: each tier is this many queues ("lanes") with delays spread evenly over
# [d x (1 - jitter), d]; a random exchange puts each job in one of them.
LANES = 8
RANDOM_EXCHANGE = "x-random"  # the rabbitmq_random_exchange plugin, shipped with RabbitMQ
# Key lanes (ricochet.keys): the rabbitmq_consistent_hash_exchange plugin, shipped with RabbitMQ,
# hashes the key header onto the lanes bound to it, each with the weight of one.
CONSISTENT_HASH_EXCHANGE = "x-consistent-hash"
SINGLE_ACTIVE_CONSUMER = "x-single-active-consumer"
# The cancel store: a stream every worker reads from its start. It keeps each cancel at least as
# long as the longest wait (a 30-day schedule) and a day more; older segments are dropped.
CANCELS_MAX_AGE = "31D"
CANCELS_MAX_AGE_S = 31 * 86_400
CANCELS_SEGMENT_BYTES = 1_000_000  # retention drops whole segments: small ones go on time
# The schedules' store: a stream of each queue's schedule states (broker/schedule_store.py),
# kept as long as the cancels, and bounded in size, since a schedule every second writes a
# record a second.
SCHEDULES_MAX_AGE = "31D"
SCHEDULES_MAX_BYTES = 100_000_000
SCHEDULES_SEGMENT_BYTES = 1_000_000
# The journal (ricochet.broker.journal): fixed arguments, so that workers of any settings
# declare it alike; an operator changes its retention with a policy (SPEC 26).
JOURNAL_MAX_AGE = "7D"
JOURNAL_MAX_BYTES = 1_000_000_000
JOURNAL_SEGMENT_BYTES = 10_000_000
# Where an exchange that routes a due job to its queue sends it when the queue is gone.
ORPHANED = {"alternate-exchange": SHARED.orphans}


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
    return growing(first_ms, multiplier, cap_ms, tiers)


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


@dataclass(frozen=True)
class QueueSpec:
    """A queue to declare; delay_ms is set for the queues that hold jobs for a time (the retry
    tiers and their lanes)."""

    name: str
    arguments: dict[str, Any]
    delay_ms: int | None = None


class Exchange(NamedTuple):
    """An exchange to declare."""

    name: str
    kind: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Binding:
    """source exchange -> destination queue (or exchange) with a routing key."""

    source: str
    destination: str
    routing_key: str = ""
    to_exchange: bool = False


@dataclass(frozen=True)
class SharedPlan:
    """What every ricochet queue of a virtual host shares (SPEC 18), the same whatever the
    settings: the levels of the delays (schedules, RetryLater), the queue of orphaned jobs, the
    cancel store and its snapshot, with their exchanges and bindings."""

    delays: list[QueueSpec]
    orphans: QueueSpec
    cancel_store: QueueSpec
    cancel_snapshot: QueueSpec
    schedule_store: QueueSpec
    journal: QueueSpec
    exchanges: list[Exchange]
    bindings: list[Binding]

    @property
    def queues(self) -> list[QueueSpec]:
        """The levels of the delays, the orphans' queue, the cancel store and its snapshot, the
        schedules' store, the journal."""
        return [
            *self.delays,
            self.orphans,
            self.cancel_store,
            self.cancel_snapshot,
            self.schedule_store,
            self.journal,
        ]


@dataclass(frozen=True)
class Plan:
    """Everything ricochet declares for one queue's settings: the queue's own part, and the
    shared part its jobs wait in."""

    names: Names
    exchanges: list[Exchange]
    queues: list[QueueSpec]  # the main, failed and events queues
    bindings: list[Binding]
    tiers: list[QueueSpec]
    # The lanes of jittered tiers (none without jitter), tier by tier.
    lanes: list[QueueSpec]
    shared: SharedPlan
    # The tiers and lanes a declare found with another delay and kept (they held jobs), by name:
    # the x-message-ttl the broker holds for each (None: it has none), until one is declared again.
    kept: Mapping[str, int | None] = field(default_factory=dict)

    @property
    def jittered(self) -> bool:
        return bool(self.lanes)

    def lanes_of(self, k: int) -> list[QueueSpec]:
        """Tier k's lanes 1..LANES-1 (none without jitter)."""
        return self.lanes[(k - 1) * (LANES - 1) : k * (LANES - 1)]

    def waiting_of(self, k: int) -> list[QueueSpec]:
        """Tier k's queue and its lanes: where its jobs wait."""
        return [self.tiers[k - 1], *self.lanes_of(k)]

    def applied_delay_ms(self, spec: QueueSpec) -> int | None:
        """The delay the broker applies to a queue of the plan: a kept tier or lane waits its
        older one until it is declared again, any other its planned one. What every tool shows
        of a tier's delay (logs, status, waiting, the console) is this."""
        return self.kept.get(spec.name, spec.delay_ms)

    def tier_delay_ms(self, k: int) -> int | None:
        """The delay the broker applies in tier k now (with jitter, the longest of its lanes)."""
        return self.applied_delay_ms(self.tiers[k - 1])

    def kept_tiers(self) -> list[int]:
        """The tiers whose queue or a lane the broker keeps with an older delay."""
        return [
            k
            for k in range(1, len(self.tiers) + 1)
            if any(spec.name in self.kept for spec in self.waiting_of(k))
        ]

    def keeping(self, kept: Mapping[str, int | None]) -> "Plan":
        """This plan with the broker keeping these tiers and lanes at these delays."""
        return replace(self, kept=dict(kept))


def _dead_lettering(queue_type: str) -> dict[str, Any]:
    # Quorum queues can dead-letter at-least-once, which requires reject-publish overflow.
    if queue_type == "quorum":
        return {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    return {}


def _no_delivery_limit(queue_type: str, broker_version: tuple[int, ...] | None) -> dict[str, Any]:
    # RabbitMQ 4.0 gives quorum queues a delivery limit of 20, and 4.0 counts a job's rejections
    # from earlier tiers too: a failed copy handed back 20 times would be dropped, a job retried
    # often would be dead-lettered by the broker, not ricochet. -1 lifts it on the queues that
    # are read: those with consumers, and the tiers, which `ricochet waiting` reads and hands
    # back (a tier's job at the limit would go back to its queue early). 3.x has no limit and
    # reads -1 as 0, so it gets none.
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
            **unlimited,
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
        *return_route(n),
        Binding(n.failed, n.failed),
        Binding(n.failed, n.events),
        Binding(n.dlx, n.failed, n.attempt_key(r), to_exchange=True),
        *(tier_source(n, k, jittered=jitter > 0) for k in range(1, r + 1)),
        *([] if r else [Binding(n.first_tier_exchange, n.failed, to_exchange=True)]),
        *(Binding(n.lanes(k), lane) for k in range(1, r + 1) if jitter > 0 for lane in lanes(n, k)),
        Binding(SHARED.return_exchange, n.queue, return_key(n.queue)),
    ]
    fanout = aio_pika.ExchangeType.FANOUT.value
    return Plan(
        names=n,
        exchanges=[
            Exchange(
                n.dlx,
                aio_pika.ExchangeType.DIRECT.value,
                {"alternate-exchange": n.first_tier_exchange},
            ),
            Exchange(n.first_tier_exchange, fanout, {}),
            Exchange(n.return_exchange, fanout, {}),
            Exchange(n.return_to_queue, fanout, ORPHANED),
            Exchange(n.failed, fanout, {}),
            *(Exchange(n.lanes(k), RANDOM_EXCHANGE, {}) for k in range(1, r + 1) if jitter > 0),
        ],
        queues=[
            QueueSpec(
                n.queue,
                {
                    **qtype,
                    "x-dead-letter-exchange": n.dlx,
                    **dl,
                    **unlimited,
                    **({MAX_PRIORITY: settings.max_priority} if settings.max_priority else {}),
                },
            ),
            QueueSpec(n.failed, {**qtype, **unlimited}),
            QueueSpec(n.events, {**qtype, "x-max-length": EVENTS_MAX_LENGTH, **unlimited}),
        ],
        bindings=bindings,
        tiers=tiers,
        lanes=lane_specs,
        shared=shared_plan(broker_version),
    )


@dataclass(frozen=True)
class KeyLanesPlan:
    """A queue's key lanes (SPEC 28), declared with the queue's first job with a key: the
    exchange that hashes the key header onto the lanes, and the lanes, each delivered to one
    consumer of the vhost at a time. A job that no lane takes goes back to the queue (the
    exchange's alternate is the queue's return route), where a worker sends it on again."""

    exchange: Exchange
    lanes: list[QueueSpec]
    bindings: list[Binding]


def key_lanes_plan(queue: str, count: int, broker_version: tuple[int, ...] | None) -> KeyLanesPlan:
    """The exchange, the count lanes and their bindings of queue's keys (pure). Quorum queues
    whatever RICOCHET_QUEUE_TYPE says, as the shared objects are, so that a client and a worker
    declare them alike. Lanes never dead-letter: a job that fails in one goes to its tier by a
    copy."""
    n = Names(queue)
    arguments = {
        QUEUE_TYPE: "quorum",
        SINGLE_ACTIVE_CONSUMER: True,
        **_no_delivery_limit("quorum", broker_version),
    }
    lanes = [QueueSpec(n.key_lane(i), arguments) for i in range(count)]
    return KeyLanesPlan(
        Exchange(
            n.keys,
            CONSISTENT_HASH_EXCHANGE,
            {"hash-header": KEY, "alternate-exchange": n.return_exchange},
        ),
        lanes,
        [Binding(n.keys, lane.name, "1") for lane in lanes],
    )


# Rate limits (ricochet.rates): a type's tokens wait in a classic queue (the leader banks at most
# the burst; the length bounds a bucket whatever a leader does); an announcement of a worker's
# limits lives as long as three of its heartbeats.
TOKENS_MAX = 10_000
ANNOUNCEMENT_TTL_MS = 30_000


@dataclass(frozen=True)
class RatePlan:
    """A queue's rate limits in the broker: per limited type, its tokens and the queue where its
    jobs wait for one (behind an exchange of that name, which keeps a job's routing key); and
    where workers announce their limits."""

    exchanges: list[Exchange]
    queues: list[QueueSpec]
    bindings: list[Binding]


def rate_plan(queue: str, job_types: list[str], broker_version: tuple[int, ...] | None) -> RatePlan:
    """The objects of queue's limited types (pure). Fixed arguments, so that workers of any
    limits declare them alike: the limits themselves are announced (Names.rates)."""
    n = Names(queue)
    unlimited = _no_delivery_limit("quorum", broker_version)
    fanout = aio_pika.ExchangeType.FANOUT.value
    return RatePlan(
        [Exchange(n.limited(t), fanout, {}) for t in job_types],
        [
            QueueSpec(
                n.rates,
                {QUEUE_TYPE: "classic", TTL: ANNOUNCEMENT_TTL_MS, "x-max-length": TOKENS_MAX},
            ),
            *(
                QueueSpec(
                    n.tokens(t),
                    {QUEUE_TYPE: "classic", "x-max-length": TOKENS_MAX, "x-overflow": "drop-head"},
                )
                for t in job_types
            ),
            *(QueueSpec(n.limited(t), {QUEUE_TYPE: "quorum", **unlimited}) for t in job_types),
        ],
        [Binding(n.limited(t), n.limited(t)) for t in job_types],
    )


def shared_plan(broker_version: tuple[int, ...] | None) -> SharedPlan:
    """The plan's shared part: quorum queues whatever the settings, whose dead-lettering is
    at-least-once, with no delivery limit, so that workers of any settings declare them alike.
    A due job whose queue is gone (no binding for its key) goes from the return exchange to its
    alternate, the orphans, rather than wait in the broker's dead-letter worker, which would
    hold back the lowest level for every queue."""
    quorum = {QUEUE_TYPE: "quorum"}
    unlimited = _no_delivery_limit("quorum", broker_version)
    dl = _dead_lettering("quorum")
    topic = aio_pika.ExchangeType.TOPIC.value
    return SharedPlan(
        delays=[
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
        orphans=QueueSpec(SHARED.orphans, {**quorum, **unlimited}),
        # Kept past the longest wait, in small segments: retention drops whole segments.
        cancel_store=QueueSpec(
            SHARED.cancels,
            {
                QUEUE_TYPE: "stream",
                "x-max-age": CANCELS_MAX_AGE,
                "x-stream-max-segment-size-bytes": CANCELS_SEGMENT_BYTES,
            },
        ),
        # The last message written, read by a get and a requeue: no delivery limit to drop it.
        cancel_snapshot=QueueSpec(
            SHARED.cancels_snapshot,
            {**quorum, "x-max-length": 1, "x-overflow": "drop-head", **unlimited},
        ),
        schedule_store=QueueSpec(
            SHARED.schedules,
            {
                QUEUE_TYPE: "stream",
                "x-max-age": SCHEDULES_MAX_AGE,
                "x-max-length-bytes": SCHEDULES_MAX_BYTES,
                "x-stream-max-segment-size-bytes": SCHEDULES_SEGMENT_BYTES,
            },
        ),
        journal=QueueSpec(
            SHARED.journal,
            {
                QUEUE_TYPE: "stream",
                "x-max-age": JOURNAL_MAX_AGE,
                "x-max-length-bytes": JOURNAL_MAX_BYTES,
                "x-stream-max-segment-size-bytes": JOURNAL_SEGMENT_BYTES,
            },
        ),
        exchanges=[
            *(Exchange(SHARED.delay(k), topic, {}) for k in range(DELAY_LEVELS)),
            Exchange(SHARED.return_exchange, topic, ORPHANED),
            Exchange(SHARED.orphans, aio_pika.ExchangeType.FANOUT.value, {}),
        ],
        bindings=[*delay_bindings(SHARED), Binding(SHARED.orphans, SHARED.orphans)],
    )


def lead_spec(name: str) -> QueueSpec:
    """A lead (of a queue's schedules, or of its rate limits): a classic queue that holds
    nothing (a probe published to it is dropped at once), declared exclusive by the process that
    leads."""
    return QueueSpec(name, {QUEUE_TYPE: "classic", "x-max-length": 0})


Levels = Names | SharedNames


def _level_below(n: Levels, k: int) -> str:
    """Where level k of the delays passes a job on: the level below, and from level 0 to the
    return exchange (a queue's own, for the per-queue levels of earlier versions)."""
    return n.delay(k - 1) if k else n.return_exchange


def _level_pattern(k: int, digit: str) -> str:
    """The topic pattern of level k's digit in a delay key."""
    return "*." * (DELAY_LEVELS - 1 - k) + digit + ".#"


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


def return_route(n: Names) -> list[Binding]:
    """A job back from a tier (or an earlier version's per-queue levels) goes through Q.return,
    which the tiers name and which has no alternate, to Q through an exchange whose alternate
    is the orphans: with Q deleted, the job is orphaned rather than dropped by a classic tier or
    held for ever by a quorum tier's at-least-once dead-lettering. In the order they are bound:
    while an earlier version's Q.return -> Q is still there, the hop bound to Q first, so that
    no job goes both to Q and, through a hop bound to nothing, to the orphans."""
    return [
        Binding(n.return_to_queue, n.queue),
        Binding(n.return_exchange, n.return_to_queue, to_exchange=True),
    ]


def earlier_return(n: Names) -> Binding:
    """The route back from the tiers of earlier versions: the return exchange bound to Q itself,
    with no way to the orphans (return_route replaces it)."""
    return Binding(n.return_exchange, n.queue)


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
    stale.append(earlier_return(n))
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


def delivery_limit_policy_command(names: Names) -> str:
    """The rabbitmqctl command that lifts RabbitMQ 4's delivery limit on the queues ricochet
    reads (consumed, or scanned: the tiers and their lanes), for queues declared before ricochet
    set it (their arguments cannot change)."""
    queues = "|".join(re.escape(q) for q in (names.queue, names.failed, names.events))
    tiers = re.escape(f"{names.queue}.retry.") + r"[0-9]+(\.lane\.[0-9]+)?"
    return (
        f"rabbitmqctl set_policy --apply-to queues --priority 10 "
        f"'{names.queue}.no-delivery-limit' '^({queues}|{tiers})$' '{{\"delivery-limit\": -1}}'"
    )
