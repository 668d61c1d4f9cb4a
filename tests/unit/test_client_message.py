"""An enqueue's arguments made into the message, or refused with InvalidJob naming the argument."""

import datetime as dt
import decimal
import json
import math
import uuid
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from aiormq import spec
from pamqp import frame, header
from ricochet import InvalidJob
from ricochet.broker.amqp import table_size
from ricochet.client.message import (
    HEADER_MAX_DEPTH,
    MAX_MESSAGE_BYTES,
    Outgoing,
    cancelled_id,
    check_frame,
    job_message,
    run_at_text,
)
from ricochet.delivery.failed import PROPERTIES_RESERVE_BYTES
from ricochet.errors import RicochetError
from ricochet.headers import is_reserved

NOW = dt.datetime(2026, 11, 24, 10, 0, 0, 123456, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
PLUS_5 = dt.timezone(dt.timedelta(hours=5))
FRAME_MAX = 131_072  # RabbitMQ's default


def nested(depth: int) -> dict[str, Any]:
    """A header value of tables within tables, `depth` of them."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def cyclic() -> dict[str, Any]:
    table: dict[str, Any] = {}
    table["self"] = table
    return table


def message(job_type: str | None = "mail", payload: Any = None, **job: Any) -> Outgoing:
    return job_message(job_type, {} if payload is None else payload, now=NOW, **job)


def on_the_wire(sent: Outgoing) -> spec.Basic.Properties:
    """The properties as the broker reads them: encoded into a content header, then decoded."""
    encoded = frame.marshal(header.ContentHeader(0, len(sent.body), sent.properties), 1)
    _, _, content_header = frame.unmarshal(encoded)
    assert isinstance(content_header, header.ContentHeader)
    return content_header.properties


@pytest.mark.parametrize(
    ("job", "names"),
    [
        ({"job_type": ""}, "job_type"),
        ({"job_type": "x" * 256}, "job_type"),
        ({"job_type": "é" * 128}, "job_type"),  # 256 bytes in UTF-8
        ({"job_type": 7}, "job_type"),
        ({"job_type": "mail\ud800"}, "job_type"),  # a lone surrogate has no UTF-8
        ({"message_id": "\udfff"}, "message_id"),
        ({"payload": {"text": "\ud800"}}, "payload"),
        ({"headers": {"x-\ud800": "x"}}, "headers"),
        ({"headers": {"note": "\ud800"}}, "headers"),
        ({"message_id": ""}, "message_id"),
        ({"message_id": "m" * 256}, "message_id"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 26}, "max_retries"),
        ({"max_retries": 2.0}, "max_retries"),
        ({"max_retries": "2"}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"retry_delays_ms": ()}, "retry_delays_ms"),
        ({"retry_delays_ms": [9]}, "retry_delays_ms"),
        ({"retry_delays_ms": [86_400_001]}, "retry_delays_ms"),
        ({"retry_delays_ms": [1000] * 26}, "retry_delays_ms"),
        ({"retry_delays_ms": [1000, True]}, "retry_delays_ms"),
        ({"retry_delays_ms": [1000.0]}, "retry_delays_ms"),
        ({"retry_delays_ms": "1000,2000"}, "retry_delays_ms"),
        ({"retry_delays_ms": 1000}, "retry_delays_ms"),
        ({"retry_delays_ms": {1000}}, "retry_delays_ms"),
        ({"delay": -0.001}, "delay"),
        ({"delay": -DAY}, "delay"),
        ({"delay": 30 * 86400 + 1}, "delay"),
        ({"delay": 31 * DAY}, "delay"),
        ({"delay": math.inf}, "delay"),
        ({"delay": math.nan}, "delay"),
        ({"delay": 1e300}, "delay"),
        ({"delay": "5"}, "delay"),
        ({"delay": True}, "delay"),
        ({"run_at": dt.datetime(2026, 11, 25, 10, 0)}, "run_at"),  # naive
        ({"run_at": NOW + 30 * DAY + dt.timedelta(milliseconds=1)}, "run_at"),
        ({"run_at": "2026-11-25T10:00:00Z"}, "run_at"),
        ({"run_at": dt.date(2026, 11, 25)}, "run_at"),
        ({"delay": 5, "run_at": NOW + DAY}, "delay and run_at"),
        ({"delay": 0, "run_at": NOW}, "delay and run_at"),
        ({"payload": {"when": NOW}}, "payload"),
        ({"payload": {1, 2}}, "payload"),
        ({"payload": math.nan}, "payload"),
        ({"payload": {"a": math.inf}}, "payload"),
        ({"payload": {}, "content_type": "text/plain"}, "content_type"),
        ({"headers": ["x"]}, "headers"),
        ({"headers": {1: "x"}}, "headers"),
        ({"headers": {"": "x"}}, "headers"),
        ({"headers": {"h" * 129: "x"}}, "headers"),
        ({"headers": {"x-death": []}}, "headers"),
        ({"headers": {"x-first-death-queue": "jobs"}}, "headers"),
        ({"headers": {"x-last-death-reason": "rejected"}}, "headers"),
        ({"headers": {"x-delivery-count": 1}}, "headers"),
        ({"headers": {"x-acquired-count": 1}}, "headers"),
        ({"headers": {"failed-reason": "x"}}, "headers"),
        ({"headers": {"failed-anything": "x"}}, "headers"),
        ({"headers": {"retry-count": 1}}, "headers"),
        ({"headers": {"replay-count": 1}}, "headers"),
        ({"headers": {"run-at": "2026-11-25T10:00:00Z"}}, "headers"),
        ({"headers": {"max-retries": 1}}, "headers"),
        ({"headers": {"retry-delays-ms": "1000"}}, "headers"),
        ({"headers": {"original-queue": "jobs"}}, "headers"),
        ({"headers": {"blob": b"raw"}}, "headers"),  # bytes: the codec takes bytearray only
        ({"headers": {"big": 2**70}}, "headers"),
        ({"headers": {"set": {1}}}, "headers"),
        # Names are checked at every depth: pamqp fails on a name that is not a string with an
        # AttributeError, and cuts a long one short (two names may then become one).
        ({"headers": {"a": {1: "x"}}}, "headers"),
        ({"headers": {"a": {"b": {None: "x"}}}}, "headers"),
        ({"headers": {"a": [1, {2: "x"}]}}, "headers"),
        ({"headers": {"a": {"b": 1, 2: "x"}}}, "headers"),
        ({"headers": {"a": {"k" * 129: 1}}}, "headers"),
        ({"headers": {"a": {"\ud800": 1}}}, "headers"),
        ({"headers": {"a": ["\ud800"]}}, "headers"),
        ({"headers": {"a": (1, 2)}}, "headers"),
        ({"headers": {"a": [object()]}}, "headers"),
        ({"headers": {"a": {"b": b"raw"}}}, "headers"),
        # An AMQP timestamp is seconds since 1970, unsigned.
        ({"headers": {"at": dt.datetime(1, 1, 1, tzinfo=PLUS_5)}}, "headers"),
        ({"headers": {"at": dt.datetime(1960, 1, 1, tzinfo=dt.UTC)}}, "headers"),
        ({"headers": {"d": decimal.Decimal("nan")}}, "headers"),
        ({"headers": {"deep": nested(HEADER_MAX_DEPTH + 1)}}, "headers"),
        ({"headers": {"deep": nested(5000)}}, "headers"),
        ({"headers": {"cycle": cyclic()}}, "headers"),
        ({"headers": {"cycle": [cyclic()]}}, "headers"),
        ({"run_at": dt.datetime(1, 1, 1, tzinfo=PLUS_5)}, "run_at"),  # no UTC time holds it
        ({"payload": b"", "content_type": "t" * 256}, "content_type"),
        ({"payload": b"", "content_type": ""}, "content_type"),
        ({"payload": b"", "content_type": 7}, "content_type"),
    ],
)
def test_out_of_bounds_is_refused_naming_the_argument(job: dict[str, Any], names: str) -> None:
    """Each rule of the contract: InvalidJob (a ValueError, and a RicochetError as every error
    ricochet raises on purpose) whose message starts with the argument's name."""
    payload = job.pop("payload", {})
    job_type = job.pop("job_type", "mail")
    with pytest.raises(InvalidJob) as raised:
        job_message(job_type, payload, now=NOW, **job)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, RicochetError)
    assert str(raised.value).startswith(names), str(raised.value)


