"""Fixtures: a broker connection, a queue name of the test's own, in-process workers."""

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from tests.broker import BROKER
from tests.support import (
    AMQP_URL,
    InProcessWorker,
    StartWebhook,
    StartWorker,
    WebhookServer,
    delete_topology,
    make_settings,
    reap_spawned,
    remove_leftovers,
)


@pytest.fixture(scope="session")
def own_vhost() -> Iterator[None]:
    """The vhost of this test process (tests/broker.py), made for its session and deleted after
    it with whatever the session's tests left there. The suites that talk to BROKER use it."""
    BROKER.open_vhost()
    yield
    BROKER.close_vhost()


@pytest.fixture(autouse=True)
def _reap_spawned() -> Iterator[None]:
    """A ricochet process a test left running (its wait timed out, say) is killed after it, so
    it cannot outlive the run or haunt the next test."""
    yield
    reap_spawned()


@pytest.fixture
async def queue_name(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A main-queue name no other test uses. Last of all (every worker of the test stopped,
    every ricochet process it started killed), whatever the broker still holds under names
    that begin with it is deleted: a broker keeps every queue, and a few hundred left behind
    stop it from taking connections."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60]
    name = f"t.{stem}.{uuid.uuid4().hex[:8]}"
    yield name
    reap_spawned()  # a process still running would declare its queues again
    await remove_leftovers(name)


@pytest.fixture
async def connection(queue_name: str) -> AsyncIterator[AbstractConnection]:
    """A connection for the test itself; the test's queues are deleted afterwards."""
    conn = await aio_pika.connect(AMQP_URL, client_properties={"connection_name": "tests"})
    yield conn
    await delete_topology(conn, queue_name)
    await conn.close()


@pytest.fixture
async def channel(connection: AbstractConnection) -> AsyncIterator[AbstractChannel]:
    ch = await connection.channel(publisher_confirms=True)
    yield ch
    if not ch.is_closed:
        await ch.close()


@pytest.fixture
async def start_worker(
    queue_name: str, connection: AbstractConnection
) -> AsyncIterator[StartWorker]:
    """Start in-process workers on the test's queue: `await start_worker(handler, **settings)`
    (ready=False: without waiting for the worker to be ready)."""
    workers: list[InProcessWorker] = []

    async def start(handler: Any, *, ready: bool = True, **overrides: Any) -> InProcessWorker:
        worker = InProcessWorker(make_settings(queue_name, **overrides), handler)
        workers.append(worker)
        return await worker.start(ready)

    yield start
    for worker in workers:
        await worker.stop()


@pytest.fixture
async def webhook() -> AsyncIterator[StartWebhook]:
    """Local webhook endpoints: `await webhook([500, 200])` answers 500, then 200 from then on."""
    servers: list[WebhookServer] = []

    async def start(statuses: list[int], hang_on: str | None = None) -> WebhookServer:
        server = await WebhookServer(statuses, hang_on).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


# tests/compose needs a Docker engine and base images: make test-compose runs it, by path.
collect_ignore = ["compose"]
