"""The AMQP adapter: the only module that uses aiormq and pamqp, aio-pika's protocol layer.

The worker takes its deliveries from the AMQP channel under aio-pika's and reads them from the
frames: aio-pika's IncomingMessage decodes and checks every property of every delivery, while a
job needs the body, five properties and the delivery. A copy of a message (failed or cleaned)
still has every property decoded by aio-pika itself, so a copy keeps what it always kept.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aio_pika.message import IncomingMessage
from aiormq import spec
from aiormq.abc import AbstractChannel as FramesChannel
from aiormq.abc import DeliveredMessage
from pamqp.encode import field_table

# What a dropped connection or a closed channel raises from any call on it.
CONNECTION_ERRORS = CONNECTION_EXCEPTIONS
# Absent, transient, persistent: the delivery modes aio-pika decodes.
KNOWN_DELIVERY_MODES = (None, 1, 2)


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
        properties = self._raw.header.properties
        if properties.delivery_mode not in KNOWN_DELIVERY_MODES:
            # aio-pika refuses a mode other clients may send (0, 3); a copy is persistent anyway.
            properties.delivery_mode = None
        return IncomingMessage(self._raw)


class Frames:
    """The AMQP channel under an aio-pika channel, where deliveries are taken as frames."""

    def __init__(self, channel: FramesChannel) -> None:
        self._channel = channel

    @classmethod
    async def under(cls, channel: AbstractChannel) -> "Frames":
        return cls(await channel.get_underlay_channel())

    @property
    def is_closed(self) -> bool:
        return bool(self._channel.is_closed)

    async def get(self, queue: str) -> Delivery | None:
        """One message fetched with basic.get (unacked), or None when the queue is empty."""
        got = await self._channel.basic_get(queue)
        return Delivery(got) if isinstance(got.delivery, spec.Basic.GetOk) else None

    async def consume(self, queue: str, on_delivery: Callable[[Delivery], object]) -> str:
        """Subscribe, handing each delivery to on_delivery; returns the consumer tag."""

        async def deliver(raw: DeliveredMessage) -> None:
            on_delivery(Delivery(raw))

        return str((await self._channel.basic_consume(queue, deliver)).consumer_tag)

    async def cancel(self, consumer_tag: str) -> None:
        await self._channel.basic_cancel(consumer_tag)

    def on_cancelled(self, callback: Callable[[str], object]) -> None:
        """Call callback(consumer_tag) when the broker cancels a consumer (basic.cancel)."""

        def cancelled(frame: spec.Basic.Cancel) -> None:
            callback(str(frame.consumer_tag))

        self._channel.on_consumer_cancel_callbacks.add(cancelled)


def frame_max(connection: AbstractConnection) -> int:
    """The largest frame the broker accepts on this connection (the tune it sent at open)."""
    assert connection.transport is not None
    return int(connection.transport.connection.connection_tune.frame_max)


def parse_version(text: str) -> tuple[int, ...] | None:
    """'3.10.8' -> (3, 10, 8), '4.1' -> (4, 1), '4.0.0-rc.1' -> (4, 0, 0); None for no version."""
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(n) for n in numbers.groups() if n is not None) if numbers else None


def broker_version(connection: AbstractConnection) -> tuple[int, ...] | None:
    """The broker's RabbitMQ version from the properties it sent at open (None if it sent none)."""
    assert connection.transport is not None
    version = connection.transport.connection.server_properties.get("version")
    if not isinstance(version, str | bytes):
        return None
    return parse_version(version.decode() if isinstance(version, bytes) else version)


def table_size(table: Mapping[str, Any]) -> int:
    """Bytes of a header table as it travels in a frame."""
    return len(field_table(dict(table)))


def refusal(error: BaseException | None) -> str:
    """What the broker said when it did not confirm a publish (returned or nacked)."""
    frame = getattr(error, "frame", None)
    return getattr(frame, "reply_text", None) or type(frame).__name__
