"""The HTTP endpoints of a service process, served on a real socket (no broker needed)."""

import asyncio
import socket

import aiohttp
import psutil
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from ricochet.errors import RicochetError
from ricochet.service.http import serve_http

from tests.support import free_port

LOOPBACK = "127.0.0.1"


async def get(port: int, path: str) -> tuple[int, str, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, response.headers["Content-Type"], await response.text()


async def test_endpoints_follow_the_registry_and_the_ready_flag() -> None:
    """/healthz is always 200, /readyz follows ready(), /metrics exposes the given registry."""
    registry = CollectorRegistry()
    Counter("demo_events", "Events.", registry=registry).inc(3)
    ready = False
    port = free_port()
    async with serve_http(LOOPBACK, port, registry, lambda: ready):
        assert (await get(port, "/healthz"))[0] == 200
        assert (await get(port, "/readyz"))[0] == 503
        ready = True
        assert (await get(port, "/readyz"))[0] == 200
        status, content_type, text = await get(port, "/metrics")
        assert status == 200
        assert content_type.startswith("text/plain; version=")
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples["demo_events_total"] == 3


async def test_the_server_stops_with_the_block() -> None:
    """Leaving the block closes the port again."""
    port = free_port()
    async with serve_http(LOOPBACK, port, CollectorRegistry(), lambda: True):
        pass
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(port, "/healthz")


def listening() -> set[int]:
    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


async def test_port_zero_serves_nothing() -> None:
    """Port 0 turns HTTP off: the block runs and the process opens no listening socket."""
    before = listening()
    async with serve_http(LOOPBACK, 0, CollectorRegistry(), lambda: True):
        during = listening()
    assert during == before


async def test_a_port_in_use_is_a_clear_error() -> None:
    """A taken port raises RicochetError naming the variable and the port, before the block."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RicochetError, match=f"RICOCHET_HTTP_PORT={port}: cannot listen"):
            async with serve_http(LOOPBACK, port, CollectorRegistry(), lambda: True):
                pytest.fail("the block must not run")


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    return await reader.read()  # b"" once the server has closed the connection


async def test_a_client_slow_to_send_its_request_is_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that sends half a request line and stalls is closed by the server after
    REQUEST_TIMEOUT_S, so slow clients cannot hold sockets and memory for ever."""
    monkeypatch.setattr("ricochet.service.http.REQUEST_TIMEOUT_S", 0.5)
    port = free_port()
    async with serve_http(LOOPBACK, port, CollectorRegistry(), lambda: True):
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        await writer.drain()
        assert await asyncio.wait_for(read_until_closed(reader), 5) == b""
        writer.close()


async def test_connections_beyond_the_cap_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With MAX_CONNECTIONS open, a further connection is closed at once; once one closes,
    requests are served again."""
    monkeypatch.setattr("ricochet.service.http.MAX_CONNECTIONS", 3)
    port = free_port()
    async with serve_http(LOOPBACK, port, CollectorRegistry(), lambda: True):
        held = [await asyncio.open_connection(LOOPBACK, port) for _ in range(3)]
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        assert await asyncio.wait_for(read_until_closed(reader), 2) == b""
        writer.close()
        held[0][1].close()
        await asyncio.sleep(0.1)
        assert (await get(port, "/healthz"))[0] == 200
        for _, other in held[1:]:
            other.close()


async def test_not_ready_names_its_reasons() -> None:
    """/readyz 503 names each reason unready() gives, one a line."""
    port = free_port()
    reasons = ["orders: conflict (queue 'orders' conflicts with the settings)", "mail: connecting"]
    async with serve_http(
        LOOPBACK, port, CollectorRegistry(), lambda: False, unready=lambda: reasons
    ):
        status, _, text = await get(port, "/readyz")
    assert status == 503
    assert text.splitlines() == ["not ready", *reasons]
