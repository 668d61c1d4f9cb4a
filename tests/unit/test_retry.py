"""The retry decision: tier delays, the facts read from a delivery, and the decision table."""

from collections.abc import Mapping
from typing import Any

import pytest
from ricochet.broker.plan import tier_delays_ms
from ricochet.delivery.retry import (
    Ack,
    Decision,
    Facts,
    Fail,
    FailureKind,
    Outcome,
    Retry,
    Run,
    Sanitize,
    decide,
    max_attempts,
    read_facts,
)


def facts(
    headers: Mapping[str, object],
    redelivered: bool = False,
    routing_key: str = "jobs",
    max_retries: int = 3,
    from_tier: bool = True,
    type_max_retries: int | None = None,
) -> Facts:
    """The facts of a delivery from the main queue "jobs" (back from a tier, unless told)."""
    return read_facts(
        headers,
        redelivered=redelivered,
        routing_key=routing_key,
        from_tier=from_tier,
        queue="jobs",
        max_retries=max_retries,
        type_max_retries=type_max_retries,
    )


def death(
    queue: object = "jobs", reason: object = "rejected", count: object = 1, **extra: object
) -> dict[str, object]:
    """An x-death entry; its fields may be of any type, as a forged one's are."""
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
def test_forged_death(headers: dict[str, object], forged: bool) -> None:
    """Only a non-empty list of tables with string queue/reason and a positive count is genuine."""
    assert facts(headers).forged is forged


@pytest.mark.parametrize(
    ("headers", "from_tier", "forged"),
    [
        ({"x-death": [death()]}, True, False),
        ({"x-death": [death()]}, False, True),
        ({"x-death": [death("jobs.retry.1", "expired", 2), death()]}, False, True),
        # The broker's record of another queue (a user's own dead-lettering upstream) stays.
        ({"x-death": [death("orders", "rejected", 2)]}, False, False),
        ({"x-death": [death("jobs", "expired", 2)]}, False, False),
        ({}, False, False),
    ],
)
def test_main_queue_rejection_only_on_a_job_back_from_a_tier(
    headers: dict[str, object], from_tier: bool, forged: bool
) -> None:
    """A main-queue rejection on a job that did not come back from a tier was written by a
    publisher: RabbitMQ 4 would restart its count, RabbitMQ 3 go on from it, so it is cleaned."""
    assert facts(headers, from_tier=from_tier).forged is forged


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
def test_retries_so_far(headers: dict[str, object], retries: int) -> None:
    """Retries so far is the count of the x-death entry for (main queue, rejected): the attempt
    is one more."""
    assert facts(headers).attempt == retries + 1


def test_original_routing_key() -> None:
    """The first routing key survives tier round-trips through the rejection's x-death entry."""
    headers = {"x-death": [death("jobs.retry.1", "expired"), death(**{"routing-keys": ["jobs"]})]}
    assert facts(headers, routing_key="jobs.attempt.1").original_routing_key == "jobs"
    assert facts({}, routing_key="jobs").original_routing_key == "jobs"
    no_keys = {"x-death": [death(**{"routing-keys": []})]}
    assert facts(no_keys, routing_key="k").original_routing_key == "k"


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
    assert facts(headers, max_retries=configured).max_attempts == expected


@pytest.mark.parametrize(
    ("type_retries", "header_retries", "retries"),
    # The type's and the header's budget: each unset, lower than the setting's 3, higher, or 0.
    [
        (None, None, 3),
        (None, 1, 1),
        (None, 5, 3),
        (None, 0, 0),
        (1, None, 1),
        (1, 1, 1),
        (1, 5, 1),
        (1, 0, 0),
        (5, None, 3),
        (5, 1, 1),
        (5, 5, 3),
        (5, 0, 0),
        (0, None, 0),
        (0, 1, 0),
        (0, 5, 0),
        (0, 0, 0),
    ],
)
def test_budget_is_the_smallest_set(
    type_retries: int | None, header_retries: int | None, retries: int
) -> None:
    """max_attempts = 1 + the smallest of RICOCHET_MAX_RETRIES, the type's and the header's
    budget, the unset ones left out: the type and the header lower it, never raise it, and
    with the setting at 0 every job gets one attempt."""
    assert max_attempts(3, type_retries, header_retries) == 1 + retries
    assert max_attempts(0, type_retries, header_retries) == 1
    headers = {} if header_retries is None else {"max-retries": header_retries}
    read = facts(headers, max_retries=3, type_max_retries=type_retries)
    assert read.max_attempts == 1 + retries


