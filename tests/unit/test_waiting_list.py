"""The list of waiting jobs from the journal and the broker's depths (ricochet.ops.waiting): what
it lists, where, what it counts as unrecorded, which jobs it marks cancelled."""

import datetime as dt
import json

import pytest
from ricochet.broker.cancel_log import CancelLog
from ricochet.broker.journal import Entry
from ricochet.broker.plan import plan
from ricochet.names import SHARED
from ricochet.ops.jobs import histories
from ricochet.ops.waiting import DELAYS, listing, lookback
from ricochet.ops.waits import Listing, Place, listing_of
from ricochet.settings import Settings

NOW = 1_800_000_000_000
PLAN = plan(Settings(queue="q", retry_delays_ms="60000,120000", max_retries=2))
JITTERED = plan(Settings(queue="q", max_retries=2, retry_delay_ms=1000, retry_jitter=0.5))


def retrying(message_id: str, at: int, tier: int | None, queue: str = "q") -> Entry:
    detail: dict[str, object] = {"due_at_ms": at + 60_000, "reason": "ValueError: down"}
    if tier is not None:
        detail["tier"] = tier
    return Entry(at, "retrying", queue, message_id, "mail", 1, detail)


def started(message_id: str, at: int, queue: str = "q") -> Entry:
    return Entry(at, "started", queue, message_id, "mail", 1, {})


def no_cancels() -> CancelLog:
    return CancelLog(86_400)


async def test_jobs_the_journal_has_waiting_are_listed_soonest_first_where_they_wait() -> None:
    entries = [
        started("b", NOW - 2_000),
        retrying("b", NOW - 1_000, tier=1),
        started("a", NOW - 6_000),
        retrying("a", NOW - 5_000, tier=None),  # a RetryLater: in the delays
        Entry(NOW - 3_000, "succeeded", "q", "done", "mail", 1, {}),
        retrying("gone", NOW - 90_000, tier=1),  # due 30 s ago: back in its queue
    ]
    held = {Place("q.retry.1", 60_000): 1, Place(SHARED.delay(3), 800, 3): 1}
    rows, unrecorded = await listing(
        list(histories(entries).values()), PLAN, held, no_cancels(), NOW
    )
    assert [(r.message_id, r.place, r.attempt, r.reason) for r in rows] == [
        ("a", DELAYS, 2, "ValueError: down"),
        ("b", "q.retry.1", 2, "ValueError: down"),
    ]
    assert rows[0].due_at == dt.datetime.fromtimestamp((NOW + 55_000) / 1000, dt.UTC)
    assert unrecorded == {}


async def test_what_a_place_holds_beyond_the_journal_is_counted_unrecorded() -> None:
    """A tier counts with its lanes; the levels hold every queue's jobs, so another queue's
    waiting jobs there count as known too (and are not listed)."""
    entries = [
        retrying("a", NOW - 1_000, tier=1),
        retrying("other", NOW - 1_000, tier=None, queue="elsewhere"),
    ]
    lane = JITTERED.lanes_of(1)[0]
    held = {
        Place("q.retry.1", 1_000): 1,
        Place(lane.name, 1_200): 2,
        Place(SHARED.delay(5), 3_200, 5): 3,
        Place("q.retry.2", 2_000): 1,
    }
    rows, unrecorded = await listing(
        list(histories(entries).values()), JITTERED, held, no_cancels(), NOW
    )
    assert [r.message_id for r in rows] == ["a"]
    assert unrecorded == {"q.retry.1": 2, DELAYS: 2, "q.retry.2": 1}


async def test_a_job_a_cancel_covers_is_marked_and_an_id_enqueued_again_after_it_is_not() -> None:
    cancels = no_cancels()
    cancels.add_cancel("q", "x", offset=10, at_s=(NOW - 3_000) / 1000, now_s=NOW / 1000)
    cancels.add_cancel("q", "y", offset=11, at_s=(NOW - 3_000) / 1000, now_s=NOW / 1000)
    entries = [
        Entry(NOW - 9_000, "enqueued", "q", "x", "mail", None, {}),
        retrying("x", NOW - 8_000, tier=1),
        Entry(NOW - 9_000, "enqueued", "q", "y", "mail", None, {}),
        Entry(NOW - 1_000, "enqueued", "q", "y", "mail", None, {"due_at_ms": NOW + 5_000}),
        retrying("z", NOW - 8_000, tier=1),
    ]
    rows, _ = await listing(list(histories(entries).values()), PLAN, {}, cancels, NOW)
    assert {r.message_id: r.cancelled for r in rows} == {"x": True, "y": False, "z": False}


async def test_a_job_run_again_is_listed_with_the_attempt_it_makes_next() -> None:
    """A job that failed its way to the failed queue, was replayed and failed once more waits for
    its second attempt, whatever attempts its first run made."""
    entries = [
        retrying("r", NOW - 9_000, tier=1),
        Entry(NOW - 8_500, "retrying", "q", "r", "mail", 2, {"tier": 2, "due_at_ms": NOW}),
        Entry(NOW - 8_000, "started", "q", "r", "mail", 3, {}),
        Entry(NOW - 7_900, "failed", "q", "r", "mail", 3, {"kind": "exhausted"}),
        Entry(NOW - 5_000, "replayed", "q", "r", "mail", None, {}),
        Entry(NOW - 4_000, "started", "q", "r", "mail", 1, {}),
        retrying("r", NOW - 3_000, tier=1),
        Entry(NOW - 1_000, "enqueued", "q", "s", "mail", None, {"due_at_ms": NOW + 9_000}),
    ]
    rows, _ = await listing(list(histories(entries).values()), PLAN, {}, no_cancels(), NOW)
    assert [(r.message_id, r.attempt) for r in rows] == [("s", 1), ("r", 2)]


def test_the_journal_is_read_back_over_the_longest_tier_and_an_hour_at_least() -> None:
    assert lookback(PLAN) == dt.timedelta(hours=1)
    long = plan(Settings(queue="q", retry_delays_ms="7200000", max_retries=1))
    assert lookback(long) == dt.timedelta(hours=2, seconds=60)


async def test_a_listing_comes_back_whole_from_the_monitor_s_json() -> None:
    """`ricochet waiting` asking the monitor reads its /api/waiting back into what it would
    have listed itself; an answer that is not one is refused."""
    entries = [retrying("a", NOW - 1_000, tier=1), retrying("b", NOW - 2_000, tier=None)]
    rows, _ = await listing(list(histories(entries).values()), PLAN, {}, no_cancels(), NOW)
    found = Listing(rows, {"q.retry.1": 2}, "the monitor's index", False)
    answer = json.loads(json.dumps(found.as_dict()))
    assert listing_of(answer) == found
    for broken in ({}, {**answer, "jobs": [{"message_id": 1}]}, {**answer, "unrecorded": []}):
        with pytest.raises((KeyError, TypeError, ValueError, AttributeError)):
            listing_of(broken)
