"""A tier listed from the records of its retries when they account for its depth
(ricochet.ops.recorded), and what a retry's record holds (ricochet.broker.retries)."""

import datetime as dt
import json
from typing import Any

import aio_pika
import pytest
from ricochet.broker.plan import plan
from ricochet.broker.retries import (
    RECORD_TYPE_MOST,
    Retried,
    read_records,
    record_of,
    retry_records,
)
from ricochet.ops.recorded import ARRIVING_MS, LEAVING_MS, SKEW_MS, listed_from_records
from ricochet.ops.waiting import by_tier, recorded_tiers
from ricochet.ops.waits import Place
from ricochet.settings import Settings

TTL_MS = 60_000
TIER = Place("orders.retry.1", TTL_MS)
COUNTED_MS = 1_800_000_000_000
NOW = dt.datetime.fromtimestamp(COUNTED_MS / 1000, dt.UTC)


def records(*came_ms: int) -> list[tuple[str, int, Retried]]:
    return [
        (f"j{i}", 1, Retried("ValueError: down", at, 1, "charge")) for i, at in enumerate(came_ms)
    ]


def listed(depth: int, recorded: list[tuple[str, int, Retried]], now: dt.datetime = NOW) -> Any:
    return listed_from_records(TIER, "orders", depth, COUNTED_MS, recorded, now)


def test_records_that_account_for_the_depth_list_the_tier() -> None:
    came = [COUNTED_MS - 30_000, COUNTED_MS - 10_000]
    rows = listed(2, records(*came))
    assert rows is not None
    assert [(r.message_id, r.type, r.queue, r.attempt, r.reason, r.place) for r in rows] == [
        ("j0", "charge", "orders", 2, "ValueError: down", "orders.retry.1"),
        ("j1", "charge", "orders", 2, "ValueError: down", "orders.retry.1"),
    ]
    assert [r.due_at.timestamp() * 1000 for r in rows] == [at + TTL_MS for at in came]
    assert all(r.exact and r.leaves_at == r.due_at for r in rows)


@pytest.mark.parametrize("depth", [1, 3])
def test_a_job_more_or_less_than_the_records_say_sends_the_look_to_read(depth: int) -> None:
    """A record lost on its own (a job more), or one whose job never reached the tier
    (a job less): the records cannot say which, so the tier is read."""
    assert listed(depth, records(COUNTED_MS - 30_000, COUNTED_MS - 10_000)) is None


def test_jobs_gone_well_before_the_count_or_come_well_after_it_are_not_counted() -> None:
    gone = COUNTED_MS - TTL_MS - LEAVING_MS
    later = COUNTED_MS + SKEW_MS + 1
    assert listed(1, records(gone, COUNTED_MS - 30_000, later)) is not None
    assert listed(2, records(gone, COUNTED_MS - 30_000, later)) is None


@pytest.mark.parametrize(
    "came_ms",
    [
        COUNTED_MS - TTL_MS - LEAVING_MS + 1,  # left a moment before the count: maybe still there
        COUNTED_MS - TTL_MS + SKEW_MS,  # leaving as it was counted
        COUNTED_MS - ARRIVING_MS + 1,  # its nack maybe not yet in the tier
        COUNTED_MS + SKEW_MS,  # clocks apart
    ],
)
def test_a_job_coming_or_leaving_as_the_tier_was_counted_may_be_counted_or_not(
    came_ms: int,
) -> None:
    assert listed(1, records(COUNTED_MS - 30_000, came_ms)) is not None
    assert listed(2, records(COUNTED_MS - 30_000, came_ms)) is not None
    assert listed(0, records(COUNTED_MS - 30_000, came_ms)) is None
    assert listed(3, records(COUNTED_MS - 30_000, came_ms)) is None


def test_a_short_tier_is_listed_when_nothing_comes_or_leaves_near_the_count() -> None:
    short = Place("orders.retry.1", 3_000)
    far = records(COUNTED_MS - 1_500)
    assert listed_from_records(short, "orders", 1, COUNTED_MS, far, NOW) is not None
    assert listed_from_records(short, "orders", 2, COUNTED_MS, far, NOW) is None


def test_a_job_that_has_left_since_the_count_is_counted_and_not_listed() -> None:
    later = NOW + dt.timedelta(seconds=40)
    rows = listed(2, records(COUNTED_MS - 30_000, COUNTED_MS - 10_000), later)
    assert rows is not None
    assert [r.message_id for r in rows] == ["j1"]


def test_an_empty_tier_with_no_records_lists_nothing() -> None:
    assert listed(0, []) == []


def batch(*rows: Any) -> aio_pika.Message:
    return retry_records(rows)


def earlier(headers: dict[str, Any], message_id: str = "j1") -> aio_pika.Message:
    """The one record a message of an earlier ricochet."""
    all_headers: dict[str, Any] = {
        "ricochet-queue": "orders",
        "ricochet-attempt": 1,
        "ricochet-at-ms": 5,
    }
    return aio_pika.Message(
        b"ValueError: down", message_id=message_id, type="retry", headers=all_headers | headers
    )


def test_a_record_names_its_tier_and_type() -> None:
    entry = batch(record_of("orders", "j1", 2, "ValueError: down", 5, tier=2, job_type="charge"))
    assert read_records(entry, "orders") == [("j1", 2, Retried("ValueError: down", 5, 2, "charge"))]
    assert read_records(entry, "invoices") == []


