"""Publishing one job to the main queue (for scripts and trying things out)."""

import json
import re
import uuid
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import PublishError

from app.errors import RicochetError


def header_value(text: str) -> Any:
    """K=V values from the command line: integers become integers, the rest stay strings."""
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def is_json(payload: str) -> bool:
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True


async def publish_job(
    connection: AbstractConnection,
    queue: str,
    payload: str,
    *,
    job_type: str | None = None,
    message_id: str | None = None,
    headers: dict[str, Any] | None = None,
) -> str:
    """Publish a persistent job with a publisher confirm; returns its message_id."""
    message_id = message_id or uuid.uuid4().hex
    message = aio_pika.Message(
        payload.encode(),
        message_id=message_id,
        type=job_type,
        headers=headers or {},
        content_type="application/json" if is_json(payload) else "text/plain",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        await publish_to_queue(channel, queue, message)
    finally:
        await channel.close()
    return message_id


async def publish_to_queue(channel: AbstractChannel, queue: str, message: aio_pika.Message) -> None:
    """Publish to a queue through the default exchange, confirmed; a missing queue is an error.

    The channel must have publisher confirms and on_return_raises.
    """
    try:
        await channel.default_exchange.publish(message, routing_key=queue, mandatory=True)
    except PublishError:
        raise RicochetError(
            f"queue {queue!r} does not exist: run 'ricochet topology' or start a worker first"
        ) from None
