"""What a waiting job is, read from its message where it waits (ricochet.ops.waits), and the
console's groups of them: tables of cases, no broker."""

import datetime as dt
from typing import Any

import pytest
from ricochet.monitor.groups import WAITING_SHOWN, waiting_groups
from ricochet.names import delay_key
from ricochet.ops.waits import (
    Place,
    copy_says,
    destination,
    iso,
    level_place,
    next_attempt,
    read_waiting,
)

NOW = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.UTC)
TIER = Place("jobs.retry.2", 60_000)


def rejected(count: int, queue: str = "jobs", at: dt.datetime = NOW) -> dict[str, Any]:
    return {"queue": queue, "reason": "rejected", "count": count, "time": at}


@pytest.mark.parametrize(
    ("headers", "attempt"),
    [
        ({}, 1),  # a schedule
        ({"ricochet-retries": 2}, 3),  # a RetryLater copy after attempt 2
        ({"x-death": [rejected(1)]}, 2),  # in tier 1 after a nack
        ({"x-death": [rejected(2), rejected(5, queue="other")]}, 3),
        ({"ricochet-retries": 2, "x-death": [rejected(1)]}, 4),  # back from the delays, nacked
        ({"ricochet-retries": "2", "x-death": "forged"}, 1),  # not ricochet's: counts nothing
        ({"ricochet-retries": True}, 1),
    ],
)
def test_the_next_attempt_is_counted_as_the_worker_will(
    headers: dict[str, Any], attempt: int
) -> None:
    """1 + the retries a copy carries + the broker's rejections from the queue since."""
    assert next_attempt(headers, "jobs") == attempt


def test_a_tier_job_is_due_its_ttl_after_its_retry_in_the_journal() -> None:
    """With the journal's entry of its retry, a tier's job is due to the millisecond; without,
    the latest death it shows (x-death keeps the first, in whole seconds) is a lower bound."""
    came = NOW - dt.timedelta(seconds=10, milliseconds=250)
    headers = {"x-death": [rejected(2, at=NOW - dt.timedelta(minutes=5))]}
    kwargs: dict[str, Any] = {
        "message_id": "m",
        "amqp_type": "mail",
        "body": b"{}",
        "headers": headers,
        "routing_key": "jobs.retry.2",
        "timestamp": None,
        "now": NOW,
    }
    exact = read_waiting(TIER, "jobs", came_at=came, reason="ValueError: x", **kwargs)
    due = came + dt.timedelta(minutes=1)
    assert (exact.due_at, exact.leaves_at, exact.exact) == (due, due, True)
    assert exact.as_row() == {
        "message_id": "m",
        "type": "mail",
        "queue": "jobs",
        "attempt": 3,
        "due_at": "2026-11-26T12:00:49.750Z",
        "reason": "ValueError: x",
        "cancelled": False,
    }
    bound = read_waiting(TIER, "jobs", **kwargs)
    assert (bound.due_at, bound.exact, bound.reason) == (NOW - dt.timedelta(minutes=4), False, None)


def test_a_job_in_the_delays_is_due_when_its_copy_says() -> None:
    """A copy to the delays says since when it waits: with its key's units, its due time; in
    level k it leaves that level before what the lower levels still hold it."""
    key = delay_key(1_500, "jobs")  # 15 units: levels 3, 2, 1 and 0
    since_ms = int(NOW.timestamp() * 1000)
    headers = {"ricochet-waiting-since": since_ms, "ricochet-wait-reason": "RetryLater: later"}
    due, reason = copy_says(headers, key)
    assert (due, reason) == (NOW + dt.timedelta(milliseconds=1500), "RetryLater: later")
    job = read_waiting(
        level_place(2),
        "jobs",
        message_id="m",
        amqp_type=None,
        body=b'{"type": "report"}',
        headers=headers,
        routing_key=key,
        timestamp=None,
        due_at=due,
        reason=reason,
        now=NOW,
    )
    # Left in level 2 after 8 + 4 units; levels 1 and 0 hold it 3 more.
    assert job.leaves_at == NOW + dt.timedelta(milliseconds=1200)
    assert (job.type, job.attempt) == ("report", 1)
    assert copy_says({}, key) == (None, None)  # a copy of an earlier ricochet says nothing


@pytest.mark.parametrize(
    ("key", "queue"),
    [
        (delay_key(100, "jobs"), "jobs"),
        (delay_key(100, "a.x"), "a.x"),  # a dotted name is the queue's whole
        ("jobs.attempt.1", None),
        (delay_key(100, "")[:-1], None),  # the digits alone: a per-queue level's key
    ],
)
def test_a_delay_key_names_its_queue(key: str, queue: str | None) -> None:
    assert destination(key) == queue


def test_iso_has_milliseconds_and_z() -> None:
    assert iso(NOW + dt.timedelta(microseconds=123_456)) == "2026-11-26T12:00:00.123Z"


def test_the_console_groups_waiting_jobs_by_reason() -> None:
    """The largest group first, a scheduled job's (no reason) a group too; each lists its jobs
    soonest first, and the page shows WAITING_SHOWN jobs at most in all."""
    rows = []
    for i in range(WAITING_SHOWN + 10):
        reason = "ValueError: down" if i % 3 else None
        rows.append(
            read_waiting(
                TIER,
                "jobs",
                message_id=f"m{i}",
                amqp_type="mail",
                body=b"",
                headers={},
                routing_key="",
                timestamp=None,
                came_at=NOW - dt.timedelta(seconds=i),
                reason=reason,
                now=NOW,
            )
        )
    groups = waiting_groups(rows)
    assert [g.reason for g in groups] == ["ValueError: down", None]
    assert sum(g.count for g in groups) == len(rows)
    assert sum(len(g.jobs) for g in groups) == WAITING_SHOWN
    first = groups[0].jobs
    assert first == sorted(first, key=lambda row: row.due_at)
