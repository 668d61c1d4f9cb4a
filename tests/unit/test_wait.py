"""Shaping the wait: RetryLater, run-at, ricochet's retry count, cancels, in the pure decision."""

import datetime as dt
import math
from typing import Any

import pytest
from ricochet import RetryLater
from ricochet.broker.cancel_log import CancelLog
from ricochet.delivery.retry import (
    Ack,
    Cancel,
    Decision,
    Delay,
    Fail,
    FailureKind,
    Outcome,
    Retry,
    RetryByCopy,
    Run,
    Sanitize,
    decide,
    parse_run_at,
    read_facts,
)
from ricochet.headers import RETRIES
from ricochet.names import delay_key, is_delay_key

NOW = dt.datetime(2026, 11, 24, 12, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("after", "seconds"),
    [(1, 1.0), (0.25, 0.25), (86_400, 86_400.0), (dt.timedelta(minutes=2), 120.0)],
)
def test_retry_later_takes_seconds_or_a_timedelta(after: Any, seconds: float) -> None:
    """RetryLater(after): seconds as int or float, or a timedelta."""
    assert RetryLater(after).after_s == seconds
    assert str(RetryLater(after, "rate limited")) == "rate limited"


@pytest.mark.parametrize(
    "after",
    [0, -1, 86_400.5, dt.timedelta(days=2), dt.timedelta(0), math.nan, math.inf, True, "5", None],
)
def test_retry_later_out_of_range(after: Any) -> None:
    """0 < after <= 86,400 s, else ValueError before anything happens."""
    with pytest.raises(ValueError, match="RetryLater after="):
        RetryLater(after)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-24T12:00:05Z", NOW + dt.timedelta(seconds=5)),
        ("2026-11-24T13:00:05+01:00", NOW + dt.timedelta(seconds=5)),
        ("2026-11-24T12:00:05.250000+00:00", NOW + dt.timedelta(seconds=5.25)),
        ("2026-11-24t12:00:05z", NOW + dt.timedelta(seconds=5)),  # RFC 3339 allows lower case
        (dt.datetime(2026, 11, 24, 12, 0, 5), NOW + dt.timedelta(seconds=5)),  # AMQP timestamp
        ("2026-11-24T12:00:05", None),  # no offset: whose noon?
        ("tomorrow", None),
        ("", None),
        (b"2026-11-24T12:00:05Z", None),
        (1764000000, None),
    ],
)
def test_run_at_is_iso_8601_with_an_offset(value: Any, expected: dt.datetime | None) -> None:
    """run-at: an ISO-8601 date-time with a UTC offset or Z; anything else cannot be read."""
    assert parse_run_at(value) == expected


# The routing key of a job back from the delays: the one that spelled its wait.
BACK_FROM_DELAYS = delay_key(1000, "jobs")


def facts(
    headers: dict[str, Any],
    *,
    routing_key: str = "jobs",
    cancelled: bool = False,
    max_retries: int = 3,
) -> Any:
    key_tier = (
        int(routing_key.rsplit(".", 1)[1]) if routing_key.startswith("jobs.attempt.") else None
    )
    return read_facts(
        headers,
        redelivered=False,
        routing_key=routing_key,
        from_tier=key_tier is not None,
        from_delays=is_delay_key(routing_key),
        queue="jobs",
        max_retries=max_retries,
        type_max_retries=None,
        key_tier=key_tier,
        cancelled=cancelled,
        now=NOW,
    )


def rejected(count: int) -> dict[str, Any]:
    return {"x-death": [{"queue": "jobs", "reason": "rejected", "count": count}]}


