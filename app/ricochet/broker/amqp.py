"""The AMQP adapter: the only module that uses aiormq and pamqp, aio-pika's protocol layer.

The Client publishes on the AMQP channel under aio-pika's, a message built straight into the
protocol's properties (Publisher, properties()): an aio_pika.Message checks and converts every
property, and aio-pika then builds the same properties from it again, most of what an enqueue
costs besides the broker's work (bench/README.md). Both are aiormq's and pamqp's public API.

The worker takes its deliveries from the AMQP channel under aio-pika's and reads them from the
frames: aio-pika's IncomingMessage decodes and checks every property of every delivery, while a
job needs the body, five properties and the delivery. A copy of a message (failed or cleaned)
still has every property decoded by aio-pika itself, so a copy keeps what it always kept.

The broker passes message properties on as they were published, and pamqp refuses some that
other clients send (a short string that is not UTF-8, a timestamp past the year 9999). It does so
in aiormq's connection reader, which then closes the connection; the broker hands the message to
the next worker, whose connection dies the same way. read_properties_leniently() keeps such a
delivery: see there.
"""

import datetime as dt
import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from importlib import metadata
from typing import Any

import aio_pika
import pamqp.frame
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aiormq import spec
from aiormq.abc import AbstractChannel as FramesChannel
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import ChannelAccessRefused, ConnectionCommandInvalid
from pamqp import decode
from pamqp.encode import field_table
from pamqp.header import ContentHeader

from ricochet.errors import ConfigError

# What a dropped connection or a closed channel raises from any call on it.
CONNECTION_ERRORS = CONNECTION_EXCEPTIONS
# What the broker closes the connection with for a command it cannot carry out: an exchange of
# a type no enabled plugin provides, say.
COMMAND_INVALID = ConnectionCommandInvalid
# What the broker closes a channel with for an object the user may not configure, write or read.
ACCESS_REFUSED = ChannelAccessRefused


class Delivery:
    """A delivered message, as read from its frames (settled with Frames.settle on its channel)."""

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
        "unreadable",
    )

    def __init__(self, raw: DeliveredMessage) -> None:
        properties = raw.header.properties
        # What of its properties was not readable as sent (they are read leniently), or None.
        self.unreadable: str | None = (
            "; ".join(properties.problems) if isinstance(properties, LenientProperties) else None
        )
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

    def published_s(self) -> float | None:
        """The job's AMQP timestamp (when its producer published it) in epoch seconds, if any."""
        stamp = self._raw.header.properties.timestamp
        return None if stamp is None else epoch_s(stamp)

    def app_id(self) -> str | None:
        """The AMQP app_id property (who says they published it), if any."""
        app_id: str | None = self._raw.header.properties.app_id
        return app_id

    def priority(self) -> int | None:
        """The job's AMQP priority property, if any."""
        priority: int | None = self._raw.header.properties.priority
        return priority

    def properties(self, names: Iterable[str]) -> dict[str, Any]:
        """These properties, by the names aio_pika.Message takes, as they were read."""
        properties = self._raw.header.properties
        return {name: getattr(properties, PAMQP_NAMES.get(name, name)) for name in names}


def epoch_s(stamp: dt.datetime) -> float:
    """An AMQP timestamp in epoch seconds: they are UTC, and the client library reads them naive."""
    return stamp.replace(tzinfo=stamp.tzinfo or dt.UTC).timestamp()


# The frame reader pamqp itself uses for a content header; read_properties_leniently() wraps it.
_read_header_strictly = pamqp.frame._unmarshal_header_frame
# A short string's most bytes: text read leniently is cut back to it, so that a copy can carry it.
SHORT_STRING_MAX_BYTES = 255
# Property names as the AMQP spec and a failed copy spell them, where pamqp's differ.
AMQP_NAMES = {"message_type": "type"}
PAMQP_NAMES = {amqp: pamqp for pamqp, amqp in AMQP_NAMES.items()}

Problems = list[str]


# The majors of the protocol libraries this adapter was written against, and the private names
# of theirs that it wraps or reads: an upgrade that moves one must stop ricochet at start, not
# let a delivery it would have read kill the connection later.
WRITTEN_FOR = {"pamqp": 4, "aiormq": 7}
PRIVATE_NAMES: tuple[tuple[str, object, str], ...] = (
    ("pamqp", pamqp.frame, "_unmarshal_header_frame"),
    ("pamqp", ContentHeader, "unmarshal"),
    ("pamqp", spec.Basic.Properties, "__slots__"),
    ("pamqp", spec.Basic.Properties, "flags"),
    ("pamqp", spec.Basic.Properties, "amqp_type"),
    ("pamqp", decode, "by_type"),
    ("aiormq", DeliveredMessage, "header"),
    ("aiormq", DeliveredMessage, "delivery"),
    ("aiormq", DeliveredMessage, "channel"),
)


