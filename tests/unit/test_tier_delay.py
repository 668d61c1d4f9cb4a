"""The delay the broker applies to a tier kept at an older one: read from what a declare saw,
carried by the plan and the record of the topology, and the steps that route to such a tier
again once it is declared anew."""

import json
from typing import Any

import pytest
from ricochet.broker.diff import Bind, QueueSeen, Step, Unbind, held_delay_ms, tier_routes
from ricochet.broker.plan import LANES, TTL, Binding, plan
from ricochet.broker.record import KEPT, kept_of, record_of, recorded_settings
from ricochet.names import Names
from ricochet.settings import Settings

N = Names("orders")


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"queue": "orders", "max_retries": 3, "retry_delay_ms": 1_000}
    return Settings(**(values | overrides))


@pytest.mark.parametrize(
    ("ttl", "held"),
    [
        (30_000, 30_000),  # the management API's number
        ("30000", 30_000),  # a refused declaration's words
        (None, None),  # a queue with no TTL holds its jobs until they are consumed
        ("none", None),
        ("3.5", None),
        ("-1", None),
        (True, None),
    ],
)
def test_the_delay_a_kept_tier_holds_is_its_ttl(ttl: object, held: int | None) -> None:
    arguments = {} if ttl is None else {TTL: ttl}
    assert held_delay_ms(QueueSeen("quorum", arguments)) == held


@pytest.mark.parametrize(
    ("kept", "applied", "kept_tiers"),
    [
        ({}, [1_000, 2_000, 4_000], []),
        ({N.tier(1): 30_000}, [30_000, 2_000, 4_000], [1]),
        ({N.tier(3): None}, [1_000, 2_000, None], [3]),
        ({N.tier(1): 30_000, N.tier(2): 60_000}, [30_000, 60_000, 4_000], [1, 2]),
        ({"other.retry.1": 5}, [1_000, 2_000, 4_000], []),
    ],
)
def test_a_plan_shows_each_tier_with_the_delay_the_broker_applies(
    kept: dict[str, int | None], applied: list[int | None], kept_tiers: list[int]
) -> None:
    p = plan(settings()).keeping(kept)
    assert [p.applied_delay_ms(spec) for spec in p.tiers] == applied
    assert [spec.delay_ms for spec in p.tiers] == [1_000, 2_000, 4_000]  # the planned ones
    assert p.kept_tiers() == kept_tiers


def test_a_kept_lane_keeps_its_tier_kept() -> None:
    p = plan(settings(retry_jitter=0.5))
    lane = p.lanes_of(2)[3]
    kept = p.keeping({lane.name: 7})
    assert kept.kept_tiers() == [2]
    assert kept.applied_delay_ms(lane) == 7
    assert kept.applied_delay_ms(p.tiers[1]) == 2_000


@pytest.mark.parametrize(
    ("k", "routes"),
    [
        # Tier 1 takes the first dead-letters again; the hold on Q goes after.
        (
            1,
            [
                Bind(Binding(N.first_tier_exchange, N.tier(1))),
                Unbind(Binding(N.first_tier_exchange, N.queue)),
            ],
        ),
        (2, [Bind(Binding(N.dlx, N.tier(2), N.attempt_key(1)))]),
        (3, [Bind(Binding(N.dlx, N.tier(3), N.attempt_key(2)))]),
    ],
)
def test_a_tier_declared_again_is_routed_to_again(k: int, routes: list[Step]) -> None:
    assert tier_routes(plan(settings()), k) == routes


def test_a_jittered_tier_declared_again_gets_its_lanes_back_and_no_hold() -> None:
    p = plan(settings(retry_jitter=0.5))
    routes = tier_routes(p, 1)
    assert routes[0] == Bind(Binding(N.first_tier_exchange, N.lanes(1), to_exchange=True))
    assert routes[1:] == [
        Bind(Binding(N.lanes(1), name))
        for name in [N.tier(1), *(N.lane(1, i) for i in range(1, LANES))]
    ]
    # Every route added is one the plan wants.
    assert all(isinstance(s, Bind) and s.binding in p.bindings for s in routes)


@pytest.mark.parametrize(
    ("kept", "read"),
    [
        ({}, {}),
        ({N.tier(1): 30_000, N.lane(2, 1): None}, {N.tier(1): 30_000, N.lane(2, 1): None}),
    ],
)
def test_the_record_carries_what_the_declare_kept(
    kept: dict[str, int | None], read: dict[str, int | None]
) -> None:
    record = json.loads(record_of(settings(), kept))
    assert kept_of(record) == read
    assert recorded_settings(settings(retry_delay_ms=50), record) == settings()


@pytest.mark.parametrize(
    "record",
    [
        None,  # nothing declared yet
        {"max_retries": 3},  # the record of an earlier ricochet
        {KEPT: "orders.retry.1"},
        {KEPT: [30_000]},
        {KEPT: {"orders.retry.1": "30000"}},
        {KEPT: {"orders.retry.1": 1.5}},
        {KEPT: {"orders.retry.1": True}},
    ],
)
def test_a_record_that_keeps_nothing_readable_keeps_nothing(record: dict[str, Any] | None) -> None:
    assert kept_of(record) == {}
