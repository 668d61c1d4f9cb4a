"""What a passive declare tells (nothing is consumed, nothing declared): a queue's depth and
consumers, whether an exchange exists; and whether a queue exists, asked without an error."""

from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelNotFoundEntity

from ricochet.broker.publish import publish_to_queue
from ricochet.errors import MissingQueue
from ricochet.headers import PROBE


@dataclass(frozen=True)
class Depth:
    """Messages ready in a queue and consumers on it, as the broker reports them."""

    messages: int
    consumers: int


async def read_depth(channel: AbstractChannel, queue: str) -> Depth | None:
    """The queue's depth, or None when it does not exist (the broker then closes the channel)."""
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except ChannelNotFoundEntity:
        return None
    ok = declared.declaration_result
    return Depth(ok.message_count or 0, ok.consumer_count or 0)


async def exchange_exists(channel: AbstractChannel, name: str) -> bool:
    """Whether the exchange exists (when it does not, the broker closes the channel)."""
    try:
        await channel.get_exchange(name, ensure=True)
    except ChannelNotFoundEntity:
        return False
    return True


async def queue_exists(channel: AbstractChannel, queue: str) -> bool:
    """Whether the queue exists, asked on a confirming channel by a mandatory message that
    expires at once: the broker returns it when no queue takes it. A passive declare of a
    missing queue is an error that the broker logs, and that closes the channel: this one is
    for a question asked again and again (as the schedules' lead is, broker/lead.py)."""
    try:
        await publish_to_queue(
            channel, queue, aio_pika.Message(b"", headers={PROBE: 1}, expiration=0)
        )
    except MissingQueue:
        return False
    return True


class KeptChannel:
    """A channel kept from one use to the next, opened again only once the broker closed it (as
    it does after a passive declare of a missing queue, or a refused declaration)."""

    def __init__(self, connection: AbstractConnection, *, confirming: bool = False) -> None:
        self._connection = connection
        self._confirming = confirming  # publishes confirmed, and raising when returned
        self._channel: AbstractChannel | None = None

    async def get(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(
                publisher_confirms=self._confirming, on_return_raises=self._confirming
            )
        return self._channel

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()
