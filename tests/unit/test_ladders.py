"""The retry shape per job type and per job (SPEC 21): the ladder helpers, the ladder in force,
its budget and its waits, in the pure decision."""

from collections.abc import Mapping
from typing import Any

import pytest
import ricochet
from ricochet import ladders
from ricochet.delivery.retry import (
    Delay,
    Facts,
    Fail,
    FailureKind,
    Outcome,
    Retry,
    decide,
    read_facts,
)
from ricochet.errors import InvalidRetryDelays
from ricochet.headers import MAX_RETRIES, RETRIES, RETRY_DELAYS

# A job back from the delays (its copy's routing key spelled its wait).
BACK_FROM_DELAYS = ".".join("0" * 25) + ".jobs"
EMAIL = (5_000, 10_000, 20_000)


def test_the_helpers_are_exported() -> None:
    """ricochet.exponential, linear and fixed are the package's own names."""
    assert ricochet.exponential is ladders.exponential
    assert ricochet.linear is ladders.linear
    assert ricochet.fixed is ladders.fixed


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        (ladders.exponential(5_000, 3), (5_000, 10_000, 20_000)),
        (ladders.exponential(2_000, 4, multiplier=3.0), (2_000, 6_000, 18_000, 54_000)),
        (ladders.exponential(1_000, 4, max_ms=3_000), (1_000, 2_000, 3_000, 3_000)),
        (ladders.exponential(10, 2, multiplier=1.15), (10, 12)),  # 11.5: whole milliseconds
        # Capped at the longest delay allowed, a day, when no max_ms is given.
        (ladders.exponential(60_000, 25)[-1:], (86_400_000,)),
        (ladders.linear(2_000, 3), (2_000, 4_000, 6_000)),
        (ladders.fixed(60_000, 2), (60_000, 60_000)),
        (ladders.fixed(10, 25), (10,) * 25),
    ],
)
def test_helpers_make_ladders(made: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """exponential, linear and fixed make the ladders their names say, as tuples."""
    assert made == expected
    assert ladders.checked(made) == made


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: ladders.exponential(9, 3), "delay_ms"),
        (lambda: ladders.exponential(86_400_001, 1), "delay_ms"),
        (lambda: ladders.exponential(1_000, 0), "retries"),
        (lambda: ladders.exponential(1_000, 26), "retries"),
        (lambda: ladders.exponential(1_000, True), "retries"),
        (lambda: ladders.exponential(1_000, 3, multiplier=0.5), "multiplier"),
        (lambda: ladders.exponential(1_000, 3, multiplier=11), "multiplier"),
        (lambda: ladders.exponential(1_000, 3, max_ms=999), "max_ms"),
        (lambda: ladders.linear(1.5, 3), "delay_ms"),  # type: ignore[arg-type]
        (lambda: ladders.linear(50_000_000, 2), "86400000"),  # 100,000,000 ms: over a day
        (lambda: ladders.fixed(1_000, -1), "retries"),
    ],
)
def test_helpers_refuse_arguments_out_of_bounds(call: Any, argument: str) -> None:
    """A helper's argument out of bounds is a ValueError naming it, never a ladder that a
    handler's registration would refuse later."""
    with pytest.raises(ValueError, match=argument):
        call()


def test_any_sequence_of_delays_is_a_ladder() -> None:
    """A list or a range is read as the tuple it holds; text and sets are no ladders."""
    assert ladders.checked([100, 200]) == (100, 200)
    assert ladders.checked(range(1_000, 4_000, 1_000)) == (1_000, 2_000, 3_000)
    for not_a_ladder in ("100,200", b"100", {100, 200}, 100):
        with pytest.raises(ValueError, match="not a ladder"):
            ladders.checked(not_a_ladder)


@pytest.mark.parametrize(
    ("text", "ladder"),
    [("5000,10000,20000", EMAIL), ("10", (10,)), (" 100 , 200", (100, 200))],
)
def test_header_text_round_trip(text: str, ladder: tuple[int, ...]) -> None:
    """The header's text is comma-separated integers; spaces around them are read too."""
    assert ladders.parse(text) == ladder
    assert ladders.parse(ladders.text(ladder)) == ladder


@pytest.mark.parametrize(
    "text",
    ["", "5000,", "5,000", "-10", "1e4", "5000;10000", "9", ",".join(["10"] * 26), "1" * 5000],
)
def test_header_text_out_of_bounds(text: str) -> None:
    with pytest.raises(ValueError, match="1-25 integers"):
        ladders.parse(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, True),
        (5_000, True),
        (-1, True),
        (2**70, True),
        (True, False),
        (False, False),
        (1.0, False),
        ("5000", False),
        (None, False),
        ([1], False),
    ],
)
def test_is_int_takes_an_int_but_not_a_bool(value: object, expected: bool) -> None:
    """Only an int is one: a bool (an int to Python), a float of a whole number, a string of
    digits or nothing is not."""
    assert ladders.is_int(value) is expected


def test_spread_stays_within_the_jitter() -> None:
    """A wait spread by jitter j lies in [d x (1 - j), d]: the draw picks where."""
    assert ladders.spread(10_000, 0.5, 0.0) == 10_000
    assert ladders.spread(10_000, 0.5, 0.999999) == 5_000
    assert ladders.spread(10_000, 0.2, 0.5) == 9_000


