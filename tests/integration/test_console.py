"""The failed-jobs console against the real broker: its pages, its forms behind the token, and a
real browser (Debian's chromium, headless) using it as a person would."""

import re
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aio_pika.abc import AbstractChannel, AbstractConnection
from playwright.async_api import Dialog, async_playwright
from prometheus_client import CollectorRegistry
from ricochet.broker.declare import declare
from ricochet.delivery.retry import FailureKind
from ricochet.monitor.console import Console
from ricochet.names import Names
from ricochet.ops.failed_queue import list_failed
from ricochet.ops.selection import Selection
from ricochet.service.http import serve_http

from tests.integration.failures import publish_failed
from tests.support import (
    depth,
    free_port,
    make_settings,
    monitor_process,
    take,
)

TOKEN = "console-token-for-tests-0123"
CHARGE = ConnectionError("payments API: 503 Service Unavailable")
SCRIPT = "<script>window.__ran = true; alert('x')</script>"
CHROMIUM = Path("/usr/bin/chromium")
# Headless and quiet: no first-run pages, no traffic of the browser's own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
]


async def make_copies(connection: AbstractConnection, channel: AbstractChannel, queue: str) -> None:
    """Five copies in two reasons, then one whose reason and body hold a script."""
    await declare(connection, make_settings(queue))
    for i in range(3):
        await publish_failed(
            channel, queue, f"invoice-{4810 + i}", CHARGE, job_type="invoice.charge",
            kind=FailureKind.EXHAUSTED,
        )  # fmt: skip
    for i in range(2):
        await publish_failed(channel, queue, f"mail-{220 + i}", KeyError("recipient"))
    await publish_failed(channel, queue, "evil", ValueError(SCRIPT), job_type="import")


async def failed_ids(channel: AbstractChannel, queue: str) -> list[str]:
    failed = Names(queue).failed
    return [str(m.message_id) for m in await take(channel, failed, await depth(channel, failed))]


@asynccontextmanager
async def console(queue: str, token: str | None) -> AsyncIterator[str]:
    """The console on a local port, in this process; yields its base URL."""
    port = free_port()
    settings = make_settings(queue, console_token=token)
    routes = Console(settings).routes()
    async with serve_http("127.0.0.1", port, CollectorRegistry(), lambda: True, routes):
        yield f"http://127.0.0.1:{port}"


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def post(url: str, form: dict[str, str]) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=form, allow_redirects=False) as response,
    ):
        return response.status, response.headers.get("Location", "")


