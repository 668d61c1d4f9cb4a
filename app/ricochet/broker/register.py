"""The register: a queue that keeps one message, the newest written (SPEC 25).

A store that needs only its last value (the topology's record, the cancels' snapshot) keeps it
as the one message of a queue of length one that drops its head. It is read without being taken:
a get, handed back at once (before it is looked at), so that a reader holds it from the others
for a round trip only; one that finds the queue empty meanwhile looks again for a while.

Anyone who may publish in the vhost can write a register. A reader that is told who may have
written it (`writer`) takes only a value the broker vouches for: one published with that
`user_id`, which RabbitMQ refuses from a connection of any other user. A value written by
another user, or by nobody named, is passed over with a warning, as if there were none.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
from aio_pika.abc import AbstractChannel

from ricochet.log import get_logger

log = get_logger("ricochet.register")

LOOK_EVERY_S = 0.05
# A register of ricochet's own declaring (the snapshot's is a queue of the plan): a classic queue
# counts no deliveries, so reading spends nothing.
ARGUMENTS: dict[str, Any] = {
    "x-queue-type": "classic",
    "x-max-length": 1,
    "x-overflow": "drop-head",
}


def amqp_user(amqp_url: str) -> str:
    """The user a connection to this URL authenticates as (AMQP's default: guest) (pure)."""
    username = urlsplit(amqp_url).username
    return unquote(username) if username else "guest"


async def declare_register(channel: AbstractChannel, name: str) -> None:
    """Declare a register of ricochet's own (durable; as it is when it exists)."""
    await channel.declare_queue(name, durable=True, arguments=ARGUMENTS)


async def write_register(
    channel: AbstractChannel,
    name: str,
    body: bytes,
    *,
    writer: str | None = None,
    content_type: str | None = None,
) -> None:
    """Make body the register's value (the one before is dropped), as writer when given (the
    broker refuses a writer that is not the connection's user)."""
    message = aio_pika.Message(
        body,
        content_type=content_type,
        user_id=writer,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
    await channel.default_exchange.publish(message, routing_key=name)


async def read_register(
    channel: AbstractChannel,
    name: str,
    patience_s: float,
    *,
    writer: str | None = None,
    on_empty: Callable[[], Awaitable[object]] | None = None,
    needless: Callable[[], bool] | None = None,
) -> bytes | None:
    """The register's value, left in it; None when it is empty for patience_s, or (with writer)
    not written by writer. on_empty, when given, is awaited once if the first look finds it
    empty, before it looks again (what a reader can start meanwhile); the looks end early once
    needless() says the value is no longer needed. ChannelNotFoundEntity when there is no such
    queue."""
    queue = await channel.get_queue(name, ensure=False)
    give_up = time.monotonic() + patience_s
    while (message := await queue.get(no_ack=False, fail=False)) is None:
        if on_empty is not None:
            await on_empty()
            on_empty = None
        if time.monotonic() >= give_up or (needless is not None and needless()):
            return None
        await asyncio.sleep(LOOK_EVERY_S)
    await message.nack(requeue=True)
    if writer is not None and message.user_id != writer:
        log.warning(
            "register not written by this user: passed over",
            register=name,
            written_by=message.user_id,
            user=writer,
        )
        return None
    return message.body
