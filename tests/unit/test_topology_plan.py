"""The topology plan: names, arguments and bindings for a set of settings."""

import pytest
from ricochet.broker.topology import (
    Binding,
    Kept,
    Names,
    plan,
    quorum_tier_kept,
    stale_bindings,
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
    assert set(p.bindings) == {
        Binding("jobs.return", "jobs"),
        Binding("jobs.failed", "jobs.failed"),
        Binding("jobs.failed", "jobs.failed.events"),
        Binding("jobs.dlx.first", "jobs.retry.1"),
        Binding("jobs.dlx", "jobs.retry.2", "jobs.attempt.1"),
        Binding("jobs.dlx", "jobs.retry.3", "jobs.attempt.2"),
        Binding("jobs.dlx", "jobs.failed", "jobs.attempt.3", to_exchange=True),
    }
    exchanges = {name: (kind.value, args) for name, kind, args in p.exchanges}
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
