"""The AMQP adapter reads a delivery from its frames as aio-pika would, with no broker."""

from typing import Any

import pytest
from aio_pika.message import IncomingMessage
from aiormq.abc import DeliveredMessage
from pamqp import commands, frame, header
from pamqp.body import ContentBody
from pamqp.common import FieldTable

from app.amqp import Delivery, table_size

HEADERS: FieldTable = {
    "tenant": "acme",
    "n": 7,
    "raw": bytearray(b"\xff\x00"),
    "nested": {"k": [1, "two"]},
}
PROPERTIES = commands.Basic.Properties(
    headers=HEADERS,
    message_id="m-1",
    message_type="invoice.paid",
    correlation_id="c-9",
    content_type="application/json",
    delivery_mode=2,
    priority=3,
    app_id="billing",
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


class SettledOn:
    """The channel end of a delivery: records what it is settled with."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.sent.append(("ack", delivery_tag, multiple))

    async def basic_nack(self, delivery_tag: int, requeue: bool = True) -> None:
        self.sent.append(("nack", delivery_tag, requeue))


def through_the_wire(*frames: Any) -> list[Any]:
    """The frames marshalled to bytes and read back, as the client receives them."""
    return [frame.unmarshal(frame.marshal(f, channel_id=1))[2] for f in frames]


def delivered(method: Any, body: bytes = b'{"a": 1}') -> DeliveredMessage:
    read_method, read_header, read_body = through_the_wire(
        method, header.ContentHeader(body_size=len(body), properties=PROPERTIES), ContentBody(body)
    )
    return DeliveredMessage(read_method, read_header, read_body.value, SettledOn())  # type: ignore[arg-type]


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
    assert delivery.decoded().app_id == "billing"


async def test_delivery_is_settled_on_its_channel() -> None:
    """An ack (single or multiple) and a dead-lettering nack (never requeued) name its tag."""
    raw = delivered(commands.Basic.Deliver("ctag", 9, False, "", "jobs"))
    delivery = Delivery(raw)
    await delivery.ack()
    await delivery.ack(multiple=True)
    await delivery.dead_letter()
    assert raw.channel.sent == [("ack", 9, False), ("ack", 9, True), ("nack", 9, False)]  # type: ignore[attr-defined]


def test_table_size_is_the_encoded_size() -> None:
    """A header table's size as it travels: what fitting a failed copy to a frame counts."""
    assert table_size({}) == 4  # the table's length field alone
    assert table_size({"k": "v"}) == 4 + 1 + 1 + 1 + 4 + 1  # name, type, string length, value
    assert table_size(HEADERS) > table_size({"tenant": "acme"})