@pytest.mark.parametrize(
    ("headers", "routing_key", "cancelled", "outcome", "decision"),
    [
        # A schedule ahead waits for it, spending nothing; a past or present one runs.
        (
            {"run-at": "2026-11-24T12:00:05Z"},
            "jobs",
            False,
            None,
            Delay(5000, retries=0),
        ),
        (
            {"run-at": "2026-11-24T12:00:00.0001Z"},
            "jobs",
            False,
            None,
            Delay(1, retries=0),
        ),
        ({"run-at": "2026-11-24T12:00:00Z"}, "jobs", False, None, Run()),
        ({"run-at": "2020-01-01T00:00:00Z"}, "jobs", False, None, Run()),
        # One that cannot be read fails for good at once.
        ({"run-at": "soon"}, "jobs", False, None, Fail(FailureKind.PERMANENT)),
        # So does one further ahead than a cancel is kept (31 days); up to that it waits.
        (
            {"run-at": "2026-12-25T12:00:00.001Z"},
            "jobs",
            False,
            None,
            Fail(FailureKind.PERMANENT),
        ),
        (
            {"run-at": "2026-12-25T12:00:00Z"},
            "jobs",
            False,
            None,
            Delay(31 * 86_400_000, retries=0),
        ),
        # Cancelled while it waited (scheduled, in a tier, after a RetryLater): dropped when it
        # comes due, whatever else it says.
        ({"run-at": "2026-11-24T12:00:05Z"}, "jobs", True, None, Cancel()),
        ({"run-at": "2020-01-01T00:00:00Z"}, BACK_FROM_DELAYS, True, None, Cancel()),
        ({**rejected(2)}, "jobs.attempt.2", True, None, Cancel()),
        ({RETRIES: 1}, BACK_FROM_DELAYS, True, None, Cancel()),
        ({"run-at": "soon"}, "jobs", True, None, Cancel()),
        # A job still in the backlog is covered too (SPEC 23): which cancels cover it is the
        # cancel store's call (a job enqueued after its cancel is not covered).
        ({}, "jobs", True, None, Cancel()),
        # A handler that stopped for a cancel ends its job cancelled, on any attempt.
        ({}, "jobs", False, Outcome.CANCELLED, Cancel()),
        ({**rejected(3)}, "jobs.attempt.3", False, Outcome.CANCELLED, Cancel()),
        # RetryLater spends an attempt and waits its time; the copy carries the retries made.
        ({}, "jobs", False, Outcome.LATER, Delay(1500, retries=1)),
        (
            {**rejected(2)},
            "jobs.attempt.2",
            False,
            Outcome.LATER,
            Delay(1500, retries=3),
        ),
        # ... and with no attempt left it fails as exhausted.
        (
            {**rejected(3)},
            "jobs.attempt.3",
            False,
            Outcome.LATER,
            Fail(FailureKind.EXHAUSTED),
        ),
        (
            {RETRIES: 3},
            BACK_FROM_DELAYS,
            False,
            Outcome.LATER,
            Fail(FailureKind.EXHAUSTED),
        ),
        # Back from the delays with retries made: its key leads to tier 1, so a copy goes to its
        # own tier; once a tier sent it back, its key leads right again and a nack does.
        (
            {RETRIES: 1},
            BACK_FROM_DELAYS,
            False,
            Outcome.TRANSIENT,
            RetryByCopy(2),
        ),
        (
            {RETRIES: 2},
            "jobs.attempt.2",
            False,
            Outcome.TRANSIENT,
            Retry(3),
        ),
        (
            {RETRIES: 1, **rejected(1)},
            "jobs.attempt.2",
            False,
            Outcome.TRANSIENT,
            Retry(3),
        ),
        ({RETRIES: 1}, BACK_FROM_DELAYS, False, Outcome.SUCCEEDED, Ack()),
        # A fresh scheduled job back from the delays retries by nack, into tier 1.
        (
            {"run-at": "2026-11-24T11:59:00Z"},
            BACK_FROM_DELAYS,
            False,
            Outcome.TRANSIENT,
            Retry(1),
        ),
    ],
)
def test_decisions_of_the_wait(
    headers: dict[str, Any],
    routing_key: str,
    cancelled: bool,
    outcome: Outcome | None,
    decision: Decision,
) -> None:
    """Schedules, cancels and RetryLater in the decision table."""
    later_ms = 1500 if outcome is Outcome.LATER else None
    found = facts(headers, routing_key=routing_key, cancelled=cancelled)
    assert decide(found, outcome, later_ms) == decision


