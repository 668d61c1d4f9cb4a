"""An enqueue's arguments made into the message that goes on the wire, or InvalidJob (pure).

Every check runs before anything is sent, so a call that raises here leaves no trace on the broker.
"""

import datetime as dt
import json
import math
import random
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from aiormq import spec

from ricochet.broker.amqp import table_size
from ricochet.errors import InvalidJob
from ricochet.headers import MAX_RETRIES, RUN_AT, is_reserved

# An AMQP short string (the type and message_id properties) holds at most 255 bytes.
SHORT_STRING_MAX_BYTES = 255
# The codec cuts a longer header name short (and says so only in its log).
HEADER_NAME_MAX_BYTES = 128
MAX_RETRIES_ALLOWED = 25
# The longest wait a job may be scheduled for (section 15 keeps a cancel at least this long).
MAX_SCHEDULE = dt.timedelta(days=30)
JSON = "application/json"
# Built once: json.dumps with any option builds an encoder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))

PERSISTENT = 2  # the delivery_mode of a message the broker writes to disk

Delay = float | dt.timedelta


class Outgoing(NamedTuple):
    """A message as basic.publish takes it. Built straight into the protocol's properties: an
    aio_pika.Message would cost more than the rest of an enqueue (bench/README.md)."""

    body: bytes
    properties: spec.Basic.Properties


def job_message(
    job_type: str | None,
    payload: Any,
    *,
    now: dt.datetime,
    message_id: str | None = None,
    max_retries: int | None = None,
    delay: Delay | None = None,
    run_at: dt.datetime | None = None,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
) -> Outgoing:
    """The persistent message of one job; InvalidJob, naming the argument, when one is out of
    bounds. `now` (aware) is the clock that delay and run_at are read against."""
    job_headers = _own_headers(headers)
    if max_retries is not None:
        job_headers[MAX_RETRIES] = _max_retries(max_retries)
    due = _due(now, delay, run_at)
    if due is not None:
        job_headers[RUN_AT] = run_at_text(due)
    if job_headers:
        _check_encodable(job_headers)
    body, content_type = _body(payload, content_type)
    return Outgoing(
        body,
        spec.Basic.Properties(
            content_type=content_type,
            delivery_mode=PERSISTENT,
            message_id=(
                _short_string("message_id", message_id) if message_id is not None else _new_id()
            ),
            message_type=_short_string("job_type", job_type) if job_type is not None else None,
            headers=job_headers,
            timestamp=now,
        ),
    )


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
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"max_retries must be an int in 0-{MAX_RETRIES_ALLOWED}, not {value!r}")
    if not 0 <= value <= MAX_RETRIES_ALLOWED:
        raise InvalidJob(f"max_retries={value} is out of bounds: allowed 0-{MAX_RETRIES_ALLOWED}")
    return value


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
    return run_at


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
        if (
            not isinstance(name, str)
            or not 0 < len(_utf8("headers", name)) <= HEADER_NAME_MAX_BYTES
        ):
            raise InvalidJob(
                f"headers: a header name must be a string of 1-{HEADER_NAME_MAX_BYTES} bytes,"
                f" not {name!r}"
            )
        if is_reserved(name):
            raise InvalidJob(
                f"headers: {name!r} is a header that ricochet or the broker owns"
                " (the README lists them)"
            )
    return dict(headers)


def _check_encodable(headers: dict[str, Any]) -> None:
    try:
        table_size(headers)
    except (TypeError, ValueError) as error:
        raise InvalidJob(f"headers cannot be sent as an AMQP table: {error}") from None


def _body(payload: Any, content_type: str | None) -> tuple[bytes, str | None]:
    """bytes go as they are (with the content_type given); anything else as JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), content_type
    if content_type is not None:
        raise InvalidJob("content_type is for a bytes payload; any other payload is sent as JSON")
    try:
        body = _ENCODER.encode(payload).encode()  # a lone surrogate fails the second encode
    except (TypeError, ValueError) as error:
        raise InvalidJob(f"payload cannot be JSON-encoded: {error}") from None
    return body, JSON
