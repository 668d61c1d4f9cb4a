"""What RabbitMQ 4 changed under ricochet (a quorum delivery limit of 20, its own x-death
counting), checked on whichever broker the suite runs against: every broker must give the same
answers."""

import json
import shlex

from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.amqp import broker_version
from ricochet.broker.declare import declare
from ricochet.broker.plan import plan
from ricochet.names import Names
from ricochet.ops.replay import replay
from ricochet.ops.selection import Selection
from structlog.testing import capture_logs

from tests.broker import BROKER
from tests.integration.failures import publish_failed
from tests.recorder import Recorder
from tests.support import StartWorker, depth, make_settings, publish, take, wait_depth, wait_for

# More than RabbitMQ 4's default quorum delivery limit of 20.
HAND_BACKS = 25


async def hand_back(channel: AbstractChannel, queue: str, times: int) -> int:
    """Take the oldest message and return it with basic.reject(requeue=true), as a browsing tool
    or a crashing consumer does, `times` times; how many times there was one to take."""
    q = await channel.declare_queue(queue, passive=True)
    for taken in range(times):
        message = await q.get(fail=False)
        if message is None:
            return taken
        await message.reject(requeue=True)
    return times


async def test_failed_copy_handed_back_25_times_is_kept(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """A failed copy rejected with requeue 25 times is still in Q.failed (RabbitMQ 4 drops a
    quorum queue's message after 20 unless the queue lifts its delivery limit)."""
    names = Names(queue_name)
    await declare(connection, make_settings(queue_name))
    await publish_failed(channel, queue_name, "m1", ValueError("no rows"))
    await wait_depth(channel, names.failed, 1)
    assert await hand_back(channel, names.failed, HAND_BACKS) == HAND_BACKS
    [copy] = await take(channel, names.failed, 1)
    assert copy.message_id == "m1"


async def test_replay_dry_run_25_times_loses_no_copy(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """Each dry run holds every copy and hands it back when it closes its channel: 25 of them
    in a row leave every copy in Q.failed."""
    names = Names(queue_name)
    await declare(connection, make_settings(queue_name))
    ids = ["m1", "m2", "m3"]
    for message_id in ids:
        await publish_failed(channel, queue_name, message_id, ValueError("no rows"))
    await wait_depth(channel, names.failed, len(ids))
    for _ in range(HAND_BACKS):
        result = await replay(connection, names, Selection(), dry_run=True)
        assert sorted(f.message_id or "" for f in result.selected) == ids
        await wait_depth(channel, names.failed, len(ids))
    kept = await take(channel, names.failed, len(ids))
    assert sorted(str(m.message_id) for m in kept) == ids


async def test_job_retried_through_25_tiers_never_meets_the_delivery_limit(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Every retry is a new message in the main queue, so a job that fails 25 times and then
    succeeds goes through all 25 tiers, past RabbitMQ 4's limit of 20 deliveries."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=25, retry_delay_ms=10, retry_delay_multiplier=1.0)
    await publish(channel, queue_name, json.dumps({"fail": 25}), message_id="stubborn")
    await wait_for(lambda: "stubborn" in recorder.succeeded, 60, "the 26th attempt to succeed")
    assert recorder.attempts("stubborn") == list(range(1, 27))
    assert await depth(channel, Names(queue_name).failed) == 0


async def test_client_set_death_counts_the_same_on_every_broker(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A publisher's well-formed x-death claiming two rejections from Q: RabbitMQ 3 would count
    on from it and RabbitMQ 4 restart at 1, so ricochet cleans it and the job gets its full
    budget, attempts 1 to 4, on every broker."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=3, retry_delay_ms=10)
    claimed = [{"queue": queue_name, "reason": "rejected", "count": 2, "exchange": ""}]
    await publish(
        channel,
        queue_name,
        json.dumps({"fail": "always"}),
        message_id="claims",
        headers={"x-death": claimed},
    )
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert recorder.attempts("claims") == [1, 2, 3, 4]
    assert copy.headers["failed-kind"] == "exhausted"
    assert copy.headers["retry-count"] == 3


async def test_queues_of_an_older_deployment_keep_jobs_after_the_upgrade_step(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """Q and Q.failed declared without a delivery limit argument (by an older ricochet): the
    worker keeps them as they are; on RabbitMQ 4 it logs, once per queue, the policy command
    that lifts the limit, and once an operator ran it, a copy handed back 25 times is kept."""
    names = Names(queue_name)
    old = plan(make_settings(queue_name))  # what a ricochet unaware of the limit declared
    for spec in old.queues[:2]:
        await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
    with capture_logs() as logs:
        await declare(connection, make_settings(queue_name))
    warned = [e for e in logs if "delivery limit" in e["event"]]
    version = broker_version(connection)
    assert version is not None
    assert sorted(e["queue"] for e in warned) == (
        sorted([names.queue, names.failed]) if version >= (4, 0) else []
    )
    try:
        for command in {e["command"] for e in warned}:
            program, *args = shlex.split(command)
            assert program == "rabbitmqctl"
            BROKER.rabbitmqctl(*args)
        await publish_failed(channel, queue_name, "m1", ValueError("no rows"))
        await wait_depth(channel, names.failed, 1)
        assert await hand_back(channel, names.failed, HAND_BACKS) == HAND_BACKS
    finally:
        BROKER.rabbitmqctl("clear_policy", f"{names.queue}.no-delivery-limit", check=False)
