"""A retrying loop on a connection ends when its task is cancelled, even when an await inside
swallowed the cancel (as aiormq and Python 3.11's wait_for can): lost_or_cancelled."""

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any, cast

from aio_pika.abc import AbstractConnection
from ricochet.broker.connection import lost_or_cancelled


def live_connection() -> AbstractConnection:
    """What is_lost reads of a connection: open, and connected."""
    connected = asyncio.Event()
    connected.set()
    return cast(AbstractConnection, SimpleNamespace(is_closed=False, connected=connected))


async def test_a_loop_that_swallows_its_cancel_still_ends() -> None:
    connection = live_connection()
    turns = 0

    async def retrying() -> None:
        nonlocal turns
        while not lost_or_cancelled(connection):
            turns += 1
            with contextlib.suppress(asyncio.CancelledError):  # as a library's await may
                await asyncio.sleep(0.01)

    task = asyncio.get_running_loop().create_task(retrying())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait_for(task, 1)
    assert turns > 0


async def test_a_live_connection_of_a_running_task_goes_on() -> None:
    assert not lost_or_cancelled(live_connection())


async def test_a_lost_connection_ends_the_loop() -> None:
    connection: Any = live_connection()
    connection.connected.clear()
    assert lost_or_cancelled(connection)
