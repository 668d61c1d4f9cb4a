"""The AMQP adapter reads a delivery from its frames as aio-pika would, with no broker."""

import datetime as dt
import struct
from importlib import metadata
from typing import Any

import aio_pika
import pamqp.frame
import pytest
from aio_pika.message import IncomingMessage
from aiormq.exceptions import InvalidFrameError
from pamqp import commands, header
from ricochet.broker.amqp import (
    AMQP_NAMES,
    Delivery,
    Frames,
    adapter_problems,
    read_properties_leniently,
    require_adapter,
    table_size,
)
from ricochet.errors import ConfigError

from tests.support import ForeignBytes, ForeignTimestamp
from tests.unit.frames import (
    HEADERS,
    PROPERTIES,
    SettlingChannel,
    delivered,
    read_by_aiormq,
    read_leniently,
)

FIELDS = (
    "body",
    "headers",
    "message_id",
    "type",
    "correlation_id",
    "content_type",
    "routing_key",
    "redelivered",
    "delivery_tag",
)


@pytest.mark.parametrize(
    "method",
    [
        commands.Basic.Deliver("ctag", 5, False, "", "jobs"),
        commands.Basic.Deliver("ctag", 6, True, "jobs.return", "jobs.attempt.2"),
        commands.Basic.GetOk(7, True, "", "jobs", message_count=3),
    ],
)
def test_delivery_reads_what_aio_pika_reads(method: Any) -> None:
    """Field by field, for a consumed and a fetched delivery, first and redelivered."""
    raw = delivered(method)
    delivery = Delivery(raw)
    by_aio_pika = IncomingMessage(raw)
    assert {f: getattr(delivery, f) for f in FIELDS} == {f: getattr(by_aio_pika, f) for f in FIELDS}
    assert delivery.headers == HEADERS
    copied = ("content_type", "content_encoding", "message_id", "type", "timestamp", "app_id")
    assert delivery.properties(copied) == {f: getattr(by_aio_pika, f) for f in copied}


async def test_settling_sends_the_nacks_first_and_waits_for_the_last_frame_only() -> None:
    """A dead-lettering nack (never requeued) for each tag, then the multiple ack, then each
    single ack, in that order on the channel; only the last waits until it is written."""
    channel = SettlingChannel()
    await Frames(channel).settle([4, 2], 3, [6, 7])  # type: ignore[arg-type]
    assert channel.sent == [
        ("nack", 4, False, False, False),
        ("nack", 2, False, False, False),
        ("ack", 3, True, None, False),
        ("ack", 6, False, None, False),
        ("ack", 7, False, None, True),
    ]


def test_table_size_is_the_encoded_size() -> None:
    """A header table's size as it travels: what fitting a failed copy to a frame counts."""
    assert table_size({}) == 4  # the table's length field alone
    assert table_size({"k": "v"}) == 4 + 1 + 1 + 1 + 4 + 1  # name, type, string length, value
    assert table_size(HEADERS) > table_size({"tenant": "acme"})


FAR_FUTURE = ForeignTimestamp(2000, 1, 1, tzinfo=dt.UTC)
NOT_UTF8 = "'utf-8' codec can't decode byte"