def adapter_problems(
    versions: Mapping[str, str], names: Iterable[tuple[str, object, str]] = PRIVATE_NAMES
) -> list[str]:
    """What keeps this adapter from working with these installed versions (pure)."""
    problems = [
        f"{package} {versions[package]} is installed; ricochet is written for {package} {major}.x"
        for package, major in WRITTEN_FOR.items()
        if (parse_version(versions[package]) or ())[:1] != (major,)
    ]
    problems += [
        f"{package} {versions[package]} has no {getattr(owner, '__name__', owner)}.{name}"
        for package, owner, name in names
        if not _has(owner, name)
    ]
    return problems


def _has(owner: object, name: str) -> bool:
    """An attribute, or a field a class declares without a default (aiormq's DeliveredMessage)."""
    return hasattr(owner, name) or name in getattr(owner, "__annotations__", {})


def require_adapter() -> None:
    """Refuse to go on (ConfigError) with protocol libraries this adapter cannot work with."""
    versions = {package: metadata.version(package) for package in WRITTEN_FOR}
    problems = adapter_problems(versions)
    if problems:
        raise ConfigError("the AMQP libraries do not fit: " + "; ".join(problems))


def read_properties_leniently() -> None:
    """Have aiormq's connection reader keep a delivery whose properties pamqp refuses.

    pamqp (4.x) raises while it reads a content header whose short strings are not UTF-8 or
    whose timestamps no date can hold, and aiormq (7.x, the reader's FrameReceiver.get_frame
    calls pamqp.frame.unmarshal) closes the whole connection on it. Such a header is read again
    here, property by property: a short string with its undecodable bytes replaced (U+FFFD), a
    timestamp out of range as None, and the frame, the body and the delivery as usual. The
    properties say what was unreadable (LenientProperties.problems), so the consumer can fail
    the delivery. A header that is readable reads exactly as before; one broken beyond its
    values (truncated, an unknown field type) still closes the connection. The process has one
    pamqp, so this holds for every connection; calling it again changes nothing.
    """
    require_adapter()
    pamqp.frame._unmarshal_header_frame = _read_header


def _read_header(frame_data: bytes) -> ContentHeader:
    try:
        return _read_header_strictly(frame_data)
    except Exception as refused:  # pamqp's ValueError, and what datetime raises past its range
        properties = LenientProperties()
        header = ContentHeader(properties=properties)
        try:
            header.unmarshal(frame_data)
        except (struct.error, ValueError, IndexError):
            raise refused from None
        properties.problems = properties.problems or [str(refused)]
        return header


class LenientProperties(spec.Basic.Properties):
    """Message properties read as far as they can be; problems says what could not be."""

    problems: Problems

    def unmarshal(self, flags: int, data: bytes) -> None:
        self.problems = []
        for name in self.__slots__:
            if flags & self.flags[name]:
                amqp_type = self.amqp_type(name)
                read = LENIENT_READERS.get(amqp_type)
                where = AMQP_NAMES.get(name, name)
                consumed, value = (
                    read(data, where, self.problems) if read else decode.by_type(data, amqp_type)
                )
                setattr(self, name, value)
                data = data[consumed:]


def _short_str(data: bytes, where: str, problems: Problems) -> tuple[int, str]:
    end = 1 + data[0]
    return end, _text(data[1:end], where, problems)


def _text(raw: bytes, where: str, problems: Problems) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as error:
        problems.append(f"{where}: {error}")
    # A replacement character takes three bytes for the one it replaces.
    cut = raw.decode(errors="replace").encode()[:SHORT_STRING_MAX_BYTES]
    return cut.decode(errors="ignore")


def _timestamp(data: bytes, where: str, problems: Problems) -> tuple[int, dt.datetime | None]:
    try:
        return decode.timestamp(data)
    except (ValueError, OverflowError, OSError) as error:
        problems.append(f"{where}: {error}")
        return 8, None


def _table(data: bytes, where: str, problems: Problems) -> tuple[int, dict[str, Any]]:
    (length,) = struct.unpack_from(">I", data)
    end = 4 + length
    if end > len(data):
        raise ValueError("field table longer than its frame")
    table: dict[str, Any] = {}
    offset = 4
    while offset < end:
        key_end = offset + 1 + data[offset]
        raw_key = data[offset + 1 : key_end]
        key = _text(raw_key, f"{where} key {raw_key!r}", problems)
        consumed, table[key] = _value(data[key_end:], f"{where}[{key!r}]", problems)
        offset = key_end + consumed
    return end, table


def _headers(data: bytes, where: str, problems: Problems) -> tuple[int, dict[str, Any]]:
    """The headers table; one nested deeper than Python recurses is passed over whole (its
    length says where it ends), as a problem, never a reason to close the connection."""
    try:
        return _table(data, where, problems)
    except RecursionError:
        (length,) = struct.unpack_from(">I", data)
        problems.append(f"{where}: tables nested deeper than can be read")
        return 4 + length, {}


def _array(data: bytes, where: str, problems: Problems) -> tuple[int, list[Any]]:
    (length,) = struct.unpack_from(">I", data)
    end = 4 + length
    if end > len(data):
        raise ValueError("field array longer than its frame")
    items: list[Any] = []
    offset = 4
    while offset < end:
        consumed, item = _value(data[offset:], f"{where}[{len(items)}]", problems)
        items.append(item)
        offset += consumed
    return end, items


