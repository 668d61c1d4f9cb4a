"""A delivery read from the frames holds what aio-pika would read, and the handler's Job holds
what the publisher sent."""

from aio_pika.abc import AbstractChannel
from aio_pika.message import IncomingMessage

from app import Job
from app.delivery import Delivery
from tests.support import publish, wait_for

FIELDS = (
    "body",
    "headers",
    "message_id",
    "type",
    "correlation_id",
    "content_type",
    "routing_key",
    "redelivered",
    "delivery_tag",
)
HEADERS = {"tenant": "acme", "n": 7, "raw": bytearray(b"\xff\x00"), "nested": {"k": [1, "two"]}}


async def publish_sample(channel: AbstractChannel, queue: str) -> None:
    """A message with every property a job reads, and header values of several AMQP types."""
    await publish(
        channel,
        queue,
        b'{"a": 1}',
        headers=HEADERS,
        message_id="m-1",
        type="invoice.paid",
        correlation_id="c-9",
        content_type="application/json",
    )


async def test_delivery_reads_what_aio_pika_reads(
    channel: AbstractChannel, queue_name: str
) -> None:
    """Field by field, on a first delivery and on a redelivery of the same message."""
    await channel.declare_queue(queue_name, durable=False, auto_delete=True)
    await publish_sample(channel, queue_name)
    amqp = await channel.get_underlay_channel()
    for redelivered in (False, True):
        raw = await amqp.basic_get(queue_name)
        delivery = Delivery(raw)
        read_by_aio_pika = IncomingMessage(raw)
        assert {f: getattr(delivery, f) for f in FIELDS} == {
            f: getattr(read_by_aio_pika, f) for f in FIELDS
        }
        assert (delivery.headers, delivery.redelivered) == (HEADERS, redelivered)
        await amqp.basic_nack(delivery.delivery_tag, requeue=True)


async def test_the_job_holds_what_was_published(
    start_worker, channel: AbstractChannel, queue_name: str
) -> None:
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)

    await start_worker(handler)
    await publish_sample(channel, queue_name)
    await wait_for(lambda: bool(seen), 10, "the job to run")
    [job] = seen
    assert (job.body, job.payload, job.headers) == (b'{"a": 1}', {"a": 1}, HEADERS)
    assert (job.message_id, job.type, job.correlation_id, job.content_type) == (
        "m-1",
        "invoice.paid",
        "c-9",
        "application/json",
    )
    assert (job.routing_key, job.attempt) == (queue_name, 1)
