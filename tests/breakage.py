"""Ways an operator, a producer or an old deployment breaks a declared topology, for doctor
and the worker to find, and what mends it."""

import json
import re
import uuid
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelPreconditionFailed

from tests.broker import BROKER
from tests.support import publish, wait_for


async def unbind(channel: AbstractChannel, source: str, queue: str, routing_key: str = "") -> None:
    """Remove a queue's binding, as someone clicking Unbind in the management UI."""
    await (await channel.get_queue(queue, ensure=False)).unbind(source, routing_key=routing_key)


async def unbind_exchange(channel: AbstractChannel, source: str, destination: str) -> None:
    """Remove an exchange's binding to another exchange, as in the management UI."""
    await (await channel.get_exchange(destination, ensure=False)).unbind(source)


async def redeclare(channel: AbstractChannel, name: str, arguments: dict[str, Any]) -> None:
    """Delete a queue and declare it again with other arguments (say, an old tier's TTL)."""
    await channel.queue_delete(name)
    await channel.declare_queue(name, durable=True, arguments=arguments)


async def declare_plain(connection: AbstractConnection, queue: str) -> None:
    """Put a queue in conflict with its worker's settings, as a producer that declares the
    queues it publishes to does: delete it and declare it again as a plain durable classic
    queue; again if its worker declared its own in between."""

    async def plain() -> bool:
        channel = await connection.channel()
        try:
            await channel.queue_delete(queue)
            await channel.declare_queue(queue, durable=True)
        except ChannelPreconditionFailed:
            return False
        await channel.close()
        return True

    await wait_for(plain, 20, f"{queue} declared as a plain queue")


async def delete_queue(connection: AbstractConnection, queue: str) -> None:
    """Delete the queue (what mends a conflict: its worker declares it again)."""
    channel = await connection.channel()
    await channel.queue_delete(queue)
    await channel.close()


async def fill(channel: AbstractChannel, queue: str, n: int) -> None:
    """Put n messages in a queue."""
    for i in range(n):
        await publish(channel, queue, f"message {i}")


def add_policy(queue: str, definition: dict[str, Any]) -> str:
    """A policy that applies to this one queue only (the broker's other queues keep theirs);
    returns its name for remove_policy."""
    name = f"doctor-test-{uuid.uuid4().hex[:8]}"
    BROKER.rabbitmqctl(
        "set_policy",
        name,
        f"^{re.escape(queue)}$",
        json.dumps(definition),
        "--apply-to",
        "queues",
        "--priority",
        "100",
    )
    return name


def remove_policy(name: str) -> None:
    BROKER.rabbitmqctl("clear_policy", name)
