"""The HTTP side of a service process: /metrics, /healthz and /readyz on one port."""

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.errors import RicochetError

log = structlog.get_logger("ricochet.http")

# All interfaces: in a container the orchestrator and Prometheus reach the process from outside.
HOST = "0.0.0.0"


def routes(registry: CollectorRegistry, ready: Callable[[], bool]) -> web.RouteTableDef:
    """The endpoints: metrics from the process's registry, liveness, and readiness from ready()."""
    table = web.RouteTableDef()

    @table.get("/metrics")
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    @table.get("/healthz")
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    @table.get("/readyz")
    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    return table


@asynccontextmanager
async def serve_http(
    port: int, registry: CollectorRegistry, ready: Callable[[], bool]
) -> AsyncIterator[None]:
    """Serve the endpoints on HOST:port for the duration of the block (nothing when port is 0).

    Raises RicochetError when the port cannot be bound (in use, or not allowed).
    """
    if port == 0:
        yield
        return
    app = web.Application()
    app.add_routes(routes(registry, ready))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, HOST, port).start()
    except OSError as error:
        await runner.cleanup()
        raise RicochetError(
            f"RICOCHET_HTTP_PORT={port}: cannot listen on {HOST}:{port} ({error.strerror}); "
            "choose a free port, or 0 to turn HTTP off"
        ) from None
    log.info("http serving", host=HOST, port=port, paths=["/metrics", "/healthz", "/readyz"])
    try:
        yield
    finally:
        await runner.cleanup()
