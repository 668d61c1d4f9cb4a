"""Where a job is and what happened to it, read from the journal (SPEC 26): `ricochet job ID`
and `ricochet jobs`. The folding of a job's entries into its state is pure (fold); reading the
stream back is ricochet.broker.journal's.

Entries come from several processes, each writing its own in batches, so the stream's order is
not quite the order of events: a job's state is its entry latest in time (at_ms), and an entry
older than the one that set it changes its history but not its state.
"""

import base64
import binascii
import datetime as dt
import heapq
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from aio_pika.abc import AbstractConnection

from ricochet.broker.journal import Entry, read_journal
from ricochet.delivery.failed import FailureInfo
from ricochet.ops.waits import iso

STATES = ("queued", "running", "waiting", "succeeded", "failed", "cancelled", "unknown")
# What each entry makes of a job's state (progress changes none; a due time decides between
# waiting and queued).
_STATE_OF = {
    "enqueued": "queued",
    "started": "running",
    "succeeded": "succeeded",
    "retrying": "waiting",
    "scheduled": "waiting",
    "failed": "failed",
    "cancelled": "cancelled",
    "replayed": "queued",
    "relaunched": "queued",
    "discarded": "failed",
}
NO_RESULT: Mapping[str, Any] = MappingProxyType({})
# An attempt's entry that ends it.
_ENDS = frozenset({"succeeded", "retrying", "failed", "cancelled"})


def moved_entries(queue: str, moved: list[FailureInfo], event: str, at_ms: int) -> list[Entry]:
    """The entries of failed copies a command replayed or discarded (those with an id), at the
    time it began to move them: a replayed job may run again before the command ends."""
    return [
        Entry(at_ms, event, queue, copy.message_id, copy.type, None, {})
        for copy in moved
        if copy.message_id
    ]


def iso_ms(at_ms: int | None) -> str | None:
    """An epoch-ms time as ISO-8601 UTC, to the millisecond."""
    return None if at_ms is None else iso(dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC))


@dataclass(slots=True)
class Attempt:
    attempt: int
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    outcome: str | None = None
    reason: str | None = None
    duration_s: float | None = None
    process: str | None = None
    # Its start known only from its end's duration (its started entry not read yet, or lost).
    start_inferred: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "started_at": iso_ms(self.started_at_ms),
            "ended_at": iso_ms(self.ended_at_ms),
            "outcome": self.outcome,
            "reason": self.reason,
            "duration_s": self.duration_s,
            "process": self.process,
        }


@dataclass(slots=True)
class JobHistory:
    """A job of a queue as its entries tell it."""

    message_id: str
    queue: str
    type: str | None = None
    state: str = "unknown"
    state_at_ms: int = -1
    due_at_ms: int | None = None
    # The retry tier it waits in, when its state is a retry's into one (else it waits in the
    # delays, or not at all).
    tier: int | None = None
    # The attempt it makes next, as the entry that set its state says (a replayed or enqueued
    # job starts again at 1, whatever its history holds).
    next_attempt: int = 1
    attempts: list[Attempt] = field(default_factory=list)
    # The result, or why there is none; one empty mapping shared until then (an index holds many).
    result: Mapping[str, Any] = field(default_factory=lambda: NO_RESULT)
    progress: Any = None
    last_at_ms: int = -1
    reason: str | None = None
    # Each entry's time and event, flat (at_ms, event, at_ms, event, ...): an index holds a
    # million entries, and a pair a tuple would cost as much again.
    events: list[int | str] = field(default_factory=list)

    def now(self, now_ms: int) -> str:
        """The state as of now_ms: a job waiting past its due time is back in its queue."""
        if self.state == "waiting" and self.due_at_ms is not None and self.due_at_ms <= now_ms:
            return "queued"
        if self.state == "queued" and self.due_at_ms is not None and self.due_at_ms > now_ms:
            return "waiting"
        return self.state

    @property
    def attempt(self) -> int | None:
        return self.attempts[-1].attempt if self.attempts else None

    def as_dict(self, now_ms: int, with_result: bool = True) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "queue": self.queue,
            "type": self.type,
            "state": self.now(now_ms),
            "attempts": [attempt.as_dict() for attempt in self.attempts],
            "due_at": iso_ms(self.due_at_ms) if self.now(now_ms) == "waiting" else None,
            "result": self.result.get("result") if with_result else None,
            **({} if not with_result else _result_note(self.result)),
            "progress": self.progress,
            "events": [
                {"at": iso_ms(cast(int, at)), "event": event}
                for at, event in sorted(
                    zip(self.events[::2], self.events[1::2], strict=True), key=lambda e: e[0]
                )
            ],
        }

    def row(self, now_ms: int) -> dict[str, Any]:
        """The job as a row of `ricochet jobs`."""
        last = self.attempts[-1] if self.attempts else None
        return {
            "message_id": self.message_id,
            "queue": self.queue,
            "type": self.type,
            "state": self.now(now_ms),
            "attempt": self.attempt,
            "at": iso_ms(self.last_at_ms),
            "duration_s": last.duration_s if last else None,
            "reason": self.reason,
        }


def _result_note(result: Mapping[str, Any]) -> dict[str, Any]:
    """Why a succeeded job shows no result, when it returned one the journal did not keep."""
    return {key: value for key, value in result.items() if key != "result"}


