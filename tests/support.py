"""Helpers the tests share: publishing, reading queues, running workers in-process or not."""

import asyncio
import datetime as dt
import inspect
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aio_pika.exceptions import ChannelNotFoundEntity
from aiohttp import web
from pydantic import SecretStr
from ricochet.broker.journal import Entry, journal_record
from ricochet.broker.management import open_api, vhost
from ricochet.broker.plan import LANES, MAX_TIERS
from ricochet.errors import RicochetError
from ricochet.handlers.invoker import Invoker
from ricochet.headers import RETRIES
from ricochet.names import DELAY_LEVELS, SHARED, Names
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings, variable_name
from ricochet.worker.worker import Worker
from structlog.testing import capture_logs
from structlog.typing import EventDict, WrappedLogger

from tests.broker import BROKER, Broker

ROOT = Path(__file__).resolve().parent.parent
AMQP_URL = BROKER.amqp_url


def make_settings(queue: str, **overrides: Any) -> Settings:
    """Settings for a test: its own queue, millisecond delays, no HTTP server."""
    values: dict[str, Any] = {
        "amqp_url": AMQP_URL,
        "management_url": BROKER.management_url,
        "queue": queue,
        "retry_delay_ms": 50,
        "http_port": 0,
        "connect_timeout_s": 5,
        "shutdown_timeout_s": 5,
    }
    if "retry_delays_ms" in overrides:  # an explicit ladder replaces the formula's delays
        del values["retry_delay_ms"]
    values.update(overrides)
    return Settings(**values)


class ForeignBytes(str):
    """A string as some other languages' clients send raw bytes: one that is not UTF-8 (the
    client library here only sends str, encoded as UTF-8). It reads as the text it decodes to."""

    raw: bytes

    def __new__(cls, raw: bytes) -> "ForeignBytes":
        value = super().__new__(cls, raw.decode("utf-8", "replace"))
        value.raw = raw
        return value

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


class ForeignTimestamp(dt.datetime):
    """A timestamp as other clients may send it: more milliseconds than a date can hold (a year
    past 9999)."""

    def timestamp(self) -> float:
        return float(2**62)


# Ports a test's server is given: below Linux's ephemeral range (32768-60999), which the
# kernel hands to outgoing connections. A port the kernel chose (bind to 0) is one of those, and
# another suite's AMQP connection could take it before the server bound it: CI's compose stack
# once found its broker's port so taken, beside the matrix. Above the brokers' management ports
# (15672-15692), below their nodes' distribution ports (25672 and up), which a node started
# later needs.
SERVER_PORTS = range(16_000, 25_000)


def free_port() -> int:
    """A TCP port nothing listens on right now (for a test's server), outside the ephemeral
    range."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different TCP ports nothing listens on right now, outside the ephemeral range."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.choice(SERVER_PORTS)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


async def http_status(port: int, path: str) -> int | None:
    """The status a local HTTP endpoint answers with, or None while nothing listens."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}{path}") as response,
        ):
            return response.status
    except aiohttp.ClientConnectionError:
        return None


async def answers(port: int, path: str, code: int) -> bool:
    """Whether a local HTTP endpoint answers with this status now."""
    return await http_status(port, path) == code


@asynccontextmanager
async def statuses_seen(port: int, path: str) -> AsyncIterator[set[int | None]]:
    """Every status a local HTTP endpoint answered with, polled every 0.2 s while the block
    runs."""
    seen: set[int | None] = set()

    async def poll() -> None:
        while True:
            seen.add(await http_status(port, path))
            await asyncio.sleep(0.2)

    task = asyncio.get_running_loop().create_task(poll())
    try:
        yield seen
    finally:
        task.cancel()


async def publish(
    channel: AbstractChannel,
    queue: str,
    body: bytes | str,
    *,
    headers: dict[str, Any] | None = None,
    **properties: Any,
) -> None:
    """Publish one persistent message to a queue through the default exchange, confirmed."""
    await channel.default_exchange.publish(
        aio_pika.Message(
            body.encode() if isinstance(body, str) else body,
            headers=headers or {},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **properties,
        ),
        routing_key=queue,
    )