def _value(data: bytes, where: str, problems: Problems) -> tuple[int, Any]:
    """A field table's or array's value: the kinds that hold text or a timestamp read leniently,
    the others as pamqp reads them."""
    read = NESTED_READERS.get(data[:1])
    if read is None:
        return decode.embedded_value(data)
    consumed, value = read(data[1:], where, problems)
    return 1 + consumed, value


LenientReader = Callable[[bytes, str, Problems], tuple[int, Any]]
LENIENT_READERS: dict[str, LenientReader] = {
    "shortstr": _short_str,
    "timestamp": _timestamp,
    "table": _headers,
}
NESTED_READERS: dict[bytes, LenientReader] = {b"F": _table, b"A": _array, b"T": _timestamp}


# A message's properties as the protocol carries them.
Properties = spec.Basic.Properties
PERSISTENT = 2  # the delivery_mode of a message the broker writes to disk


def properties(
    *,
    content_type: str | None,
    message_id: str,
    message_type: str | None,
    headers: dict[str, Any],
    timestamp: dt.datetime,
    priority: int,
) -> Properties:
    """A persistent message's properties, as basic.publish takes them."""
    return Properties(
        content_type=content_type,
        delivery_mode=PERSISTENT,
        priority=priority,
        message_id=message_id,
        message_type=message_type,
        headers=headers,
        timestamp=timestamp,
    )


class Publisher:
    """The AMQP channel under an aio-pika channel with publisher confirms, where the Client
    publishes messages already built into their properties."""

    def __init__(self, channel: FramesChannel) -> None:
        self._channel = channel

    @classmethod
    async def under(cls, channel: AbstractChannel) -> "Publisher":
        return cls(await channel.get_underlay_channel())

    @property
    def is_closed(self) -> bool:
        return bool(self._channel.is_closed)

    async def publish(
        self,
        body: bytes,
        properties: Properties,
        routing_key: str,
        timeout_s: float | None,
        exchange: str = "",
        *,
        mandatory: bool = True,
    ) -> None:
        """Publish through the exchange (the default one: to the queue of that name), and wait
        for the confirm; PublishError when no queue took a mandatory one, DeliveryError when the
        broker refused it, TimeoutError when it has not confirmed it within timeout_s (aiormq's
        own timer, which it runs for every publish anyway)."""
        await self._channel.basic_publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            mandatory=mandatory,
            timeout=timeout_s,
        )


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

    async def consume(
        self,
        queue: str,
        on_delivery: Callable[[Delivery], object],
        arguments: Mapping[str, Any] | None = None,
    ) -> str:
        """Subscribe (with the consumer arguments given), handing each delivery to on_delivery;
        returns the consumer tag."""

        async def deliver(raw: DeliveredMessage) -> None:
            on_delivery(Delivery(raw))

        consumed = await self._channel.basic_consume(
            queue, deliver, arguments=None if arguments is None else dict(arguments)
        )
        return str(consumed.consumer_tag)

    async def settle(
        self, dead_letter: Sequence[int], multiple: int | None, acks: Sequence[int]
    ) -> None:
        """Settle deliveries of this channel, returning once the last frame is written: a nack
        without requeue for each tag of dead_letter (the broker dead-letters them), then an ack
        with multiple=True up to the tag multiple (if any), then an ack for each tag of acks.

        The broker reads a channel's frames in order, so a multiple ack written after a nack
        never settles that delivery as a success. Only the last frame waits to be written: the
        others go into the channel's queue behind one another, as aiormq's wait=False puts them.
        """
        channel = self._channel
        sends = [partial(channel.basic_nack, tag, requeue=False) for tag in dead_letter]
        if multiple is not None:
            sends.append(partial(channel.basic_ack, multiple, multiple=True))
        sends += [partial(channel.basic_ack, tag) for tag in acks]
        for send in sends[:-1]:
            await send(wait=False)
        if sends:
            await sends[-1]()

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


def header_frame_bytes(message: aio_pika.Message) -> int:
    """Bytes of the frame that carries a message's properties and headers (the content header):
    the broker closes the whole connection on one larger than its frame_max."""
    header = ContentHeader(body_size=len(message.body), properties=message.properties)
    return len(pamqp.frame.marshal(header, 1))


def table_size(table: Mapping[str, Any]) -> int:
    """Bytes of a header table as it travels in a frame."""
    return len(field_table(dict(table)))


def refusal(error: BaseException | None) -> str:
    """What the broker said when it did not confirm a publish (returned or nacked)."""
    frame = getattr(error, "frame", None)
    return getattr(frame, "reply_text", None) or type(frame).__name__


async def requeue_all(channel: AbstractChannel) -> None:
    """Hand every delivery the channel still holds back to its queue, in one basic.nack
    (delivery tag 0 with multiple: all of them, including any the client has not seen yet)."""
    underlay = await channel.get_underlay_channel()
    await underlay.basic_nack(delivery_tag=0, multiple=True, requeue=True)