def fold(job: JobHistory, entry: Entry) -> None:
    """Apply one entry of the job to what is known of it."""
    job.type = entry.type or job.type
    job.last_at_ms = max(job.last_at_ms, entry.at_ms)
    job.events += (entry.at_ms, entry.event)
    detail = entry.detail
    if entry.event == "progress":
        job.progress = detail.get("progress")
        return
    if entry.event == "started" or entry.event in _ENDS:
        _fold_attempt(job, entry)
    if entry.event == "succeeded":
        job.result = {k: v for k, v in detail.items() if k.startswith("result")}
    if entry.at_ms < job.state_at_ms:
        return  # older than what set the state: history only
    job.state, job.state_at_ms = _STATE_OF[entry.event], entry.at_ms
    due = detail.get("due_at_ms")
    job.due_at_ms = due if type(due) is int else None
    tier = detail.get("tier")
    job.tier = tier if type(tier) is int and entry.event == "retrying" else None
    made = entry.attempt if entry.attempt is not None else 0
    job.next_attempt = made + 1 if entry.event == "retrying" else max(made, 1)
    if entry.event in ("retrying", "failed"):
        job.reason = _text(detail.get("reason"))
    elif entry.event in ("succeeded", "enqueued", "replayed", "relaunched"):
        job.reason = None


def _fold_attempt(job: JobHistory, entry: Entry) -> None:
    number = entry.attempt if entry.attempt is not None else (job.attempt or 1)
    attempt = next((a for a in reversed(job.attempts) if a.attempt == number), None)
    started = entry.event == "started"
    # A second start of an attempt is a delivery again (a worker lost with it); a start read
    # after its end (entries of several processes come in any order) is that attempt's.
    again = started and attempt is not None and attempt.started_at_ms is not None
    if attempt is None or (again and not attempt.start_inferred):
        attempt = Attempt(number)
        job.attempts.append(attempt)
        job.attempts.sort(key=lambda a: a.attempt)
    detail = entry.detail
    if started:
        attempt.started_at_ms = entry.at_ms
        attempt.start_inferred = False
        attempt.process = _text(detail.get("process")) or attempt.process
        return
    attempt.ended_at_ms = entry.at_ms
    attempt.outcome = entry.event
    attempt.reason = _text(detail.get("reason"))
    attempt.process = attempt.process or _text(detail.get("process"))
    duration = detail.get("duration_s")
    attempt.duration_s = duration if _seconds(duration) else None
    if attempt.started_at_ms is None and attempt.duration_s is not None:
        # An attempt that ended before its started entry was written: its end says how long.
        attempt.started_at_ms = entry.at_ms - round(attempt.duration_s * 1000)
        attempt.start_inferred = True


def _seconds(value: object) -> bool:
    """A duration a handler can have run: at most a year, in seconds."""
    return type(value) in (int, float) and 0 <= value <= 31_536_000  # type: ignore[operator]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def histories(entries: Iterable[Entry]) -> dict[tuple[str, str], JobHistory]:
    """Each job's history, by (queue, message_id), from entries in any order."""
    jobs: dict[tuple[str, str], JobHistory] = {}
    for entry in sorted(entries, key=lambda e: e.at_ms):
        key = (entry.queue, entry.message_id)
        job = jobs.get(key)
        if job is None:
            job = jobs[key] = JobHistory(entry.message_id, entry.queue)
        fold(job, entry)
    return jobs


# A page of `ricochet jobs`: newest first, each page after the cursor of the one before.
def encode_cursor(job: JobHistory) -> str:
    raw = json.dumps([job.last_at_ms, job.queue, job.message_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str, str]:
    """ValueError for a cursor no page gave."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at_ms, queue, message_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError) as error:
        raise ValueError(f"{cursor!r} is not a cursor `ricochet jobs` gave") from error
    if type(at_ms) is not int or not isinstance(queue, str) or not isinstance(message_id, str):
        raise ValueError(f"{cursor!r} is not a cursor `ricochet jobs` gave")
    return at_ms, queue, message_id


@dataclass(frozen=True)
class JobFilter:
    queue: str | None = None
    type: str | None = None
    state: str | None = None

    def __call__(self, job: JobHistory, now_ms: int) -> bool:
        return (
            (self.queue is None or job.queue == self.queue)
            and (self.type is None or job.type == self.type)
            and (self.state is None or job.now(now_ms) == self.state)
        )


def page(
    jobs: Iterable[JobHistory],
    matches: JobFilter,
    now_ms: int,
    limit: int,
    before: tuple[int, str, str] | None = None,
) -> tuple[list[JobHistory], str | None]:
    """The newest `limit` jobs that match, older than the cursor, and the next page's cursor:
    one pass over the jobs (the monitor's index holds a million entries' jobs), not a sort."""

    def order(job: JobHistory) -> tuple[int, str, str]:
        return (job.last_at_ms, job.queue, job.message_id)

    chosen = heapq.nlargest(
        limit + 1,
        (j for j in jobs if (before is None or order(j) < before) and matches(j, now_ms)),
        key=order,
    )
    shown = chosen[:limit]
    return shown, encode_cursor(shown[-1]) if len(chosen) > limit else None


@dataclass
class Read:
    """What a read of the journal gave: the jobs, the entries read, and since when."""

    jobs: dict[tuple[str, str], JobHistory]
    entries: int
    since: dt.datetime
    complete: bool


async def read_jobs(
    connection: AbstractConnection, since: dt.datetime, message_id: str | None = None
) -> Read:
    """Read the journal since then, up to now, into each job's history (only message_id's, when
    given)."""
    kept: list[Entry] = []

    def read(entry: Entry, _: int) -> None:
        if message_id is None or entry.message_id == message_id:
            kept.append(entry)

    end = await read_journal(connection, since, read)
    return Read(histories(kept), len(kept), since, end is not None)
