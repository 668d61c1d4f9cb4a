"""The console against the real broker when it is pushed: a failed queue larger than a page,
many page views at once, clients that give up. Pages stay small and link to the next, the
probes answer meanwhile, and page views share one scan and leave none behind."""

import asyncio
import html
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from ricochet.broker.declare import declare
from ricochet.names import Names
from structlog.testing import capture_logs

from tests.broker import BROKER
from tests.integration.failures import publish_failed
from tests.integration.test_console import console, get, make_copies
from tests.support import consumers, depth, make_settings, wait_depth, wait_for

PAGE_MAX_BYTES = 1_000_000  # SPEC 24: a console page stays under 1 MB
VIEWS = 70  # page views at once: more than the HTTP server's 64 connections


class Holder:
    """A reader of Q.failed of the test's own, holding copies unacked as a `failed list`
    does: a console scan that starts meanwhile waits for it to hand them back."""

    def __init__(self, connection: AbstractConnection, queue: str) -> None:
        self._connection = connection
        self._failed = Names(queue).failed
        self._held: list[AbstractIncomingMessage] = []

    async def __aenter__(self) -> "Holder":
        self._channel = await self._connection.channel()
        queue = await self._channel.get_queue(self._failed, ensure=False)
        self._queue = queue
        self._tag = await queue.consume(self._hold)
        await wait_for(lambda: self._held, 10, "the holder to hold a copy")
        return self

    async def _hold(self, message: AbstractIncomingMessage) -> None:
        self._held.append(message)

    async def release(self) -> None:
        """Hand every copy back (in one nack, as a scan does) and stop reading."""
        if self._channel.is_closed:
            return
        await self._queue.cancel(self._tag)
        await self._held[-1].nack(multiple=True, requeue=True)
        await self._channel.close()

    async def __aexit__(self, *_: object) -> None:
        await self.release()


def console_connections(queue: str) -> int:
    """The console's connections to the broker, for this queue, as rabbitmqctl lists them."""
    listed = BROKER.rabbitmqctl("list_connections", "client_properties", "-q", "--no-table-headers")
    return listed.count(f'{{"connection_name","ricochet console {queue} ')


async def fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


async def view(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    """fetch(), with status 0 for a connection the server closed at once: in a burst of
    connections, those beyond the server's cap, before the 503s close theirs."""
    try:
        return await fetch(session, url)
    except aiohttp.ClientConnectionError:
        return 0, ""


@asynccontextmanager
async def one_connection_each() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session that opens a connection of its own for every request, as many
    browsers (or scripts) at once do."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def test_pages_are_small_and_together_list_every_copy_once(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """With more copies than a page lists, /failed is cut into pages under 1 MB: each says which
    page of how many it is and how many jobs there are in all, a group cut by a page says which
    of its jobs the page lists, and following the next-page links lists every copy once."""
    await declare(connection, make_settings(queue_name))
    ids = [f"ledger-{i}" for i in range(240)] + [f"row-{i}" for i in range(260)]
    for message_id in ids[:240]:
        await publish_failed(channel, queue_name, message_id, TimeoutError("ledger timed out"))
    for i, message_id in enumerate(ids[240:]):
        await publish_failed(channel, queue_name, message_id, ValueError(f"row {i} is malformed"))
    listed: list[str] = []
    async with console(queue_name, None) as base:
        url: str | None = f"{base}/failed"
        pages = 0
        while url is not None and pages < 100:
            status, page = await get(url)
            assert status == 200
            assert len(page.encode()) < PAGE_MAX_BYTES
            pages += 1
            assert "500 failed jobs in 261 reasons" in page
            if pages == 1:
                assert "jobs 1-200 of 240" in page  # the largest group, cut
            listed += re.findall(r'<td class="id"><a href="/failed/([^"]+)">', page)
            following = re.search(r'<a rel="next" href="([^"]+)"', page)
            url = f"{base}{html.unescape(following.group(1))}" if following else None
        assert pages > 1, "one page lists them all"
        total = re.search(r"page \d+ of (\d+)", page)
        assert total is not None
        assert int(total.group(1)) == pages
        assert (await get(f"{base}/failed?page={pages + 1}"))[0] == 404
    assert sorted(listed) == sorted(ids)
    assert await depth(channel, Names(queue_name).failed) == 500


async def test_probes_answer_while_page_views_wait(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """With 70 page views waiting on a failed queue another reader holds, /healthz, /readyz and
    /metrics answer at once; the views beyond what the console serves at once get 503 without
    waiting, and the views it serves share one scan and get the same page."""
    await make_copies(connection, channel, queue_name)
    with capture_logs() as logs:
        async with (
            console(queue_name, None) as base,
            Holder(connection, queue_name) as holder,
            one_connection_each() as session,
        ):
            views = [asyncio.create_task(view(session, f"{base}/failed")) for _ in range(VIEWS)]
            await asyncio.sleep(2)  # time for every view to connect (a generous bound)
            for path in ["/healthz", "/readyz", "/metrics"]:
                assert (await asyncio.wait_for(get(f"{base}{path}"), 10))[0] == 200, path
            refused = [task.result()[0] for task in views if task.done()]
            assert refused.count(503) > VIEWS // 2
            assert set(refused) <= {503, 0}
            await holder.release()
            answers = await asyncio.wait_for(asyncio.gather(*views), 60)
    served = [page for status, page in answers if status == 200]
    assert served
    assert len(served) + len(refused) == VIEWS
    assert len(set(served)) == 1
    assert [e["event"] for e in logs].count("console scan") == 1
    await wait_depth(channel, Names(queue_name).failed, 6)


async def test_views_given_up_leave_no_scan_behind(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Page views whose clients give up while the scan waits for another reader leave nothing
    behind: the console lets go of the broker, and no scan reads Q.failed after the reader
    hands its copies back."""
    await make_copies(connection, channel, queue_name)
    failed = Names(queue_name).failed
    with capture_logs() as logs:
        async with console(queue_name, None) as base, Holder(connection, queue_name):
            timeout = aiohttp.ClientTimeout(total=1)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for outcome in await asyncio.gather(
                    *(fetch(session, f"{base}/failed") for _ in range(5)), return_exceptions=True
                ):
                    assert isinstance(outcome, TimeoutError)

            async def let_go() -> bool:
                return await asyncio.to_thread(console_connections, queue_name) == 0

            await wait_for(let_go, 20, "the console to let go of the broker")
        await wait_depth(channel, failed, 6)
        await asyncio.sleep(1)  # a scan left behind would start now
        assert await consumers(connection, failed) == 0
    assert not [e for e in logs if e["event"] == "console scan done"]
