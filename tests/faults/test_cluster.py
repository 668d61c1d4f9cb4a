"""A three-node RabbitMQ cluster started on this machine (separate node names and ports): one node
stopped under load, quorum queues carry on, nothing lost."""

import asyncio
import datetime as dt
import json
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel
from ricochet.broker.connection import close_quietly
from ricochet.broker.declare import declare
from ricochet.broker.plan import plan
from ricochet.names import SHARED_PREFIX, Names
from ricochet.ops.jobs import read_jobs
from structlog.typing import EventDict

from tests.faults.harness import FaultRun, fault_settings, progress, publish_mixed
from tests.faults.node import Node, start_cluster
from tests.recorder import Recorder
from tests.support import (
    InProcessWorker,
    delete_topology,
    depth,
    publish,
    readiness_at_each_log_line,
    wait_for,
)

# Not 5682 (the fault suite's single node) nor 5672 (the shared broker).
CLUSTER_PORTS = {"ricochet-c1": 5691, "ricochet-c2": 5692, "ricochet-c3": 5693}
JOBS = 3000


@pytest.fixture(scope="module")
def cluster(node_dir: Path) -> Iterator[list[Node]]:
    """Three fresh nodes in one cluster; stopped and their data removed after the module."""
    nodes = start_cluster(node_dir, list(CLUSTER_PORTS), list(CLUSTER_PORTS.values()))
    yield nodes
    for node in nodes:
        node.discard()


@pytest.fixture
async def cluster_run(
    cluster: list[Node], queue_name: str, tmp_path: Path
) -> AsyncIterator[FaultRun]:
    """A run whose worker uses c1 and whose test connection (publishing, accounting) uses c3."""
    c1, _, c3 = cluster
    connection = await aio_pika.connect(c3.url, client_properties={"connection_name": "tests"})
    run = FaultRun(
        "cluster: queue leader's node stopped (3 nodes)",
        connection,
        fault_settings(queue_name, c1.url),
        tmp_path,
    )
    yield run
    for worker in run.workers:
        if worker.alive:
            worker.kill()
    async with await aio_pika.connect(c1.url) as cleanup:
        await delete_topology(cleanup, queue_name)
    await close_quietly(connection)


def queue_rows(node: Node, queue_prefix: str, *columns: str) -> dict[str, list[str]]:
    """Queue name -> the columns asked for, as the node lists them: the queue's own and those
    the vhost's ricochet queues share (the cluster is this test's alone)."""
    listed = node.ctl("list_queues", "name", *columns, "--no-table-headers")
    rows = (line.split("\t") for line in listed.splitlines())
    ours = (queue_prefix, SHARED_PREFIX)
    return {name: values for name, *values in rows if name.startswith(ours)}


def queue_members(node: Node, queue_prefix: str, column: str) -> dict[str, str]:
    """Queue name -> `leader` or `online` (members that run) as the node lists them."""
    return {name: value for name, (value,) in queue_rows(node, queue_prefix, column).items()}


def stranded_dead_letters(node: Node, queue_prefix: str) -> dict[str, str]:
    """Queues that hold dead-lettered messages without passing them on (counted in `messages`,
    neither ready nor unacked), name -> leader.

    RabbitMQ before 3.10.20 (rabbitmq-server#7677) can leave the at-least-once dead-letter worker
    of a quorum queue unregistered after a leader change: the queue keeps the messages, safely,
    but moves them only once it has a new leader.
    """
    columns = ("messages", "messages_ready", "messages_unacknowledged", "leader")
    rows = queue_rows(node, queue_prefix, *columns)
    return {
        name: leader
        for name, (total, ready, unacked, leader) in rows.items()
        if int(total) > int(ready) + int(unacked)
    }


def change_member(node: Node, command: str, queue: str, member: str) -> None:
    """`rabbitmq-queues delete_member` or `add_member`: a quorum queue's replica on member."""
    subprocess.run(
        ["rabbitmq-queues", "-n", node.name, "-q", command, queue, member],
        check=True,
        capture_output=True,
        timeout=60,
    )


def elect_new_leader(node: Node, queue: str, leader: str) -> None:
    """Remove the leader's replica and add it back: the others elect a new leader, which starts
    a new dead-letter worker (the operator's remedy for the broker bug above)."""
    for command in ("delete_member", "add_member"):
        change_member(node, command, queue, leader)


