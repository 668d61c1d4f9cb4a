"""The monitor's index of the journal: entries folded into jobs, the jobs changed longest ago
forgotten past its bound, pages newest first, and the API's query read or refused."""

import pytest
from aiohttp import web
from multidict import MultiDict
from ricochet.broker.journal import Entry, journal_record
from ricochet.monitor.index import JobIndex, counted_entries
from ricochet.monitor.job_views import LIMIT_MOST, selection
from ricochet.ops.jobs import JobFilter, decode_cursor, page
from ricochet.ops.report import job_text


def entry(at_ms: int, event: str, message_id: str, queue: str = "jobs", **detail: object) -> Entry:
    return Entry(at_ms, event, queue, message_id, "report", 1, dict(detail))


def test_entries_fold_into_their_job_and_a_job_is_found_by_id_in_each_queue() -> None:
    index = JobIndex()
    index.add(entry(1, "enqueued", "a"))
    index.add(entry(2, "started", "a"))
    index.add(entry(3, "succeeded", "a", duration_s=0.5, result=7))
    index.add(entry(4, "enqueued", "a", queue="other"))
    assert index.entries == 4
    assert len(index) == 2
    ours, theirs = index.job("a")[-1], index.job("a", "jobs")[0]
    assert (ours.queue, ours.state) == ("other", "queued")
    assert (theirs.state, theirs.result) == ("succeeded", {"result": 7})
    assert index.job("missing") == []


def test_past_its_bound_the_index_forgets_the_jobs_changed_longest_ago() -> None:
    index = JobIndex(most=5)
    for i, message_id in enumerate(["a", "b", "c"]):
        index.add(entry(i, "enqueued", message_id))
    index.add(entry(10, "started", "a"))  # a changed last: b is now the one changed longest ago
    index.add(entry(11, "enqueued", "d"))
    assert index.entries == 5
    index.add(entry(12, "enqueued", "e"))
    assert index.job("b") == []
    assert [j.message_id for j in index.jobs()] == ["c", "a", "d", "e"]
    assert index.entries == 5
    index.add(entry(13, "started", "e"))
    index.add(entry(14, "succeeded", "e"))
    assert index.entries <= 5
    assert index.job("e")[0].state == "succeeded"
    assert sum(1 for _ in index.jobs()) == len(index)


def test_pages_go_newest_first_and_every_job_once() -> None:
    index = JobIndex()
    for i in range(25):
        index.add(entry(1000 - i * 7 % 50, "enqueued", f"j{i}"))
    seen: list[str] = []
    cursor = None
    while True:
        shown, cursor_text = page(index.jobs(), JobFilter(), 0, 4, cursor)
        seen += [job.message_id for job in shown]
        if cursor_text is None:
            break
        cursor = decode_cursor(cursor_text)
    assert sorted(seen) == sorted(f"j{i}" for i in range(25))
    times = [index.job(m)[0].last_at_ms for m in seen]
    assert times == sorted(times, reverse=True)


def test_a_record_s_entries_are_counted_without_reading_them() -> None:
    record = journal_record([entry(1, "enqueued", "a"), entry(2, "enqueued", "b", reason="x")])

    class Seen:
        type = record.type
        body = record.body

    assert counted_entries(Seen()) == 2  # type: ignore[arg-type]
    Seen.body = b"not a record"
    assert counted_entries(Seen()) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ({"state": "lost"}, "state must be one of"),
        ({"limit": "0"}, "limit must be"),
        ({"limit": str(LIMIT_MOST + 1)}, "limit must be"),
        ({"limit": "²"}, "limit must be"),
        ({"before": "x"}, "is not a cursor"),
    ],
)
def test_a_query_the_api_cannot_read_is_refused_saying_why(query: dict[str, str], why: str) -> None:
    with pytest.raises(web.HTTPBadRequest) as refused:
        selection(MultiDict(query))
    assert why in str(refused.value.text)


def test_a_query_gives_its_filters_and_empty_ones_are_none() -> None:
    matches, limit, cursor = selection(MultiDict({"queue": "jobs", "type": "", "state": "failed"}))
    assert (matches, limit, cursor) == (JobFilter("jobs", None, "failed"), 50, None)


def test_a_withheld_result_is_said_so_in_text() -> None:
    shown: dict[str, object] = {
        "message_id": "a",
        "queue": "jobs",
        "type": None,
        "state": "succeeded",
        "due_at": None,
        "attempts": [],
        "result": None,
        "result_withheld": True,
        "progress": None,
    }
    assert "result:      withheld" in job_text(shown)
    del shown["result_withheld"]
    assert "result:" not in job_text(shown)
    assert "result:      [1]" in job_text({**shown, "result": [1]})
    truncated = job_text({**shown, "result_truncated": True, "result_bytes": 9000})
    assert "not recorded" in truncated
    assert "9000" in truncated


def test_an_attempt_s_start_read_after_its_end_is_that_attempt_s() -> None:
    """Entries of several processes arrive in any order: a started entry folded after its
    attempt's end fills that attempt's start; a second start of an attempt that had begun is
    a delivery again; the events are shown in time order."""
    index = JobIndex()
    index.add(entry(2_000, "succeeded", "a", duration_s=0.5))
    index.add(entry(1_600, "started", "a", process="host:1"))
    (job,) = index.job("a")
    assert [(a.attempt, a.started_at_ms, a.outcome) for a in job.attempts] == [
        (1, 1_600, "succeeded")
    ]
    assert [e["event"] for e in job.as_dict(3_000)["events"]] == ["started", "succeeded"]
    index.add(entry(1_000, "started", "b"))
    index.add(entry(1_500, "started", "b"))  # its worker lost: delivered again
    assert [a.started_at_ms for a in index.job("b")[0].attempts] == [1_000, 1_500]
