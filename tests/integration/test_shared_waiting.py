"""The delays' levels are the vhost's, shared by every ricochet queue (SPEC 18): a waiting job's
route carries its queue, so names with dots never capture each other's jobs, and a job whose
queue is deleted while it waits ends in ricochet.orphans, never lost and never in the way."""

import datetime as dt
import json
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job

from tests.support import (
    InProcessWorker,
    StartWorker,
    delete_topology,
    depth,
    make_settings,
    orphans_tally,
    publish,
    wait_for,
)


def soon(seconds: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()


@pytest.fixture
async def dotted(queue_name: str, connection: AbstractConnection) -> AsyncIterator[str]:
    """A second queue whose name ends in the test's own: a.<queue_name>."""
    name = f"a.{queue_name}"
    yield name
    await delete_topology(connection, name)


async def test_a_dotted_name_never_captures_another_queues_scheduled_jobs(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, dotted: str
) -> None:
    """Workers on x and a.x side by side, each with jobs scheduled through the shared levels:
    each job runs once, on the worker of its own queue."""
    ran: dict[str, list[str | None]] = {queue_name: [], dotted: []}

    def recording(queue: str):  # type: ignore[no-untyped-def]
        async def handler(job: Job) -> None:
            ran[queue].append(job.message_id)

        return handler

    await start_worker(recording(queue_name))
    other = await InProcessWorker(make_settings(dotted), recording(dotted)).start()
    try:
        for queue in (queue_name, dotted):
            for i in range(3):
                await publish(
                    channel,
                    queue,
                    json.dumps({}),
                    message_id=f"{queue}-{i}",
                    headers={"run-at": soon(1)},
                )
        await wait_for(lambda: sum(map(len, ran.values())) == 6, 20, "the six jobs to run")
    finally:
        await other.stop()
    for queue, ids in ran.items():
        assert sorted(map(str, ids)) == [f"{queue}-{i}" for i in range(3)]


async def test_a_job_whose_queue_is_deleted_while_it_waits_goes_to_the_orphans(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """The queue goes while its job waits in the shared levels: when due, the job goes to
    ricochet.orphans whole (never dropped, never held by the broker's dead-letter worker)."""
    worker = await start_worker(lambda job: None)
    message_id = f"orphan-{queue_name}"
    await publish(channel, queue_name, b"{}", message_id=message_id, headers={"run-at": soon(3)})

    async def taken() -> bool:
        return await depth(channel, queue_name) == 0

    await wait_for(taken, 10, "the worker to take the job")
    await worker.stop()  # it drains: the job was sent to wait, and acked
    await delete_topology(connection, queue_name)

    tally: Counter[str] = Counter()

    async def orphaned() -> bool:
        await orphans_tally(channel, tally, {message_id})
        return message_id in tally

    await wait_for(orphaned, 20, "the job in ricochet.orphans")
