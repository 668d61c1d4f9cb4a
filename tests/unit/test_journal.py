"""The journal's pure parts: what a settled delivery writes, what a reader takes of a record
(whoever wrote it), how a job's entries fold into its state, and the pages of `ricochet jobs`."""

import json

import pytest
from ricochet.broker.journal import Entry, Journal, journal_record, read_entries
from ricochet.delivery.events import Returned, Settled
from ricochet.delivery.failed import Failure
from ricochet.delivery.retry import (
    ACK,
    CANCEL,
    SANITIZE,
    Delay,
    Facts,
    Fail,
    FailureKind,
    Retry,
)
from ricochet.handlers.job import check_progress
from ricochet.observe.journal import entry_of, result_detail
from ricochet.ops.jobs import JobFilter, JobHistory, decode_cursor, histories, page

FACTS = Facts(attempt=2, max_attempts=4, original_routing_key="jobs")
AT = 1_764_000_000_000


def _entry(event: Settled) -> Entry | None:
    return entry_of(event, "jobs", AT, lambda tier: 1000 * tier, 4096)


def test_each_settlement_writes_its_entry() -> None:
    failure = Failure(ValueError("boom"))
    succeeded = _entry(Settled("a", FACTS, ACK, None, None, "mail", 0.25, Returned({"n": 1})))
    assert succeeded == Entry(
        AT, "succeeded", "jobs", "a", "mail", 2, {"duration_s": 0.25, "result": {"n": 1}}
    )
    retrying = _entry(Settled("a", FACTS, Retry(2), failure, None, "mail", 0.5))
    assert retrying is not None
    assert retrying.event == "retrying"
    assert retrying.detail["due_at_ms"] == AT + 2000
    assert retrying.detail["tier"] == 2
    assert retrying.detail["reason"] == "ValueError: boom"
    scheduled = _entry(Settled("a", FACTS, Delay(5000, retries=1), None, None, "mail"))
    assert scheduled is not None
    assert scheduled.event == "scheduled"
    assert scheduled.detail == {"due_at_ms": AT + 5000}
    later = _entry(Settled("a", FACTS, Delay(5000, retries=2), failure, None, "mail", 0.1))
    assert later is not None
    assert later.event == "retrying"
    failed = _entry(Settled("a", FACTS, Fail(FailureKind.EXHAUSTED), failure, {}, "mail", 0.1))
    assert failed is not None
    assert failed.event == "failed"
    assert failed.detail["kind"] == "exhausted"
    cancelled = _entry(Settled("a", FACTS, CANCEL, None, None, "mail"))
    assert cancelled is not None
    assert cancelled.event == "cancelled"
    assert _entry(Settled("a", FACTS, SANITIZE)) is None
    assert _entry(Settled(None, FACTS, ACK)) is None


def test_a_result_is_kept_whole_or_said_truncated_never_failing() -> None:
    assert result_detail(Returned([1, 2]), 100) == {"result": [1, 2]}
    assert result_detail(Returned(None), 100) == {"result": None}
    assert result_detail(Returned("x" * 200), 100) == {
        "result_truncated": True,
        "result_bytes": 202,
    }
    assert result_detail(Returned(object()), 100) == {"result_unrecorded": "not JSON: a object"}
    assert result_detail(Returned(float("nan")), 100) == {"result_unrecorded": "not JSON: a float"}


def test_progress_takes_a_percentage_or_a_small_object() -> None:
    for value in (0, 55.5, 100, {"synced": 3}):
        check_progress(value)
    for bad in (-1, 101, True, "half", [1], {"x": "y" * 2000}, {"x": float("inf")}):
        with pytest.raises(ValueError, match="progress"):
            check_progress(bad)


def test_a_reader_takes_only_what_has_an_entry_s_shape() -> None:
    entry = Entry(AT, "started", "jobs", "a", None, 1, {"process": "h:1"})
    good = list(entry)
    assert read_entries(journal_record([entry]).body) == [entry]
    forged = [
        [AT, "exploded", "jobs", "a", None, 1, {}],  # no such event
        [-1, "started", "jobs", "a", None, 1, {}],  # a time before 1970
        [10**20, "started", "jobs", "a", None, 1, {}],  # past what a date holds
        [AT, "started", "", "a", None, 1, {}],  # no queue
        [AT, "started", "jobs", "x" * 5000, None, 1, {}],  # an id no message carries
        [AT, "started", "jobs", "a", 7, 1, {}],  # a type that is not text
        [AT, "started", "jobs", "a", None, True, {}],  # an attempt that is not a count
        [AT, "started", "jobs", "a", None, 1, []],  # no detail object
        [AT, "started", "jobs", "a", None],  # too short
        "started",
    ]
    assert read_entries(json.dumps([*forged, good]).encode()) == [entry]
    assert read_entries(b"not json") == []
    assert read_entries(b"[" * 100_000) == []
    assert read_entries(b'{"a": 1}') == []