async def test_pages_show_what_failed_list_shows(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """/failed groups the copies by reason with counts that add up to `failed list`'s; a job's
    page shows its headers, traceback and body; every value from a job is escaped; reading
    takes nothing from the queue."""
    await make_copies(connection, channel, queue_name)
    listed = await list_failed(connection, Names(queue_name), Selection())
    async with console(queue_name, TOKEN) as base:
        status, html = await get(f"{base}/failed")
        assert status == 200
        assert f"{len(listed.selected)} failed jobs in 3 reasons" in html
        counts = re.findall(r'<div class="count">(\d+)</div>', html)
        assert sorted(map(int, counts)) == [1, 2, 3]
        assert "ConnectionError: payments API: 503 Service Unavailable" in html
        assert "<script>" not in html
        assert "ValueError: &lt;script&gt;window.__ran = true;" in html

        status, job = await get(f"{base}/failed/evil")
        assert status == 200
        assert "<script>" not in job
        assert "{&#34;id&#34;: &#34;evil&#34;}" in job  # the body, escaped
        assert "failed-exception" in job
        assert "Traceback" in job

        assert (await get(f"{base}/failed/nope"))[0] == 404
    assert await failed_ids(channel, queue_name) == [
        "invoice-4810", "invoice-4811", "invoice-4812", "mail-220", "mail-221", "evil",
    ]  # fmt: skip


async def test_forms_need_the_token(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """A POST without the token, or with a wrong one, gets 403 and changes nothing; without
    RICOCHET_CONSOLE_TOKEN the console is read-only: no forms, and every POST gets 403."""
    await make_copies(connection, channel, queue_name)
    async with console(queue_name, TOKEN) as base:
        for form in [{"message_id": "evil"}, {"message_id": "evil", "token": "wrong-token-123456"}]:
            assert (await post(f"{base}/failed/actions/discard", form))[0] == 403
    async with console(queue_name, None) as base:
        _, html = await get(f"{base}/failed")
        assert "Read-only" in html
        assert "<form" not in html
        form = {"message_id": "evil", "token": TOKEN}
        for path in [
            "/failed/actions/discard",
            "/failed/actions/replay",
            "/failed",
            "/failed/evil",
            "/waiting/cancel",
            "/waiting",
            "/schedules",
        ]:
            assert (await post(f"{base}{path}", form))[0] == 403, path
    async with console(queue_name, TOKEN) as base:
        form = {"message_id": "evil", "token": TOKEN}
        assert (await post(f"{base}/failed/evil", form))[0] == 405  # the forms post to actions
    assert await depth(channel, Names(queue_name).failed) == 6


async def test_group_replay_and_discard(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """With the token, a reason group is replayed to Q or discarded, whole and alone: the other
    copies stay in Q.failed, in order."""
    await make_copies(connection, channel, queue_name)
    async with console(queue_name, TOKEN) as base:
        replayed = await post(
            f"{base}/failed/actions/replay",
            {"reason": f"ConnectionError: {CHARGE}", "token": TOKEN},
        )
        assert replayed == (303, "/failed?replayed=3")
        discarded = await post(
            f"{base}/failed/actions/discard", {"reason": "KeyError: 'recipient'", "token": TOKEN}
        )
        assert discarded == (303, "/failed?discarded=2")
        _, html = await get(f"{base}/failed?replayed=3")
        assert "Replayed 3 jobs" in html
        assert "1 failed job in 1 reason" in html
    jobs = await take(channel, queue_name, 3)
    assert [m.message_id for m in jobs] == ["invoice-4810", "invoice-4811", "invoice-4812"]
    assert await failed_ids(channel, queue_name) == ["evil"]


async def test_in_a_browser(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """In headless chromium: the groups are on the page, a job opens on its own link, replaying
    it with the token takes it off the page, a POST without the token is refused (403), and a
    payload holding <script> shows as text and never runs."""
    await make_copies(connection, channel, queue_name)
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> Awaitable[None]:
        dialogs.append(dialog.message)
        return dialog.dismiss()

    async with (
        monitor_process(queue_name, TOKEN) as base,
        async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1366, "height": 900})
        page.on("dialog", on_dialog)
        await page.goto(f"{base}/failed")
        assert await page.locator("h1").inner_text() == "6 failed jobs in 3 reasons"
        assert await page.locator("section.group").count() == 3
        reasons = await page.locator("section.group h2").all_inner_texts()
        assert reasons[0] == "ConnectionError: payments API: 503 Service Unavailable"
        assert f"ValueError: {SCRIPT}" in reasons

        await page.get_by_role("link", name="evil").click()
        assert page.url == f"{base}/failed/evil"
        assert f"ValueError: {SCRIPT}" in await page.locator("dl").first.inner_text()
        assert await page.evaluate("window.__ran === undefined")

        await page.get_by_role("link", name="← all failed jobs").click()
        await page.get_by_role("link", name="invoice-4811").click()
        await page.get_by_label("Console token").fill(TOKEN)
        await page.get_by_role("button", name="Replay").click()
        await page.wait_for_url(f"{base}/failed?replayed=1")
        assert await page.locator("p.note.done").inner_text() == f"Replayed 1 job to {queue_name}."
        assert await page.locator("h1").inner_text() == "5 failed jobs in 3 reasons"
        assert await page.get_by_role("link", name="invoice-4811").count() == 0

        refused = await page.request.post(
            f"{base}/failed/actions/discard", form={"message_id": "invoice-4810"}
        )
        assert refused.status == 403
        assert await page.evaluate("window.__ran === undefined")
        await browser.close()
    assert dialogs == []
    assert [m.message_id for m in await take(channel, queue_name, 1)] == ["invoice-4811"]
    assert len(await failed_ids(channel, queue_name)) == 5


async def test_a_multi_line_reason_group_from_a_browser(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """A group whose reason spans lines is discarded whole from chromium's form, which sends
    the reason's line breaks as CRLF: the page says how many went, and the other group stays."""
    await declare(connection, make_settings(queue_name))
    for i in range(2):
        await publish_failed(channel, queue_name, f"multi-{i}", ValueError("line one\nline two"))
    await publish_failed(channel, queue_name, "single", KeyError("recipient"))
    async with console(queue_name, TOKEN) as base, async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = await browser.new_page()
        await page.goto(f"{base}/failed")
        group = page.locator("section.group").filter(has_text="line two")
        await group.get_by_label("Console token").fill(TOKEN)
        await group.get_by_role("button", name="Discard these 2").click()
        await page.wait_for_url(f"{base}/failed?discarded=2")
        assert await page.locator("h1").inner_text() == "1 failed job in 1 reason"
        await browser.close()
    assert await failed_ids(channel, queue_name) == ["single"]


def chromium() -> str:
    """Debian's chromium, which `make tools` installs (never a browser build of Playwright's)."""
    assert CHROMIUM.exists(), "chromium is missing: make tools installs it"
    return str(CHROMIUM)
