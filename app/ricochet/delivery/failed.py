"""The failed copy: what a job looks like in the failed queue, and what it says of a failure."""

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import aio_pika
from aio_pika.abc import AbstractMessage

from ricochet.broker.amqp import Delivery, table_size
from ricochet.delivery.retry import (
    POISON_DELIVERIES,
    RUN_AT_MAX_AHEAD_MS,
    Facts,
    FailureKind,
    job_type,
    parse_run_at,
)
from ricochet.delivery.tracebacks import format_traceback
from ricochet.errors import InvalidProperties, InvalidSchedule, PoisonMessage, RicochetError
from ricochet.headers import (
    DEATH_PREFIXES,
    DEATHS,
    FAILED_AT,
    FAILED_DROPPED_HEADERS,
    FAILED_EXCEPTION,
    FAILED_KIND,
    FAILED_REASON,
    FAILED_TRACEBACK,
    FAILURE_HEADERS,
    ORIGINAL_QUEUE,
    ORIGINAL_ROUTING_KEY,
    REPLAY_COUNT,
    RETRIES,
    RETRY_COUNT,
    RUN_AT,
    WAIT_REASON,
    WAITING_SINCE,
)
from ricochet.ladders import is_int
from ricochet.log import redact

REASON_MAX_CHARS = 1000
TRACEBACK_MAX_CHARS = 4096
# A message's properties and headers travel in one frame; this much of it is left to the
# properties other than the headers (at most eight short strings and a few numbers).
PROPERTIES_RESERVE_BYTES = 4096

# Headers the broker writes while dead-lettering; a failed copy starts its history afresh.
DEATH_HEADERS = (DEATHS, *DEATH_PREFIXES)
# Message properties carried over to the failed copy and back on replay.
COPIED_PROPERTIES = (
    "content_type",
    "content_encoding",
    "message_id",
    "correlation_id",
    "type",
    "timestamp",
    "app_id",
    "priority",
)


# What ricochet wrote on a copy about the job's wait: each copy writes its own anew.
WAIT_HEADERS = frozenset({RETRIES, WAITING_SINCE, WAIT_REASON})