async def in_tier(
    channel: AbstractChannel,
    queue: str,
    ids: list[str],
    *,
    at_ms: int = 0,
    delay_ms: int = 60_000,
    reason: str = "ValueError: down",
) -> None:
    """Jobs of queue in its first tier (of delay_ms), as the worker sends them there: each a
    failed first attempt, with its journal entry (its reason, and when it was sent, at_ms)."""
    tier = Names(queue).tier(1)
    publishes = [
        channel.default_exchange.publish(
            aio_pika.Message(
                b"{}",
                message_id=message_id,
                type="job",
                headers={RETRIES: 1},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            tier,
        )
        for message_id in ids
    ]
    detail = {"tier": 1, "due_at_ms": at_ms + delay_ms, "reason": reason}
    entries = [Entry(at_ms, "retrying", queue, message_id, "job", 1, detail) for message_id in ids]
    for start in range(0, len(entries), 500):
        record = journal_record(entries[start : start + 500])
        publishes.append(channel.default_exchange.publish(record, SHARED.journal))
    await asyncio.gather(*publishes)


async def depth(channel: AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    return declared.declaration_result.message_count or 0


async def consumers(connection: AbstractConnection, queue: str) -> int:
    """Consumers of a queue (0 when it does not exist yet)."""
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except ChannelNotFoundEntity:
        return 0
    await channel.close()
    return declared.declaration_result.consumer_count or 0


async def exists(connection: AbstractConnection, queue: str) -> bool:
    channel = await connection.channel()
    try:
        await channel.declare_queue(queue, passive=True)
    except ChannelNotFoundEntity:
        return False
    await channel.close()
    return True


async def _holds(predicate: Callable[[], object | Awaitable[object]]) -> bool:
    result = predicate()
    return bool(await result) if inspect.isawaitable(result) else bool(result)


async def wait_for(
    predicate: Callable[[], object | Awaitable[object]],
    timeout_s: float = 20,
    what: str = "condition",
) -> None:
    """Poll a predicate (sync or async) until it holds; fail the test with what it waited for."""
    deadline = time.monotonic() + timeout_s
    while not await _holds(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_depth(channel: AbstractChannel, queue: str, n: int, timeout_s: float = 20) -> None:
    async def reached() -> bool:
        return await depth(channel, queue) >= n

    await wait_for(reached, timeout_s, f"{n} messages in {queue}")


async def take(
    channel: AbstractChannel, queue: str, n: int, timeout_s: float = 20
) -> list[AbstractIncomingMessage]:
    """Get (and ack) n messages from a queue, waiting for them to arrive."""
    q = await channel.declare_queue(queue, passive=True)
    got: list[AbstractIncomingMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        message = await q.get(fail=False, no_ack=True)
        if message is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(got)} of {n} messages arrived in {queue}")
            await asyncio.sleep(0.05)
            continue
        got.append(message)
    return got


async def take_waiting(channel: AbstractChannel, message_id: str) -> AbstractIncomingMessage:
    """A job's copy in the shared levels, taken; the others there are handed back."""
    for k in range(DELAY_LEVELS):
        level = await channel.declare_queue(SHARED.delay(k), passive=True)
        found, others = None, []
        while (message := await level.get(fail=False, no_ack=False)) is not None:
            if message.message_id == message_id:
                await message.ack()
                found = message
            else:
                others.append(message)
        for message in others:
            await message.nack(requeue=True)
        if found is not None:
            return found
    raise AssertionError(f"{message_id} is in none of the levels")


async def orphans_tally(
    channel: AbstractChannel, tally: Counter[str], ids: Collection[str] | None = None
) -> list[AbstractIncomingMessage]:
    """Take the copies of these ids (of any id, without ids) in ricochet.orphans, count each
    by its id in tally, and return them; the others are handed back: ricochet.orphans is the
    vhost's, other tests' orphans may be there."""
    orphans = await channel.declare_queue(SHARED.orphans, passive=True)
    taken, others = [], []
    while (message := await orphans.get(fail=False, no_ack=False)) is not None:
        if ids is None or message.message_id in ids:
            await message.ack()
            tally[str(message.message_id)] += 1
            taken.append(message)
        else:
            others.append(message)
    for message in others:
        await message.nack(requeue=True)
    return taken


async def api_queue(queue: str, columns: str = "arguments,messages,messages_dlx") -> dict[str, Any]:
    """The management API's object for a queue ({} when it does not exist)."""
    async with open_api(BROKER.management_url, BROKER.amqp_url) as api:
        found = await api.queue(vhost(BROKER.amqp_url), queue, columns)
    return found or {}


async def remove_leftovers(prefix: str) -> list[str]:
    """Delete the queues and exchanges whose names begin with prefix (what a test left behind,
    which the broker would keep for ever); their names, [] when the management API does not
    answer."""
    pattern = "^" + re.escape(prefix)
    try:
        async with open_api(BROKER.management_url, BROKER.amqp_url) as api:
            where = vhost(BROKER.amqp_url)
            queues = await api.listing("queues", where, pattern, "name")
            exchanges = await api.listing("exchanges", where, pattern, "name")
    except RicochetError:
        return []
    names = [item["name"] for item in queues + exchanges]
    if names:
        connection = await aio_pika.connect(BROKER.amqp_url)
        channel = await connection.channel()
        for item in queues:
            await channel.queue_delete(item["name"])
        for item in exchanges:
            await channel.exchange_delete(item["name"])
        await connection.close()
    return names


def figures_known(*queues: str) -> Callable[[], Awaitable[bool]]:
    """For wait_for: the management API has figures for these queues (a new queue's appear
    within some seconds)."""

    async def known() -> bool:
        return all(["messages" in await api_queue(q) for q in queues])

    return known


# The key lanes a test's worker may declare (RICOCHET_KEY_LANES' default); remove_leftovers
# deletes any more.
KEY_LANES_DELETED = 16


async def delete_topology(connection: AbstractConnection, queue: str) -> None:
    """Remove every queue and exchange ricochet may have declared for this main queue."""
    n = Names(queue)
    channel = await connection.channel()
    tiers = range(1, MAX_TIERS + 1)
    lanes = [n.lane(k, i) for k in tiers for i in range(1, LANES)]
    delays = [n.delay(k) for k in range(DELAY_LEVELS)]
    for name in [
        n.queue,
        n.failed,
        n.events,
        n.record,
        n.cancels,
        *map(n.tier, tiers),
        *lanes,
        *delays,
        *map(n.key_lane, range(KEY_LANES_DELETED)),
    ]:
        await channel.queue_delete(name)
    for name in [
        n.dlx,
        n.first_tier_exchange,
        n.return_exchange,
        n.return_to_queue,
        n.failed,
        *map(n.lanes, tiers),
        *delays,
        n.keys,
    ]:
        await channel.exchange_delete(name)
    await channel.close()


class InProcessWorker:
    """A Worker running as a task of the test's event loop."""

    def __init__(self, settings: Settings, handler: Any) -> None:
        self.settings = settings
        self.metrics = Metrics(*settings.queue_names)
        self.lifecycle = Lifecycle()
        self.worker = Worker(
            settings,
            Invoker(handler, settings.handler_timeout_s),
            self.metrics,
            self.lifecycle,
        )
        self.task: asyncio.Task[None] | None = None

    async def start(self, wait_ready: bool = True) -> "InProcessWorker":
        """Start serving; unless told not to, wait until /readyz would say 200."""
        self.task = asyncio.create_task(self.worker.serve())
        if not wait_ready:
            return self

        async def ready() -> bool:
            assert self.task is not None
            if self.task.done():
                self.task.result()  # raises what stopped it
            return self.lifecycle.ready

        await wait_for(ready, 20, "the worker to consume")
        return self

    async def stop(self) -> None:
        if self.task is None:
            return
        if not self.task.done():
            self.lifecycle.request_stop()
        await asyncio.wait_for(self.task, 30)
        self.task = None

    def count(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "ricochet_jobs_total", {"queue": self.settings.queue, "outcome": outcome}
        )
        return value or 0.0

    def gauge(self, name: str) -> float | None:
        """A gauge of this worker's queue as a scrape would read it now."""
        return self.gauge_of(self.settings.queue, name)

    def gauge_of(self, queue: str, name: str) -> float | None:
        """A gauge of one of this worker's queues as a scrape would read it now."""
        return self.metrics.registry.get_sample_value(name, {"queue": queue})


# The start_worker fixture: `await start_worker(handler, **settings)`, which waits for the worker
# to be ready unless given `ready=False`.
StartWorker = Callable[..., Awaitable[InProcessWorker]]


def env_text(value: Any) -> str:
    """A setting's value as its variable is written: a ladder "50,100", queues "a=1,b"."""
    if isinstance(value, tuple):
        return ",".join(
            env_text(item)
            if not isinstance(item, tuple)
            else "=".join(map(str, filter(None, item)))
            for item in value
        )
    return str(value)


def ricochet_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment for a ricochet process with these settings (and nothing else RICOCHET_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    for name, value in settings.model_dump().items():
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if value is not None:
            env[variable_name(name)] = env_text(value)
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(
    args: list[str], env: dict[str, str], output: Path | None = None, **kwargs: Any
) -> "subprocess.Popen[str]":
    """Start `python -m ricochet ARGS` from the repository root (use it as a context manager).

    Output goes to the file `output` when given (a busy worker would fill a pipe), else to pipes.
    """
    sink = output.open("a") if output is not None else None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ricochet", *args],
            cwd=ROOT,
            env=env,
            stdout=sink or subprocess.PIPE,
            stderr=subprocess.STDOUT if sink else subprocess.PIPE,
            text=True,
            **kwargs,
        )
    finally:
        if sink is not None:
            sink.close()
    SPAWNED.append(proc)
    return proc


# Every process spawn() started; the reap_spawned fixture kills those a test left running.
SPAWNED: list["subprocess.Popen[str]"] = []


def reap_spawned() -> None:
    """Kill the spawned processes still running and close their pipes."""
    for proc in SPAWNED:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    SPAWNED.clear()


def run_cli(
    args: list[str], env: dict[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m ricochet ARGS` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "ricochet", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def close_connections(
    queue: str, role: str = "worker", broker: Broker = BROKER, pid: int | None = None
) -> int:
    """Have the broker close the connections of ricochet processes of a queue (of one process,
    given its pid); returns how many. A node under load lists a new connection a moment late:
    none found is looked for again."""
    deadline = time.monotonic() + 5
    while (
        closed := _close_connections(queue, role, broker, pid)
    ) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return closed


def _close_connections(queue: str, role: str, broker: Broker, pid: int | None) -> int:
    listed = broker.rabbitmqctl(
        "list_connections", "pid", "client_properties", "-q", "--no-table-headers"
    )
    prefix = f"ricochet {role} {queue} "
    closed = 0
    for line in listed.splitlines():
        connection, _, properties = line.partition("\t")
        found = re.search(r'\{"connection_name","([^"]*)"\}', properties)
        name = found.group(1) if found else ""
        if name.startswith(prefix) and (pid is None or name.endswith(f":{pid}")):
            broker.rabbitmqctl("close_connection", connection, "test", check=False)
            closed += 1
    return closed


def journal(path: Path) -> list[tuple[str, str, int]]:
    """(event, message_id, attempt) lines written by tests.handlers."""
    if not path.exists():
        return []
    rows = []
    # The last line may still be being written: only whole lines count.
    for line in path.read_text().split("\n")[:-1]:
        event, message_id, attempt = line.split()
        rows.append((event, message_id, int(attempt)))
    return rows


def log_events(text: str) -> list[dict[str, Any]]:
    """A process's JSON log lines, in order: only whole lines (the last may still be being
    written), and only those that are JSON objects."""
    return [json.loads(line) for line in text.split("\n")[:-1] if line.startswith("{")]


def logged_ids(events: list[dict[str, Any]], event: str) -> set[str]:
    """The message_ids of the log lines of this event."""
    return {str(line.get("message_id")) for line in events if line.get("event") == event}


def done_ids(events: list[dict[str, Any]]) -> set[str]:
    """The ids of the jobs whose success was logged."""
    return logged_ids(events, "job succeeded")


@contextmanager
def readiness_at_each_log_line(ready: Callable[[], bool]) -> Iterator[list[EventDict]]:
    """Capture the log lines, each with what /readyz answered when it was written."""

    def sample(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
        event["ready"] = ready()
        return event

    with capture_logs(processors=[sample]) as lines:
        yield lines


class WebhookServer:
    """A local HTTP endpoint that records alert bodies and answers with scripted statuses."""

    def __init__(self, statuses: list[int], hang_on: str | None = None) -> None:
        self.statuses = statuses  # answered in turn; the last one repeats
        self.hang_on = hang_on  # alerts of this event are never answered
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["event"] == self.hang_on:
            await asyncio.sleep(3600)
        self.requests.append(body)
        status = self.statuses[min(len(self.requests), len(self.statuses)) - 1]
        return web.Response(status=status)

    async def start(self) -> "WebhookServer":
        app = web.Application()
        app.router.add_post("/hook/secret-token", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook/secret-token"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def delivered(self, event: str) -> list[dict[str, Any]]:
        """Bodies of this event that were answered with a 2xx."""
        return [
            body
            for i, body in enumerate(self.requests)
            if body["event"] == event and self.statuses[min(i, len(self.statuses) - 1)] < 300
        ]


# The webhook fixture: `await webhook([500, 200])` answers 500, then 200 from then on;
# `await webhook([200], hang_on="job.failed")` never answers job alerts.
StartWebhook = Callable[..., Awaitable[WebhookServer]]


@asynccontextmanager
async def monitor_process(queue: str, token: str | None = None) -> AsyncIterator[str]:
    """`ricochet monitor` with its HTTP server on a free local port; yields the base URL."""
    port = free_port()
    env = ricochet_env(make_settings(queue, http_port=port, console_token=token))
    proc = spawn(["monitor"], env)
    try:
        await wait_for(lambda: answers(port, "/healthz", 200), 30, "the monitor's HTTP server")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.communicate, timeout=30)
