"""The retry decision: tier delays, x-death reading, attempts and the decision table."""

from typing import Any

import pytest

from app.retry import (
    Action,
    Decision,
    FailureKind,
    Outcome,
    death_is_forged,
    decide,
    is_poison,
    max_attempts,
    original_routing_key,
    retries_so_far,
    tier_delays_ms,
)


def death(queue: str = "jobs", reason: str = "rejected", count: Any = 1, **extra: Any) -> dict:
    return {"queue": queue, "reason": reason, "count": count, **extra}


@pytest.mark.parametrize(
    ("first", "multiplier", "cap", "tiers", "expected"),
    [
        (30_000, 2.0, 3_600_000, 3, [30_000, 60_000, 120_000]),  # the defaults
        (100, 3.0, 1_000, 4, [100, 300, 900, 1_000]),  # capped
        (10, 1.0, 10, 2, [10, 10]),  # constant
        (1000, 1.5, 86_400_000, 3, [1000, 1500, 2250]),
        (7, 1.1, 100, 2, [7, 8]),  # 7.7 rounds to whole milliseconds
        (30_000, 2.0, 3_600_000, 0, []),  # no retries, no tiers
    ],
)
def test_tier_delays(
    first: int, multiplier: float, cap: int, tiers: int, expected: list[int]
) -> None:
    """Tier k waits first * multiplier^(k-1), capped, rounded to whole milliseconds."""
    assert tier_delays_ms(first, multiplier, cap, tiers) == expected


@pytest.mark.parametrize(
    ("headers", "forged"),
    [
        ({}, False),
        ({"x-death": [death()]}, False),
        ({"x-death": [death(), death("jobs.retry.1", "expired", 2)]}, False),
        ({"x-death": "rejected"}, True),
        ({"x-death": []}, True),
        ({"x-death": None}, True),
        ({"x-death": {"queue": "jobs"}}, True),
        ({"x-death": [death(count=0)]}, True),
        ({"x-death": [death(count=-1)]}, True),
        ({"x-death": [death(count=True)]}, True),
        ({"x-death": [death(count="3")]}, True),
        ({"x-death": [death(count=1.0)]}, True),
        ({"x-death": [death(queue=b"jobs")]}, True),
        ({"x-death": [death(reason=None)]}, True),
        ({"x-death": [death(), "junk"]}, True),
        ({"x-death": [{"count": 1}]}, True),
    ],
)
def test_forged_death(headers: dict, forged: bool) -> None:
    """Only a non-empty list of tables with string queue/reason and a positive count is genuine."""
    assert death_is_forged(headers) is forged


@pytest.mark.parametrize(
    ("headers", "retries"),
    [
        ({}, 0),
        ({"x-death": [death(count=2)]}, 2),
        # Tier expiries and other queues do not count; only rejections from the main queue.
        ({"x-death": [death("jobs.retry.2", "expired", 1), death(count=2)]}, 2),
        ({"x-death": [death("other", count=5), death(count=1)]}, 1),
        ({"x-death": [death(reason="expired", count=4)]}, 0),
        ({"x-death": [death(reason="maxlen", count=4), death("jobs.retry.1", "expired", 3)]}, 0),
    ],
)
def test_retries_so_far(headers: dict, retries: int) -> None:
    """Retries so far is the count of the x-death entry for (main queue, rejected)."""
    assert retries_so_far(headers, "jobs") == retries


def test_original_routing_key() -> None:
    """The first routing key survives tier round-trips through the rejection's x-death entry."""
    headers = {"x-death": [death("jobs.retry.1", "expired"), death(**{"routing-keys": ["jobs"]})]}
    assert original_routing_key(headers, "jobs", "jobs.attempt.1") == "jobs"
    assert original_routing_key({}, "jobs", "jobs") == "jobs"
    assert original_routing_key({"x-death": [death(**{"routing-keys": []})]}, "jobs", "k") == "k"


@pytest.mark.parametrize(
    ("header", "configured", "expected"),
    [
        (None, 3, 4),
        (1, 3, 2),
        (0, 3, 1),
        (10, 3, 4),  # the header lowers the budget, never raises it
        ("2", 3, 3),  # digit strings (what most tools send) count too
        ("two", 3, 4),
        (-1, 3, 4),
        (True, 3, 4),
        (2.0, 3, 4),
        (5, 0, 1),
    ],
)
def test_max_attempts(header: Any, configured: int, expected: int) -> None:
    """max_attempts = 1 + min(configured retries, a max-retries header that is an integer >= 0)."""
    headers = {} if header is None else {"max-retries": header}
    assert max_attempts(headers, configured) == expected


@pytest.mark.parametrize(
    ("headers", "redelivered", "poison"),
    [
        ({}, True, False),
        ({"x-delivery-count": 5}, True, False),
        ({"x-delivery-count": 6}, True, True),
        ({"x-acquired-count": 6}, True, True),  # RabbitMQ 4.x counts returns here
        ({"x-delivery-count": "9"}, True, False),
        ({"x-delivery-count": True}, True, False),
        ({"x-delivery-count": 99}, False, False),  # a first delivery: a publisher wrote it
    ],
)
def test_poison(headers: dict, redelivered: bool, poison: bool) -> None:
    """More than five unacked deliveries, counted by the broker on a redelivery, make a job
    poison."""
    assert is_poison(headers, redelivered) is poison


@pytest.mark.parametrize(
    ("outcome", "attempt", "allowed", "decision"),
    [
        (Outcome.SUCCEEDED, 1, 4, Decision(Action.ACK)),
        (Outcome.SUCCEEDED, 4, 4, Decision(Action.ACK)),
        (Outcome.TRANSIENT, 1, 4, Decision(Action.RETRY)),
        (Outcome.TRANSIENT, 3, 4, Decision(Action.RETRY)),
        (Outcome.TRANSIENT, 4, 4, Decision(Action.FAIL, FailureKind.EXHAUSTED)),
        (Outcome.TRANSIENT, 6, 4, Decision(Action.FAIL, FailureKind.EXHAUSTED)),
        (Outcome.TRANSIENT, 1, 1, Decision(Action.FAIL, FailureKind.EXHAUSTED)),
        (Outcome.PERMANENT, 1, 4, Decision(Action.FAIL, FailureKind.PERMANENT)),
        (Outcome.PERMANENT, 4, 4, Decision(Action.FAIL, FailureKind.PERMANENT)),
    ],
)
def test_decide(outcome: Outcome, attempt: int, allowed: int, decision: Decision) -> None:
    """Success acks; permanent fails at once; transient retries while attempts remain."""
    assert decide(outcome, attempt, allowed) == decision
