"""An enqueue's arguments made into the message that goes on the wire, or InvalidJob (pure).

Every check runs before anything is sent, so a call that raises here leaves no trace on the broker.
They matter beyond the call: a message the codec cannot encode, or one the broker will not take,
fails in the connection shared by every enqueue in flight. The broker closes the connection for
a header frame over its frame_max, and the channel for a body over its max_message_size; the
other callers' publishes on them are then cut off unconfirmed (NotConfirmed, though some were
enqueued).
"""

import datetime as dt
import json
import math
import random
import struct
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ricochet import keys, ladders
from ricochet import priority as priorities
from ricochet.broker.amqp import Properties, properties, table_size
from ricochet.delivery.failed import PROPERTIES_RESERVE_BYTES
from ricochet.errors import InvalidJob
from ricochet.headers import KEY, MAX_RETRIES, RETRY_DELAYS, RUN_AT, is_reserved
from ricochet.settings import queue_problem

# An AMQP short string (the type and message_id properties) holds at most 255 bytes.
SHORT_STRING_MAX_BYTES = 255
# The codec cuts a longer header name short (and says so only in its log).
HEADER_NAME_MAX_BYTES = 128
# Tables and arrays within a header value, at most: deeper, the codec that encodes it here and
# the one that reads it in the worker recurse towards Python's limit (and a table that holds
# itself would recurse for ever).
HEADER_MAX_DEPTH = 32
# The largest body the broker takes: RabbitMQ's max_message_size, 128 MiB by default on 3.10 to
# 4.x. A client has no way to read the setting (the protocol does not carry it; the management
# API would need its credentials), so a broker configured lower refuses a body between its
# setting and this one by closing the channel, and the enqueues in flight on it with it.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
MAX_RETRIES_ALLOWED = 25
# The longest wait a job may be scheduled for (section 15 keeps a cancel at least this long).
MAX_SCHEDULE = dt.timedelta(days=30)
JSON = "application/json"
# Built once: json.dumps with any option builds an encoder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))

Delay = float | dt.timedelta


class Outgoing(NamedTuple):
    """A message as basic.publish takes it. Built straight into the protocol's properties: an
    aio_pika.Message would cost more than the rest of an enqueue (bench/README.md)."""

    body: bytes
    properties: Properties


def job_message(
    job_type: str | None,
    payload: Any,
    *,
    now: dt.datetime,
    message_id: str | None = None,
    max_retries: int | None = None,
    retry_delays_ms: Sequence[int] | None = None,
    delay: Delay | None = None,
    run_at: dt.datetime | None = None,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
    priority: int | None = None,
    key: str | None = None,
) -> Outgoing:
    """The persistent message of one job; InvalidJob, naming the argument, when one is out of
    bounds. `now` (aware) is the clock that delay and run_at are read against; a job without a
    priority is sent with the default one (ricochet.priority)."""
    job_headers = _own_headers(headers)
    if max_retries is not None:
        job_headers[MAX_RETRIES] = _max_retries(max_retries)
    if retry_delays_ms is not None:
        job_headers[RETRY_DELAYS] = _retry_delays(retry_delays_ms)
    if key is not None:
        job_headers[KEY] = _key(key)
    due = _due(now, delay, run_at)
    if due is not None:
        job_headers[RUN_AT] = run_at_text(due)
    if job_headers:
        _check_encodable(job_headers)
    body, content_type = _body(payload, content_type)
    if len(body) > MAX_MESSAGE_BYTES:
        raise InvalidJob(
            f"payload is {len(body)} bytes: the broker takes at most {MAX_MESSAGE_BYTES}"
            " (its max_message_size, 128 MiB by default)"
        )
    return Outgoing(
        body,
        properties(
            content_type=content_type,
            message_id=(
                _short_string("message_id", message_id) if message_id is not None else _new_id()
            ),
            message_type=_short_string("job_type", job_type) if job_type is not None else None,
            headers=job_headers,
            timestamp=now,
            priority=_priority(priority),
        ),
    )


def check_frame(headers: Mapping[str, Any] | None, frame_max: int) -> None:
    """InvalidJob when the headers, as sent, take more of the connection's frame than the worker
    lets a job's headers take: the header frame holds every property, and the worker keeps
    PROPERTIES_RESERVE_BYTES of it for the others, so a job accepted here fits its frame with
    any properties, and the worker can publish it again (section 24)."""
    limit = frame_max - PROPERTIES_RESERVE_BYTES
    size = table_size(headers) if headers else 0
    if size > limit:
        raise InvalidJob(
            f"headers take {size} bytes as an AMQP table: at most {limit} fit a frame of this"
            f" connection ({frame_max} bytes, {PROPERTIES_RESERVE_BYTES} kept for the other"
            " properties)"
        )


def cancelled_id(message_id: object) -> str:
    """The message_id of a cancel, or InvalidJob when no job can have it: empty, not a string,
    or over 255 bytes in UTF-8 (what an AMQP short string holds; 255 ASCII characters)."""
    return _short_string("message_id", message_id)


def target_queue(queue: object) -> str:
    """The queue a job or cancel names, or InvalidJob when no ricochet queue has that name."""
    problem = queue_problem(queue)
    if problem:
        raise InvalidJob(f"queue {queue!r} is refused: {problem}")
    return str(queue)


