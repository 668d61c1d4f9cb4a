"""Every delivery ends settled once: never lost, never settled twice, whatever the broker's
state or the delivery's bytes."""

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from aio_pika import DeliveryMode
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq import spec
from aiormq.exceptions import ChannelPreconditionFailed
from ricochet import Job
from ricochet.broker.amqp import CONNECTION_ERRORS, Frames
from ricochet.errors import PermanentError
from ricochet.names import Names

from tests.recorder import Recorder
from tests.support import (
    ForeignBytes,
    ForeignTimestamp,
    StartWorker,
    depth,
    publish,
    readiness_at_each_log_line,
    take,
    wait_for,
)


async def test_failed_copy_reaches_the_failed_queue_when_it_is_unbound(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """With the failed queue unbound from its exchange, a failed job still lands in it (and its
    event in the events queue): only the failed queue's own confirm lets the original go."""
    n = Names(queue_name)
    await start_worker(Recorder())
    failed = await channel.declare_queue(n.failed, passive=True)
    await failed.unbind(n.failed, routing_key="")
    await publish(channel, queue_name, json.dumps({"fail": "permanent"}), message_id="p-1")
    [copy] = await take(channel, n.failed, 1)
    [event] = await take(channel, n.events, 1)
    assert copy.message_id == event.message_id == "p-1"
    assert copy.headers["failed-kind"] == event.headers["failed-kind"] == "permanent"


async def test_job_stays_in_its_queue_while_the_failed_queue_is_gone(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """With the failed queue deleted, the failed job is neither acked nor announced: it comes
    back to the main queue when its worker stops."""
    n = Names(queue_name)
    recorder = Recorder()
    worker = await start_worker(recorder, shutdown_timeout_s=0.5)
    await channel.queue_delete(n.failed)
    await publish(channel, queue_name, json.dumps({"fail": "permanent"}), message_id="p-2")
    await wait_for(lambda: recorder.attempts("p-2") == [1], 10, "the job to run")
    await asyncio.sleep(1)  # the copy is refused, then published again after a pause
    await worker.stop()

    async def back() -> bool:
        return await depth(channel, queue_name) == 1

    await wait_for(back, 10, "the job back in the main queue")
    assert await depth(channel, n.events) == 0


async def test_a_loop_turn_s_settling_dead_letters_and_acks_in_order(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """The settler's frames of a loop turn, on the broker: the nacks sent ahead of a multiple
    ack that reaches past their tags are dead-lettered, not acked; every other delivery is
    acked, none comes back; settling on the closed channel then raises what the settler reads
    as the channel gone."""
    n = Names(queue_name)
    await channel.declare_queue(n.failed, durable=True)
    await channel.declare_queue(
        queue_name,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": n.failed},
    )
    for i in range(1, 7):
        await publish(channel, queue_name, b"{}", message_id=f"m{i}")
    consuming = await connection.channel()
    await consuming.set_qos(prefetch_count=10)
    frames = await Frames.under(consuming)
    tags: dict[str | None, int] = {}
    await frames.consume(queue_name, lambda d: tags.update({d.message_id: d.delivery_tag}))
    await wait_for(lambda: len(tags) == 6, 10, "six deliveries")
    await frames.settle([tags["m2"], tags["m5"]], tags["m4"], [tags["m6"]])
    await consuming.close()  # what is still unsettled goes back to the queue
    assert sorted(m.message_id or "" for m in await take(channel, n.failed, 2)) == ["m2", "m5"]
    await asyncio.sleep(0.5)
    assert (await depth(channel, queue_name), await depth(channel, n.failed)) == (0, 0)
    with pytest.raises(CONNECTION_ERRORS):
        await frames.settle([], None, [tags["m1"]])


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    ("headers", "delivery_mode", "error", "reason"),
    [
        ({"max-retries": "²"}, 2, PermanentError("no"), "PermanentError: no"),
        ({}, 0, PermanentError("no"), "PermanentError: no"),
        ({}, 3, PermanentError("no"), "PermanentError: no"),
        ({}, 2, Unprintable(), "Unprintable: <exception str() failed>"),
    ],
    ids=["superscript-max-retries", "delivery-mode-0", "delivery-mode-3", "unprintable-error"],
)
async def test_odd_delivery_still_ends_in_the_failed_queue(
    start_worker: StartWorker,
    channel: AbstractChannel,
    queue_name: str,
    headers: dict[str, Any],
    delivery_mode: int,
    error: Exception,
    reason: str,
) -> None:
    """A header, a property or an exception the worker cannot read as it expects does not
    leave the delivery unsettled: the job fails into the failed queue like any other."""

    async def handler(job: Job) -> None:
        raise error

    await start_worker(handler, max_retries=0)
    properties = spec.Basic.Properties(message_id="odd-1", headers=headers)
    properties.delivery_mode = delivery_mode  # past pamqp's check: other clients send 0 or 3
    frames = await channel.get_underlay_channel()
    try:
        await frames.basic_publish(b"{}", routing_key=queue_name, properties=properties)
    except ChannelPreconditionFailed:  # RabbitMQ 3 refuses the publish, so never delivers one
        pytest.skip("the broker refuses this delivery mode")
    [copy] = await take(channel, Names(queue_name).failed, 1, timeout_s=10)
    assert copy.headers["failed-reason"] == reason
    assert copy.delivery_mode == DeliveryMode.PERSISTENT
    assert await depth(channel, queue_name) == 0


FAR_FUTURE = ForeignTimestamp(2000, 1, 1, tzinfo=dt.UTC)


NOT_UTF8 = "'utf-8' codec can't decode byte"


@pytest.mark.parametrize(
    ("properties", "unreadable"),
    [
        (
            {"message_id": "odd-ts", "timestamp": FAR_FUTURE},
            "timestamp: year 146140482 is out of range",
        ),
        (
            {"message_id": ForeignBytes(b"odd-\xff")},
            f"message_id: {NOT_UTF8} 0xff in position 4: invalid start byte",
        ),
        (
            {"message_id": "odd-type", "message_type": ForeignBytes(b"\xc3(")},
            f"type: {NOT_UTF8} 0xc3 in position 0: invalid continuation byte",
        ),
        (
            {"message_id": "odd-ct", "content_type": ForeignBytes(b"text/\xff")},
            f"content_type: {NOT_UTF8} 0xff in position 5: invalid start byte",
        ),
        (
            {"message_id": "odd-key", "headers": {ForeignBytes(b"k\xff"): "v"}},
            f"headers key b'k\\xff': {NOT_UTF8} 0xff in position 1: invalid start byte",
        ),
        (
            {"message_id": "odd-when", "headers": {"when": FAR_FUTURE}},
            "headers['when']: year 146140482 is out of range",
        ),
    ],
    ids=[
        "timestamp-past-9999",
        "message-id-not-utf8",
        "type-not-utf8",
        "content-type-not-utf8",
        "header-key-not-utf8",
        "header-timestamp-past-9999",
    ],
)
async def test_delivery_with_undecodable_properties_fails_and_the_connection_stays(
    start_worker: StartWorker,
    channel: AbstractChannel,
    queue_name: str,
    properties: dict[str, Any],
    unreadable: str,
) -> None:
    """Properties the client library cannot decode (a short string that is not UTF-8, a timestamp
    past the year 9999), which the broker passes on as they were sent: the delivery goes to the
    failed queue with its body intact and a reason that says so, the worker keeps its connection,
    and the job published after it runs."""
    recorder = Recorder()
    worker = await start_worker(recorder, max_retries=2)
    body = b"\x00\xff not JSON, kept as sent"
    frames = await channel.get_underlay_channel()
    with readiness_at_each_log_line(lambda: worker.lifecycle.ready) as lines:
        await frames.basic_publish(
            body, routing_key=queue_name, properties=spec.Basic.Properties(**properties)
        )
        await publish(channel, queue_name, json.dumps({}), message_id="after")
        [copy] = await take(channel, Names(queue_name).failed, 1, timeout_s=10)
        await wait_for(lambda: recorder.succeeded == ["after"], 10, "the next job to succeed")

    assert copy.body == body
    assert copy.message_id == properties["message_id"]  # what could be read of it
    assert copy.headers["failed-kind"] == "permanent"
    assert (
        copy.headers["failed-reason"]
        == f"InvalidProperties: properties could not be decoded: {unreadable}"
    )
    assert list(recorder.seen) == ["after"]
    assert not any("reconnecting" in line["event"] for line in lines)
    assert await depth(channel, queue_name) == 0
