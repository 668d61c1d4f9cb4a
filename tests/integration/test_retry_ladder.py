"""The retry ladder end to end: the broker moves jobs through the tiers to the failed queue."""

import itertools
import json
import time

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job
from ricochet.names import Names

from tests.recorder import Recorder
from tests.support import ForeignBytes, StartWorker, publish, take, wait_depth, wait_for

QUEUE_TYPES = ["quorum", "classic"]


async def until_seen(recorder: Recorder, message_id: str, attempts: int) -> None:
    async def seen() -> bool:
        return len(recorder.seen[message_id]) >= attempts

    await wait_for(seen, 30, f"{attempts} attempts of {message_id}")


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_success_is_acked(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """A job whose handler returns is acked: the main queue is empty and nothing failed."""
    recorder = Recorder()
    worker = await start_worker(recorder, queue_type=queue_type)
    await publish(channel, queue_name, json.dumps({"n": 1}), message_id="ok-1")

    async def done() -> bool:
        return worker.count("succeeded") == 1

    await wait_for(done, 10, "the job to succeed")
    await worker.stop()
    n = Names(queue_name)
    for queue in (n.queue, n.failed, n.tier(1)):
        declared = await channel.declare_queue(queue, passive=True)
        assert declared.declaration_result.message_count == 0, queue
    assert recorder.attempts("ok-1") == [1]


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_always_failing_job_walks_every_tier(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """Attempts are spaced by the tier delays (200, 400, 800 ms); then the job is in the failed
    queue with the SPEC's headers and a byte-identical body."""
    recorder = Recorder()
    await start_worker(
        recorder,
        queue_type=queue_type,
        max_retries=3,
        retry_delay_ms=200,
        retry_delay_multiplier=2.0,
    )
    body = json.dumps({"fail": "always", "data": "é\u2603"}).encode()
    await publish(
        channel,
        queue_name,
        body,
        message_id="walker",
        type="report",
        correlation_id="corr-1",
        app_id="tests",
        content_type="application/json",
        headers={"tenant": "acme"},
    )
    n = Names(queue_name)
    [copy] = await take(channel, n.failed, 1, timeout_s=30)

    assert recorder.attempts("walker") == [1, 2, 3, 4]
    times = [a.at for a in recorder.seen["walker"]]
    gaps_ms = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    for gap, delay in zip(gaps_ms, (200, 400, 800), strict=True):
        assert delay - 5 <= gap <= delay + 400, (gaps_ms, "tier delays")
    assert {a.max_attempts for a in recorder.seen["walker"]} == {4}

    assert copy.body == body
    assert (copy.message_id, copy.type, copy.correlation_id, copy.app_id) == (
        "walker",
        "report",
        "corr-1",
        "tests",
    )
    assert copy.content_type == "application/json"
    assert copy.delivery_mode == 2
    h = copy.headers
    assert h["tenant"] == "acme"
    assert h["failed-kind"] == "exhausted"
    assert h["failed-reason"] == "ConnectionError: transient trouble on attempt 4"
    assert h["failed-exception"] == "ConnectionError"
    traceback = h["failed-traceback"]
    assert isinstance(traceback, str)
    assert "ConnectionError" in traceback
    assert h["retry-count"] == 3
    assert h["original-queue"] == queue_name
    assert h["original-routing-key"] == queue_name
    failed_at = h["failed-at"]
    assert isinstance(failed_at, str)
    assert failed_at.endswith("+00:00")
    assert not any(k.startswith(("x-death", "x-first-death", "x-last-death")) for k in h)
    # The monitor's copy went to the events queue as well; nothing is left anywhere else.
    await wait_depth(channel, n.events, 1)
    for queue in (n.queue, n.tier(1), n.tier(2), n.tier(3)):
        declared = await channel.declare_queue(queue, passive=True)
        assert declared.declaration_result.message_count == 0, queue


async def test_job_recovers_on_a_retry(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A job that fails twice succeeds on attempt 3 and is acked; nothing reaches failed."""
    recorder = Recorder()
    worker = await start_worker(recorder, max_retries=3, retry_delay_ms=20)
    await publish(channel, queue_name, json.dumps({"fail": 2}), message_id="phoenix")

    async def done() -> bool:
        return "phoenix" in recorder.succeeded

    await wait_for(done, 15, "the job to recover")
    await worker.stop()
    assert recorder.attempts("phoenix") == [1, 2, 3]
    declared = await channel.declare_queue(Names(queue_name).failed, passive=True)
    assert declared.declaration_result.message_count == 0
    assert worker.count("retried") == 2
    assert worker.count("succeeded") == 1


async def test_permanent_error_skips_retries(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """PermanentError sends the job to the failed queue on its first attempt."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=5, retry_delay_ms=20)
    await publish(channel, queue_name, json.dumps({"fail": "permanent"}), message_id="doomed")
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert recorder.attempts("doomed") == [1]
    assert copy.headers["failed-kind"] == "permanent"
    assert copy.headers["retry-count"] == 0
    assert copy.headers["failed-exception"] == "ricochet.errors.PermanentError"


async def test_max_retries_header_lowers_budget(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A max-retries header of 1 gives the job two attempts, even with 5 configured."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=5, retry_delay_ms=20)
    await publish(
        channel,
        queue_name,
        json.dumps({"fail": "always"}),
        message_id="brief",
        headers={"max-retries": 1},
    )
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert recorder.attempts("brief") == [1, 2]
    assert {a.max_attempts for a in recorder.seen["brief"]} == {2}
    assert copy.headers["retry-count"] == 1
    assert copy.headers["max-retries"] == 1


async def test_bad_bodies_and_unknown_types_fail_and_worker_keeps_going(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """An undecodable body and an unknown type fail at once; later jobs still run."""
    from ricochet import Router

    router = Router()
    handled: list[str | None] = []

    @router.handler("known")
    def known(job: Job) -> None:
        job.payload  # noqa: B018 - decoding is part of the contract
        handled.append(job.message_id)

    await start_worker(router, max_retries=3, retry_delay_ms=20)
    await publish(channel, queue_name, b"\xff\xfe not json", message_id="garbage", type="known")
    await publish(channel, queue_name, b"{}", message_id="stranger", type="unknown")
    await publish(channel, queue_name, b"{}", message_id="fine", type="known")
    copies = {m.message_id: m for m in await take(channel, Names(queue_name).failed, 2)}

    async def fine_done() -> bool:
        return "fine" in handled

    await wait_for(fine_done, 10, "the good job")
    assert copies["garbage"].headers["failed-kind"] == "permanent"
    assert copies["garbage"].headers["failed-exception"] == "ricochet.errors.InvalidPayload"
    assert copies["garbage"].body == b"\xff\xfe not json"
    assert copies["stranger"].headers["failed-exception"] == "ricochet.errors.UnknownJobType"
    reason = copies["stranger"].headers["failed-reason"]
    assert isinstance(reason, str)
    assert "unknown" in reason


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_no_retries(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """With RICOCHET_MAX_RETRIES=0 a transient failure goes straight to the failed queue."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=0, queue_type=queue_type)
    await publish(channel, queue_name, json.dumps({"fail": "always"}), message_id="once")
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert recorder.attempts("once") == [1]
    assert copy.headers["failed-kind"] == "exhausted"
    assert copy.headers["retry-count"] == 0


async def test_sync_handler_runs_in_a_thread(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Sync handlers run concurrently in threads, so a slow one does not block others."""
    import threading

    started = threading.Barrier(3, timeout=10)
    threads: set[str] = set()

    def handler(job: Job) -> None:
        threads.add(threading.current_thread().name)
        started.wait()  # only passes when three jobs run at the same time

    worker = await start_worker(handler, prefetch=3)
    for i in range(3):
        await publish(channel, queue_name, b"{}", message_id=f"s{i}")

    async def done() -> bool:
        return worker.count("succeeded") == 3

    await wait_for(done, 15, "three concurrent sync jobs")
    assert len(threads) == 3
    assert threading.main_thread().name not in threads


async def test_handler_timeout_is_transient(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A handler that runs past the timeout is retried, then fails with HandlerTimeout."""
    recorder = Recorder()
    await start_worker(recorder, handler_timeout_s=0.2, max_retries=1, retry_delay_ms=20)
    started = time.monotonic()
    await publish(channel, queue_name, json.dumps({"sleep_s": 5}), message_id="slow")
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert time.monotonic() - started < 4
    assert recorder.attempts("slow") == [1, 2]
    assert copy.headers["failed-exception"] == "ricochet.errors.HandlerTimeout"
    assert copy.headers["failed-kind"] == "exhausted"


async def test_forged_death_is_cleaned_and_handled_fresh(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A publisher-written x-death is removed by republishing; the job runs as attempt 1."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=2, retry_delay_ms=20)
    forged = [{"queue": queue_name, "reason": "rejected", "count": "99"}]
    await publish(
        channel,
        queue_name,
        json.dumps({"fail": 1}),
        message_id="forger",
        headers={"x-death": forged, "keep": "me"},
    )

    async def done() -> bool:
        return "forger" in recorder.succeeded

    await wait_for(done, 15, "the cleaned job to succeed")
    first = recorder.seen["forger"][0]
    assert first.attempt == 1
    assert "x-death" not in first.headers
    assert first.headers["keep"] == "me"
    assert recorder.attempts("forger") == [1, 2]


async def test_poison_delivery_goes_to_failed(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A quorum-queue job returned unacked more than five times is failed as poison, unhandled."""
    from ricochet.broker.declare import declare

    from tests.support import make_settings

    settings = make_settings(queue_name)
    await declare(connection, settings)
    await publish(channel, queue_name, b"{}", message_id="poison")
    # Each get-and-close is a delivery that ended without an ack, as if the worker died.
    for _ in range(6):
        ch = await connection.channel()
        queue = await ch.declare_queue(queue_name, passive=True)
        await wait_depth(ch, queue_name, 1)
        assert await queue.get(fail=False) is not None
        await ch.close()
    recorder = Recorder()
    await start_worker(recorder)
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert copy.headers["failed-kind"] == "poison"
    assert copy.headers["failed-exception"] == "ricochet.errors.PoisonMessage"
    assert recorder.seen["poison"] == []


async def test_delivery_count_from_a_publisher_is_not_poison(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A first delivery that carries an x-delivery-count written by its publisher is handled as
    usual, not failed as poison."""
    recorder = Recorder()
    await start_worker(recorder)
    await publish(channel, queue_name, b"{}", message_id="forged", headers={"x-delivery-count": 99})
    await wait_for(lambda: recorder.succeeded == ["forged"], 10, "the job to succeed")


async def test_header_that_is_not_utf8_survives_into_the_failed_copy(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A long-string header of raw bytes (as other clients send them) neither blocks the failed
    copy nor is lost: the copy carries the same bytes, as a byte array."""
    await start_worker(Recorder())
    raw = b"\xff\xfe binary"
    await publish(
        channel,
        queue_name,
        json.dumps({"fail": "permanent"}),
        message_id="raw",
        headers={"blob": ForeignBytes(raw)},
    )
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert copy.message_id == "raw"
    blob = copy.headers["blob"]
    assert isinstance(blob, bytes | bytearray)
    assert bytes(blob) == raw


async def test_topology_declared_twice(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """Declaring the same topology twice, even concurrently, changes nothing and raises nothing."""
    import asyncio

    from ricochet.broker.declare import declare

    from tests.support import make_settings

    settings = make_settings(queue_name, max_retries=2)
    await asyncio.gather(declare(connection, settings), declare(connection, settings))
    await declare(connection, settings)
    for name in (
        queue_name,
        f"{queue_name}.retry.1",
        f"{queue_name}.retry.2",
        f"{queue_name}.failed",
    ):
        await channel.declare_queue(name, passive=True)


async def test_sends_a_delivery_to_the_right_tier_after_each_failure(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """The job's routing key after tier k is Q.attempt.k; x-death records each tier it passed."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=2, retry_delay_ms=30)
    await publish(channel, queue_name, json.dumps({"fail": 2}), message_id="tracked")
    await until_seen(recorder, "tracked", 3)
    keys = [a.routing_key for a in recorder.seen["tracked"]]
    assert keys == [queue_name, f"{queue_name}.attempt.1", f"{queue_name}.attempt.2"]
    third = recorder.seen["tracked"][2].headers["x-death"]
    queues = {(d["queue"], d["reason"]): d["count"] for d in third}
    assert queues[(queue_name, "rejected")] == 2
    assert queues[(f"{queue_name}.retry.1", "expired")] == 1
    assert queues[(f"{queue_name}.retry.2", "expired")] == 1


async def test_a_job_whose_headers_nearly_fill_a_frame_still_reaches_the_failed_queue(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A failed job's copy adds failure headers; when the job's own headers nearly fill the
    frame by themselves, the largest of them go (named in failed-dropped-headers) instead of
    the broker closing the connection on an oversized frame, and the worker goes on."""
    recorder = Recorder()
    worker = await start_worker(recorder)
    frame_max = 131_072  # the broker's default, which every broker of the matrix keeps
    headers = {"blob": "b" * (frame_max - 200), "tenant": "acme"}  # fits; a copy would not
    await publish(
        channel, queue_name, json.dumps({"fail": "permanent"}), message_id="big", headers=headers
    )
    await publish(channel, queue_name, json.dumps({"n": 1}), message_id="after")
    (copy,) = await take(channel, Names(queue_name).failed, 1)
    assert copy.message_id == "big"
    assert copy.body == json.dumps({"fail": "permanent"}).encode()
    assert copy.headers is not None
    assert copy.headers["failed-dropped-headers"] == "blob"
    assert "blob" not in copy.headers
    assert copy.headers["tenant"] == "acme"
    assert copy.headers["failed-kind"] == "permanent"

    async def after_ran() -> bool:
        return worker.count("succeeded") == 1

    await wait_for(after_ran, 10, "the next job to succeed on the same worker")
    assert recorder.attempts("big") == [1]
