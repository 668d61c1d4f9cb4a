"""The schedules' store: one stream per vhost, ricochet.schedules, of the state of each queue's
schedules (for each, the last occurrence enqueued), as the queue's leader last wrote it.

A record holds the whole state of one queue's schedules, so a reader needs only the newest
record of each queue it asks about. The leader writes one after the occurrences it enqueues,
and again at least every CHECKPOINT_S: a reader finds every led queue's state within the last
READ_WINDOW_S, and reads the whole stream (31 days at most, SCHEDULES_MAX_BYTES at most) only
for a queue that had no leader for longer, or none ever. It is read as every log is
(ricochet.broker.stream_log).
"""

import datetime as dt
import json
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from ricochet.broker.amqp import Delivery
from ricochet.broker.publish import publish_to_queue
from ricochet.broker.stream_log import read_up_to_now
from ricochet.headers import RECORD_QUEUE
from ricochet.ladders import is_int
from ricochet.log import get_logger
from ricochet.names import SHARED

log = get_logger("ricochet.schedules")

STATE = "schedules"
CHECKPOINT_S = 3600.0
READ_WINDOW_S = 2 * CHECKPOINT_S
# A reader that has not seen its own marker by then gives up (the store does not answer).
READ_TIMEOUT_S = 60.0
# The latest instant a record may hold: the last millisecond a datetime can name (an occurrence is
# named by its time). Anything later is not a time a leader wrote.
LATEST_MS = (dt.datetime.max - dt.datetime(1970, 1, 1)) // dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class Entry:
    """A schedule's state: the last occurrence enqueued (None: none yet), and when a leader
    first ran it (its occurrences before that were never due)."""

    last_ms: int | None
    since_ms: int

    @property
    def accounted_ms(self) -> int:
        """The occurrences up to this instant are accounted for."""
        return self.last_ms if self.last_ms is not None else self.since_ms - 1


State = dict[str, Entry]


def encode_state(state: Mapping[str, Entry]) -> bytes:
    """A record's body: {name: {"last": ms or null, "since": ms}}."""
    return json.dumps(
        {name: {"last": e.last_ms, "since": e.since_ms} for name, e in state.items()},
        separators=(",", ":"),
    ).encode()


def decode_state(body: bytes) -> tuple[State, list[str]]:
    """A record's state, and the names of the entries left out because they cannot be read (an
    instant that is not a whole number of ms from the epoch to LATEST_MS); a body that cannot be
    read at all names "*" (pure)."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):
        return {}, ["*"]
    if not isinstance(raw, dict):
        return {}, ["*"]
    state: State = {}
    unreadable: list[str] = []
    for name, value in raw.items():
        entry = _entry(value)
        if entry is None:
            unreadable.append(name)
        else:
            state[name] = entry
    return state, unreadable


def _entry(value: Any) -> Entry | None:
    if not isinstance(value, dict):
        return None
    last, since = _ms(value.get("last")), _ms(value.get("since"))
    if since is None or (last is None and value.get("last") is not None):
        return None
    return Entry(last, since)


def _ms(value: Any) -> int | None:
    """An instant as a record spells it, else None."""
    if is_int(value) and 0 <= value <= LATEST_MS:
        return value
    return None


def _record(kind: str, body: bytes, message_id: str, queue: str | None = None) -> aio_pika.Message:
    return aio_pika.Message(
        body,
        type=kind,
        message_id=message_id,
        headers={RECORD_QUEUE: queue} if queue else None,
        timestamp=time.time(),
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


async def write_state(channel: AbstractChannel, queue: str, state: Mapping[str, Entry]) -> None:
    """Record queue's schedule state, confirmed, on a confirming channel."""
    await publish_to_queue(
        channel, SHARED.schedules, _record(STATE, encode_state(state), uuid.uuid4().hex, queue)
    )


async def read_states(connection: AbstractConnection, queues: Collection[str]) -> dict[str, State]:
    """The newest state of each queue (those with none recorded are left out)."""
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=READ_WINDOW_S)
    found = await _read(connection, set(queues), since)
    missing = set(queues) - found.keys()
    if missing:
        found |= await _read(connection, missing, "first")
    states: dict[str, State] = {}
    for queue, body in found.items():
        states[queue], unreadable = decode_state(body)
        if unreadable:
            log.warning(
                "schedule state recorded cannot be read: ignored, the schedule starts afresh",
                queue=queue,
                schedules=unreadable,
            )
    return states


async def _read(
    connection: AbstractConnection, queues: set[str], offset: dt.datetime | str
) -> dict[str, bytes]:
    """The newest record body of each of queues, reading the store from offset up to now."""
    newest: dict[str, bytes] = {}

    def read(entry: Delivery, _: int) -> None:
        queue = (entry.headers or {}).get(RECORD_QUEUE)
        if entry.type == STATE and queue in queues:
            newest[str(queue)] = entry.body

    if await read_up_to_now(connection, SHARED.schedules, read, offset, READ_TIMEOUT_S) is None:
        raise TimeoutError(f"the schedules' store was not read up to now in {READ_TIMEOUT_S:g} s")
    return newest
