"""What a waiting job is, read from its message where RabbitMQ holds it (pure): the job's queue,
its next attempt, when it is due and when it leaves the queue it is in.

A job waits in one of two kinds of queue, both of one TTL each, so that the broker sends their
messages on in the order they came (SPEC 3, 18):

- a retry tier or lane of its queue, Q.retry.k (.lane.i): it came by a nack, or by a copy, and
  goes back to Q when the tier's TTL has run since it came;
- a level of the shared delays, ricochet.delay.k: its routing key spells the whole wait in
  binary, one digit a level from the highest, then its queue's name; level k holds it 2^k units
  (its digit is 1), and it passes the levels below whose digit is 0 at once.

When it came in is the broker's to know, and not to tell: x-death keeps only the first time a job
died in a queue, in whole seconds. So ricochet writes it in the journal (its `retrying` entry)
and, where no entry is found, a lower bound stands in: the latest death the job shows, or its
timestamp. A lower bound is safe where it decides (a read hands a job back before it could be
due), and shown as the due time where nothing better is known.
"""

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ricochet.delivery.retry import job_type
from ricochet.headers import DEATHS, RETRIES, WAIT_REASON, WAITING_SINCE
from ricochet.ladders import is_int
from ricochet.names import DELAY_LEVELS, DELAY_UNIT_MS, SHARED, is_delay_key


@dataclass(frozen=True)
class Place:
    """A queue that holds waiting jobs: its name, its TTL, and for a level of the delays its k
    (None for a tier or a lane, whose jobs are all its own queue's)."""

    name: str
    ttl_ms: int
    level: int | None = None


@dataclass(frozen=True)
class Waiting:
    """One waiting job as `ricochet waiting` shows it (SPEC 23), and where it waits."""

    message_id: str | None
    type: str | None
    queue: str
    attempt: int  # the next one
    due_at: dt.datetime
    reason: str | None
    place: str
    # When it leaves the queue it is in (the same as due_at but in the levels): the scan hands it
    # back before then.
    leaves_at: dt.datetime
    # Whether due_at is the journal's (True) or a lower bound read from the message.
    exact: bool
    # Whether a recorded cancel covers it: acked as cancelled when it comes due.
    cancelled: bool = False

    def as_row(self) -> dict[str, Any]:
        """The JSON row of SPEC 23."""
        return {
            "message_id": self.message_id,
            "type": self.type,
            "queue": self.queue,
            "attempt": self.attempt,
            "due_at": iso(self.due_at),
            "reason": self.reason,
            "cancelled": self.cancelled,
        }


@dataclass(frozen=True)
class Listing:
    """What a look found: the waiting jobs that match, soonest due first; by place, how many
    more the broker holds there than the journal accounts for; what was read."""

    rows: list[Waiting]
    unrecorded: dict[str, int]
    read: str
    complete: bool

    def as_dict(self) -> dict[str, Any]:
        """As the monitor's /api/waiting answers it: each row with where it waits."""
        return {
            "jobs": [{**row.as_row(), "waits_in": row.place} for row in self.rows],
            "unrecorded": self.unrecorded,
            "read": self.read,
            "complete": self.complete,
        }


def listing_of(answer: Mapping[str, Any]) -> Listing:
    """A Listing from its JSON (Listing.as_dict, as the monitor answers it); KeyError, TypeError
    or ValueError when it is not one."""
    rows = [
        Waiting(
            message_id=_text_or_none(row["message_id"]),
            type=_text_or_none(row["type"]),
            queue=str(row["queue"]),
            attempt=int(row["attempt"]),
            due_at=(due := dt.datetime.fromisoformat(row["due_at"])),
            reason=_text_or_none(row["reason"]),
            place=str(row["waits_in"]),
            leaves_at=due,
            exact=True,
            cancelled=bool(row["cancelled"]),
        )
        for row in answer["jobs"]
    ]
    unrecorded = {str(place): int(count) for place, count in answer["unrecorded"].items()}
    return Listing(rows, unrecorded, str(answer["read"]), bool(answer["complete"]))


def _text_or_none(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"not a text: {value!r}")


@dataclass(frozen=True)
class Shown:
    """Everything about one waiting job: its row, where it waits, properties, headers, body."""

    waiting: Waiting
    properties: dict[str, Any]
    headers: dict[str, Any]
    body: str
    body_encoding: str  # "utf-8" or "base64"

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.waiting.as_row(),
            "waits_in": self.waiting.place,
            "properties": self.properties,
            "headers": self.headers,
            "body": self.body,
            "body_encoding": self.body_encoding,
        }