def _e(at: int, event: str, attempt: int | None = None, **detail: object) -> Entry:
    return Entry(at, event, "jobs", "a", "mail", attempt, dict(detail))


def test_a_job_s_state_is_its_latest_entry_whatever_order_they_were_written() -> None:
    entries = [
        _e(AT + 5, "started", 1, process="h:1"),
        _e(AT, "enqueued"),  # the client's batch landed after the worker's
        _e(AT + 9, "retrying", 1, reason="boom", due_at_ms=AT + 1009, duration_s=0.004),
        _e(AT + 1010, "started", 2),
        _e(AT + 1011, "progress", 2, progress=40),
        _e(AT + 1020, "succeeded", 2, duration_s=0.01, result="ok"),
    ]
    for order in (entries, entries[::-1]):
        job = histories(order)["jobs", "a"]
        assert job.now(AT + 2000) == "succeeded"
        assert [(a.attempt, a.outcome, a.reason) for a in job.attempts] == [
            (1, "retrying", "boom"),
            (2, "succeeded", None),
        ]
        assert job.result == {"result": "ok"}
        assert job.progress == 40


def test_a_waiting_job_is_queued_once_due() -> None:
    job = histories([_e(AT, "enqueued"), _e(AT + 1, "retrying", 1, due_at_ms=AT + 100)])[
        "jobs", "a"
    ]
    assert job.now(AT + 50) == "waiting"
    assert job.as_dict(AT + 50)["due_at"] is not None
    assert job.now(AT + 100) == "queued"
    assert job.as_dict(AT + 100)["due_at"] is None
    scheduled = histories([_e(AT, "enqueued", due_at_ms=AT + 100)])["jobs", "a"]
    assert scheduled.now(AT + 50) == "waiting"
    assert scheduled.now(AT + 100) == "queued"


def test_pages_go_newest_first_and_never_show_a_job_twice() -> None:
    jobs = [JobHistory(f"j{n}", "jobs", "mail", "succeeded", last_at_ms=AT + n) for n in range(7)]
    everything = JobFilter()
    first, cursor = page(jobs, everything, AT, 3)
    assert [j.message_id for j in first] == ["j6", "j5", "j4"]
    assert cursor is not None
    second, cursor = page(jobs, everything, AT, 3, decode_cursor(cursor))
    assert [j.message_id for j in second] == ["j3", "j2", "j1"]
    assert cursor is not None
    third, cursor = page(jobs, everything, AT, 3, decode_cursor(cursor))
    assert [j.message_id for j in third] == ["j0"]
    assert cursor is None
    with pytest.raises(ValueError, match="not a cursor"):
        decode_cursor("not-a-cursor")


def test_an_attempt_written_as_its_end_alone_started_its_duration_before() -> None:
    """A short attempt's started entry is never written: its end says when it started; a forged
    duration (negative, infinite, NaN) says nothing."""
    job = histories([_e(AT + 500, "succeeded", 1, duration_s=0.25, process="h:1")])["jobs", "a"]
    assert [(a.started_at_ms, a.ended_at_ms, a.process) for a in job.attempts] == [
        (AT + 250, AT + 500, "h:1")
    ]
    for forged in (-1, float("inf"), float("nan"), "1", True):
        job = histories([_e(AT, "succeeded", 1, duration_s=forged)])["jobs", "a"]
        assert job.attempts[0].started_at_ms is None
        assert job.attempts[0].duration_s is None


def test_a_started_entry_is_written_only_for_an_attempt_still_running() -> None:
    """The journal holds a started entry open: an attempt that ended before the next write is
    its end entry alone; one still running is written started; a record names its process."""
    journal = Journal()
    started = [Entry(AT, "started", "jobs", m, None, 1, {}) for m in ("short", "long")]
    journal.open("short-attempt", lambda: started[0])
    journal.open("long-attempt", lambda: started[1])
    journal.close("short-attempt")
    journal.add(Entry(AT + 5, "succeeded", "jobs", "short", None, 1, {"duration_s": 0.005}))
    written = journal.take(100)
    assert [(e.message_id, e.event) for e in written] == [
        ("long", "started"),
        ("short", "succeeded"),
    ]
    record = journal_record(written)
    read = read_entries(record.body, record.app_id)
    assert all(e.detail["process"] == record.app_id for e in read)
