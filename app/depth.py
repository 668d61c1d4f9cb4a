"""A queue's depth and consumers, read with a passive declare (nothing is consumed)."""

from dataclasses import dataclass

from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import ChannelNotFoundEntity


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
