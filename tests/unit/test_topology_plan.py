"""The topology plan: names, arguments and bindings for a set of settings."""

from collections import Counter

import pytest
from ricochet.broker.diff import (
    NOTHING_READ,
    Bind,
    Conflict,
    DeclareExchange,
    DeclareQueue,
    DelayDiffers,
    Difference,
    ExchangeDiffers,
    ExchangeSeen,
    Held,
    Kept,
    LimitNotLifted,
    QueueSeen,
    RetireLanes,
    RetireTier,
    Step,
    Unbind,
    Unwanted,
    diff,
    diff_own,
    diff_shared,
    failed_side,
    planned_bindings,
    planned_exchanges,
    planned_queues,
    quorum_tier_kept,
    reconcile,
    seen_in_refusal,
)
from ricochet.broker.plan import (
    LANES,
    Binding,
    Exchange,
    Plan,
    QueueSpec,
    delay_bindings,
    ladder_ms,
    lane_delays_ms,
    plan,
    return_route,
    stale_bindings,
    stale_lanes,
    stale_tiers,
)
from ricochet.names import DELAY_LEVELS, DELAY_UNIT_MS, SHARED, Names, delay_key
from ricochet.settings import Settings


def test_default_plan_matches_spec() -> None:
    """Defaults: quorum queues, three tiers of 30/60/120 s, bindings as SPEC section 3."""
    p = plan(Settings(queue="jobs"))
    main, failed, events = p.queues
    assert main.name == "jobs"
    assert main.arguments == {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "jobs.dlx",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    assert [t.name for t in p.tiers] == ["jobs.retry.1", "jobs.retry.2", "jobs.retry.3"]
    assert [t.arguments["x-message-ttl"] for t in p.tiers] == [30000, 60000, 120000]
    assert [t.arguments["x-dead-letter-routing-key"] for t in p.tiers] == [
        "jobs.attempt.1",
        "jobs.attempt.2",
        "jobs.attempt.3",
    ]
    assert all(t.arguments["x-dead-letter-exchange"] == "jobs.return" for t in p.tiers)
    assert (failed.name, events.name) == ("jobs.failed", "jobs.failed.events")
    assert "x-max-length" in events.arguments
    assert "x-max-length" not in failed.arguments
    assert not set(delay_bindings(p.names)) & set(p.bindings)  # the levels are shared now
    assert set(p.bindings) == {
        Binding("jobs.return", "jobs.return.queue", to_exchange=True),
        Binding("jobs.return.queue", "jobs"),
        Binding("ricochet.return", "jobs", "*." * DELAY_LEVELS + "jobs"),
        Binding("jobs.failed", "jobs.failed"),
        Binding("jobs.failed", "jobs.failed.events"),
        Binding("jobs.dlx.first", "jobs.retry.1"),
        Binding("jobs.dlx", "jobs.retry.2", "jobs.attempt.1"),
        Binding("jobs.dlx", "jobs.retry.3", "jobs.attempt.2"),
        Binding("jobs.dlx", "jobs.failed", "jobs.attempt.3", to_exchange=True),
    }
    exchanges = {name: (kind, args) for name, kind, args in p.exchanges}
    assert exchanges["jobs.dlx"] == ("direct", {"alternate-exchange": "jobs.dlx.first"})
    assert exchanges["jobs.dlx.first"][0] == exchanges["jobs.return"][0] == "fanout"
    assert exchanges["jobs.return.queue"] == ("fanout", {"alternate-exchange": "ricochet.orphans"})


def test_no_retries_sends_first_failure_to_failed() -> None:
    """With max_retries = 0 there is no tier: the first-tier exchange leads to failed."""
    p = plan(Settings(queue="q", max_retries=0))
    assert p.tiers == []
    assert Binding("q.dlx.first", "q.failed", to_exchange=True) in p.bindings
    assert not any(b.destination.startswith("q.retry") for b in p.bindings)


def test_classic_queues_have_no_quorum_arguments() -> None:
    """Classic queues dead-letter at-most-once: no strategy or overflow arguments."""
    p = plan(Settings(queue="q", queue_type="classic"))
    for spec in [*p.queues, *p.tiers]:
        assert spec.arguments["x-queue-type"] == "classic"
        assert "x-dead-letter-strategy" not in spec.arguments
        assert "x-overflow" not in spec.arguments


def test_stale_bindings_never_include_planned_ones() -> None:
    """Reconciling removes only bindings the current plan does not want."""
    for retries in (0, 1, 3, 25):
        p = plan(Settings(queue="q", max_retries=retries))
        assert not set(stale_bindings(p)) & set(p.bindings)


@pytest.mark.parametrize(
    ("key", "from_tier"),
    [
        ("jobs.attempt.1", True),
        ("jobs.attempt.25", True),
        ("jobs", False),
        ("jobs.attempt.", False),
        ("jobs.attempt.x", False),
        ("other.attempt.1", False),
        ("jobs.attempt.1.more", False),
    ],
)
def test_attempt_keys(key: str, from_tier: bool) -> None:
    """Only Q.attempt.k, the key a tier gives a job on its way back, counts as from a tier."""
    assert Names("jobs").is_attempt_key(key) is from_tier


@pytest.mark.parametrize(
    ("queue_type", "version", "limit"),
    [
        ("quorum", (4, 0, 5), {"x-delivery-limit": -1}),
        ("quorum", (4, 3), {"x-delivery-limit": -1}),
        # RabbitMQ 3 has no delivery limit and reads -1 as 0: one requeue would drop the copy.
        ("quorum", (3, 10, 8), {}),
        ("quorum", None, {}),
        ("classic", (4, 3), {}),
    ],
)
def test_consumed_queues_have_no_delivery_limit_on_rabbitmq_4(
    queue_type: str, version: tuple[int, ...] | None, limit: dict[str, int]
) -> None:
    """RabbitMQ 4's default delivery limit of 20 is lifted on the queues ricochet reads: those
    it consumes from, and the tiers and lanes, which `ricochet waiting` reads and hands back."""
    p = plan(Settings(queue="q", queue_type=queue_type, retry_jitter=0.5), version)
    assert p.tiers
    assert p.lanes
    for spec in [*p.queues, *p.tiers, *p.lanes]:
        assert {k: v for k, v in spec.arguments.items() if k == "x-delivery-limit"} == limit


def test_stale_tiers_are_those_beyond_the_budget() -> None:
    """A start looks for tiers an earlier, larger RICOCHET_MAX_RETRIES left, up to the most."""
    stale = stale_tiers(plan(Settings(queue="jobs", max_retries=23)))
    assert stale == {24: "jobs.retry.24", 25: "jobs.retry.25"}


# The management API's figures for a quorum tier, as RabbitMQ 3.10 to 4.3 give them: `messages`
# is the sum of the other three.
EMPTY = {"messages": 0, "messages_ready": 0, "messages_unacknowledged": 0, "messages_dlx": 0}


@pytest.mark.parametrize(
    ("figures", "kept"),
    [
        (EMPTY, None),
        (
            {**EMPTY, "messages": 3, "messages_dlx": 3},
            Kept(
                3,
                "0 ready, 0 unacked, 3 expired whose dead-letter the broker has not delivered yet",
            ),
        ),
        (
            {**EMPTY, "messages": 1, "messages_unacknowledged": 1},
            Kept(
                1,
                "0 ready, 1 unacked, 0 expired whose dead-letter the broker has not delivered yet",
            ),
        ),
        ({"name": "jobs.retry.3"}, Kept(None, "the management API has no figures for it yet")),
        (
            {**EMPTY, "messages_dlx": None},
            Kept(None, "the management API has no figures for it yet"),
        ),
        (None, Kept(None, "the management API does not list it")),
    ],
)
def test_a_quorum_tier_goes_only_when_the_api_shows_it_empty(
    figures: dict[str, object] | None, kept: Kept | None
) -> None:
    """Dead-letters the broker has not delivered and unacked jobs keep a tier, as ready ones do;
    figures that are missing keep it too."""
    assert quorum_tier_kept(figures) == kept


def test_an_explicit_ladder_replaces_the_formula() -> None:
    """RICOCHET_RETRY_DELAYS_MS: tier k waits the k-th delay, and there are as many tiers."""
    settings = Settings(queue="q", retry_delays_ms="1000,5000,5000,60000")
    assert settings.max_retries == 4
    assert ladder_ms(settings) == [1000, 5000, 5000, 60000]
    assert [t.delay_ms for t in plan(settings).tiers] == [1000, 5000, 5000, 60000]


@pytest.mark.parametrize(
    ("delay_ms", "jitter", "lanes"),
    [
        (7000, 0.5, [6500, 6000, 5500, 5000, 4500, 4000, 3500]),
        (7000, 1.0, [6000, 5000, 4000, 3000, 2000, 1000, 0]),
        (10, 0.1, [10, 10, 10, 9, 9, 9, 9]),  # whole milliseconds
    ],
)
def test_lanes_spread_a_tier_evenly_down_to_its_jitter(
    delay_ms: int, jitter: float, lanes: list[int]
) -> None:
    """A jittered tier's lanes wait from the full delay (the tier's own queue) evenly down to
    delay x (1 - jitter)."""
    assert len(lanes) == LANES - 1
    assert lane_delays_ms(delay_ms, jitter) == lanes


def test_a_jittered_tier_is_a_random_exchange_over_its_lanes() -> None:
    """With jitter, each tier's source leads to a random exchange bound to the tier's queue and
    its lanes; the direct routes to the tiers' queues are stale; without, the lanes are."""
    p = plan(Settings(queue="q", max_retries=2, retry_delay_ms=1000, retry_jitter=0.5))
    kinds = {name: kind for name, kind, _ in p.exchanges}
    assert kinds["q.retry.1.lanes"] == kinds["q.retry.2.lanes"] == "x-random"
    assert Binding("q.dlx.first", "q.retry.1.lanes", to_exchange=True) in p.bindings
    assert Binding("q.dlx", "q.retry.2.lanes", "q.attempt.1", to_exchange=True) in p.bindings
    for k in (1, 2):
        fed = {b.destination for b in p.bindings if b.source == f"q.retry.{k}.lanes"}
        assert fed == {f"q.retry.{k}", *(f"q.retry.{k}.lane.{i}" for i in range(1, LANES))}
    assert {lane.arguments["x-dead-letter-routing-key"] for lane in p.lanes} == {
        "q.attempt.1",
        "q.attempt.2",
    }
    assert Binding("q.dlx", "q.retry.2", "q.attempt.1") in stale_bindings(p)
    assert Binding("q.dlx.first", "q.retry.1") in stale_bindings(p)
    assert not set(stale_bindings(p)) & set(p.bindings)
    assert stale_lanes(p) == list(range(3, 26))
    assert stale_lanes(plan(Settings(queue="q", max_retries=2))) == list(range(1, 26))


@pytest.mark.parametrize(
    ("delay_ms", "units"),
    [(0, 0), (1, 1), (100, 1), (101, 2), (1000, 10), (30 * 86_400_000, 25_920_000)],
)
def test_a_delay_key_spells_whole_units_rounded_up(delay_ms: int, units: int) -> None:
    """The key holds a job at least its delay: units of 100 ms, rounded up, in binary, the
    longest level first."""
    key = delay_key(delay_ms, "a.x")
    *digits, queue = key.split(".", DELAY_LEVELS)
    assert (len(digits), queue) == (DELAY_LEVELS, "a.x")
    assert int("".join(digits), 2) == units
    assert len(delay_key(delay_ms, "q" * 200).encode()) <= 255  # the longest queue name
    assert units * DELAY_UNIT_MS >= delay_ms


def test_each_level_of_the_delays_waits_on_its_digit_and_passes_on_the_rest() -> None:
    """Level k waits 2^k units in its queue on a 1 and goes on to the level below on a 0; the
    lowest level leads to the shared return exchange. The levels are the vhost's: the same
    quorum queues with no delivery limit whatever the settings (SPEC 18)."""
    p = plan(Settings(queue="q", queue_type="classic"), (4, 0, 5))
    assert [d.arguments["x-message-ttl"] for d in p.shared.delays] == [
        2**k * DELAY_UNIT_MS for k in range(DELAY_LEVELS)
    ]
    assert [d.name for d in p.shared.delays] == [f"ricochet.delay.{k}" for k in range(DELAY_LEVELS)]
    assert all(d.arguments["x-queue-type"] == "quorum" for d in p.shared.delays)
    assert all(d.arguments["x-delivery-limit"] == -1 for d in p.shared.delays)
    assert p.shared.delays[0].arguments["x-dead-letter-exchange"] == "ricochet.return"
    assert p.shared.delays[3].arguments["x-dead-letter-exchange"] == "ricochet.delay.2"
    assert "x-dead-letter-routing-key" not in p.shared.delays[3].arguments
    shared = p.shared.bindings
    assert Binding("ricochet.delay.0", "ricochet.delay.0", "*." * 24 + "1.#") in shared
    assert (
        Binding("ricochet.delay.0", "ricochet.return", "*." * 24 + "0.#", to_exchange=True)
        in shared
    )
    assert Binding("ricochet.delay.24", "ricochet.delay.24", "1.#") in shared
    assert Binding("ricochet.delay.24", "ricochet.delay.23", "0.#", to_exchange=True) in shared
    assert SHARED.delay_entry == "ricochet.delay.24"


def test_the_shared_part_does_not_depend_on_the_settings() -> None:
    """Workers of any settings declare the shared objects alike, so they can share them."""
    version = (3, 10, 8)
    one = plan(Settings(queue="a", queue_type="classic", max_retries=0), version)
    other = plan(Settings(queue="b", retry_jitter=0.5, retry_delay_ms=10), version)
    assert one.shared == other.shared


@pytest.mark.parametrize(
    "settings",
    [
        Settings(queue="orders"),
        Settings(queue="orders", queue_type="classic", max_retries=0),
        Settings(queue="orders", retry_jitter=0.5, retry_delay_ms=10),
    ],
)
def test_the_failed_side_is_the_failed_exchange_and_queues_alone(settings: Settings) -> None:
    """The monitor declares the failed exchange, the failed and events queues and the failed
    exchange's bindings to them, in the queue's own order, whatever the retry settings."""
    n = Names("orders")
    p = plan(settings)
    own = diff_own(p, NOTHING_READ)
    steps = failed_side(p, NOTHING_READ)
    assert [step for step in own if step in steps] == steps
    assert [type(step).__name__ for step in steps] == [
        "DeclareExchange",
        "DeclareQueue",
        "DeclareQueue",
        "Bind",
        "Bind",
    ]
    assert steps[0] == DeclareExchange(Exchange(n.failed, "fanout", {}))
    assert [step.spec.name for step in steps if isinstance(step, DeclareQueue)] == [
        n.failed,
        n.events,
    ]
    assert [step.binding for step in steps if isinstance(step, Bind)] == [
        Binding(n.failed, n.failed),
        Binding(n.failed, n.events),
    ]


def test_a_due_job_whose_queue_is_gone_goes_to_the_orphans() -> None:
    """The return exchange's alternate is the orphans' exchange, bound to the orphans' queue."""
    p = plan(Settings(queue="q"))
    exchanges = {name: (kind, args) for name, kind, args in p.shared.exchanges}
    assert exchanges["ricochet.return"] == ("topic", {"alternate-exchange": "ricochet.orphans"})
    assert exchanges["ricochet.orphans"][0] == "fanout"
    assert Binding("ricochet.orphans", "ricochet.orphans") in p.shared.bindings
    assert p.shared.orphans.name == "ricochet.orphans"


def test_the_cancel_store_is_a_stream_kept_past_the_longest_wait() -> None:
    """A stream every worker can read from its start, kept 31 days: longer than a 30-day
    schedule."""
    store = plan(Settings(queue="q", queue_type="classic")).shared.cancel_store
    assert store.name == "ricochet.cancels"  # the vhost's, shared by every queue (SPEC 18)
    assert store.arguments["x-queue-type"] == "stream"
    assert store.arguments["x-max-age"] == "31D"


def test_a_job_back_from_the_delays_was_published_to_the_main_queue() -> None:
    """The key that spelled a job's wait is not the one it was published with: that was Q."""
    n = Names("jobs")
    assert n.published_key(delay_key(90_000, "jobs")) == "jobs"
    assert n.published_key(delay_key(90_000, "jobs").removesuffix(".jobs")) == "jobs"  # earlier
    assert n.published_key("jobs.attempt.2") == "jobs.attempt.2"
    assert n.published_key("0.1.1") == "0.1.1"  # not a delay key: a key of the producer's own


# The diff of a plan with what the broker holds (broker/diff.py): the declare's steps and what
# doctor names.


def as_planned(p: Plan) -> Held:
    """A broker that holds exactly the plan (read through the management API)."""
    return Held(
        queues={
            spec.name: QueueSeen(spec.arguments["x-queue-type"], spec.arguments, 0)
            for spec in planned_queues(p)
        },
        exchanges={x.name: ExchangeSeen(x.kind, x.arguments) for x in planned_exchanges(p)},
        bindings=planned_bindings(p),
    )


def kinds(steps: list[Step]) -> Counter[str]:
    return Counter(type(step).__name__ for step in steps)


@pytest.mark.parametrize(
    ("settings", "counts"),
    [
        # 3 tiers: 25 levels' exchanges + return + orphans, 5 own; 3 own queues, 30 shared, 3
        # tiers; 22 tiers and 25 tiers' lanes beyond; 50 + 1 shared bindings, 9 own; 28 stale.
        (
            Settings(queue="q"),
            {
                "DeclareExchange": 27 + 5,
                "DeclareQueue": 3 + 30 + 3,
                "RetireTier": 22,
                "RetireLanes": 25,
                "Bind": 51 + 9,
                "Unbind": 28,
            },
        ),
        (
            Settings(queue="q", max_retries=0),
            {
                "DeclareExchange": 27 + 5,
                "DeclareQueue": 3 + 30,
                "RetireTier": 25,
                "RetireLanes": 25,
                "Bind": 51 + 7,
                "Unbind": 28,
            },
        ),
        # Jitter: a random exchange per tier, 7 lanes each, bound with the tier's queue; the
        # tiers' direct routes are stale.
        (
            Settings(queue="q", max_retries=2, retry_jitter=0.5),
            {
                "DeclareExchange": 27 + 5 + 2,
                "DeclareQueue": 3 + 30 + 2 + 14,
                "RetireTier": 23,
                "RetireLanes": 23,
                "Bind": 51 + 8 + 16,
                "Unbind": 28 + 2,
            },
        ),
    ],
)
def test_a_broker_not_read_is_given_every_step(settings: Settings, counts: dict[str, int]) -> None:
    """A declare reads nothing first: it declares every object and binding of the plan, and
    retires whatever earlier settings may have left, each once."""
    steps = diff(plan(settings), NOTHING_READ)
    assert kinds(steps) == counts
    assert len({repr(step) for step in steps}) == len(steps)


def test_the_declare_keeps_every_job_routed_while_it_reconciles() -> None:
    """The shared part comes first; tiers are declared before stale ones go; the first-tier
    exchange's new route before any stale binding goes (with none it drops the dead-letter);
    the other bindings after them (a key bound twice for a moment would copy a job)."""
    p = plan(Settings(queue="q", max_retries=2))
    steps = diff(p, NOTHING_READ)
    at = steps.index
    shared = diff_shared(p.shared, NOTHING_READ)
    assert steps[: len(shared)] == shared
    first = Bind(Binding("q.dlx.first", "q.retry.1"))
    second = Bind(Binding("q.dlx", "q.retry.2", "q.attempt.1"))
    hold = Unbind(Binding("q.dlx.first", "q"))
    assert at(DeclareQueue(p.tiers[1], tier=2)) < at(RetireTier(3, "q.retry.3")) < at(first)
    assert at(first) < at(hold) < at(RetireLanes(1)) < at(second)
    assert max(at(Unbind(b)) for b in stale_bindings(p)) < at(second)


def test_a_job_back_from_a_tier_of_a_deleted_queue_goes_to_the_orphans() -> None:
    """A tier dead-letters to Q.return (its argument, which cannot change), which has no
    alternate: it goes on to Q through Q.return.queue, whose alternate is the orphans, so that
    with Q deleted the job is orphaned, not dropped or held by the broker."""
    p = plan(Settings(queue="q"))
    exchanges = {name: (kind, args) for name, kind, args in p.exchanges}
    assert exchanges["q.return"] == ("fanout", {})
    assert exchanges["q.return.queue"] == ("fanout", {"alternate-exchange": "ricochet.orphans"})
    into_q = [b for b in p.bindings if b.destination == "q" and b.source != "ricochet.return"]
    assert into_q == [Binding("q.return.queue", "q")]
    assert Binding("q.return", "q.return.queue", to_exchange=True) in p.bindings
    assert Binding("q.return", "q") in stale_bindings(p)  # an earlier version's, with no way out


def test_an_earlier_return_binding_goes_once_the_new_route_is_bound() -> None:
    """On a broker of an earlier version (Q.return bound to Q itself): the hop is declared, bound
    to Q, then Q.return to the hop, and only then the old binding goes, so that a job back from
    a tier always has a way to Q (two ways at once take it there once), and never goes to the
    orphans through a hop bound to nothing while Q is there."""
    p = plan(Settings(queue="q"))
    earlier = as_planned(p)
    new_route = set(return_route(p.names))
    assert earlier.exchanges is not None
    assert earlier.bindings is not None
    old = Binding("q.return", "q")
    held = Held(
        queues=earlier.queues,
        exchanges={k: v for k, v in earlier.exchanges.items() if k != "q.return.queue"},
        bindings=[*(b for b in earlier.bindings if b not in new_route), old],
    )
    steps = diff(p, held)
    hop = next(x for x in p.exchanges if x.name == "q.return.queue")
    assert steps == [
        DeclareExchange(hop),
        Bind(Binding("q.return.queue", "q")),
        Bind(Binding("q.return", "q.return.queue", to_exchange=True)),
        Unbind(old),
    ]


def test_a_broker_that_holds_the_plan_needs_nothing() -> None:
    """Read through the management API, a broker that holds exactly the plan differs in
    nothing, whatever the settings."""
    for settings in (
        Settings(queue="q"),
        Settings(queue="q", queue_type="classic", max_retries=0),
        Settings(queue="q", retry_jitter=0.5),
    ):
        p = plan(settings, (4, 0, 5))
        assert diff(p, as_planned(p)) == []


TIER = plan(Settings(queue="q")).tiers[1]  # q.retry.2, 60 s
MAIN_4 = plan(Settings(queue="q"), (4, 0, 5)).queues[0]  # with x-delivery-limit -1
FAILED = plan(Settings(queue="q")).queues[1]


def seen(
    spec: QueueSpec, changed: dict[str, object] | None = None, queue_type: str = "quorum"
) -> QueueSeen:
    """spec as the broker holds it, with these arguments changed (None: absent)."""
    held = {**spec.arguments, **(changed or {})}
    return QueueSeen(queue_type, {k: v for k, v in held.items() if v is not None}, 2)


@pytest.mark.parametrize(
    ("step", "held", "found"),
    [
        (DeclareQueue(FAILED), None, DeclareQueue),
        (DeclareQueue(FAILED), seen(FAILED), None),
        (DeclareQueue(TIER, tier=2), seen(TIER, {"x-message-ttl": 45000}), DelayDiffers),
        # With no delay at all it is mended the same way: emptied, then declared again.
        (DeclareQueue(TIER, tier=2), seen(TIER, {"x-message-ttl": None}), DelayDiffers),
        (
            DeclareQueue(TIER, tier=2),
            seen(TIER, {"x-message-ttl": 45000, "x-max-length": 5}),
            Conflict,
        ),
        (DeclareQueue(TIER, tier=2), seen(TIER, queue_type="classic"), Conflict),
        # A queue that is not a tier's cannot take another delay by a redeclaration.
        (DeclareQueue(FAILED), seen(FAILED, {"x-message-ttl": 1000}), Conflict),
        (DeclareQueue(MAIN_4), seen(MAIN_4, {"x-delivery-limit": None}), LimitNotLifted),
        (
            DeclareQueue(MAIN_4),
            seen(MAIN_4, {"x-delivery-limit": None, "x-dead-letter-exchange": "other"}),
            Conflict,
        ),
        (DeclareQueue(MAIN_4), seen(MAIN_4, {"x-delivery-limit": 20}), Conflict),
    ],
)
def test_what_a_planned_queue_needs(
    step: DeclareQueue, held: QueueSeen | None, found: type | None
) -> None:
    """Missing: declared; as planned: nothing; a tier's delay alone: redeclared once empty; the
    delivery limit alone not lifted: kept, a policy lifts it; anything else: a conflict that
    only deleting the queue mends."""
    result = reconcile(step, held)
    assert (None if result is None else type(result)) is found


@pytest.mark.parametrize(
    ("step", "refusal", "found"),
    [
        # The broker's words, as RabbitMQ 3.10.8 and 4.3.6 say them.
        (
            DeclareQueue(TIER, tier=2),
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q.retry.2' in "
            "vhost '/': received '60000' but current is '45000'",
            DelayDiffers,
        ),
        (
            DeclareQueue(MAIN_4),
            "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost "
            "'/': received the value '-1' of type 'byte' but current is none",
            LimitNotLifted,
        ),
        (
            DeclareQueue(TIER, tier=2),
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q.retry.2' in "
            "vhost '/': received 'quorum' but current is 'classic'",
            Conflict,
        ),
        (
            DeclareQueue(FAILED),
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q.failed' in "
            "vhost '/': received none but current is the value '5' of type 'signedint'",
            Conflict,
        ),
        # Words that name nothing leave the queue as planned: the declare refuses it anyway.
        (DeclareQueue(TIER, tier=2), "PRECONDITION_FAILED - something else", None),
    ],
)
def test_a_refused_declaration_is_read_as_doctor_reads_the_api(
    step: DeclareQueue, refusal: str, found: type | None
) -> None:
    """The broker refuses a declaration whose arguments differ and names the first that does:
    the declare reads its words into what the broker holds, and the diff decides as it does
    for doctor."""
    held = seen_in_refusal(step.spec, refusal)
    assert held.refusal == refusal
    result = reconcile(step, held)
    assert (None if result is None else type(result)) is found


def held(
    p: Plan,
    missing: tuple[str, ...] = (),
    queues: dict[str, QueueSeen] | None = None,
    exchanges: dict[str, ExchangeSeen] | None = None,
    unbound: tuple[Binding, ...] = (),
    bound: tuple[Binding, ...] = (),
) -> Held:
    """The plan as the broker holds it, with these objects missing, these queues and exchanges
    as given, these bindings missing and these more."""
    planned = as_planned(p)
    assert planned.queues is not None
    assert planned.exchanges is not None
    return Held(
        {**{n: q for n, q in planned.queues.items() if n not in missing}, **(queues or {})},
        {**{n: x for n, x in planned.exchanges.items() if n not in missing}, **(exchanges or {})},
        [*(b for b in planned_bindings(p) if b not in unbound), *bound],
    )


P = plan(Settings(queue="q", max_retries=2))
LATER = "*." * 25 + "later"  # another ricochet queue's binding on the shared return exchange


@pytest.mark.parametrize(
    ("broker", "steps"),
    [
        (
            held(P, missing=("q.failed.events", "q.return")),
            [
                DeclareExchange(Exchange("q.return", "fanout", {})),
                DeclareQueue(P.queues[2]),
            ],
        ),
        (
            held(P, exchanges={"q.dlx": ExchangeSeen("topic", {})}),
            [
                ExchangeDiffers(
                    P.exchanges[0],
                    ExchangeSeen("topic", {}),
                    (Difference("alternate-exchange", None, "q.dlx.first"),),
                )
            ],
        ),
        (
            held(P, unbound=(Binding("q.return.queue", "q"),)),
            [Bind(Binding("q.return.queue", "q"))],
        ),
        # An earlier budget of 3: its safety net and tier 3, with the binding that feeds it.
        (
            held(
                P,
                queues={"q.retry.3": QueueSeen("quorum", {"x-message-ttl": 120000}, 2)},
                bound=(
                    Binding("q.dlx", "q.failed", "q.attempt.3", to_exchange=True),
                    Binding("q.dlx", "q.retry.3", "q.attempt.2"),
                ),
            ),
            [
                RetireTier(3, "q.retry.3", QueueSeen("quorum", {"x-message-ttl": 120000}, 2)),
                Unbind(Binding("q.dlx", "q.failed", "q.attempt.3", to_exchange=True)),
                Unbind(Binding("q.dlx", "q.retry.3", "q.attempt.2")),
            ],
        ),
        # Earlier jitter: the lanes' exchange of tier 1 still there.
        (
            held(P, exchanges={"q.retry.1.lanes": ExchangeSeen("x-random", {})}),
            [RetireLanes(1)],
        ),
        # Bindings ricochet did not make, into the failed queue and out of the dlx; one into
        # the main queue from a publisher's exchange, another queue's on the shared return
        # exchange and the default exchange's are none of ricochet's business.
        (
            held(
                P,
                bound=(
                    Binding("q.failed", "q", "q"),
                    Binding("mine", "q.failed"),
                    Binding("mine", "q", "k"),
                    Binding("ricochet.return", "later", LATER),
                    Binding("", "q.retry.1", "q.retry.1"),
                ),
            ),
            [Unwanted(Binding("q.failed", "q", "q")), Unwanted(Binding("mine", "q.failed"))],
        ),
        # A binding on the shared return exchange that is not a queue's own: `#.x` would take
        # the jobs of `a.x`.
        (
            held(P, bound=(Binding("ricochet.return", "later", "#.later"),)),
            [Unwanted(Binding("ricochet.return", "later", "#.later"))],
        ),
    ],
)
def test_what_differs_from_the_plan_on_a_broker_read(broker: Held, steps: list[Step]) -> None:
    """Read through the management API, the diff holds only what is missing, differs, was left
    by earlier settings, or was bound by someone else."""
    assert diff(P, broker) == steps
