"""The HTTP side of a service process: /metrics, /healthz and /readyz on one port."""

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ricochet.errors import RicochetError
from ricochet.log import get_logger
from ricochet.settings import variable_name

log = get_logger("ricochet.http")

# Probes and scrapes are one short request each: a client that takes longer than this to send
# its request (or keeps an idle connection) is cut off, so slow clients cannot pile up.
REQUEST_TIMEOUT_S = 5.0
# Prometheus and a probe or two need a handful; beyond this new connections are closed at once.
MAX_CONNECTIONS = 64


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def routes(
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    healthy: Callable[[], bool],
    unready: Callable[[], list[str]] = list,
) -> web.RouteTableDef:
    """The endpoints: metrics from the process's registry, liveness from healthy(), and
    readiness from ready() (when not ready, /readyz names each reason unready() gives)."""
    table = web.RouteTableDef()

    @table.get("/metrics")
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    @table.get("/healthz")
    async def healthz(_: web.Request) -> web.Response:
        if healthy():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="unhealthy\n")

    @table.get("/readyz")
    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        reasons = ["not ready", *unready()]
        return web.Response(status=503, text="".join(f"{r}\n" for r in reasons))

    return table


@asynccontextmanager
async def serve_http(
    host: str,
    port: int,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    pages: Iterable[web.AbstractRouteDef] = (),
    healthy: Callable[[], bool] = lambda: True,
    unready: Callable[[], list[str]] = list,
) -> AsyncIterator[None]:
    """Serve the endpoints, and a service's own pages, on host:port for the duration of the
    block (nothing when port is 0); /healthz answers 200 while the process runs, unless
    healthy() says otherwise; /readyz answers 200 while ready(), else 503 naming what unready()
    says.

    Raises RicochetError when the port cannot be bound (in use, or not allowed).
    """
    if port == 0:
        yield
        return
    app = web.Application()
    app.add_routes(routes(registry, ready, healthy, unready))
    pages = list(pages)
    app.add_routes(pages)
    # aiohttp's keep-alive timer runs from the connection's start, also while a request's
    # headers are still arriving: it is the header-read timeout too. A client that goes away
    # cancels its request's handler, so a page given up leaves no work behind.
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=REQUEST_TIMEOUT_S,
        handler_cancellation=True,
    )
    await runner.setup()
    handler = runner.server
    assert handler is not None

    def accept() -> asyncio.BaseProtocol:
        return _Refused() if len(handler.connections) >= MAX_CONNECTIONS else handler()

    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(accept, host, port)
    except OSError as error:
        await runner.cleanup()
        raise RicochetError(
            f"{variable_name('http_port')}={port}: cannot listen on {host}:{port} "
            f"({error.strerror}); choose a free port, or 0 to turn HTTP off"
        ) from None
    paths = [
        "/metrics",
        "/healthz",
        "/readyz",
        *sorted({p.path for p in pages if isinstance(p, web.RouteDef) and p.method == "GET"}),
    ]
    log.info("http serving", host=host, port=port, paths=paths)
    try:
        yield
    finally:
        server.close()
        await runner.cleanup()