@pytest.mark.parametrize(
    ("headers", "redelivered", "retries", "poison"),
    [
        ({}, True, 0, False),
        ({"x-delivery-count": 5}, True, 0, False),
        ({"x-delivery-count": 6}, True, 0, True),
        ({"x-acquired-count": 6}, True, 0, True),  # RabbitMQ 4.x counts returns here
        ({"x-delivery-count": "9"}, True, 0, False),
        ({"x-delivery-count": True}, True, 0, False),
        ({"x-delivery-count": 99}, False, 0, False),  # a first delivery: a publisher wrote it
        # RabbitMQ 4.0 carries the count through the tiers: seven rejections are not crashes.
        ({"x-delivery-count": 7}, True, 7, False),
        ({"x-delivery-count": 11}, True, 6, False),
        ({"x-delivery-count": 13}, True, 7, True),
        ({"x-acquired-count": 13}, True, 7, True),
    ],
)
def test_poison(headers: dict[str, object], redelivered: bool, retries: int, poison: bool) -> None:
    """More than five unacked deliveries beyond the job's own retries, counted by the broker on
    a redelivery, make a job poison."""
    if retries:
        headers = {**headers, "x-death": [death(count=retries)]}
    assert facts(headers, redelivered).poison is poison


def test_unreadable_properties_are_a_fact() -> None:
    """Whether the delivery's properties could be decoded is carried into its facts."""
    assert not facts({}).unreadable
    assert read_facts(
        {},
        redelivered=False,
        routing_key="jobs",
        from_tier=False,
        queue="jobs",
        max_retries=3,
        type_max_retries=None,
        unreadable=True,
    ).unreadable


@pytest.mark.parametrize(
    ("headers", "redelivered", "retries", "alone"),
    [
        ({}, False, 0, False),  # a first delivery
        ({}, True, 0, False),  # no count (classic queues on RabbitMQ 3): nothing to judge by
        ({"x-delivery-count": 1}, True, 0, False),  # returned once: cut off beside the others
        ({"x-acquired-count": 1}, True, 0, False),
        ({"x-delivery-count": 2}, True, 0, True),  # returned twice: it may be the poison
        ({"x-acquired-count": 2}, True, 0, True),  # RabbitMQ 4.x counts returns here
        ({"x-delivery-count": 0, "x-acquired-count": 3}, True, 0, True),
        ({"x-delivery-count": 5}, True, 0, True),
        ({"x-delivery-count": 6}, True, 0, False),  # poison: failed without running
        ({"x-delivery-count": 2}, False, 0, False),  # a first delivery: a publisher wrote it
        ({"x-delivery-count": "3"}, True, 0, False),
        ({"x-delivery-count": True}, True, 0, False),
        # RabbitMQ 4.0 carries the count through the tiers: rejections are not returns.
        ({"x-delivery-count": 3}, True, 2, False),
        ({"x-delivery-count": 4}, True, 2, True),
        ({"x-acquired-count": 8}, True, 2, False),
    ],
)
def test_alone(headers: dict[str, object], redelivered: bool, retries: int, alone: bool) -> None:
    """A redelivery the broker counts returned more than once beyond the job's own retries, and
    not yet poison, runs alone; one returned once, or with no count, runs beside others."""
    if retries:
        headers = {**headers, "x-death": [death(count=retries)]}
    assert facts(headers, redelivered=redelivered).alone is alone


def test_forged_death_never_runs_alone() -> None:
    """A delivery whose x-death a publisher forged is cleaned without running its handler: it
    needs no room, whatever its count."""
    forged = {"x-death": "not a list", "x-delivery-count": 3}
    assert not facts(forged, redelivered=True).alone


FIRST = Facts(attempt=1, max_attempts=4, original_routing_key="jobs")
SECOND = Facts(attempt=2, max_attempts=4, original_routing_key="jobs")
LAST = Facts(attempt=4, max_attempts=4, original_routing_key="jobs")
ONLY = Facts(attempt=1, max_attempts=1, original_routing_key="jobs")
FORGED = Facts(attempt=1, max_attempts=4, original_routing_key="jobs", forged=True)
POISON = Facts(attempt=2, max_attempts=4, original_routing_key="jobs", poison=True)
UNREADABLE = Facts(attempt=1, max_attempts=4, original_routing_key="jobs", unreadable=True)


