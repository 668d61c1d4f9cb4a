"""SyncClient against the real broker: shared by threads, used on both sides of a fork."""

import asyncio
import multiprocessing
import os
import re
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import ClientClosed, InvalidJob, NotConfirmed, SyncClient
from ricochet.broker.declare import declare

from tests.broker import BROKER
from tests.support import AMQP_URL, close_connections, depth, make_settings, take, wait_for


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
    """32 threads enqueue 20 jobs each through one SyncClient: 640 distinct jobs, each in the
    queue once, one connection; close() leaves none, and a call after it raises ClientClosed."""
    await declare(connection, make_settings(queue_name))
    client = SyncClient(AMQP_URL, queue_name)

    def enqueue(thread: int) -> list[str]:
        return [client.enqueue("mail", {"thread": thread, "n": n}) for n in range(20)]

    with ThreadPoolExecutor(32) as pool:
        batches = await asyncio.to_thread(lambda: list(pool.map(enqueue, range(32))))
    ids = [i for batch in batches for i in batch]
    assert len(set(ids)) == 640
    assert await asyncio.to_thread(client_connection_pids, queue_name) == [os.getpid()]
    await asyncio.to_thread(client.close)
    await wait_for(
        lambda: asyncio.to_thread(lambda: not client_connection_pids(queue_name)),
        10,
        "no connection",
    )
    got = await take(channel, queue_name, 640)
    assert sorted(str(m.message_id) for m in got) == sorted(ids)
    assert await depth(channel, queue_name) == 0
    with pytest.raises(ClientClosed, match="closed"):
        client.enqueue("mail", {})


async def test_an_oversize_job_fails_alone(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Eleven threads enqueue at once through one SyncClient, one of them a job whose headers
    cannot fit a frame: that one raises InvalidJob before it is sent; the others, on the same
    connection, are confirmed and in the queue once each."""
    await channel.declare_queue(queue_name, durable=True)

    def enqueue(n: int) -> str | InvalidJob:
        try:
            return client.enqueue(
                "mail", {"n": n}, headers={"blob": "b" * 200_000} if n == 5 else None
            )
        except InvalidJob as refused:
            return refused

    with SyncClient(AMQP_URL, queue_name) as client, ThreadPoolExecutor(11) as pool:
        results = await asyncio.to_thread(lambda: list(pool.map(enqueue, range(11))))
    refused = results.pop(5)
    assert isinstance(refused, InvalidJob), refused
    good = [r for r in results if isinstance(r, str)]
    assert len(good) == 10, results
    got = Counter(str(m.message_id) for m in await take(channel, queue_name, 10))
    assert got == Counter(good)
    assert await depth(channel, queue_name) == 0


async def test_a_call_from_async_code_is_driven_for_it(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Called in a thread that runs an event loop of its own (here, this test's), a call is
    waited for as from any thread."""
    await declare(connection, make_settings(queue_name))
    client = SyncClient(AMQP_URL, queue_name)
    ids = [client.enqueue("mail", {"n": n}) for n in range(3)]
    client.close()
    got = await take(channel, queue_name, 3)
    assert [str(m.message_id) for m in got] == ids


async def test_a_connection_the_broker_closed_while_idle_is_noticed(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Nobody calls while the broker closes the client's connection: the client's loop reads
    the close, and the next enqueue connects again instead of being cut off with it."""
    await declare(connection, make_settings(queue_name))
    with SyncClient(AMQP_URL, queue_name) as client:
        await asyncio.to_thread(client.enqueue, "mail", {}, message_id="before")
        assert await asyncio.to_thread(close_connections, queue_name, "client") == 1
        running = client._running
        assert running is not None
        await wait_for(
            lambda: running.client._publisher is None or running.client._publisher.is_closed,
            5,
            "the client's loop to read the close",
        )
        await asyncio.to_thread(client.enqueue, "mail", {}, message_id="after")
    got = await take(channel, queue_name, 2)
    assert [m.message_id for m in got] == ["before", "after"]


async def test_heartbeats_go_out_while_idle(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """A heartbeat of 2 s: the broker drops a connection it hears nothing from for two 2 s
    intervals. Idle for 8 s, the client's connection lives on: its loop sends the heartbeats."""
    await declare(connection, make_settings(queue_name))
    with SyncClient(f"{AMQP_URL}?heartbeat=2", queue_name) as client:
        await asyncio.to_thread(client.enqueue, "mail", {})
        running = client._running
        assert running is not None
        opened = running.client._connection
        await asyncio.sleep(8)
        assert await asyncio.to_thread(client_connection_pids, queue_name) == [os.getpid()]
        assert running.client._connection is opened
        assert opened is not None
        assert not opened.is_closed
        await asyncio.to_thread(client.enqueue, "mail", {})
    assert len(await take(channel, queue_name, 2)) == 2


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


async def test_a_fork_while_another_thread_enqueues(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """The fork comes while a thread of the parent enqueues (the child inherits the client's
    loop mid-run and, maybe, its lock held): the child connects on its own all the same, and
    the parent's thread goes on."""
    await declare(connection, make_settings(queue_name))
    client = SyncClient(AMQP_URL, queue_name)
    stop = threading.Event()

    def enqueue_until_stopped() -> list[str]:
        ids: list[str] = []
        while not stop.is_set() or len(ids) < 20:
            ids.append(client.enqueue("mail", {"from": "parent"}))
        return ids

    with ThreadPoolExecutor(1) as pool:
        parent = pool.submit(enqueue_until_stopped)
        await wait_for(lambda: client._running is not None, 10, "the parent's first call")
        ours, theirs = multiprocessing.Pipe()
        child = fork(client, 5, theirs)
        status, child_ids = await asyncio.to_thread(received, ours)
        assert status == "ok", child_ids
        ours.send("go")
        assert await asyncio.to_thread(received, ours) == ("closed", [])
        stop.set()
        parent_ids = await asyncio.wrap_future(parent)
    await asyncio.to_thread(child.join, 20)
    assert child.exitcode == 0
    await asyncio.to_thread(client.close)
    got = await take(channel, queue_name, len(parent_ids) + 5)
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
        with pytest.raises(InvalidJob, match=r"^headers"):
            client.enqueue("mail", {}, headers={"blob": "b" * 200_000})
        with pytest.raises(InvalidJob, match=r"^message_id"):
            client.cancel("")
        with pytest.raises(NotConfirmed, match="does not exist"):
            client.enqueue("mail", {})
        # A cancel goes to the vhost's cancel store (ricochet.cancels), which other queues'
        # workers may have declared: it is recorded even for a queue no worker declared.
