"""The worker's entries in the journal (ricochet.broker.journal): a job started, and what its
settled delivery came to, each kept for the process's writer; never waited on."""

import json
from collections.abc import Callable
from typing import Any, assert_never

from ricochet.broker.journal import Entry, Journal, now_ms
from ricochet.broker.plan import Plan
from ricochet.delivery.events import Returned, Settled
from ricochet.delivery.retry import (
    Ack,
    Cancel,
    Delay,
    Fail,
    Hold,
    Line,
    Outcome,
    Retry,
    RetryByCopy,
    Sanitize,
)
from ricochet.handlers.job import Job

# The JSON of a result as its record holds it (no NaN: a reader's JSON would refuse it).
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# A string of at most this many characters fits any cap of 6 bytes a character and more.
_SHORT = 64


def result_detail(result: Returned, most_bytes: int) -> dict[str, Any]:
    """What a succeeded entry says of a handler's return value: the value, when it is JSON of
    at most most_bytes; else that it was truncated (with its size) or not JSON."""
    value = result.value
    # A value this small needs no measuring.
    if most_bytes >= 6 * _SHORT and (value is None or type(value) is bool or _small(value)):
        return {"result": value}
    try:
        text = _JSON.encode(value)
    except (TypeError, ValueError, RecursionError):
        return {"result_unrecorded": f"not JSON: a {type(value).__name__}"}
    size = len(text.encode())
    if size > most_bytes:
        return {"result_truncated": True, "result_bytes": size}
    return {"result": value}


def _small(value: object) -> bool:
    """An integer of at most 19 digits, or a string of at most _SHORT characters."""
    if type(value) is int:
        return -(10**18) < value < 10**18
    return type(value) is str and len(value) <= _SHORT


def _common(event: Settled) -> dict[str, Any]:
    """What every ended attempt's entry says: how long it ran, why it failed."""
    detail: dict[str, Any] = {}
    if event.seconds is not None:
        detail["duration_s"] = round(event.seconds, 6)
    if event.failure is not None:
        detail["reason"] = event.failure.reason  # cut as the failed copy's header is
    return detail


def entry_of(
    event: Settled,
    queue: str,
    at_ms: int,
    tier_delay_ms: Callable[[int], int | None],
    result_most: int,
) -> Entry | None:
    """The journal's entry for a settled delivery (None for a forged header cleaned, or a job
    sent to its key's line: the job is the same, its copy comes next). tier_delay_ms(k): the
    delay the broker applies in tier k now (with jitter, the longest of its lanes)."""
    if event.message_id is None:
        return None
    detail = _common(event)
    match event.decision:
        case Ack():
            name = "succeeded"
            if event.result is not None:
                detail.update(result_detail(event.result, result_most))
        case Retry(tier) | RetryByCopy(tier):
            name = "retrying"
            detail["tier"] = tier
            delay_ms = tier_delay_ms(tier)
            if delay_ms is not None:
                detail["due_at_ms"] = at_ms + delay_ms
        case Delay(delay_ms):
            name = "scheduled" if event.failure is None else "retrying"
            detail["due_at_ms"] = at_ms + delay_ms
        case Fail(kind):
            name = "failed"
            detail["kind"] = str(kind)
        case Cancel():
            name = "cancelled"
        case Sanitize() | Line() | Hold():
            return None
        case _:
            assert_never(event.decision)
    return Entry(at_ms, name, queue, event.message_id, event.kind, event.facts.attempt, detail)


class JournalWatch:
    """Keeps a queue's entries in the process's journal: the Observer of its settled deliveries,
    and started() for each handler call."""

    def __init__(
        self, journal: Journal, queue: str, applied: Callable[[], Plan], result_most: int
    ) -> None:
        self._journal = journal
        self._queue = queue
        self._applied = applied
        self._result_most = result_most

    def started(self, job: Job) -> None:
        """The job's handler starts: its entry (held open: ricochet.broker.journal), and where
        its progress goes."""
        message_id = job.message_id
        if message_id is None or not self._journal.enabled:
            return
        at_ms, queue = now_ms(), self._queue
        self._journal.open(
            job, lambda: Entry(at_ms, "started", queue, message_id, job.type, job.attempt, {})
        )
        job.note_progress_with(lambda value: self._progress(message_id, job, value))

    def ended(self, job: Job) -> None:
        """The handler returned: its end entry says when it started, if its started entry was
        not written yet; the progress it held back is written."""
        self._journal.close(job)
        job.note_progress_with(None)
        if job.held_progress is not None and job.message_id is not None:
            self._progress(job.message_id, job, job.held_progress.value)

    def _progress(self, message_id: str, job: Job, value: Any) -> None:
        detail = {"progress": value}
        entry = Entry(now_ms(), "progress", self._queue, message_id, job.type, job.attempt, detail)
        self._journal.add(entry)

    def attempted(self, outcome: Outcome, seconds: float) -> None:
        pass  # the settling says what the attempt came to

    def settled(self, event: Settled) -> None:
        if not self._journal.enabled:
            return
        entry = entry_of(event, self._queue, now_ms(), self._tier_delay_ms, self._result_most)
        if entry is not None:
            self._journal.add(entry)

    def _tier_delay_ms(self, tier: int) -> int | None:
        return self._applied().tier_delay_ms(tier)
