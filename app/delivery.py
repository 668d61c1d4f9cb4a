"""One delivery of a job, read from the frames as the AMQP client received them.

aio-pika turns every delivery into an IncomingMessage, decoding and checking all fourteen
properties one attribute at a time (12 us a message, the largest single cost of a successful
job). A job needs the body, five properties and the delivery; the full decoding is done only for
the rare copy (failed or cleaned), and by aio-pika itself, so a copy keeps what it always kept.
"""

from typing import Any

from aio_pika.message import IncomingMessage
from aiormq.abc import DeliveredMessage


class Delivery:
    """A delivered message, and the channel it is settled on (acked or dead-lettered)."""

    __slots__ = (
        "_raw",
        "body",
        "content_type",
        "correlation_id",
        "delivery_tag",
        "headers",
        "message_id",
        "redelivered",
        "routing_key",
        "type",
    )

    def __init__(self, raw: DeliveredMessage) -> None:
        properties = raw.header.properties
        delivery: Any = raw.delivery  # Basic.Deliver (consumed) or Basic.GetOk (fetched)
        self._raw = raw
        self.body = raw.body
        self.delivery_tag: int = delivery.delivery_tag
        self.redelivered = bool(delivery.redelivered)
        self.routing_key: str = delivery.routing_key or ""
        self.headers: dict[str, Any] = dict(properties.headers or {})
        self.message_id: str | None = properties.message_id
        self.type: str | None = properties.message_type
        self.correlation_id: str | None = properties.correlation_id
        self.content_type: str | None = properties.content_type

    async def ack(self, multiple: bool = False) -> None:
        await self._raw.channel.basic_ack(self.delivery_tag, multiple=multiple)

    async def dead_letter(self) -> None:
        """Reject without requeue: the broker moves it on through the queue's dead-letter route."""
        await self._raw.channel.basic_nack(self.delivery_tag, requeue=False)

    def decoded(self) -> IncomingMessage:
        """Every property decoded, as aio-pika does it: what a copy of this message carries."""
        return IncomingMessage(self._raw)
