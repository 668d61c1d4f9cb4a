"""The handler's Job holds what the publisher sent (tests/unit/test_amqp.py reads the frames)."""

from aio_pika.abc import AbstractChannel
from ricochet import Job

from tests.support import StartWorker, publish, wait_for

HEADERS = {"tenant": "acme", "n": 7, "raw": bytearray(b"\xff\x00"), "nested": {"k": [1, "two"]}}


async def test_the_job_holds_what_was_published(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)

    await start_worker(handler)
    await publish(
        channel,
        queue_name,
        b'{"a": 1}',
        headers=HEADERS,
        message_id="m-1",
        type="invoice.paid",
        correlation_id="c-9",
        content_type="application/json",
    )
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