def iso(when: dt.datetime) -> str:
    """ISO-8601 UTC with milliseconds and Z, as the delays hold a job to 100 ms."""
    return when.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _deaths(headers: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    deaths = headers.get(DEATHS)
    if not isinstance(deaths, list):
        return []
    return [d for d in deaths if isinstance(d, Mapping)]


def next_attempt(headers: Mapping[str, Any], queue: str) -> int:
    """The attempt the job makes when it is due: 1 + the retries a copy carries + the broker's
    count of its rejections from queue since (as the worker will count them, SPEC 4)."""
    copied = headers.get(RETRIES)
    retries = copied if is_int(copied) and copied > 0 else 0
    for death in _deaths(headers):
        count = death.get("count")
        if death.get("queue") == queue and death.get("reason") == "rejected" and is_int(count):
            retries += max(count, 0)
    return 1 + retries


def _latest_death(headers: Mapping[str, Any]) -> dt.datetime | None:
    times = [d["time"] for d in _deaths(headers) if isinstance(d.get("time"), dt.datetime)]
    return max((t if t.tzinfo else t.replace(tzinfo=dt.UTC) for t in times), default=None)


def came_no_earlier_than(
    headers: Mapping[str, Any], timestamp: dt.datetime | None
) -> dt.datetime | None:
    """A lower bound of when the job came into the queue it waits in: the latest death it shows
    (in whole seconds), else its timestamp; None when neither is there."""
    latest = _latest_death(headers)
    if timestamp is not None and timestamp.tzinfo is None:
        timestamp = timestamp.replace(tzinfo=dt.UTC)
    candidates = [t for t in (latest, timestamp) if t is not None]
    return max(candidates, default=None)


def level_digits(routing_key: str) -> list[int]:
    """The digits of a delay key, level 0 first."""
    return [int(d) for d in reversed(routing_key.split(".")[:DELAY_LEVELS])]


def below_ms(digits: list[int], level: int) -> int:
    """How long a job leaving level `level` still waits in the levels below it."""
    return sum(DELAY_UNIT_MS << j for j in range(level) if digits[j])


def destination(routing_key: str) -> str | None:
    """The queue a job in the delays goes to: its key after the digits (None: not a delay key of
    the shared levels)."""
    if not is_delay_key(routing_key):
        return None
    parts = routing_key.split(".", DELAY_LEVELS)
    return parts[DELAY_LEVELS] if len(parts) > DELAY_LEVELS else None


def copy_says(
    headers: Mapping[str, Any], routing_key: str
) -> tuple[dt.datetime | None, str | None]:
    """(when its wait in the delays ends, the reason of the failure it waits after) of a copy
    the worker sent there: since when it waits, and its key's units (None when it does not say:
    a copy of an earlier ricochet)."""
    since_ms = headers.get(WAITING_SINCE)
    reason = headers.get(WAIT_REASON)
    reason = reason if isinstance(reason, str) else None
    if not is_int(since_ms) or not is_delay_key(routing_key):
        return None, reason
    units = int("".join(routing_key.split(".")[:DELAY_LEVELS]), 2)
    return dt.datetime.fromtimestamp((since_ms + units * DELAY_UNIT_MS) / 1000, dt.UTC), reason


def read_waiting(
    place: Place,
    queue: str,
    *,
    message_id: str | None,
    amqp_type: str | None,
    body: bytes,
    headers: Mapping[str, Any],
    routing_key: str,
    timestamp: dt.datetime | None,
    came_at: dt.datetime | None = None,
    due_at: dt.datetime | None = None,
    reason: str | None = None,
    now: dt.datetime,
) -> Waiting:
    """The waiting job a message of place stands for, queue's (a level's jobs name theirs in
    their key). came_at: when it came into a tier, due_at: when its wait in the delays ends, as
    ricochet recorded them (else the lower bounds above stand in); reason: of its last failure."""
    ttl = dt.timedelta(milliseconds=place.ttl_ms)
    exact = True
    if place.level is None:
        if came_at is None:
            exact = False
            came_at = came_no_earlier_than(headers, timestamp) or now - ttl
        leaves_at = due = came_at + ttl
    else:
        below = dt.timedelta(milliseconds=below_ms(level_digits(routing_key), place.level))
        if due_at is None:
            exact = False
            came = came_no_earlier_than(headers, timestamp) or now - ttl
            leaves_at = came + ttl
            due = leaves_at + below
        else:
            due, leaves_at = due_at, due_at - below
    return Waiting(
        message_id=message_id,
        type=job_type(amqp_type, body),
        queue=queue,
        attempt=next_attempt(headers, queue),
        due_at=due,
        reason=reason,
        place=place.name,
        leaves_at=leaves_at,
        exact=exact,
    )


def level_place(k: int) -> Place:
    """Level k of the shared delays."""
    return Place(SHARED.delay(k), DELAY_UNIT_MS << k, k)
