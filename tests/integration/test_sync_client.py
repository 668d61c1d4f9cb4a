"""SyncClient against the real broker: shared by threads, used on both sides of a fork."""

import asyncio
import multiprocessing
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import InvalidJob, NotConfirmed, SyncClient
from ricochet.broker.topology import declare

from tests.broker import BROKER
from tests.support import AMQP_URL, depth, make_settings, take, wait_for


def received(end: Connection, timeout_s: float = 30) -> tuple[str, list[str]]:
    """What the child sent, or a failure when it sent nothing in time (it hangs)."""
    if not end.poll(timeout_s):
        raise AssertionError(f"nothing from the child in {timeout_s} s")
    message: tuple[str, list[str]] = end.recv()
    return message


def client_connection_pids(queue: str) -> list[int]:
    """The pids of the processes holding a client connection for this queue, as the broker
    lists them (from each connection's name)."""
    listed = BROKER.rabbitmqctl("list_connections", "client_properties", "-q", "--no-table-headers")
    pattern = rf'\{{"connection_name","ricochet client {re.escape(queue)} [^"]*:(\d+)"\}}'
    return sorted(int(pid) for pid in re.findall(pattern, listed))


async def test_threads_share_one_connection(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """16 threads enqueue 25 jobs each through one SyncClient: 400 distinct jobs, one
    connection; close() leaves none."""
    await declare(connection, make_settings(queue_name))
    client = SyncClient(AMQP_URL, queue_name)

    def enqueue(thread: int) -> list[str]:
        return [client.enqueue("mail", {"thread": thread, "n": n}) for n in range(25)]

    with ThreadPoolExecutor(16) as pool:
        ids = [
            i
            for batch in await asyncio.to_thread(lambda: list(pool.map(enqueue, range(16))))
            for i in batch
        ]
    assert len(set(ids)) == 400
    assert await asyncio.to_thread(client_connection_pids, queue_name) == [os.getpid()]
    await asyncio.to_thread(client.close)
    await wait_for(
        lambda: asyncio.to_thread(lambda: not client_connection_pids(queue_name)),
        10,
        "no connection",
    )
    got = await take(channel, queue_name, 400)
    assert sorted(str(m.message_id) for m in got) == sorted(ids)
    with pytest.raises(RuntimeError, match="closed"):
        client.enqueue("mail", {})


@pytest.fixture(autouse=True)
def _children() -> Iterator[None]:
    """A child that hangs is killed after its test, so the run still ends."""
    yield
    for child in multiprocessing.active_children():
        child.kill()


def fork(client: SyncClient, jobs: int, report: Connection) -> BaseProcess:
    child = multiprocessing.get_context("fork").Process(
        target=_child, args=(client, jobs, report), daemon=True
    )
    child.start()
    return child


def _child(client: SyncClient, jobs: int, report: Connection) -> None:
    """In the forked child: enqueue, say which connections exist, wait to be let go."""
    try:
        ids = [client.enqueue("mail", {"from": "child", "n": n}) for n in range(jobs)]
        report.send(("ok", ids))
        report.recv()  # the parent has looked at the connections
        client.close()
        report.send(("closed", []))
    except BaseException as error:
        report.send(("error", [repr(error)]))
        raise


async def test_a_forked_child_gets_its_own_connection(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """gunicorn's way: a SyncClient used in the parent, then a fork. The child enqueues on a
    connection of its own while the parent goes on enqueueing on its one; the child's close
    leaves the parent's connection working."""
    await declare(connection, make_settings(queue_name))
    client = SyncClient(AMQP_URL, queue_name)
    parent_ids = [await asyncio.to_thread(client.enqueue, "mail", {"from": "parent"})]

    ours, theirs = multiprocessing.Pipe()
    child = fork(client, 50, theirs)
    # The parent keeps publishing while the child does: on a shared socket the frames would mix.
    for n in range(50):
        parent_ids.append(await asyncio.to_thread(client.enqueue, "mail", {"n": n}))
    status, child_ids = await asyncio.to_thread(received, ours)
    assert status == "ok", child_ids
    pids = await asyncio.to_thread(client_connection_pids, queue_name)
    assert pids == sorted([os.getpid(), child.pid or 0])
    ours.send("go")
    assert await asyncio.to_thread(received, ours) == ("closed", [])
    await asyncio.to_thread(child.join, 20)
    assert child.exitcode == 0

    parent_ids.append(await asyncio.to_thread(client.enqueue, "mail", {"after": "child"}))
    await asyncio.to_thread(client.close)
    got = await take(channel, queue_name, 102)
    assert sorted(str(m.message_id) for m in got) == sorted(parent_ids + child_ids)
    assert await depth(channel, queue_name) == 0


async def test_a_client_made_before_the_fork_connects_in_the_child(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Made at import time in a pre-forking server and used only in the children: each child
    connects on its own, and the parent never connects."""
    await declare(connection, make_settings(queue_name))
    client = SyncClient(AMQP_URL, queue_name)
    ours, theirs = multiprocessing.Pipe()
    child = fork(client, 5, theirs)
    status, child_ids = await asyncio.to_thread(received, ours)
    assert status == "ok", child_ids
    assert await asyncio.to_thread(client_connection_pids, queue_name) == [child.pid]
    ours.send("go")
    await asyncio.to_thread(received, ours)
    await asyncio.to_thread(child.join, 20)
    assert child.exitcode == 0
    got = await take(channel, queue_name, 5)
    assert sorted(str(m.message_id) for m in got) == sorted(child_ids)
    client.close()


def test_errors_reach_the_caller(queue_name: str) -> None:
    """InvalidJob and NotConfirmed come out of the sync calls as the async client raises them."""
    with SyncClient(AMQP_URL, queue_name) as client:
        with pytest.raises(InvalidJob, match="max_retries"):
            client.enqueue("mail", {}, max_retries=99)
        with pytest.raises(NotConfirmed, match="does not exist"):
            client.enqueue("mail", {})
        with pytest.raises(NotConfirmed, match=r"cancel of job 'm1' was not recorded.*does not"):
            client.cancel("m1")  # no worker declared the queue, nor its cancel store
