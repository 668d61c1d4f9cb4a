"""The failed copy: what a job looks like in the failed queue (pure functions)."""

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pamqp.encode import field_table

from app.job import job_type
from app.retry import FailureKind

REASON_MAX_CHARS = 1000
TRACEBACK_MAX_CHARS = 4096
# A message's properties and headers travel in one frame; this much of it is left to the
# properties other than the headers (at most eight short strings and a few numbers).
PROPERTIES_RESERVE_BYTES = 4096

# Headers the broker writes while dead-lettering; a failed copy starts its history afresh.
DEATH_HEADERS = ("x-death", "x-first-death-", "x-last-death-")
FAILURE_HEADERS = (
    "failed-at",
    "failed-reason",
    "failed-exception",
    "failed-traceback",
    "failed-kind",
    "retry-count",
    "original-queue",
    "original-routing-key",
)
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


def copied_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The application headers as a copy carries them: without the broker's dead-letter
    bookkeeping, and with long strings that are not UTF-8 as byte arrays of the same bytes."""
    return {k: _sendable(v) for k, v in headers.items() if not k.startswith(DEATH_HEADERS)}


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
    """'ExceptionType: message', at most REASON_MAX_CHARS characters."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:REASON_MAX_CHARS]


def failed_headers(
    headers: Mapping[str, Any],
    exc: BaseException,
    kind: FailureKind,
    retry_count: int,
    queue: str,
    routing_key: str,
    now: dt.datetime,
    formatted_traceback: str,
) -> dict[str, Any]:
    """The failed copy's headers: the original's without x-death, plus the failure's.

    formatted_traceback is app.tracebacks.format_traceback(exc), which the caller also logs.
    """
    return {
        **copied_headers(headers),
        "failed-at": now.astimezone(dt.UTC).isoformat(),
        "failed-reason": failure_reason(exc),
        "failed-exception": exception_name(exc),
        # Its end: that is where the error was raised.
        "failed-traceback": formatted_traceback[-TRACEBACK_MAX_CHARS:],
        "failed-kind": str(kind),
        "retry-count": retry_count,
        "original-queue": queue,
        "original-routing-key": routing_key,
    }


def fit_to_frame(headers: dict[str, Any], frame_max: int) -> dict[str, Any]:
    """The headers, with the traceback and then the reason shortened until they fit one frame.

    A header frame larger than the connection's frame_max makes the broker close the whole
    connection, so a failed copy that does not fit would send its job round forever.
    """
    fitted = dict(headers)
    for key, keep_end in (("failed-traceback", True), ("failed-reason", False)):
        excess = len(field_table(fitted)) - (frame_max - PROPERTIES_RESERVE_BYTES)
        if excess <= 0:
            break
        text = fitted[key]
        # Cutting n characters removes at least n bytes of UTF-8.
        fitted[key] = text[excess:] if keep_end else text[: max(len(text) - excess, 0)]
    return fitted


def copied_properties(message: Any) -> dict[str, Any]:
    """The message properties a copy keeps (taken from an incoming message)."""
    return {name: getattr(message, name) for name in COPIED_PROPERTIES}


@dataclass(frozen=True)
class FailureInfo:
    """What an operator needs to know about one failed copy (read from its headers)."""

    message_id: str | None
    type: str | None
    reason: str
    kind: str | None
    retry_count: int | None
    failed_at: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def read_failure(
    headers: Mapping[str, Any], message_id: str | None, amqp_type: str | None, body: bytes
) -> FailureInfo:
    """The failure a copy describes; tolerant of copies that lack some headers."""
    count = headers.get("retry-count")
    return FailureInfo(
        message_id=message_id,
        type=job_type(amqp_type, body),
        reason=_text(headers.get("failed-reason")) or "unknown",
        kind=_text(headers.get("failed-kind")),
        retry_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        failed_at=_text(headers.get("failed-at")),
    )