@pytest.mark.parametrize(
    ("job", "header"),
    [
        ({"max_retries": 0}, ("max-retries", 0)),
        ({"max_retries": 25}, ("max-retries", 25)),
        ({"retry_delays_ms": (5_000, 10_000, 20_000)}, ("retry-delays-ms", "5000,10000,20000")),
        ({"retry_delays_ms": [10]}, ("retry-delays-ms", "10")),
        ({"retry_delays_ms": [86_400_000] * 25}, ("retry-delays-ms", ",".join(["86400000"] * 25))),
        ({"delay": 0}, ("run-at", "2026-11-24T10:00:00.124Z")),
        ({"delay": 1.5}, ("run-at", "2026-11-24T10:00:01.624Z")),
        ({"delay": dt.timedelta(hours=1)}, ("run-at", "2026-11-24T11:00:00.124Z")),
        ({"delay": 30 * 86400}, ("run-at", "2026-12-24T10:00:00.124Z")),
        ({"delay": 30 * DAY}, ("run-at", "2026-12-24T10:00:00.124Z")),
        (
            {"run_at": dt.datetime(2026, 11, 24, 12, 30, tzinfo=ZoneInfo("Europe/Paris"))},
            ("run-at", "2026-11-24T11:30:00.000Z"),
        ),
        ({"run_at": NOW + 30 * DAY}, ("run-at", "2026-12-24T10:00:00.124Z")),
        ({"run_at": NOW - 400 * DAY}, ("run-at", "2025-10-20T10:00:00.124Z")),  # past: at once
    ],
)
def test_bounds_are_inclusive_and_schedules_become_run_at(
    job: dict[str, Any], header: tuple[str, Any]
) -> None:
    """The edges are allowed; a schedule travels as an ISO-8601 UTC run-at header."""
    name, value = header
    assert on_the_wire(message(**job)).headers == {name: value}


