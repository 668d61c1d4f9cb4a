"""The failed copy: its headers, the message, and what is logged of it."""

import datetime as dt
from typing import Any

import aio_pika
import pytest
from pamqp import commands
from ricochet.broker.amqp import Delivery, table_size
from ricochet.delivery.failed import (
    PROPERTIES_RESERVE_BYTES,
    REASON_MAX_CHARS,
    TRACEBACK_MAX_CHARS,
    Failure,
    copied_headers,
    exception_name,
    failed_copy,
    failed_headers,
    failure_reason,
    fit_to_frame,
    read_failure,
)
from ricochet.delivery.retry import Facts, FailureKind
from ricochet.errors import PermanentError
from ricochet.headers import FAILURE_HEADERS

from tests.support import ForeignBytes
from tests.unit.frames import HEADERS, delivered, read_leniently


class CustomError(Exception):
    pass


def raised(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:
        return caught


def test_headers_replace_death_with_failure() -> None:
    """Original headers stay, x-death bookkeeping goes, the failure headers of the SPEC come."""
    original = {
        "tenant": "acme",
        "x-death": [{"queue": "jobs", "reason": "rejected", "count": 3}],
        "x-first-death-queue": "jobs",
        "x-first-death-reason": "rejected",
        "x-last-death-queue": "jobs",
    }
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    exc = raised(ValueError("bad row 7"))
    headers = failed_headers(original, Failure(exc), FailureKind.EXHAUSTED, 3, "jobs", "jobs", now)
    assert headers["tenant"] == "acme"
    assert not any(k.startswith(("x-death", "x-first-death", "x-last-death")) for k in headers)
    assert headers["failed-at"] == "2026-01-02T03:04:05+00:00"
    assert headers["failed-reason"] == "ValueError: bad row 7"
    assert headers["failed-exception"] == "ValueError"
    assert "raise exc" in headers["failed-traceback"]
    assert headers["failed-kind"] == "exhausted"
    assert headers["retry-count"] == 3
    assert headers["original-queue"] == "jobs"
    assert headers["original-routing-key"] == "jobs"


def test_reason_and_traceback_are_bounded() -> None:
    """failed-reason keeps at most 1000 characters, failed-traceback the last 4096."""
    exc = raised(RuntimeError("x" * 5000))
    now = dt.datetime.now(dt.UTC)
    headers = failed_headers({}, Failure(exc), FailureKind.PERMANENT, 0, "q", "q", now)
    assert len(headers["failed-reason"]) == REASON_MAX_CHARS
    assert headers["failed-reason"].startswith("RuntimeError: xxx")
    assert len(headers["failed-traceback"]) == TRACEBACK_MAX_CHARS
    assert headers["failed-traceback"].endswith("x\n")


def test_exception_names() -> None:
    """Builtins are named bare; everything else with its module."""
    assert exception_name(ValueError()) == "ValueError"
    assert exception_name(PermanentError()) == "ricochet.errors.PermanentError"
    assert exception_name(CustomError()) == f"{__name__}.CustomError"
    assert failure_reason(CustomError()) == "CustomError"
    assert failure_reason(CustomError("boom")) == "CustomError: boom"


def test_copied_headers_drop_only_the_dead_letter_ones() -> None:
    """Only the dead-letter headers are dropped."""
    assert copied_headers({"x-death": [], "x-first-death-exchange": "", "a": 1, "x-other": 2}) == {
        "a": 1,
        "x-other": 2,
    }


def test_copied_headers_carry_raw_strings_as_byte_arrays() -> None:
    """Long strings the client read as bytes (not UTF-8) are copied as byte arrays, however
    deep in the table, so the copy can be published."""
    copied = copied_headers({"raw": b"\xff\x00", "deep": {"list": [b"\xfe", "text", 1]}})
    assert copied == {
        "raw": bytearray(b"\xff\x00"),
        "deep": {"list": [bytearray(b"\xfe"), "text", 1]},
    }
    assert table_size(copied)  # encodable


FRAME_MAX = 131_072


def big_failure(application_bytes: int) -> dict[str, Any]:
    """Failure headers with a full-length reason and traceback, and one large application header."""
    headers = failed_headers(
        {"blob": "é" * (application_bytes // 2)},
        Failure(raised(ValueError("x" * TRACEBACK_MAX_CHARS + "raise here"))),
        FailureKind.PERMANENT,
        0,
        "jobs",
        "jobs",
        dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
    )
    return headers


def test_headers_that_fit_are_untouched() -> None:
    """A failed copy well within the frame keeps its reason and traceback whole."""
    headers = big_failure(1000)
    assert fit_to_frame(headers, FRAME_MAX) == headers


@pytest.mark.parametrize(
    ("application_bytes", "traceback_kept", "reason_kept"),
    [
        (FRAME_MAX - PROPERTIES_RESERVE_BYTES - 4000, True, True),  # the traceback is cut
        (FRAME_MAX - PROPERTIES_RESERVE_BYTES - 600, False, True),  # then the reason
    ],
)
def test_large_copies_are_cut_to_the_frame(
    application_bytes: int, traceback_kept: bool, reason_kept: bool
) -> None:
    """Near the frame limit the traceback is cut first (keeping its end), then the reason
    (keeping its start), until the encoded headers leave room for the other properties."""
    headers = big_failure(application_bytes)
    fitted = fit_to_frame(headers, FRAME_MAX)
    assert table_size(fitted) <= FRAME_MAX - PROPERTIES_RESERVE_BYTES
    assert fitted["blob"] == headers["blob"]
    assert bool(fitted["failed-traceback"]) is traceback_kept
    if traceback_kept:
        assert fitted["failed-traceback"].endswith("raise here\n")
    assert bool(fitted["failed-reason"]) is reason_kept
    assert headers["failed-reason"].startswith(fitted["failed-reason"])


def test_application_headers_near_the_frame_go_largest_first_and_are_named() -> None:
    """A job whose own headers nearly fill a frame by themselves still gets a copy that fits:
    with the traceback and reason cut, its largest headers go, named in failed-dropped-headers,
    and the failure headers and the smaller headers stay."""
    headers = big_failure(FRAME_MAX - PROPERTIES_RESERVE_BYTES - 100)
    headers["tenant"] = "acme"
    fitted = fit_to_frame(headers, FRAME_MAX)
    assert table_size(fitted) <= FRAME_MAX - PROPERTIES_RESERVE_BYTES
    assert "blob" not in fitted
    assert fitted["failed-dropped-headers"] == "blob"
    assert fitted["tenant"] == "acme"
    assert fitted["failed-kind"] == "permanent"
    assert "failed-dropped-headers" in FAILURE_HEADERS  # a replay does not carry it back
    # The reason keeps its start: a failed copy always says why it failed.
    assert headers["failed-reason"].startswith(fitted["failed-reason"])
    assert len(fitted["failed-reason"]) >= min(200, len(headers["failed-reason"]))


def delivery_from_tier() -> Delivery:
    """A third attempt at a job published to "jobs", back from the tier of its second."""
    return Delivery(delivered(commands.Basic.Deliver("ctag", 4, False, "jobs.return", "jobs")))


FACTS = Facts(attempt=3, max_attempts=3, original_routing_key="jobs.original")
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def test_failed_copy_carries_the_job_and_its_failure() -> None:
    """The copy keeps the body, the properties and the application headers, is persistent,
    and says why it failed; its log fields repeat the kind, reason and traceback."""
    exc = raised(ValueError("bad row 7"))
    failed = failed_copy(
        delivery_from_tier(),
        FACTS,
        Failure(exc),
        FailureKind.EXHAUSTED,
        queue="jobs",
        frame_max=FRAME_MAX,
        now=NOW,
    )
    message = failed.message
    assert message.body == b'{"a": 1}'
    assert (message.message_id, message.type, message.app_id) == ("m-1", "invoice.paid", "billing")
    assert message.delivery_mode is aio_pika.DeliveryMode.PERSISTENT
    headers = failed_headers(
        HEADERS, Failure(exc), FailureKind.EXHAUSTED, 2, "jobs", "jobs.original", NOW
    )
    assert message.headers == headers
    assert failed.log_fields == {
        "kind": "exhausted",
        "error": "ValueError: bad row 7",
        "exception": headers["failed-traceback"].removesuffix("\n"),
    }
    assert failed.log_fields["exception"].endswith("ValueError: bad row 7")


def test_failed_copy_without_an_exception_is_poison() -> None:
    """A poison job's handler never ran: its copy fails it as a PoisonMessage."""
    failed = failed_copy(
        delivery_from_tier(),
        FACTS,
        None,
        FailureKind.POISON,
        queue="jobs",
        frame_max=FRAME_MAX,
        now=NOW,
    )
    reason = "PoisonMessage: delivered more than 5 times without an ack"
    assert failed.message.headers["failed-exception"] == "ricochet.errors.PoisonMessage"
    assert failed.message.headers["failed-reason"] == reason
    assert failed.log_fields == {
        "kind": "poison",
        "error": reason,
        "exception": f"ricochet.errors.{reason}",  # never raised: no stack, only its last line
    }


async def test_failed_copy_of_unreadable_properties_says_so() -> None:
    """A delivery whose properties could not be decoded fails as InvalidProperties, naming what
    was unreadable; its copy keeps the body and what could be read of the rest."""
    sent = commands.Basic.Properties(message_id=ForeignBytes(b"m-\xff"), app_id="billing")
    failed = failed_copy(
        await read_leniently(sent, b"\x00\xff"),
        FACTS,
        None,
        FailureKind.PERMANENT,
        queue="jobs",
        frame_max=FRAME_MAX,
        now=NOW,
    )
    reason = (
        "InvalidProperties: properties could not be decoded: message_id: "
        "'utf-8' codec can't decode byte 0xff in position 2: invalid start byte"
    )
    assert failed.message.headers["failed-exception"] == "ricochet.errors.InvalidProperties"
    assert failed.message.headers["failed-reason"] == failed.log_fields["error"] == reason
    assert (failed.message.body, failed.message.message_id) == (b"\x00\xff", "m-\ufffd")
    assert failed.message.app_id == "billing"


def test_failed_copy_logs_the_whole_traceback_its_frame_cut() -> None:
    """A copy fitted to a small frame keeps only the end of its traceback; the log line says
    the reason the copy carries, and the whole traceback."""
    exc = raised(RuntimeError("x" * 300))
    failed = failed_copy(
        delivery_from_tier(),
        FACTS,
        Failure(exc),
        FailureKind.PERMANENT,
        queue="jobs",
        frame_max=PROPERTIES_RESERVE_BYTES + 1000,
        now=NOW,
    )
    headers = failed.message.headers
    assert not str(headers["failed-traceback"]).startswith("Traceback")
    assert failed.log_fields["error"] == headers["failed-reason"]
    assert failed.log_fields["exception"].startswith("Traceback (most recent call last):")
    assert failed.log_fields["exception"].endswith("RuntimeError: " + "x" * 300)


def test_reason_and_traceback_are_scrubbed() -> None:
    """A database URL's password and an ?api_key= value raised by a handler reach neither the
    failed-reason nor the failed-traceback header, even when the reason is cut mid-URL."""
    url = "postgresql://app:hunter2@db:5432/orders?api_key=k3y"
    padding = "x" * (REASON_MAX_CHARS - 30)
    exc = raised(ConnectionError(f"{padding} cannot reach {url}"))
    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    headers = failed_headers({}, Failure(exc), FailureKind.EXHAUSTED, 3, "jobs", "jobs", now)
    for key in ("failed-reason", "failed-traceback"):
        assert "hunter" not in headers[key]
        assert "k3y" not in headers[key]
    assert "app:***@db" in headers["failed-traceback"]
    assert "api_key=***" in headers["failed-traceback"]


def test_read_failure_scrubs_reasons_written_elsewhere() -> None:
    """A copy whose failed-reason holds a password (written by another client or an older
    version) is read without it: replay's output, the monitor's log and the webhook use this."""
    failure = read_failure(
        {"failed-reason": b"OperationalError: mysql://root:hunter2@db/x?token=t0k"}, "m", "t", b"{}"
    )
    assert failure.reason == "OperationalError: mysql://root:***@db/x?token=***"
