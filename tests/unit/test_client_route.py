"""Where the client sends a job due later (pure): to the shared delays, as a worker would send
it to wait, with the same key and the same note of its wait; a job due now goes to its queue."""

import datetime as dt
from typing import Any

import pytest
from ricochet.client.message import job_message
from ricochet.client.route import to_the_delays
from ricochet.delivery.failed import counted_copy
from ricochet.headers import RUN_AT, WAIT_REASON, WAITING_SINCE
from ricochet.names import SHARED, delay_key

from tests.unit.frames import read_leniently

NOW = dt.datetime(2026, 11, 24, 10, 0, 0, 123000, tzinfo=dt.UTC)  # a whole millisecond
NOW_MS = 1_795_514_400_123
QUEUE = "a.x"


@pytest.mark.parametrize(
    ("enqueue", "key"),
    [
        ({}, None),  # not scheduled
        ({"delay": 0}, None),  # due now
        ({"delay": 0.0005}, delay_key(1, QUEUE)),  # its run-at rounded up to 1 ms ahead
        ({"run_at": NOW - dt.timedelta(seconds=5)}, None),  # in the past: runs at once
        ({"run_at": NOW + dt.timedelta(microseconds=200)}, delay_key(1, QUEUE)),  # one unit
        ({"delay": 2}, delay_key(2000, QUEUE)),
        ({"delay": 2.05}, delay_key(2050, QUEUE)),  # 21 units: rounded up, never early
        ({"delay": dt.timedelta(days=30)}, delay_key(30 * 86_400_000, QUEUE)),
    ],
)
def test_a_job_due_later_goes_to_the_delays(enqueue: dict[str, Any], key: str | None) -> None:
    message = job_message("mail", {}, now=NOW, message_id="m", **enqueue)
    headers = dict(message.properties.headers or {})
    before = dict(headers)
    route = to_the_delays(headers, QUEUE, NOW)
    if key is None:
        assert route is None
        assert headers == before  # nothing noted on a job for its queue
        return
    assert route == (SHARED.delay_entry, key)
    assert headers == {**before, WAITING_SINCE: NOW_MS}  # a first wait: no reason, no retries
    assert RUN_AT in headers  # the worker reads it again when the job comes back


async def test_the_client_notes_the_wait_as_a_workers_copy_does() -> None:
    """A worker that takes the job from its queue and sends it to wait writes the same headers
    as the client that sends it there itself."""
    message = job_message("mail", {}, now=NOW, message_id="m", delay=5, headers={"x-a": "b"})
    taken = await read_leniently(message.properties, message.body)
    headers = dict(message.properties.headers or {})
    to_the_delays(headers, QUEUE, NOW)
    copy = counted_copy(taken, 0, (NOW_MS, None))
    assert copy.headers == headers
    assert WAIT_REASON not in headers