@pytest.mark.parametrize(
    ("when", "text"),
    [
        (dt.datetime(2026, 11, 24, 10, 0, tzinfo=dt.UTC), "2026-11-24T10:00:00.000Z"),
        (dt.datetime(2026, 11, 24, 10, 0, 0, 1000, tzinfo=dt.UTC), "2026-11-24T10:00:00.001Z"),
        # Rounded up, never down: a job must not run before the time asked.
        (dt.datetime(2026, 11, 24, 10, 0, 0, 1, tzinfo=dt.UTC), "2026-11-24T10:00:00.001Z"),
        (
            dt.datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
            "2027-01-01T00:00:00.000Z",
        ),
        (
            dt.datetime(2026, 11, 24, 5, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            "2026-11-24T10:00:00.000Z",
        ),
    ],
)
def test_run_at_text(when: dt.datetime, text: str) -> None:
    assert run_at_text(when) == text
    assert dt.datetime.fromisoformat(text) >= when


@pytest.mark.parametrize(
    ("payload", "body", "content_type"),
    [
        ({"to": "ann@example.com", "n": 1}, b'{"to":"ann@example.com","n":1}', "application/json"),
        ([1, 2], b"[1,2]", "application/json"),
        ("hello", b'"hello"', "application/json"),
        (None, b"null", "application/json"),
        ({"name": "Zoë"}, '{"name":"Zoë"}'.encode(), "application/json"),
        (b"\x00\xffraw", b"\x00\xffraw", None),
        (bytearray(b"{}"), b"{}", None),
    ],
)
def test_payload(payload: Any, body: bytes, content_type: str | None) -> None:
    """bytes go as they are; anything else is JSON (that the handler's job.payload reads back)."""
    sent = job_message("mail", payload, now=NOW)
    assert (sent.body, on_the_wire(sent).content_type) == (body, content_type)
    if content_type:
        assert json.loads(sent.body) == payload


def test_headers_nest_up_to_the_limit() -> None:
    """Tables and arrays within tables travel, as deep as the limit."""
    headers = {"deep": nested(HEADER_MAX_DEPTH), "list": [{"a": [1, "b"]}], "empty": {}}
    assert on_the_wire(message(headers=headers)).headers == headers


def test_a_body_over_the_broker_limit_is_refused() -> None:
    """The broker's max_message_size (128 MiB by default) is the largest body it takes."""
    largest = bytes(MAX_MESSAGE_BYTES)
    assert message(payload=largest).body is largest
    with pytest.raises(InvalidJob, match=r"^payload is 134217729 bytes"):
        message(payload=bytes(MAX_MESSAGE_BYTES + 1))
    with pytest.raises(InvalidJob, match=r"^payload is 134217730 bytes"):
        message(payload="x" * MAX_MESSAGE_BYTES)  # JSON: with its two quotes


def test_headers_up_to_the_frame_fit() -> None:
    """The headers may take the frame but the room the worker keeps for the other properties,
    so that what the client accepts the worker can copy; a byte more is refused."""
    limit = FRAME_MAX - PROPERTIES_RESERVE_BYTES
    fitting = {"blob": "b" * (limit - table_size({"blob": ""}))}
    assert table_size(fitting) == limit
    check_frame(fitting, FRAME_MAX)
    with pytest.raises(InvalidJob, match=r"^headers take 126977 bytes.* at most 126976"):
        check_frame({**fitting, "blob": fitting["blob"] + "b"}, FRAME_MAX)
    check_frame({}, FRAME_MAX)


def test_a_frame_of_the_largest_headers_and_properties_fits() -> None:
    """The room kept is enough for every property a job can carry at its largest."""
    limit = FRAME_MAX - PROPERTIES_RESERVE_BYTES
    sent = message(
        "t" * 255,
        b"",
        message_id="m" * 255,
        content_type="c" * 255,
        max_retries=25,
        retry_delays_ms=[86_400_000] * 25,
        delay=1,
        headers={"blob": ""},
    )
    assert sent.properties.headers is not None
    sent.properties.headers["blob"] = "b" * (limit - table_size(sent.properties.headers))
    check_frame(sent.properties.headers, FRAME_MAX)
    encoded = frame.marshal(header.ContentHeader(0, len(sent.body), sent.properties), 1)
    assert len(encoded) <= FRAME_MAX


@pytest.mark.parametrize(
    "message_id", ["", None, 7, b"m1", "m" * 256, "é" * 128, "m\ud800", ["m1"]]
)
def test_a_cancel_of_an_impossible_id_is_refused(message_id: Any) -> None:
    """A message_id no job can have: InvalidJob naming message_id, as enqueue refuses it."""
    with pytest.raises(InvalidJob, match=r"^message_id"):
        cancelled_id(message_id)


@pytest.mark.parametrize("message_id", ["m", "m" * 255, "é" * 127, "order 42/ü"])
def test_a_cancel_takes_any_id_enqueue_takes(message_id: str) -> None:
    assert cancelled_id(message_id) == message_id
    assert on_the_wire(message(message_id=message_id)).message_id == message_id


def test_bytes_keep_the_content_type_given() -> None:
    sent = message(payload=b"a,b", content_type="text/csv")
    assert (sent.body, on_the_wire(sent).content_type) == (b"a,b", "text/csv")


def test_the_message_is_persistent_typed_and_identified() -> None:
    sent = on_the_wire(message("mail", {"a": 1}))
    other = on_the_wire(message("mail", {"a": 1}))
    assert sent.delivery_mode == 2  # persistent
    assert sent.message_type == "mail"
    assert uuid.UUID(hex=str(sent.message_id)).version == 4
    assert len(str(sent.message_id)) == 32
    assert sent.message_id != other.message_id
    assert sent.timestamp == NOW.replace(microsecond=0)  # AMQP keeps whole seconds
    assert on_the_wire(message(message_id="order-1")).message_id == "order-1"
    assert on_the_wire(message(None)).message_type is None


def test_application_headers_travel_untouched() -> None:
    """The application's own headers, x- ones included, go as given; the caller's mapping is
    not changed by the headers ricochet adds."""
    own = {"x-request-id": "r-1", "tenant": "acme", "traceparent": "00-ab-cd-01", "n": 3}
    sent = on_the_wire(message(headers=own, max_retries=2, delay=1))
    assert sent.headers == {**own, "max-retries": 2, "run-at": "2026-11-24T10:00:01.124Z"}
    assert own == {"x-request-id": "r-1", "tenant": "acme", "traceparent": "00-ab-cd-01", "n": 3}


@pytest.mark.parametrize(
    ("name", "reserved"),
    [
        ("x-death", True),
        ("x-first-death-exchange", True),
        ("x-last-death-queue", True),
        ("x-delivery-count", True),
        ("x-acquired-count", True),
        ("failed-at", True),
        ("failed-dropped-headers", True),
        ("retry-count", True),
        ("replay-count", True),
        ("run-at", True),
        ("max-retries", True),
        ("original-routing-key", True),
        ("ricochet-retries", True),  # the worker's count of a copy's retries
        ("x-request-id", False),
        ("x-deathly", False),
        ("traceparent", False),
        ("failed", False),
        ("Run-At", False),  # header names are case-sensitive: this one is the application's
        ("retry-counter", False),
    ],
)
def test_reserved_header_names(name: str, reserved: bool) -> None:
    assert is_reserved(name) is reserved