@pytest.mark.parametrize(
    ("facts_", "outcome", "decision"),
    [
        # Before the handler runs: unreadable properties, forged x-death and poison are settled
        # without it; unreadable properties fail even when the rest would be cleaned or poison.
        (FIRST, None, Run()),
        (LAST, None, Run()),
        (FORGED, None, Sanitize()),
        (POISON, None, Fail(FailureKind.POISON)),
        (UNREADABLE, None, Fail(FailureKind.PERMANENT)),
        (FORGED._replace(unreadable=True), None, Fail(FailureKind.PERMANENT)),
        (POISON._replace(unreadable=True), None, Fail(FailureKind.PERMANENT)),
        # After it ran.
        (FIRST, Outcome.SUCCEEDED, Ack()),
        (LAST, Outcome.SUCCEEDED, Ack()),
        (FIRST, Outcome.TRANSIENT, Retry(1)),
        (SECOND, Outcome.TRANSIENT, Retry(2)),
        (Facts(3, 4, "jobs"), Outcome.TRANSIENT, Retry(3)),
        (LAST, Outcome.TRANSIENT, Fail(FailureKind.EXHAUSTED)),
        (Facts(6, 4, "jobs"), Outcome.TRANSIENT, Fail(FailureKind.EXHAUSTED)),
        (ONLY, Outcome.TRANSIENT, Fail(FailureKind.EXHAUSTED)),
        (FIRST, Outcome.PERMANENT, Fail(FailureKind.PERMANENT)),
        (LAST, Outcome.PERMANENT, Fail(FailureKind.PERMANENT)),
        (ONLY, Outcome.PERMANENT, Fail(FailureKind.PERMANENT)),
    ],
)
def test_decide(facts_: Facts, outcome: Outcome | None, decision: Decision) -> None:
    """Unreadable properties fail, forged is cleaned and poison fails before the handler runs;
    then success acks, permanent fails at once, transient retries in the tier of its attempt
    while attempts remain."""
    assert decide(facts_, outcome) == decision


@pytest.mark.parametrize(
    ("headers", "redelivered", "max_retries", "outcome", "decision"),
    [
        # A fresh job: its handler runs, a success is acked, a failure goes to tier 1.
        ({}, False, 3, None, Run()),
        ({}, False, 3, Outcome.SUCCEEDED, Ack()),
        ({}, False, 3, Outcome.TRANSIENT, Retry(1)),
        # Back from tier 2 (two rejections): tier 3 next, the last with max-retries 3.
        ({"x-death": [death(count=2)]}, True, 3, Outcome.TRANSIENT, Retry(3)),
        (
            {"x-death": [death(count=3)]},
            False,
            3,
            Outcome.TRANSIENT,
            Fail(FailureKind.EXHAUSTED),
        ),
        # A max-retries header lowers the budget.
        (
            {"max-retries": 0},
            False,
            3,
            Outcome.TRANSIENT,
            Fail(FailureKind.EXHAUSTED),
        ),
        # No retries configured: a transient failure fails at once.
        ({}, False, 0, Outcome.TRANSIENT, Fail(FailureKind.EXHAUSTED)),
        ({}, False, 3, Outcome.PERMANENT, Fail(FailureKind.PERMANENT)),
        # A forged x-death is never nacked, whatever else it carries.
        ({"x-death": "rejected"}, False, 3, None, Sanitize()),
        (
            {"x-death": [death(count="9")], "x-delivery-count": 9},
            True,
            3,
            None,
            Sanitize(),
        ),
        # Delivered more than five times without an ack: poison, the handler does not run.
        ({"x-delivery-count": 6}, True, 3, None, Fail(FailureKind.POISON)),
        ({"x-acquired-count": 6}, True, 3, None, Fail(FailureKind.POISON)),
        ({"x-delivery-count": 5}, True, 3, None, Run()),
        ({"x-delivery-count": 99}, False, 3, None, Run()),
    ],
)
def test_spec_rows(
    headers: dict[str, object],
    redelivered: bool,
    max_retries: int,
    outcome: Outcome | None,
    decision: Decision,
) -> None:
    """Each row of the contract's decision, from the headers the broker delivers to the action."""
    assert decide(facts(headers, redelivered, max_retries=max_retries), outcome) == decision


@pytest.mark.parametrize(
    ("headers", "decision"),
    [
        # A main-queue rejection on a job that did not come back from a tier: a publisher wrote it.
        ({"x-death": [death(count=2)]}, Sanitize()),
        # The broker's record of another queue's dead-lettering upstream: a fresh job.
        ({"x-death": [death("orders", count=2)]}, Run()),
    ],
)
def test_spec_rows_of_a_job_not_from_a_tier(headers: dict[str, object], decision: Decision) -> None:
    """Only a job back from a tier may carry the main queue's own rejection count."""
    assert decide(facts(headers, from_tier=False), None) == decision
