"""The async Client against the real broker: what reaches the queue, what the worker makes of
it, and every way an enqueue can fail."""

import asyncio
import datetime as dt
import time
from collections import Counter
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import (
    BrokerUnavailable,
    Client,
    InvalidJob,
    Job,
    NotConfirmed,
    PermanentError,
    SyncClient,
)
from ricochet.broker.amqp import frame_max, table_size
from ricochet.broker.declare import declare
from ricochet.client.message import run_at_text
from ricochet.delivery.failed import PROPERTIES_RESERVE_BYTES
from ricochet.errors import ConfigError
from ricochet.headers import INCARNATION, WAITING_SINCE
from ricochet.names import SHARED

from tests.support import (
    AMQP_URL,
    StartWorker,
    close_connections,
    depth,
    make_settings,
    ricochet_env,
    run_cli,
    take,
    take_waiting,
    wait_for,
)


async def test_a_job_is_confirmed_and_run_as_enqueued(
    queue_name: str, start_worker: StartWorker
) -> None:
    """enqueue returns the id once confirmed; the worker's Job holds the type, the payload, the
    id and the headers, and its budget follows max_retries."""
    jobs: list[Job] = []

    def handler(job: Job) -> None:
        jobs.append(job)
        if job.payload.get("fail"):
            raise ConnectionError("down")

    await start_worker(handler, max_retries=3, retry_delay_ms=50)
    async with Client(AMQP_URL, queue_name) as client:
        given = await client.enqueue(
            "report",
            {"report_id": "r-1", "fail": True},
            message_id="job-1",
            max_retries=1,
            headers={"x-request-id": "req-7", "tenant": "acme"},
        )
        generated = await client.enqueue("report", {"report_id": "r-2"})
    assert given == "job-1"
    assert len(generated) == 32

    await wait_for(lambda: len(jobs) == 3, 20, "two attempts of the first job, one of the second")
    await asyncio.sleep(0.3)  # no fourth attempt comes
    first = [j for j in jobs if j.message_id == "job-1"]
    assert [(j.attempt, j.max_attempts) for j in first] == [(1, 2), (2, 2)]
    assert (first[0].type, first[0].payload) == ("report", {"report_id": "r-1", "fail": True})
    assert first[0].content_type == "application/json"
    assert first[0].headers["x-request-id"] == "req-7"
    assert first[0].headers["tenant"] == "acme"
    assert first[0].headers["max-retries"] == 1
    [second] = [j for j in jobs if j.message_id == generated]
    assert (second.type, second.payload, second.attempt) == ("report", {"report_id": "r-2"}, 1)


