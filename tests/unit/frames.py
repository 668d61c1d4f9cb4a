"""Deliveries read from real AMQP frames, with no broker."""

import asyncio
from typing import Any

from aiormq.abc import DeliveredMessage
from aiormq.connection import FrameReceiver
from pamqp import commands, frame, header
from pamqp.body import ContentBody
from pamqp.common import FieldTable
from ricochet.broker.amqp import Delivery, read_properties_leniently

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


class SettlingChannel:
    """aiormq's channel as Frames settles deliveries on it: each basic_nack and basic_ack noted
    as (kind, tag, multiple, requeue, wait), in the order sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bool, bool | None, bool]] = []

    async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        self.sent.append(("ack", delivery_tag, multiple, None, wait))

    async def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True, wait: bool = True
    ) -> None:
        self.sent.append(("nack", delivery_tag, multiple, requeue, wait))


def through_the_wire(*frames: Any) -> list[Any]:
    """The frames marshalled to bytes and read back, as the client receives them."""
    return [frame.unmarshal(frame.marshal(f, channel_id=1))[2] for f in frames]


def delivered(method: Any, body: bytes = b'{"a": 1}') -> DeliveredMessage:
    """A message with PROPERTIES as the client reads it off the wire, on a SettlingChannel."""
    read_method, read_header, read_body = through_the_wire(
        method, header.ContentHeader(body_size=len(body), properties=PROPERTIES), ContentBody(body)
    )
    return DeliveredMessage(read_method, read_header, read_body.value, SettlingChannel())  # type: ignore[arg-type]


async def read_by_aiormq(*frames: Any) -> list[Any]:
    """The frames marshalled to bytes and read back by aiormq's connection reader."""
    return await read_payload(b"".join(frame.marshal(f, channel_id=1) for f in frames), len(frames))


async def read_payload(payload: bytes, count: int) -> list[Any]:
    """The first count frames of bytes as aiormq's connection reader reads them."""
    reader = asyncio.StreamReader()
    reader.feed_data(payload)
    receiver = FrameReceiver(reader)
    return [(await receiver.get_frame())[2] for _ in range(count)]


async def read_leniently(properties: commands.Basic.Properties, body: bytes) -> Delivery:
    """A delivery with these properties as the worker's connection reads it off the wire."""
    read_properties_leniently()
    method, read_header, read_body = await read_by_aiormq(
        commands.Basic.Deliver("ctag", 3, False, "", "jobs"),
        header.ContentHeader(body_size=len(body), properties=properties),
        ContentBody(body),
    )
    return Delivery(DeliveredMessage(method, read_header, read_body.value, SettlingChannel()))  # type: ignore[arg-type]
