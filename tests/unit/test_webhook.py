"""Webhook delivery against a real local HTTP endpoint (no broker needed)."""

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from ricochet.observe.metrics import Metrics
from ricochet.observe.webhook import Webhook
from structlog.testing import capture_logs


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[str]]]:
    """A URL that redirects to another path of the same server, and the paths POSTed to."""
    posted: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        posted.append(request.path)
        if request.path == "/hook":
            raise web.HTTPTemporaryRedirect("/elsewhere")
        return web.Response()

    app = web.Application()
    app.router.add_post("/{path}", hook)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", posted
    await runner.cleanup()


async def test_redirects_are_not_followed(endpoint: tuple[str, list[str]]) -> None:
    """A webhook answering with a redirect does not get the alert sent where it points: the
    alert counts as not delivered."""
    base, posted = endpoint
    hook = Webhook(f"{base}/hook", Metrics("jobs"), first_retry_s=0.01, max_retry_s=0.01)
    hook.start()
    with capture_logs() as logs:
        await hook.send({"event": "job.failed"})
        await hook.close(5)
    assert set(posted) == {"/hook"}
    (given_up,) = [log for log in logs if log["event"] == "alert not delivered"]
    assert given_up["error"] == "HTTP 307"


async def test_an_unexpected_error_costs_one_alert_only(endpoint: tuple[str, list[str]]) -> None:
    """An alert the sender cannot even encode is logged and settled; the next one still goes
    out, and closing the webhook raises nothing (the monitor exits 0)."""
    base, posted = endpoint
    hook = Webhook(f"{base}/ok", Metrics("jobs"))
    hook.start()
    settled: list[str] = []

    async def settle(name: str) -> None:
        settled.append(name)

    with capture_logs() as logs:
        await hook.send({"event": "job.failed", "bad": object()}, lambda: settle("bad"))
        await hook.send({"event": "job.failed"}, lambda: settle("good"))
        await hook.close(5)
    assert posted == ["/ok"]
    assert settled == ["bad", "good"]
    assert any(log["event"] == "alert not delivered" for log in logs)