async def test_the_message_keeps_the_wire_contract(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Persistent, to Q through the default exchange, the type property, JSON, a run-at header
    in UTC for delay and run_at; bytes travel untouched. A job due later waits in the shared
    levels from the start, its route and its wait as a worker would write them."""
    await declare(connection, make_settings(queue_name))
    before = dt.datetime.now(dt.UTC)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("mail", {"to": "ann@example.com"}, message_id="now")
        await client.enqueue("mail", {}, message_id="later", delay=dt.timedelta(minutes=5))
        paris = dt.timezone(dt.timedelta(hours=1))
        at = dt.datetime(2026, 12, 1, 9, 30, 0, 250000, tzinfo=paris)
        await client.enqueue("mail", {}, message_id="at", run_at=at)
        await client.enqueue("raw", b"\x00\xff", message_id="bytes")
    after = dt.datetime.now(dt.UTC)

    got = {m.message_id: m for m in await take(channel, queue_name, 3)}
    got["later"] = await take_waiting(channel, "later")
    now = got["now"]
    assert (now.delivery_mode, now.type, now.routing_key, now.exchange) == (
        2,
        "mail",
        queue_name,
        "",
    )
    assert (now.body, now.content_type) == (b'{"to":"ann@example.com"}', "application/json")
    assert "run-at" not in (now.headers or {})
    assert got["later"].exchange == SHARED.delay_entry
    assert str(got["later"].routing_key).endswith(f".{queue_name}")
    assert isinstance(got["later"].headers[WAITING_SINCE], int)
    later = dt.datetime.fromisoformat(str(got["later"].headers["run-at"]))
    assert later.utcoffset() == dt.timedelta(0)
    five_minutes = dt.timedelta(minutes=5)
    assert before + five_minutes <= later <= after + five_minutes + dt.timedelta(milliseconds=1)
    assert got["at"].headers["run-at"] == "2026-12-01T08:30:00.250Z"
    assert (got["bytes"].body, got["bytes"].content_type) == (b"\x00\xff", None)


async def test_invalid_jobs_send_nothing(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """InvalidJob comes before anything reaches the broker: the queue stays empty."""
    await declare(connection, make_settings(queue_name))
    async with Client(AMQP_URL, queue_name) as client:
        jobs: list[dict[str, Any]] = [
            {"job_type": ""},
            {"max_retries": 26},
            {"delay": -1},
            {"run_at": dt.datetime(2026, 12, 1, 9, 30)},
            {"delay": 1, "run_at": dt.datetime.now(dt.UTC)},
            {"headers": {"x-death": []}},
            {"headers": {"a": {1: "x"}}},
            {"headers": {"blob": "b" * 200_000}},
            {"run_at": dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))},
            {"payload": object()},
        ]
        for job in jobs:
            arguments: dict[str, Any] = {"job_type": "mail", "payload": {}, **job}
            with pytest.raises(InvalidJob):
                await client.enqueue(
                    arguments.pop("job_type"), arguments.pop("payload"), **arguments
                )
        await client.enqueue("mail", {}, message_id="valid")
    [only] = await take(channel, queue_name, 1)
    assert only.message_id == "valid"
    assert await depth(channel, queue_name) == 0


async def test_an_oversize_job_fails_alone(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """A job whose headers cannot fit a frame, enqueued among ten good ones on one Client: it
    raises InvalidJob before it is sent (the broker would close the shared connection with a
    FRAME_ERROR, cutting the others off); every good job is confirmed, and in the queue once."""
    await channel.declare_queue(queue_name, durable=True)
    good: list[str] = []
    async with Client(AMQP_URL, queue_name) as client:
        for round_ in range(3):
            results = await asyncio.gather(
                *(
                    client.enqueue(
                        "mail",
                        {"n": n},
                        message_id=f"{round_}-{n}",
                        headers={"blob": "b" * 200_000} if n == 5 else None,
                    )
                    for n in range(11)
                ),
                return_exceptions=True,
            )
            refused = results.pop(5)
            assert isinstance(refused, InvalidJob), refused
            assert str(refused).startswith("headers"), refused
            assert all(isinstance(r, str) for r in results), results
            good += [str(r) for r in results]
    got = Counter(str(m.message_id) for m in await take(channel, queue_name, len(good)))
    assert got == Counter(good)
    assert await depth(channel, queue_name) == 0


async def test_headers_that_fill_the_frame_travel(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """The largest headers the client takes, beside every property at its longest, reach the
    queue whole; a byte more is refused before it is sent, and the client goes on."""
    await channel.declare_queue(queue_name, durable=True)
    limit = frame_max(connection) - PROPERTIES_RESERVE_BYTES
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    # What the client adds (the incarnation token is 16 hex digits of its own).
    added = {"max-retries": 25, "run-at": run_at_text(run_at), INCARNATION: "0" * 16}
    blob = "b" * (limit - table_size({**added, "blob": ""}))
    longest: dict[str, Any] = {
        "message_id": "m" * 255,
        "content_type": "c" * 255,
        "max_retries": 25,
        "run_at": run_at,
    }
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("t" * 255, b"", headers={"blob": blob}, **longest)
        with pytest.raises(InvalidJob, match=rf"^headers take {limit + 1} bytes"):
            await client.enqueue("t" * 255, b"", headers={"blob": blob + "b"}, **longest)
        await client.enqueue("mail", {}, message_id="after")
    full, after = await take(channel, queue_name, 2)
    token = full.headers.pop(INCARNATION)
    added.pop(INCARNATION)
    assert full.headers == {**added, "blob": blob}
    assert isinstance(token, str)
    assert len(token) == 16
    assert (full.message_id, full.type) == ("m" * 255, "t" * 255)
    assert after.message_id == "after"


async def test_a_cancel_of_an_impossible_id_sends_nothing(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """cancel refuses a message_id no job can have (empty, not a string, longer than an AMQP
    short string) before sending, as enqueue would; the client goes on."""
    await channel.declare_queue(queue_name, durable=True)
    async with Client(AMQP_URL, queue_name) as client:
        for message_id in ["", None, "x" * 300]:
            with pytest.raises(InvalidJob, match=r"^message_id"):
                await client.cancel(message_id)  # type: ignore[arg-type]
        await client.enqueue("mail", {}, message_id="after")
    [after] = await take(channel, queue_name, 1)
    assert after.message_id == "after"


async def test_a_missing_queue_is_an_error_not_a_lost_job(queue_name: str) -> None:
    """Q does not exist: the broker returns the job (mandatory) and enqueue says so."""
    async with Client(AMQP_URL, queue_name) as client:
        with pytest.raises(NotConfirmed, match=r"was not enqueued: queue .* does not exist"):
            await client.enqueue("mail", {}, message_id="m1")


async def test_concurrent_returns_of_one_message_id_each_fail(queue_name: str) -> None:
    """Two enqueues of the same id in flight at once, both returned: neither is taken for
    confirmed (the client library matches a return to its publish by message_id)."""
    async with Client(AMQP_URL, queue_name) as client:
        results = await asyncio.gather(
            *(client.enqueue("mail", {"n": n}, message_id="same") for n in range(4)),
            return_exceptions=True,
        )
    assert all(isinstance(r, NotConfirmed) for r in results), results


async def test_a_refused_job_is_an_error(
    queue_name: str, channel: AbstractChannel, connection: AbstractConnection
) -> None:
    """A queue that refuses publishes (full, reject-publish): the broker nacks, enqueue says so."""
    await channel.declare_queue(
        queue_name, durable=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    async with Client(AMQP_URL, queue_name) as client:
        with pytest.raises(NotConfirmed, match="the broker refused it"):
            await client.enqueue("mail", {}, message_id="m1")


def test_an_unreachable_broker_is_a_clear_error(queue_name: str) -> None:
    """No broker: BrokerUnavailable after the connect timeout, without the password."""

    async def enqueue() -> None:
        client = Client("amqp://app:hunter2@127.0.0.1:1/", queue_name, connect_timeout_s=1)
        try:
            await client.enqueue("mail", {})
        finally:
            await client.close()

    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="unreachable after 1 s") as raised:
        asyncio.run(enqueue())
    assert time.monotonic() - started < 10
    assert "hunter2" not in str(raised.value)


def test_invalid_settings_are_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client reads RICOCHET_AMQP_URL and RICOCHET_QUEUE, validated as the worker's are;
    the worker's other settings are none of its business."""
    monkeypatch.setenv("RICOCHET_QUEUE", "orders")
    monkeypatch.setenv("RICOCHET_AMQP_URL", "amqp://app:secret@rabbit:5672/")
    monkeypatch.setenv("RICOCHET_MAX_RETRIES", "99")
    client = Client()
    assert (client.queue, client.amqp_url) == ("orders", "amqp://app:secret@rabbit:5672/")
    assert Client(queue="other").queue == "other"
    with pytest.raises(ConfigError, match="RICOCHET_QUEUE='no spaces' is invalid"):
        Client(queue="no spaces")
    with pytest.raises(ConfigError, match="RICOCHET_AMQP_URL="):
        Client("http://rabbit/")


async def test_it_reconnects_after_the_broker_drops_it(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """The broker closes the client's connection between two enqueues: the second connects
    again and is confirmed."""
    await declare(connection, make_settings(queue_name))
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("mail", {}, message_id="before")
        assert await asyncio.to_thread(close_connections, queue_name, "client") == 1
        # Until the client has read the broker's close, a publish would be cut off with it.
        await wait_for(lambda: client._channel is None or client._channel.is_closed, 10)
        await client.enqueue("mail", {}, message_id="after")
    got = await take(channel, queue_name, 2)
    assert [m.message_id for m in got] == ["before", "after"]


async def test_concurrent_enqueues_share_one_connection_and_close_waits_for_them(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """500 enqueues at once, and close() called while they are in flight: every one is
    confirmed, none twice, and later enqueues are refused."""
    await declare(connection, make_settings(queue_name))
    client = Client(AMQP_URL, queue_name)
    tasks = [asyncio.create_task(client.enqueue("mail", {"n": n})) for n in range(500)]
    await asyncio.sleep(0)
    await client.close()
    assert all(t.done() for t in tasks)
    ids = [t.result() for t in tasks]
    assert len(set(ids)) == 500
    assert sorted(str(m.message_id) for m in await take(channel, queue_name, 500)) == sorted(ids)
    assert await depth(channel, queue_name) == 0
    with pytest.raises(RuntimeError, match="closed"):
        await client.enqueue("mail", {})


async def test_cancel_drops_a_scheduled_job(start_worker: StartWorker, queue_name: str) -> None:
    """Client.cancel and SyncClient.cancel: the job scheduled with delay= never runs, the one not
    cancelled does; cancelling an unknown id is no error."""
    ran: list[str | None] = []

    async def handler(job: Job) -> None:
        ran.append(job.message_id)

    worker = await start_worker(handler)
    async with Client(AMQP_URL, queue_name) as client:
        for message_id in ("async-cancelled", "sync-cancelled", "kept"):
            await client.enqueue("mail", {}, message_id=message_id, delay=1.5)
        await client.cancel("async-cancelled")
        await client.cancel("never-enqueued")
    sync = SyncClient(AMQP_URL, queue_name)
    try:
        await asyncio.to_thread(sync.cancel, "sync-cancelled")
    finally:
        await asyncio.to_thread(sync.close)
    await wait_for(lambda: ran == ["kept"], 10, "the job not cancelled")
    await wait_for(lambda: worker.count("cancelled") == 2, 10, "two cancelled jobs")
    assert ran == ["kept"]


async def test_cancelling_an_unknown_or_finished_job_changes_nothing(
    start_worker: StartWorker, queue_name: str
) -> None:
    """A cancel stops the job that waits when it is made, not its id for good: a job enqueued
    with a cancelled id right after the cancel runs, so does one scheduled with it a second
    later, and a failed job cancelled, then replayed, runs again, through a retry tier too."""
    attempts: list[tuple[str | None, int]] = []

    async def handler(job: Job) -> None:
        attempts.append((job.message_id, job.attempt))
        if job.message_id == "failed-then-replayed":
            if job.headers.get("replay-count") is None:
                raise PermanentError("fails for good, until replayed")
            if job.attempt == 1:
                raise ConnectionError("one transient failure after the replay")

    worker = await start_worker(handler, retry_delays_ms="300")
    async with Client(AMQP_URL, queue_name) as client:
        await client.cancel("unknown-then-enqueued")
        await client.enqueue("mail", {}, message_id="unknown-then-enqueued")
        await client.cancel("unknown-then-scheduled")
        await asyncio.sleep(1.1)  # a whole second later: AMQP timestamps keep whole seconds
        await client.enqueue("mail", {}, message_id="unknown-then-scheduled", delay=0.5)
        await client.enqueue("mail", {}, message_id="failed-then-replayed")
        await wait_for(lambda: worker.count("failed") == 1, 10, "the failed job")
        await client.cancel("failed-then-replayed")
    await asyncio.sleep(1.1)
    env = ricochet_env(make_settings(queue_name))
    done = await asyncio.to_thread(run_cli, ["replay", "--message-id", "failed-then-replayed"], env)
    assert done.returncode == 0, done.stderr
    await wait_for(lambda: worker.count("succeeded") == 3, 10, "three jobs done")
    assert sorted(attempts) == [
        ("failed-then-replayed", 1),
        ("failed-then-replayed", 1),
        ("failed-then-replayed", 2),
        ("unknown-then-enqueued", 1),
        ("unknown-then-scheduled", 1),
    ]
    assert worker.count("cancelled") == 0
