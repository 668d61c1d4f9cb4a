"""No delivery, however formed, stops a worker from consuming (SPEC 24): what cannot be read
goes to the failed queue as permanent saying so, what can runs as the contract reads it, a copy
the worker publishes fits the frame, and a producer cannot forge ricochet's own bookkeeping."""

import asyncio
import json
import struct
import sys

import pamqp.frame
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq import spec
from pamqp.header import ContentHeader
from ricochet import Job, RetryLater
from ricochet.broker import amqp
from ricochet.headers import RETRIES
from ricochet.names import Names

from tests.recorder import Recorder
from tests.support import (
    AMQP_URL,
    StartWorker,
    depth,
    publish,
    readiness_at_each_log_line,
    take,
    wait_for,
)

# Far deeper than Python's recursion limit: json and the frame decoder both recurse per level.
DEPTH = 5_000


def nested_table(depth: int) -> bytes:
    """A header table {"n": {"n": ... {} ...}} nested depth levels deep, as AMQP encodes it, built
    from the inside out (an encoder that recurses could not write it)."""
    table = b""
    for _ in range(depth):
        table = b"\x01nF" + struct.pack(">I", len(table)) + table
    return table


async def test_a_body_nested_too_deeply_fails_as_permanent_and_the_worker_goes_on(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Three bodies of JSON nested deeper than the parser recurses, with no type property, at
    prefetch 3: each fails as permanent (its body is not JSON the worker can read), and the job
    behind them runs."""
    recorder = Recorder()
    await start_worker(recorder, prefetch=3, max_retries=1)
    for i in range(3):
        await publish(channel, queue_name, b"[" * DEPTH, message_id=f"deep-{i}")
    await publish(channel, queue_name, json.dumps({}), message_id="after")
    copies = await take(channel, Names(queue_name).failed, 3, timeout_s=15)
    await wait_for(lambda: "after" in recorder.succeeded, 10, "the job behind them to run")
    assert sorted(c.message_id or "" for c in copies) == ["deep-0", "deep-1", "deep-2"]
    for copy in copies:
        assert copy.headers["failed-kind"] == "permanent"
        assert str(copy.headers["failed-reason"]).startswith("InvalidPayload: body is not")
        assert copy.body == b"[" * DEPTH
    assert await depth(channel, queue_name) == 0


async def test_a_max_retries_of_thousands_of_digits_runs_as_read(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A max-retries header of 5,000 digits at the head of the queue: a budget that large lowers
    nothing, so the job runs with the worker's own budget, and the jobs behind it run too."""
    recorder = Recorder()
    await (await start_worker(recorder)).stop()  # the queue is declared, and nobody consumes
    await publish(
        channel, queue_name, json.dumps({}), message_id="huge", headers={"max-retries": "9" * 5_000}
    )
    for i in range(3):
        await publish(channel, queue_name, json.dumps({}), message_id=f"good-{i}")
    await start_worker(recorder, max_retries=2)
    await wait_for(lambda: len(recorder.succeeded) == 4, 15, "all four jobs to run")
    assert [a.max_attempts for a in recorder.seen["huge"]] == [3]


async def test_a_header_table_nested_too_deeply_fails_as_permanent_and_the_connection_stays(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Headers nested deeper than any decoder recurses: the delivery goes to the failed queue as
    permanent, naming the headers, with its body and other properties; the worker keeps its
    connection and the next job runs."""
    recorder = Recorder()
    worker = await start_worker(recorder, max_retries=1)
    await publish_nested_headers(queue_name, "deep-headers")
    await publish(channel, queue_name, json.dumps({}), message_id="after")
    [copy] = await take(channel, Names(queue_name).failed, 1, timeout_s=15)
    await wait_for(lambda: "after" in recorder.succeeded, 10, "the next job to run")
    assert copy.message_id == "deep-headers"
    assert copy.headers["failed-kind"] == "permanent"
    assert "headers" in str(copy.headers["failed-reason"])
    assert worker.lifecycle.ready
    assert list(recorder.seen) == ["after"]


# Publishes one message with headers nested DEPTH levels deep. In a process of its own: the
# encoder recurses once per level, and a recursion limit raised for it would hold for the worker
# in this process too, which must read the message under the usual one.
PUBLISH_NESTED = """
import asyncio, struct, sys
import aio_pika
from aiormq import spec
from pamqp import decode
from tests.integration.test_hostile_deliveries import DEPTH, nested_table

async def main(url, queue, message_id):
    raw = nested_table(DEPTH)
    _, headers = decode.field_table(struct.pack(">I", len(raw)) + raw)
    connection = await aio_pika.connect(url)
    channel = await (await connection.channel()).get_underlay_channel()
    properties = spec.Basic.Properties(message_id=message_id, delivery_mode=2, headers=headers)
    await channel.basic_publish(b"{}", routing_key=queue, properties=properties)
    await connection.close()

sys.setrecursionlimit(4 * DEPTH + 1_000)
asyncio.run(main(*sys.argv[1:]))
"""


async def publish_nested_headers(queue: str, message_id: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PUBLISH_NESTED, AMQP_URL, queue, message_id
    )
    assert await process.wait() == 0


async def test_a_forged_ricochet_retries_header_is_ignored(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A producer's ricochet-retries header on a fresh job buys it no attempts: it runs as attempt
    1 of its budget and retries through every tier, never seeing the forged count."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=2, retry_delay_ms=20)
    await publish(
        channel, queue_name, json.dumps({"fail": 2}), message_id="forged", headers={RETRIES: 2}
    )
    await wait_for(lambda: "forged" in recorder.succeeded, 15, "the job to succeed")
    assert recorder.attempts("forged") == [1, 2, 3]
    assert RETRIES not in recorder.seen["forged"][0].headers


async def test_a_copy_that_cannot_fit_the_frame_fails_as_permanent_and_nothing_else_suffers(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A job whose headers fill its frame so nearly that the copy sent to wait out a RetryLater
    (with the count of retries it carries) would not fit: it fails as permanent saying why, the
    worker keeps its connection, and the jobs published beside it run once each."""
    ran: list[str | None] = []

    async def handler(job: Job) -> None:
        ran.append(job.message_id)
        if job.message_id == "full":
            raise RetryLater(0.05)

    worker = await start_worker(handler, max_retries=2, prefetch=4)
    frame_max = amqp.frame_max(connection)
    frames = await channel.get_underlay_channel()

    def properties(filler: int) -> spec.Basic.Properties:
        return spec.Basic.Properties(
            message_id="full", delivery_mode=2, headers={"filler": "f" * filler}
        )

    def size(filler: int) -> int:
        return len(pamqp.frame.marshal(ContentHeader(1, 2, properties(filler)), 1))

    filler = frame_max - size(0)  # then down to the largest header frame that still fits
    while size(filler) > frame_max:
        filler -= 1
    with readiness_at_each_log_line(lambda: worker.lifecycle.ready) as lines:
        await frames.basic_publish(b"{}", routing_key=queue_name, properties=properties(filler))
        for i in range(3):
            await publish(channel, queue_name, json.dumps({}), message_id=f"beside-{i}")
        [copy] = await take(channel, Names(queue_name).failed, 1, timeout_s=15)
        await wait_for(lambda: len(ran) == 4, 15, "the jobs beside it to run")
    assert copy.message_id == "full"
    assert copy.headers["failed-kind"] == "permanent"
    assert "frame" in str(copy.headers["failed-reason"])
    assert sorted(map(str, ran)) == ["beside-0", "beside-1", "beside-2", "full"]
    assert not any("reconnecting" in line["event"] for line in lines)
    assert await depth(channel, queue_name) == 0
