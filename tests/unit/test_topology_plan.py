"""The topology plan: names, arguments and bindings for a set of settings."""

import pytest
from ricochet.broker.topology import (
    DELAY_LEVELS,
    DELAY_UNIT_MS,
    LANES,
    SHARED,
    Binding,
    Kept,
    Names,
    delay_bindings,
    delay_key,
    ladder_ms,
    lane_delays_ms,
    plan,
    quorum_tier_kept,
    stale_bindings,
    stale_lanes,
    stale_tiers,
)
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
        Binding("jobs.return", "jobs"),
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
    """RabbitMQ 4's default delivery limit of 20 is lifted on the queues ricochet consumes
    from; tiers, which nothing consumes, keep their arguments."""
    p = plan(Settings(queue="q", queue_type=queue_type), version)
    for spec in p.queues:
        assert {k: v for k, v in spec.arguments.items() if k == "x-delivery-limit"} == limit
    assert all("x-delivery-limit" not in t.arguments for t in p.tiers)


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
    assert [d.arguments["x-message-ttl"] for d in p.delays] == [
        2**k * DELAY_UNIT_MS for k in range(DELAY_LEVELS)
    ]
    assert [d.name for d in p.delays] == [f"ricochet.delay.{k}" for k in range(DELAY_LEVELS)]
    assert all(d.arguments["x-queue-type"] == "quorum" for d in p.delays)
    assert all(d.arguments["x-delivery-limit"] == -1 for d in p.delays)
    assert p.delays[0].arguments["x-dead-letter-exchange"] == "ricochet.return"
    assert p.delays[3].arguments["x-dead-letter-exchange"] == "ricochet.delay.2"
    assert "x-dead-letter-routing-key" not in p.delays[3].arguments
    shared = p.shared_bindings
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
    for field in (
        "delays",
        "orphans",
        "cancel_store",
        "cancel_snapshot",
        "shared_exchanges",
        "shared_bindings",
    ):
        assert getattr(one, field) == getattr(other, field)


def test_a_due_job_whose_queue_is_gone_goes_to_the_orphans() -> None:
    """The return exchange's alternate is the orphans' exchange, bound to the orphans' queue."""
    p = plan(Settings(queue="q"))
    exchanges = {name: (kind, args) for name, kind, args in p.shared_exchanges}
    assert exchanges["ricochet.return"] == ("topic", {"alternate-exchange": "ricochet.orphans"})
    assert exchanges["ricochet.orphans"][0] == "fanout"
    assert Binding("ricochet.orphans", "ricochet.orphans") in p.shared_bindings
    assert p.orphans is not None
    assert p.orphans.name == "ricochet.orphans"


def test_the_cancel_store_is_a_stream_kept_past_the_longest_wait() -> None:
    """A stream every worker can read from its start, kept 31 days: longer than a 30-day
    schedule."""
    store = plan(Settings(queue="q", queue_type="classic")).cancel_store
    assert store is not None
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