@pytest.mark.parametrize(
    ("properties", "read", "unreadable"),
    [
        (
            {"timestamp": FAR_FUTURE},
            {"timestamp": None},
            "timestamp: year 146140482 is out of range",
        ),
        (
            {"message_id": ForeignBytes(b"m-\xff"), "message_type": ForeignBytes(b"\xc3(")},
            {"message_id": "m-\ufffd", "message_type": "\ufffd("},
            f"message_id: {NOT_UTF8} 0xff in position 2: invalid start byte; "
            f"type: {NOT_UTF8} 0xc3 in position 0: invalid continuation byte",
        ),
        (
            # 255 bytes that each read as a character of three: cut back to a short string.
            {"correlation_id": ForeignBytes(b"\xff" * 255)},
            {"correlation_id": "\ufffd" * 85},
            f"correlation_id: {NOT_UTF8} 0xff in position 0: invalid start byte",
        ),
        (
            {"headers": {"tenant": "acme", ForeignBytes(b"k\xff"): "v", "at": FAR_FUTURE}},
            {"headers": {"tenant": "acme", "k\ufffd": "v", "at": None}},
            "headers['at']: year 146140482 is out of range; "
            f"headers key b'k\\xff': {NOT_UTF8} 0xff in position 1: invalid start byte",
        ),
        (
            {"headers": {"deep": [1, {ForeignBytes(b"\xff"): FAR_FUTURE}]}},
            {"headers": {"deep": [1, {"\ufffd": None}]}},
            f"headers['deep'][1] key b'\\xff': {NOT_UTF8} 0xff in position 0: invalid start byte; "
            "headers['deep'][1]['\ufffd']: year 146140482 is out of range",
        ),
    ],
    ids=["timestamp", "short-strings", "long-short-string", "header-table", "nested-table"],
)
async def test_unreadable_properties_are_read_leniently(
    properties: dict[str, Any], read: dict[str, Any], unreadable: str
) -> None:
    """Properties pamqp refuses no longer stop aiormq's reader (which closes the connection on
    them): the delivery is read with what could be kept, and says what could not."""
    sent = commands.Basic.Properties(app_id="billing", delivery_mode=2, **properties)
    delivery = await read_leniently(sent, b"\x00\xff")
    assert delivery.unreadable == unreadable
    assert (delivery.body, delivery.delivery_tag, delivery.routing_key) == (b"\x00\xff", 3, "jobs")
    names = {AMQP_NAMES.get(name, name): name for name in read}
    kept = delivery.properties([*names, "app_id"])
    assert {name: kept[amqp] for amqp, name in names.items()} == read
    assert kept["app_id"] == "billing"
    aio_pika.Message(b"", **kept).properties.marshal()  # and a copy can carry them


async def test_readable_properties_read_as_pamqp_reads_them() -> None:
    """A delivery pamqp reads is read by pamqp alone, unmarked."""
    delivery = await read_leniently(PROPERTIES, b"{}")
    assert delivery.unreadable is None
    assert delivery.properties(["message_id", "type"]) == {
        "message_id": PROPERTIES.message_id,
        "type": PROPERTIES.message_type,
    }
    assert delivery.headers == HEADERS


class RawHeader(header.ContentHeader):
    """A content header frame of exactly these bytes."""

    def __init__(self, payload: bytes) -> None:
        super().__init__()
        self.payload = payload

    def marshal(self) -> bytes:
        return self.payload


async def test_header_broken_beyond_its_values_is_still_refused() -> None:
    """A header table longer than its frame is no value to replace: aiormq refuses the frame,
    as it did before."""
    read_properties_leniently()
    headers_flag = commands.Basic.Properties.flags["headers"]
    class_weight_size_flags = struct.pack(">HHQH", 60, 0, 1, headers_flag)
    table = struct.pack(">I", 100) + b"\x01\xff" + b"t\x01"  # 100 bytes said, 5 there
    with pytest.raises(InvalidFrameError, match="Field table length exceeds available data"):
        await read_by_aiormq(RawHeader(class_weight_size_flags + table))


INSTALLED = {"pamqp": "4.0.1", "aiormq": "7.2.4"}


@pytest.mark.parametrize(
    ("versions", "problems"),
    [
        (INSTALLED, []),
        ({"pamqp": "4.9", "aiormq": "7.0.0"}, []),
        (
            {"pamqp": "5.0.0", "aiormq": "7.2.4"},
            ["pamqp 5.0.0 is installed; ricochet is written for pamqp 4.x"],
        ),
        (
            {"pamqp": "4.0.1", "aiormq": "8.0.0"},
            ["aiormq 8.0.0 is installed; ricochet is written for aiormq 7.x"],
        ),
    ],
)
def test_the_adapter_names_a_library_of_another_major(
    versions: dict[str, str], problems: list[str]
) -> None:
    assert adapter_problems(versions) == problems


def test_the_adapter_names_a_private_name_that_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade that renames what the adapter wraps is named, with the package's version."""
    monkeypatch.delattr(pamqp.frame, "_unmarshal_header_frame")
    assert adapter_problems(INSTALLED) == ["pamqp 4.0.1 has no pamqp.frame._unmarshal_header_frame"]


def test_connecting_refuses_libraries_that_do_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any connection: a ConfigError (exit 2) naming the package and its version."""
    monkeypatch.setattr(metadata, "version", lambda package: "9.0.0")
    with pytest.raises(ConfigError, match=r"pamqp 9\.0\.0 is installed; ricochet is written for"):
        read_properties_leniently()


def test_the_installed_libraries_fit() -> None:
    require_adapter()