def run_at_text(when: dt.datetime) -> str:
    """A run-at header value: UTC, ISO-8601, milliseconds, rounded up so that a job never runs
    before the time asked (2026-11-24T10:00:00.001Z)."""
    utc = when.astimezone(dt.UTC)
    if utc.microsecond % 1000:
        utc += dt.timedelta(microseconds=1000 - utc.microsecond % 1000)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _new_id() -> str:
    """A random UUID4 in hex. From the random module, as aiormq makes one: uuid4() reads the
    system's randomness at every call; an id needs to be unique, not secret. (A forked child
    reseeds the module, so it never repeats its parent's ids.)"""
    return uuid.UUID(int=random.getrandbits(128), version=4).hex


def _utf8(argument: str, text: str) -> bytes:
    """The text as it goes on the wire; a lone surrogate has no UTF-8 and is refused."""
    try:
        return text.encode()
    except UnicodeEncodeError as error:
        raise InvalidJob(f"{argument} cannot be sent: {error}") from None


def _short_string(argument: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"{argument} must be a non-empty string, not {value!r}")
    size = len(_utf8(argument, value))
    if size > SHORT_STRING_MAX_BYTES:
        raise InvalidJob(
            f"{argument} is {size} bytes long: at most "
            f"{SHORT_STRING_MAX_BYTES} characters (bytes in UTF-8) fit an AMQP property"
        )
    return value


def _max_retries(value: object) -> int:
    if not ladders.is_int(value):
        raise InvalidJob(f"max_retries must be an int in 0-{MAX_RETRIES_ALLOWED}, not {value!r}")
    if not 0 <= value <= MAX_RETRIES_ALLOWED:
        raise InvalidJob(f"max_retries={value} is out of bounds: allowed 0-{MAX_RETRIES_ALLOWED}")
    return value


def _priority(value: object) -> int:
    if value is None:
        return priorities.DEFAULT
    try:
        return priorities.checked(value)
    except ValueError as error:
        raise InvalidJob(str(error)) from None


def _key(value: object) -> str:
    try:
        return keys.checked(value)
    except ValueError as error:
        raise InvalidJob(str(error)) from None


def _retry_delays(value: object) -> str:
    """The job's own ladder as its header carries it."""
    try:
        return ladders.text(ladders.checked(value))
    except ValueError as error:
        raise InvalidJob(f"retry_delays_ms={error}") from None


def _due(now: dt.datetime, delay: object, run_at: object) -> dt.datetime | None:
    """When a scheduled job is due (None when it is not scheduled)."""
    if delay is not None and run_at is not None:
        raise InvalidJob("delay and run_at are both given: give one of them")
    if delay is not None:
        return now + _delay(delay)
    if run_at is None:
        return None
    if not isinstance(run_at, dt.datetime):
        raise InvalidJob(f"run_at must be a datetime, not {run_at!r}")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidJob(f"run_at={run_at.isoformat()} is naive: give it a time zone (UTC, say)")
    if run_at - now > MAX_SCHEDULE:
        raise InvalidJob(f"run_at={run_at.isoformat()} is more than 30 days ahead")
    try:
        return run_at.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidJob(f"run_at={run_at.isoformat()} is before the first UTC date") from None


def _delay(value: object) -> dt.timedelta:
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value):
        seconds = float(value)
    else:
        raise InvalidJob(f"delay must be seconds (int or float) or a timedelta, not {value!r}")
    if seconds < 0:
        raise InvalidJob(f"delay={value!r} is negative")
    if seconds > MAX_SCHEDULE.total_seconds():
        raise InvalidJob(f"delay={value!r} is over 30 days")
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=seconds)


def _own_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The application's headers, copied (the caller's mapping is left as it was)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidJob(f"headers must be a mapping, not {type(headers).__name__}")
    for name in headers:
        _check_name(name)
        if is_reserved(name):
            raise InvalidJob(
                f"headers: {name!r} is a header that ricochet or the broker owns"
                " (docs/enqueueing.md lists them)"
            )
    return dict(headers)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not 0 < len(_utf8("headers", name)) <= HEADER_NAME_MAX_BYTES:
        raise InvalidJob(
            f"headers: a header name must be a string of 1-{HEADER_NAME_MAX_BYTES} bytes,"
            f" not {name!r}"
        )


def _check_encodable(headers: dict[str, Any]) -> None:
    """The names and the nesting checked here, at every depth; the values by the codec."""
    for value in headers.values():
        _check_nested(value, 1)
    try:
        table_size(headers)
    # struct.error: a number its field cannot hold (a timestamp before 1970, say).
    except (TypeError, ValueError, OverflowError, struct.error) as error:
        raise InvalidJob(f"headers cannot be sent as an AMQP table: {error}") from None


def _check_nested(value: object, depth: int) -> None:
    """The tables and arrays of a header value (the codec takes a dict or a list, no other)."""
    if not isinstance(value, dict | list):
        return
    if depth > HEADER_MAX_DEPTH:
        raise InvalidJob(f"headers: a value nests tables or arrays over {HEADER_MAX_DEPTH} deep")
    if isinstance(value, dict):
        for name in value:
            _check_name(name)
    for item in value.values() if isinstance(value, dict) else value:
        _check_nested(item, depth + 1)


def _body(payload: Any, content_type: str | None) -> tuple[bytes, str | None]:
    """bytes go as they are (with the content_type given); anything else as JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        if content_type is not None:
            _short_string("content_type", content_type)
        return bytes(payload), content_type
    if content_type is not None:
        raise InvalidJob("content_type is for a bytes payload; any other payload is sent as JSON")
    try:
        body = _ENCODER.encode(payload).encode()  # a lone surrogate fails the second encode
    except (TypeError, ValueError) as error:
        raise InvalidJob(f"payload cannot be JSON-encoded: {error}") from None
    return body, JSON
