"""Enqueueing from Python without ricochet, with pika: the wire contract by hand.

Usage: python pika_producer.py TYPE JSON-PAYLOAD [MESSAGE-ID [MAX-RETRIES]]
"""

import os
import sys

import pika
from pika.adapters.blocking_connection import BlockingChannel


def enqueue(
    channel: BlockingChannel,
    queue: str,
    job_type: str,
    payload: bytes,
    message_id: str | None = None,
    max_retries: int | None = None,
) -> None:
    """Publish one job; on a channel in confirm mode, returns once the broker has it."""
    channel.basic_publish(
        exchange="",  # the default exchange: the routing key is the queue's name
        routing_key=queue,
        body=payload,
        properties=pika.BasicProperties(
            delivery_mode=pika.DeliveryMode.Persistent,
            type=job_type,
            message_id=message_id,  # the idempotency and cancel key: give one
            content_type="application/json",
            headers={} if max_retries is None else {"max-retries": max_retries},
        ),
        mandatory=True,  # no such queue: UnroutableError instead of a job lost
    )


if __name__ == "__main__":
    job_type, payload, *rest = sys.argv[1:]
    url = os.environ.get("RICOCHET_AMQP_URL", "amqp://guest:guest@localhost:5672/")
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()  # every publish waits for the broker's confirm
        enqueue(
            channel,
            os.environ.get("RICOCHET_QUEUE", "jobs"),
            job_type,
            payload.encode(),
            message_id=rest[0] if rest else None,
            max_retries=int(rest[1]) if len(rest) > 1 else None,
        )
