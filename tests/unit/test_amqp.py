"""The AMQP adapter reads a delivery from its frames as aio-pika would, with no broker."""

from typing import Any

import pytest
from aio_pika.message import IncomingMessage
from pamqp import commands

from app.amqp import Delivery, table_size
from tests.unit.frames import HEADERS, delivered

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