def test_a_batch_holds_the_records_of_every_queue_in_order() -> None:
    entry = batch(
        record_of("orders", "j1", 1, "ValueError: down", 5, tier=1, job_type="charge"),
        record_of("invoices", "j2", 1, "KeyError: 'x'", 6, tier=1, job_type="send"),
        record_of("orders", "j3", 3, "TimeoutError", 7, tier=3, job_type="charge"),
    )
    assert read_records(entry, "orders") == [
        ("j1", 1, Retried("ValueError: down", 5, 1, "charge")),
        ("j3", 3, Retried("TimeoutError", 7, 3, "charge")),
    ]


def test_a_type_too_long_to_record_leaves_the_tier_unnamed() -> None:
    """Such a job's tier is read, never listed from a record that lacks its type."""
    long_type = "t" * (RECORD_TYPE_MOST + 1)
    entry = batch(record_of("orders", "j1", 1, "ValueError: down", 5, tier=1, job_type=long_type))
    assert read_records(entry, "orders") == [("j1", 1, Retried("ValueError: down", 5))]


def test_a_record_of_a_job_without_an_id_names_no_tier() -> None:
    """Such a job cannot be listed from a record: its tier is read."""
    entry = batch(record_of("orders", None, 1, "ValueError: down", 5, tier=1, job_type="charge"))
    assert read_records(entry, "orders") == [("", 1, Retried("ValueError: down", 5))]


def test_the_one_record_of_an_earlier_ricochet_is_read() -> None:
    named = {"ricochet-tier": 2, "ricochet-type": "charge"}
    assert read_records(earlier({}), "orders") == [("j1", 1, Retried("ValueError: down", 5))]
    assert read_records(earlier(named), "orders") == [
        ("j1", 1, Retried("ValueError: down", 5, 2, "charge"))
    ]
    assert read_records(earlier(named, message_id=""), "orders") == [
        ("", 1, Retried("ValueError: down", 5))
    ]
    assert read_records(earlier({}), "invoices") == []


@pytest.mark.parametrize(
    "headers",
    [
        {"ricochet-at-ms": 10**18},  # no date holds it
        {"ricochet-at-ms": True},
        {"ricochet-attempt": "1"},
    ],
)
def test_a_forged_record_of_an_earlier_kind_is_none(headers: dict[str, Any]) -> None:
    assert read_records(earlier(headers), "orders") == []


@pytest.mark.parametrize(
    "row",
    [
        ["orders", "j9", 1, 10**18, 1, "charge", "x"],  # no date holds it
        ["orders", "j9", 1, True, 1, "charge", "x"],
        ["orders", "j9", "1", 5, 1, "charge", "x"],
        ["orders", "j9", 1, 5, 1, "charge", None],  # a reason that is not text
        ["orders", 9, 1, 5, 1, "charge", "x"],  # an id that is not text
        ["orders", "j9", 10**4299, 5, 1, "charge", "x"],  # an attempt that would not print
        ["orders", "j9", -1, 5, 1, "charge", "x"],
        ["orders", "j9", 1, 5, 1, "charge"],  # a field short
        {"queue": "orders"},
    ],
)
def test_a_forged_row_of_a_batch_is_left_out_and_the_others_read(row: Any) -> None:
    good = record_of("orders", "j1", 1, "ValueError: down", 5, tier=1, job_type="charge")
    entry = aio_pika.Message(json.dumps([row, good]).encode(), type="retries")
    assert read_records(entry, "orders") == [("j1", 1, Retried("ValueError: down", 5, 1, "charge"))]


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[" * 100_000 + b"]" * 100_000, b'{"a": 1}', b"\xff\xfe", b""],
)
def test_an_entry_that_is_no_batch_holds_no_record(body: bytes) -> None:
    """The store takes what anyone the vhost lets in writes: a body nested past what a parser
    takes, or not JSON at all, is no record, and the reader goes on."""
    assert read_records(aio_pika.Message(body, type="retries"), "orders") == []


def test_a_forged_tier_names_none() -> None:
    for tier in (True, 10**4299, -1):
        row = ["orders", "j1", 1, 5, tier, "charge", "ValueError: down"]
        entry = aio_pika.Message(json.dumps([row]).encode(), type="retries")
        assert read_records(entry, "orders") == [("j1", 1, Retried("ValueError: down", 5))]
    assert read_records(earlier({"ricochet-tier": True}), "orders") == [
        ("j1", 1, Retried("ValueError: down", 5))
    ]


def test_a_record_that_names_no_tier_leaves_every_tier_to_be_read() -> None:
    named = Retried("ValueError: down", 5, 1, "charge")
    assert by_tier({("j1", 1): named}) == {1: [("j1", 1, named)]}
    assert by_tier({("j1", 1): named, ("j2", 1): Retried("ValueError: down", 5)}) is None


def test_only_tiers_without_lanes_are_listed_from_records() -> None:
    """A jittered tier's lane is the broker's choice, which no record knows."""
    plain = plan(Settings(queue="orders", retry_delays_ms="1000,5000"))
    assert recorded_tiers(plain) == {"orders.retry.1": 1, "orders.retry.2": 2}
    jittered = plan(Settings(queue="orders", retry_delays_ms="1000,5000", retry_jitter=0.5))
    assert recorded_tiers(jittered) == {}
