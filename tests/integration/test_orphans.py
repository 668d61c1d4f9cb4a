"""A job whose queue is deleted while it waits ends in ricochet.orphans (SPEC 18, 24), whatever
route it waits on: its schedule or a RetryLater or a ladder of its own in the shared levels, or
a retry tier of its queue. Each test has a vhost of its own, so that ricochet.orphans holds its
job alone.

The queue is deleted as an operator deletes it (queue.delete, as rabbitmqctl or the management
UI do): the queue alone, its tiers and exchanges left where they are."""

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from ricochet import Client, Job, RetryLater
from ricochet.broker.declare import declare
from ricochet.broker.management import open_api, vhost
from ricochet.names import SHARED, Names

from tests.broker import BROKER
from tests.support import (
    InProcessWorker,
    depth,
    make_settings,
    orphans_tally,
    publish,
    take,
    wait_depth,
    wait_for,
)

WAIT_S = 3  # each job's wait: the queue is deleted within it
ORPHANED_WITHIN_S = 5  # how late after its due time the job may reach ricochet.orphans
HEADER = {"x-app-trace": "kept"}  # the producer's own header, which the orphan must keep


def failing(raise_: Callable[[], Exception]) -> Callable[[Job], None]:
    def handler(job: Job) -> None:
        raise raise_()

    return handler


def never_runs(job: Job) -> None:
    raise AssertionError(f"{job.message_id} ran: its schedule was not kept")


# name: (the job's enqueue arguments, the worker's settings, its handler)
ROUTES: dict[str, tuple[dict[str, Any], dict[str, Any], Callable[[Job], None]]] = {
    "a schedule (delay)": ({"delay": WAIT_S}, {}, never_runs),
    "a RetryLater": ({}, {}, failing(lambda: RetryLater(WAIT_S))),
    "a ladder of its own": (
        {"retry_delays_ms": [WAIT_S * 1000]},
        {},
        failing(lambda: ValueError("down")),
    ),
    "a retry tier": (
        {},
        {"retry_delays_ms": [WAIT_S * 1000]},
        failing(lambda: ValueError("down")),
    ),
}


@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_job_whose_queue_is_deleted_while_it_waits_is_in_the_orphans(
    route: str, queue_name: str, vhost_url: str
) -> None:
    """A worker takes the job and sends it to wait (3 s) by the route; the worker stops, and
    the queue alone is deleted. The job reaches ricochet.orphans within 5 s of its due time,
    with the producer's header and its message_id, and nowhere else."""
    enqueue_args, overrides, handler = ROUTES[route]
    settings = make_settings(queue_name, amqp_url=vhost_url, **overrides)
    worker = await InProcessWorker(settings, handler).start()
    message_id = f"{queue_name}-job"
    async with Client(vhost_url, queue_name) as client:
        enqueued = time.monotonic()
        await client.enqueue("job", {}, message_id=message_id, headers=HEADER, **enqueue_args)
    async with await aio_pika.connect(vhost_url) as connection:
        channel = await connection.channel()

        async def waiting() -> bool:
            return await depth(channel, queue_name) == 0

        await wait_for(waiting, 10, "the worker to send the job to wait")
        await worker.stop()  # it drains: the job waits, acked
        await channel.queue_delete(queue_name)
        assert time.monotonic() - enqueued < WAIT_S, "the queue was deleted after the job came due"

        tally: Counter[str] = Counter()
        found: list[AbstractIncomingMessage] = []

        async def orphaned() -> bool:
            found.extend(await orphans_tally(channel, tally))
            return bool(tally)

        due = enqueued + WAIT_S
        await wait_for(
            orphaned, due + ORPHANED_WITHIN_S - time.monotonic(), "the job in the orphans"
        )
    assert tally == Counter({message_id: 1}), "a job of another queue in the vhost, or twice"
    headers = found[0].headers
    assert headers["x-app-trace"] == "kept"


MOVED = 100  # jobs that come back from a tier while an earlier version's route is replaced


async def test_an_earlier_versions_route_back_is_replaced_without_a_gap(
    queue_name: str, vhost_url: str
) -> None:
    """A broker declared by an earlier version (Q.return bound to Q itself, no Q.return.queue),
    with jobs coming back from a tier (100 ms) while a start declares the topology: every job is
    back in Q once, none dropped, none copied to the orphans; afterwards the old binding is gone
    and Q is reached only through the hop."""
    settings = make_settings(queue_name, amqp_url=vhost_url, retry_delay_ms=100, max_retries=1)
    n = Names(queue_name)
    async with await aio_pika.connect(vhost_url) as connection:
        await declare(connection, settings)
        channel = await connection.channel(publisher_confirms=True)
        await channel.exchange_delete(n.return_to_queue)  # and the bindings into and out of it
        await (await channel.get_queue(queue_name)).bind(n.return_exchange, routing_key="")
        ids = [f"{queue_name}-{i}" for i in range(MOVED)]

        async def back_from_the_tier() -> None:
            for message_id in ids:
                await publish(channel, n.tier(1), b"{}", message_id=message_id)
                await asyncio.sleep(0.01)

        await asyncio.gather(back_from_the_tier(), declare(connection, settings))
        await wait_depth(channel, queue_name, MOVED)
        taken = await take(channel, queue_name, MOVED)
        assert sorted(str(m.message_id) for m in taken) == sorted(ids)
        assert await depth(channel, SHARED.orphans) == 0
    async with open_api(BROKER.management_url, vhost_url) as api:
        where = f"{quote(vhost(vhost_url), safe='')}/{quote(n.return_exchange, safe='')}"
        out = await api.get(f"exchanges/{where}/bindings/source")
    assert [(b["destination"], b["destination_type"]) for b in out] == [
        (n.return_to_queue, "exchange")
    ]