# Room for the broker's stranded dead-letters to be released (below) and still settle.
@pytest.mark.timeout(300)
async def test_queue_leader_node_stopped_under_load(
    cluster: list[Node], cluster_run: FaultRun
) -> None:
    """Every queue of ricochet is led from c2 while the worker consumes through c1; c2 is stopped
    mid-run: the queues elect leaders on c1 and c3, the same worker process carries on, and every
    job completes. c2 then restarts, rejoins the cluster and its replicas run again. When the
    broker strands dead-letters (stranded_dead_letters), c2 rejoins first and the stuck queues
    elect new leaders, as an operator would; every job must still complete, none twice more
    than the prefetch. The journal, a replicated stream led from c2 too, is read through c3
    after: what it shows of the jobs is printed, and it answers to the end."""
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    c1, c2, _ = cluster
    run = cluster_run
    queue = run.settings.queue
    # A quorum queue's first leader is on the node of the client that declared it (3.10's
    # default leader locator), so declaring through c2 puts every leader on the node to stop.
    async with await aio_pika.connect(c2.url) as via_c2:
        await declare(via_c2, run.settings)
    leaders = await asyncio.to_thread(queue_members, c1, queue, "leader")
    declared = plan(run.settings)
    quorum = [
        spec.name
        for spec in [*declared.queues, *declared.shared.queues, *declared.tiers, *declared.lanes]
        if spec.arguments.get("x-queue-type") in ("quorum", "stream")
    ]
    assert set(leaders) == set(quorum)
    assert set(leaders.values()) == {c2.name}, leaders

    # Jobs that take a while, so that most of them are still to do when c2 stops.
    await publish_mixed(run, JOBS, sleep_s=0.1)
    await run.start_worker()
    await progress(run, JOBS // 3)

    async def c2_seen_running(expected: bool) -> bool:
        return (c2.name in await asyncio.to_thread(c1.running_nodes)) is expected

    await asyncio.to_thread(c2.stop)
    await wait_for(lambda: c2_seen_running(False), 30, "c1 to see c2 stopped")
    done_at_stop = len(run.done())

    still_led: dict[str, str] = {}

    async def led_elsewhere() -> bool:
        now = await asyncio.to_thread(queue_members, c1, queue, "leader")
        still_led.clear()
        still_led.update(
            {name: now.get(name, "none") for name in leaders if now.get(name) in (None, c2.name)}
        )
        return not still_led

    try:
        await wait_for(led_elsewhere, 30, "every queue to elect a leader on c1 or c3")
    except AssertionError as error:
        raise AssertionError(f"{error}; still without a new leader: {still_led}") from None
    await progress(run, done_at_stop + 500)  # carrying on, not just finishing what was in flight

    async def c2_rejoined() -> None:
        if await c2_seen_running(False):
            await asyncio.to_thread(c2.restart)
        await wait_for(lambda: c2_seen_running(True), 30, "c2 to rejoin the cluster")

    try:
        await run.until_settled(timeout_s=45)
    except AssertionError:
        stranded = await asyncio.to_thread(stranded_dead_letters, c1, queue)
        if not stranded:
            raise
        # With c2 back, removing a replica leaves two running members: a majority.
        await c2_rejoined()
        print(f"\nstranded dead-letters (RabbitMQ < 3.10.20): new leaders for {sorted(stranded)}")
        for name, leader in stranded.items():
            await asyncio.to_thread(elect_new_leader, c1, name, leader)
    tally = await run.account()
    # A dead-lettered job whose copy the stopped leader had sent to tier 1 but not yet seen
    # confirmed is sent again by the new leader (at-least-once), so a few may run twice.
    assert tally.duplicates <= run.settings.prefetch
    assert run.workers[0].starts == 1

    await c2_rejoined()
    read = await read_jobs(run.connection, since)
    shown = [j for (q, _), j in read.jobs.items() if q == queue and j.state == "succeeded"]
    # Entries written while the stream elected a new leader are dropped (counted), never a job.
    print(f"\njournal on the cluster: {len(shown)} of {tally.completed} jobs shown succeeded")
    assert read.complete
    assert shown

    async def c2_replicas_online() -> bool:
        online = await asyncio.to_thread(queue_members, c1, queue, "online")
        return all(c2.name in online.get(name, "") for name in leaders)

    await wait_for(c2_replicas_online, 30, "c2's replicas to run again")


async def test_quorum_member_removed_under_the_worker(cluster: list[Node], queue_name: str) -> None:
    """The main queue's member on the worker's node is removed, then the queue is deleted from
    another node: the worker stays or is subscribed again, is never ready while the broker has
    cancelled its consumer, and every job published before, between and after is done once,
    none failed, without a reconnect."""
    c1, _, c3 = cluster
    recorder = Recorder()
    worker = InProcessWorker(fault_settings(queue_name, c1.url), recorder)
    ids: list[str] = []

    async def jobs_done(channel: AbstractChannel, stage: str) -> None:
        ids.extend(f"{stage}-{i}" for i in range(20))
        for message_id in ids[-20:]:
            await publish(channel, queue_name, json.dumps({}), message_id=message_id)
        await wait_for(lambda: len(recorder.succeeded) >= len(ids), 30, f"{stage} jobs done")
        assert Counter(recorder.succeeded) == Counter(ids)

    async with await aio_pika.connect(c3.url) as connection:
        channel = await connection.channel()
        try:
            await worker.start()
            await jobs_done(channel, "before")
            with readiness_at_each_log_line(lambda: worker.lifecycle.ready) as lines:
                await asyncio.to_thread(change_member, c3, "delete_member", queue_name, c1.name)
                await jobs_done(channel, "member-removed")
                await channel.queue_delete(queue_name)
                await wait_for(lambda: cancelled(lines), 30, "the broker to cancel the consumer")
                await wait_for(lambda: worker.lifecycle.ready, 30, "the worker to be ready again")
            await jobs_done(channel, "after")
            assert await depth(channel, Names(queue_name).failed) == 0
        finally:
            await worker.stop()
            await delete_topology(connection, queue_name)
    events = [(line["event"], line["ready"]) for line in lines]
    assert ("consumer cancelled by the broker", False) in events
    assert ("consumer cancelled by the broker", True) not in events
    assert not any("reconnecting" in event for event, _ in events)


def cancelled(lines: list[EventDict]) -> bool:
    return any(line["event"] == "consumer cancelled by the broker" for line in lines)
