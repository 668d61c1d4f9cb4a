"""Failed copies for tests: published to the Q.failed exchange, shaped like the consumer's."""

import datetime as dt
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel
from ricochet.delivery.failed import Failure, failed_headers
from ricochet.delivery.retry import FailureKind
from ricochet.names import Names


async def publish_failed(
    channel: AbstractChannel,
    queue: str,
    message_id: str,
    error: BaseException,
    *,
    job_type: str = "report",
    kind: FailureKind = FailureKind.PERMANENT,
    headers: dict[str, Any] | None = None,
) -> None:
    """Publish one failed copy (body {"id": message_id}) to the failed exchange, confirmed."""
    exchange = await channel.get_exchange(Names(queue).failed, ensure=False)
    await exchange.publish(
        aio_pika.Message(
            f'{{"id": "{message_id}"}}'.encode(),
            message_id=message_id,
            type=job_type,
            content_type="application/json",
            headers=failed_headers(
                headers or {},
                Failure(error),
                kind,
                retry_count=0,
                queue=queue,
                routing_key=queue,
                now=dt.datetime.now(dt.UTC),
            ),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        ),
        routing_key="",
    )