def facts(
    headers: Mapping[str, object],
    *,
    routing_key: str = "jobs",
    max_retries: int = 3,
    type_max_retries: int | None = None,
    type_ladder: tuple[int, ...] | None = None,
    jitter: float = 0.0,
    draw: float | None = None,
) -> Facts:
    return read_facts(
        headers,
        redelivered=False,
        routing_key=routing_key,
        from_tier=routing_key.startswith("jobs.attempt."),
        from_delays=routing_key == BACK_FROM_DELAYS,
        queue="jobs",
        max_retries=max_retries,
        type_max_retries=type_max_retries,
        type_ladder=type_ladder,
        jitter=jitter,
        draw=draw,
    )


@pytest.mark.parametrize(
    ("headers", "type_max_retries", "type_ladder", "max_attempts", "wait_ms"),
    [
        # The worker's ladder (3 tiers): its tiers take the waits.
        ({}, None, None, 4, None),
        # The type's ladder beats the worker's, and its length is the budget (more than 3).
        ({}, None, (100, 200, 300, 400, 500), 6, 100),
        # The type's max_retries lowers its ladder's budget.
        ({}, 2, (100, 200, 300, 400, 500), 3, 100),
        # The job's ladder beats the type's.
        ({RETRY_DELAYS: "7000,8000"}, None, (100, 200, 300, 400, 500), 3, 7000),
        ({RETRY_DELAYS: "7000,8000"}, None, None, 3, 7000),
        # The job's max-retries lowers any ladder's budget; it never raises one.
        ({RETRY_DELAYS: "7000,8000", MAX_RETRIES: 1}, None, None, 2, 7000),
        ({RETRY_DELAYS: "7000", MAX_RETRIES: 9}, None, None, 2, 7000),
        ({MAX_RETRIES: 0}, None, (100,), 1, 100),
        # RICOCHET_MAX_RETRIES bounds only the worker's ladder: a type's goes past it.
        ({}, None, (100,) * 25, 26, 100),
    ],
)
def test_the_ladder_in_force_and_its_budget(
    headers: dict[str, Any],
    type_max_retries: int | None,
    type_ladder: tuple[int, ...] | None,
    max_attempts: int,
    wait_ms: int | None,
) -> None:
    """Which ladder: the job's, else its type's, else the worker's; its length is the budget,
    lowered by the type's max_retries and the job's max-retries header."""
    found = facts(headers, type_max_retries=type_max_retries, type_ladder=type_ladder)
    assert (found.attempt, found.max_attempts, found.wait_ms) == (1, max_attempts, wait_ms)


@pytest.mark.parametrize(
    ("retries", "outcome", "decision"),
    [
        (0, Outcome.TRANSIENT, Delay(5_000, retries=1)),
        (1, Outcome.TRANSIENT, Delay(10_000, retries=2)),
        (2, Outcome.TRANSIENT, Delay(20_000, retries=3)),
        (3, Outcome.TRANSIENT, Fail(FailureKind.EXHAUSTED)),
        (1, Outcome.PERMANENT, Fail(FailureKind.PERMANENT)),
        # A RetryLater's own time beats the ladder's delay; it spends an attempt all the same.
        (1, Outcome.LATER, Delay(1_500, retries=2)),
        (3, Outcome.LATER, Fail(FailureKind.EXHAUSTED)),
    ],
)
def test_retry_k_waits_the_ladder_s_kth_delay(
    retries: int, outcome: Outcome, decision: object
) -> None:
    """A type's ladder: retry k waits its k-th delay in the delays, by a copy that carries the
    retries made (so the count is exact on every broker), until the budget is spent."""
    headers = {RETRIES: retries} if retries else {}
    routing_key = BACK_FROM_DELAYS if retries else "jobs"
    found = facts(headers, routing_key=routing_key, type_ladder=EMAIL)
    assert found.attempt == retries + 1
    later_ms = 1_500 if outcome is Outcome.LATER else None
    assert decide(found, outcome, later_ms) == decision


def test_a_job_back_from_its_ladder_keeps_its_count_and_its_ladder() -> None:
    """The copy that waited carries its header: the next retry waits the next delay."""
    found = facts({RETRY_DELAYS: "1000,2000,3000", RETRIES: 2}, routing_key=BACK_FROM_DELAYS)
    assert decide(found, Outcome.TRANSIENT) == Delay(3_000, retries=3)


def test_a_producer_s_count_is_ignored_on_a_fresh_job() -> None:
    """A ricochet-retries header on a job ricochet did not route is forged: the job starts at
    attempt 1 of its ladder (SPEC 24)."""
    found = facts({RETRIES: 2}, type_ladder=EMAIL)
    assert found.attempt == 1


def test_the_worker_s_ladder_still_goes_by_its_tiers() -> None:
    """Without a ladder of its own a job retries by nack into the tier of its attempt."""
    assert decide(facts({}), Outcome.TRANSIENT) == Retry(1)


def test_jitter_spreads_the_waits_of_a_ladder_of_its_own() -> None:
    """With RICOCHET_RETRY_JITTER j, a type's wait d lies in [d x (1 - j), d]."""
    waits = {
        facts({}, type_ladder=(10_000,), jitter=0.5, draw=draw).wait_ms
        for draw in (0.0, 0.25, 0.5, 0.999)
    }
    assert waits == {10_000, 8_750, 7_500, 5_005}


@pytest.mark.parametrize(
    "value",
    ["soon", "5000,abc", "", "9", ",".join(["100"] * 26), 5000, b"5000", ["5000"], "1" * 100_000],
)
def test_an_unreadable_ladder_header_names_the_header(value: object) -> None:
    """A retry-delays-ms header that cannot be read raises InvalidRetryDelays naming it (the
    consumer's intake then fails the job as permanent), its value shown cut short."""
    with pytest.raises(InvalidRetryDelays, match=r"^retry-delays-ms header") as raised:
        facts({RETRY_DELAYS: value})
    assert len(str(raised.value)) < 400