@pytest.mark.parametrize(
    ("headers", "attempt"),
    [
        ({}, 1),
        ({RETRIES: 2}, 3),
        ({RETRIES: 2, **rejected(1)}, 4),
        ({RETRIES: "2"}, 1),  # not ricochet's: ignored
        ({RETRIES: -1}, 1),
        ({RETRIES: True}, 1),
    ],
)
def test_attempt_counts_retries_before_and_since_a_copy(
    headers: dict[str, Any], attempt: int
) -> None:
    """Attempt = 1 + the retries a copy carries + the broker's count since it was published."""
    routing_key = "jobs.attempt.1" if "x-death" in headers else BACK_FROM_DELAYS
    assert facts(headers, routing_key=routing_key).attempt == attempt


@pytest.mark.parametrize("routing_key", ["jobs", "jobs.other", "0.1.0"])
def test_a_count_of_retries_on_a_job_ricochet_did_not_route_is_forged(routing_key: str) -> None:
    """A producer's ricochet-retries on a job sent straight to the queue buys no attempts: the
    job is cleaned and runs as a first attempt (SPEC 24)."""
    found = facts({RETRIES: 2}, routing_key=routing_key)
    assert (found.forged, found.attempt) == (True, 1)
    assert decide(found, None) == Sanitize()


def test_a_cancel_log_forgets_cancels_past_the_kept_time() -> None:
    """Memory stays bounded: a cancel older than the kept time is dropped (and one read that
    old is never kept)."""
    log = CancelLog(kept_s=100)

    def kept(message_id: str) -> bool:
        return log.covers("q", message_id, None, lambda: None)

    log.add_cancel("q", "a", offset=0, at_s=0, now_s=10)
    log.add_cancel("q", "b", offset=1, at_s=50, now_s=60)
    log.add_cancel("q", "old", offset=2, at_s=0, now_s=140)
    log.prune(now_s=140)  # the reader prunes once a minute
    assert not kept("a")
    assert not kept("old")
    assert kept("b")
    log.add_cancel("q", "a", offset=3, at_s=140, now_s=150)
    log.prune(now_s=170)
    assert (kept("a"), kept("b"), len(log)) == (True, False, 1)


@pytest.mark.parametrize(
    ("message_id", "published_s", "cancelled"),
    [
        ("waiting", 990.0, True),  # published before the cancel: it was waiting
        ("waiting", 1000.0, True),  # the same second as the cancel counts as before it
        ("waiting", None, True),  # no timestamp: covered whenever it was published
        ("waiting", 1001.0, False),  # enqueued again, or replayed, after the cancel
        ("never-cancelled", 990.0, False),
        (None, 990.0, False),
    ],
)
def test_a_cancel_covers_the_job_published_before_it(
    message_id: str | None, published_s: float | None, cancelled: bool
) -> None:
    """A job of another producer than the client (no incarnation token): a cancel stops the
    job published before it, not its id for good: a job published with that id after the
    cancel runs."""
    log = CancelLog(kept_s=100)
    log.add_cancel("q", "waiting", offset=0, at_s=1000, now_s=1010)
    assert log.covers("q", message_id, None, lambda: published_s) is cancelled


def test_a_cancel_reads_the_timestamp_only_for_a_cancelled_id() -> None:
    """Every delivery is checked against the cancels: one whose id has none costs a lookup."""
    log = CancelLog(kept_s=100)

    def published_s() -> float:
        raise AssertionError("read for an id that has no cancel")

    assert not log.covers("q", "other", None, published_s)