def copied_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The application headers as a copy carries them: without the broker's dead-letter
    bookkeeping, ricochet's count of retries and what it said of the job's last wait, and with
    long strings that are not UTF-8 as byte arrays of the same bytes."""
    return {
        k: _sendable(v)
        for k, v in headers.items()
        if not k.startswith(DEATH_HEADERS) and k not in WAIT_HEADERS
    }


def _sendable(value: Any) -> Any:
    # The client reads a long string that is not UTF-8 (as other languages' clients may send)
    # as bytes, which it cannot send back as a string; a copy would never be published.
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, dict):
        return {k: _sendable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sendable(v) for v in value]
    return value


def exception_name(exc: BaseException) -> str:
    """Qualified type name: module.Class, builtins without their module."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def failure_reason(exc: BaseException) -> str:
    """'ExceptionType: message' without credentials, at most REASON_MAX_CHARS characters."""
    message = _message(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    # Scrubbed before it is cut: a cut through a URL would leave a password the scrub misses.
    return redact(text)[:REASON_MAX_CHARS]


class Failure:
    """A job's exception as ricochet reports it, its reason and traceback each worked out on
    first use and only once: the failed copy, its log line and the attempt's span share them."""

    def __init__(self, exception: BaseException) -> None:
        self.exception = exception

    @cached_property
    def reason(self) -> str:
        """failure_reason() of the exception."""
        return failure_reason(self.exception)

    @cached_property
    def traceback(self) -> str:
        """The formatted traceback without credentials, its last TRACEBACK_MAX_CHARS characters."""
        # Its end: that is where the error was raised. Scrubbed before it is cut, as the reason.
        return redact(format_traceback(self.exception))[-TRACEBACK_MAX_CHARS:]


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a handler's exception may break in its own __str__; the job must still fail
        return "<exception str() failed>"  # what the traceback module prints for it


def failed_headers(
    headers: Mapping[str, Any],
    failure: Failure,
    kind: FailureKind,
    retry_count: int,
    queue: str,
    routing_key: str,
    now: dt.datetime,
) -> dict[str, Any]:
    """The failed copy's headers: the original's without x-death, plus the failure's."""
    return {
        **copied_headers(headers),
        FAILED_AT: now.astimezone(dt.UTC).isoformat(),
        FAILED_REASON: failure.reason,
        FAILED_EXCEPTION: exception_name(failure.exception),
        FAILED_TRACEBACK: failure.traceback,
        FAILED_KIND: str(kind),
        RETRY_COUNT: retry_count,
        ORIGINAL_QUEUE: queue,
        ORIGINAL_ROUTING_KEY: routing_key,
    }


def fit_to_frame(headers: dict[str, Any], frame_max: int) -> dict[str, Any]:
    """The headers, with the traceback and then the reason (to its first 200 characters at the
    least) shortened until they fit one frame, and then, if they still do not, the job's own
    largest headers dropped.

    A header frame larger than the connection's frame_max makes the broker close the whole
    connection, so a failed copy that does not fit would send its job round forever.
    """
    fitted = dict(headers)
    limit = frame_max - PROPERTIES_RESERVE_BYTES
    for key, keep_end, floor in ((FAILED_TRACEBACK, True, 0), (FAILED_REASON, False, 200)):
        excess = table_size(fitted) - limit
        if excess <= 0:
            return fitted
        text = fitted[key]
        # Cutting n characters removes at least n bytes of UTF-8. The reason keeps its start,
        # whatever the job's own headers take: a failed copy must say why it failed.
        fitted[key] = text[excess:] if keep_end else text[: max(len(text) - excess, floor)]
    # The job's own headers nearly fill the frame by themselves: the largest go, and the copy
    # names them, so that the job itself (its body and the rest) still reaches the failed queue.
    own = [key for key in fitted if key not in FAILURE_HEADERS]
    dropped: list[str] = []
    for key in sorted(own, key=lambda k: table_size({k: fitted[k]}), reverse=True):
        if table_size(fitted) <= limit:
            break
        del fitted[key]
        dropped.append(key)
        fitted[FAILED_DROPPED_HEADERS] = ",".join(dropped)
    return fitted


def properties_of(message: AbstractMessage) -> dict[str, Any]:
    """The properties a copy keeps, of a message aio-pika has read."""
    return {name: getattr(message, name) for name in COPIED_PROPERTIES}


def copy_of(
    body: bytes, properties: Mapping[str, Any], headers: dict[str, Any]
) -> aio_pika.Message:
    """A persistent copy of a message: its body, the properties a copy keeps, these headers."""
    return aio_pika.Message(
        body,
        headers=headers,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        **{name: properties[name] for name in COPIED_PROPERTIES},
    )


@dataclass(frozen=True)
class FailedCopy:
    """A failed delivery's copy for the failed queue, and the fields of its "job failed" line."""

    message: aio_pika.Message
    log_fields: dict[str, str]


def not_run_failure(delivery: Delivery, kind: FailureKind) -> RicochetError:
    """Why a delivery failed without its handler running: properties that could not be decoded,
    deliveries that kept coming back unacked (a poison job), else a run-at that cannot be read."""
    if delivery.unreadable is not None:
        return InvalidProperties(f"properties could not be decoded: {delivery.unreadable}")
    if kind is FailureKind.POISON:
        return PoisonMessage(f"delivered more than {POISON_DELIVERIES} times without an ack")
    value = delivery.headers.get(RUN_AT)
    if parse_run_at(value) is not None:
        return InvalidSchedule(
            f"{RUN_AT} header {value!r} is more than {RUN_AT_MAX_AHEAD_MS // 86_400_000} days "
            "ahead: a job waits 30 days at most"
        )
    return InvalidSchedule(
        f"{RUN_AT} header {value!r} is not an ISO-8601 date-time with a UTC offset or Z"
    )


def failed_copy(
    delivery: Delivery,
    facts: Facts,
    failure: Failure | None,
    kind: FailureKind,
    *,
    queue: str,
    frame_max: int,
    now: dt.datetime,
) -> FailedCopy:
    """The copy of a failed delivery for the failed exchange, its headers fitted to one frame,
    and what to log of it; without a failure (the handler did not run) the failure is the
    delivery's own (not_run_failure)."""
    if failure is None:
        failure = Failure(not_run_failure(delivery, kind))
    headers = failed_headers(
        delivery.headers,
        failure,
        kind,
        retry_count=facts.attempt - 1,
        queue=queue,
        routing_key=facts.original_routing_key,
        now=now,
    )
    fitted = fit_to_frame(headers, frame_max)
    log_fields = {
        "kind": str(kind),
        "error": fitted[FAILED_REASON],
        # The header's traceback as it was before fitting: a log line has no frame to fit.
        "exception": headers[FAILED_TRACEBACK].removesuffix("\n"),
    }
    copy = copy_of(delivery.body, delivery.properties(COPIED_PROPERTIES), fitted)
    return FailedCopy(copy, log_fields)


def note_wait(headers: dict[str, Any], since_ms: int, reason: str | None) -> None:
    """Write on the headers of a job that goes to the delays since when it waits there (epoch
    milliseconds) and the reason of the failure it waits after (None: no failure), which
    `ricochet waiting` reads: on a worker's copy, and on a job the client sends there."""
    headers[WAITING_SINCE] = since_ms
    if reason is not None:
        headers[WAIT_REASON] = reason


def counted_copy(
    delivery: Delivery, retries: int, waiting: tuple[int, str | None] | None = None
) -> aio_pika.Message:
    """The copy of a job that ricochet publishes again to wait or to reach its tier: without
    the broker's dead-letter headers (RabbitMQ 4 would drop them anyway), with the retries it
    made so far (none: no header). waiting, for a copy to the delays: since when it waits there
    (epoch milliseconds) and the reason of the failure it waits after (None: no failure), which
    `ricochet waiting` reads."""
    headers = copied_headers(delivery.headers)
    if retries:
        headers[RETRIES] = retries
    if waiting is not None:
        note_wait(headers, *waiting)
    return copy_of(delivery.body, delivery.properties(COPIED_PROPERTIES), headers)


@dataclass(frozen=True)
class FailureInfo:
    """What an operator needs to know about one failed copy (read from its headers)."""

    message_id: str | None
    type: str | None
    reason: str
    kind: str | None
    retry_count: int | None
    failed_at: str | None
    # Replays so far (the relaunch reads it); not among what the commands and alerts show.
    replay_count: int = 0

    def as_dict(self) -> dict[str, Any]:
        shown = asdict(self)
        del shown["replay_count"]
        return shown


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def read_failure(
    headers: Mapping[str, Any], message_id: str | None, amqp_type: str | None, body: bytes
) -> FailureInfo:
    """The failure a copy describes; tolerant of copies that lack some headers."""
    count = headers.get(RETRY_COUNT)
    return FailureInfo(
        message_id=message_id,
        type=job_type(amqp_type, body),
        # Scrubbed again: copies written by other clients or older versions reach replay's output,
        # the monitor's log and the webhook through here.
        reason=redact(_text(headers.get(FAILED_REASON)) or "unknown"),
        kind=_text(headers.get(FAILED_KIND)),
        retry_count=count if is_int(count) else None,
        failed_at=_text(headers.get(FAILED_AT)),
        replay_count=replays if is_int(replays := headers.get(REPLAY_COUNT)) and replays > 0 else 0,
    )
