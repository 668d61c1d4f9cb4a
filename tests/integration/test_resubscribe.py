"""Staying subscribed: a consumer the broker cancels is subscribed again, and readiness says so."""

import json
from collections import Counter

from aio_pika.abc import AbstractChannel, AbstractConnection

from tests.recorder import Recorder
from tests.support import StartWorker, consumers, publish, readiness_at_each_log_line, wait_for


async def test_deleted_queue_is_declared_and_consumed_again(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """The queue is deleted under a running worker: it logs the broker's cancel, is not ready
    until it consumes again, declares the queue again, and the jobs published afterwards are
    done, without a reconnect."""
    recorder = Recorder()
    worker = await start_worker(recorder)
    with readiness_at_each_log_line(lambda: worker.lifecycle.ready) as lines:
        await channel.queue_delete(queue_name)
        await wait_for(lambda: consumers(connection, queue_name), 20, "the worker to consume")
    await wait_for(lambda: worker.lifecycle.ready, 20, "the worker to be ready again")
    ids = [f"j{i}" for i in range(5)]
    for message_id in ids:
        await publish(channel, queue_name, json.dumps({}), message_id=message_id)
    await wait_for(lambda: Counter(recorder.succeeded) == Counter(ids), 20, "every job to succeed")

    events = [(line["event"], line["ready"]) for line in lines]
    assert ("consumer cancelled by the broker", False) in events
    assert not any("reconnecting" in event for event, _ in events)
    assert (
        worker.metrics.registry.get_sample_value("ricochet_worker_consuming", {"queue": queue_name})
        == 1
    )
