"""Priority (SPEC 28), end to end on the broker of the run: a backlog delivered as the broker
orders it for the queue's type and version, a job's priority kept through a retry, the failed
queue and a replay, and a classic queue that RabbitMQ cannot give x-max-priority refused."""

import asyncio

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Client, Job, priority
from ricochet.broker.amqp import broker_version
from ricochet.broker.declare import declare
from ricochet.names import Names
from ricochet.ops.replay import replay
from ricochet.ops.selection import Selection
from structlog.testing import capture_logs

from tests.support import (
    AMQP_URL,
    StartWorker,
    api_queue,
    make_settings,
    ricochet_env,
    run_cli,
    take,
    wait_depth,
    wait_for,
)

# The backlog: normal jobs first, then high ones, then low ones, each enqueued in that order.
BACKLOG = [*((f"n{i}", None) for i in range(12)), *((f"h{i}", 8) for i in range(4))]
BACKLOG += [(f"l{i}", 1) for i in range(4)]


def sent_priority(given: int | None) -> int:
    return priority.DEFAULT if given is None else given


def strict_order(backlog: list[tuple[str, int | None]]) -> list[str]:
    """Higher first; first in, first out within one priority."""
    ranked = sorted(enumerate(backlog), key=lambda e: (-sent_priority(e[1][1]), e[0]))
    return [message_id for _, (message_id, _) in ranked]


@pytest.mark.parametrize(
    ("queue_type", "max_priority"), [("quorum", 0), ("classic", 9), ("classic", 0)]
)
async def test_a_backlog_is_delivered_as_the_broker_orders_priorities(
    start_worker: StartWorker,
    connection: AbstractConnection,
    queue_name: str,
    queue_type: str,
    max_priority: int,
) -> None:
    """Twelve jobs at the default priority, then four at 8, then four at 1, enqueued before any
    worker consumes: one worker taking a job at a time runs them strictly by priority (quorum on
    4.3+, classic with x-max-priority), high ones first in two bands (quorum on 4.0-4.2: the
    four at 8 among the first six), or in the order enqueued (quorum on 3.x, classic without it),
    as doctor's row says; a worker on a broker that applies none says so once at start."""
    settings = make_settings(queue_name, queue_type=queue_type, max_priority=max_priority)
    await declare(connection, settings)
    async with Client(AMQP_URL, queue_name) as client:
        for message_id, given in BACKLOG:
            await client.enqueue("work", {}, message_id=message_id, priority=given)
    ran: list[str] = []

    async def handler(job: Job) -> None:
        assert job.priority == sent_priority(dict(BACKLOG)[str(job.message_id)])
        ran.append(str(job.message_id))

    with capture_logs() as logs:
        await start_worker(handler, queue_type=queue_type, max_priority=max_priority, prefetch=1)
        await wait_for(lambda: len(ran) == len(BACKLOG), 20, "every job of the backlog")
    how = priority.honouring(queue_type, max_priority, broker_version(connection))
    enqueued = [message_id for message_id, _ in BACKLOG]
    match how:
        case priority.Honouring.STRICT:
            assert ran == strict_order(BACKLOG)
        case priority.Honouring.BANDS:
            assert set(ran[:6]) >= {f"h{i}" for i in range(4)}, ran
            assert [m for m in ran if not m.startswith("h")] == [
                m for m in enqueued if not m.startswith("h")
            ]
        case _:
            assert how is priority.Honouring.NONE
            assert ran == enqueued
    said = [e for e in logs if e["event"] == "priority not applied"]
    assert len(said) == (1 if how is priority.Honouring.NONE else 0)


async def test_a_job_keeps_its_priority_through_a_retry_the_failed_queue_and_a_replay(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A job enqueued at priority 7 fails, waits in a tier and fails again: each attempt sees
    priority 7, its failed copy carries it, and so does the job replayed from there."""
    seen: list[int | None] = []

    async def handler(job: Job) -> None:
        seen.append(job.priority)
        raise ConnectionError("down")

    await start_worker(handler, max_retries=1, retry_delay_ms=100)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("work", {}, message_id="urgent", priority=7)
    names = Names(queue_name)
    await wait_depth(channel, names.failed, 1)
    assert seen == [7, 7]
    result = await replay(connection, names, Selection(message_id="urgent"))
    assert [f.message_id for f in result.selected] == ["urgent"]
    (copy,) = await take(channel, names.failed, 1, timeout_s=20)
    assert seen == [7, 7, 7, 7]  # the replay's full budget again, at its priority
    assert copy.priority == 7
    assert copy.headers["replay-count"] == 1


async def test_a_classic_queue_without_x_max_priority_is_refused_with_what_to_do(
    connection: AbstractConnection, queue_name: str
) -> None:
    """A classic queue declared without x-max-priority, then RICOCHET_MAX_PRIORITY=5: `ricochet
    topology` exits 2 with the broker's words and how to declare the queue again, and the
    queue is left as it was; RICOCHET_MAX_PRIORITY on quorum queues exits 2 naming both
    settings."""
    await declare(connection, make_settings(queue_name, queue_type="classic"))
    env = ricochet_env(make_settings(queue_name, queue_type="classic"), RICOCHET_MAX_PRIORITY="5")
    refused = await asyncio.to_thread(run_cli, ["topology"], env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "x-max-priority" in refused.stderr
    assert "delete it, then run `ricochet topology`" in refused.stderr
    assert "x-max-priority" not in (await api_queue(queue_name))["arguments"]
    env = ricochet_env(make_settings(queue_name), RICOCHET_MAX_PRIORITY="5")
    quorum = await asyncio.to_thread(run_cli, ["topology", "--dry-run"], env)
    assert quorum.returncode == 2
    assert "RICOCHET_MAX_PRIORITY is for classic queues" in quorum.stderr
    assert "RICOCHET_QUEUE_TYPE" in quorum.stderr
