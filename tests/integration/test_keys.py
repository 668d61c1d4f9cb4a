"""One job per key at a time (SPEC 28), end to end on the broker of the run: jobs of one key
never overlap on any worker and start in the order they were enqueued, keys run side by side, a
retry rejoins the end of its key's line, a foreign producer's key header and a type's key
function are honoured, a key that cannot be one fails the job at once, and a worker that stops
hands its lanes to another."""

import asyncio
import time
from collections import defaultdict

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Client, InvalidJob, Job, NotConfirmed, Router
from ricochet.broker.declare import declare
from ricochet.headers import KEY
from ricochet.names import Names

from tests.support import (
    AMQP_URL,
    StartWorker,
    api_queue,
    exists,
    make_settings,
    publish,
    take,
    wait_depth,
    wait_for,
)

LANES = 4


class Runs:
    """What a handler saw: when each job of each key started and ended, and how many keys ran
    at once at most."""

    def __init__(self) -> None:
        self.started: dict[str, list[str]] = defaultdict(list)
        self.running: dict[str, str] = {}
        self.overlaps: list[tuple[str, str, str]] = []
        self.most_keys = 0
        self.done: list[str] = []

    async def run(self, job: Job, seconds: float = 0.02) -> None:
        key = str(job.key)
        if key in self.running:
            self.overlaps.append((key, self.running[key], str(job.message_id)))
        self.running[key] = str(job.message_id)
        self.started[key].append(str(job.message_id))
        self.most_keys = max(self.most_keys, len(self.running))
        await asyncio.sleep(seconds)
        del self.running[key]
        self.done.append(str(job.message_id))


async def test_jobs_of_a_key_run_one_at_a_time_in_their_order_and_keys_side_by_side(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """Two workers of prefetch 10 on 4 lanes; 8 keys x 6 jobs, enqueued interleaved: no two
    jobs of a key overlap, each key's jobs start in their enqueue order, more than one key runs
    at once, every job runs once. The first job of the queue declares the lanes; the client
    sends the next ones straight to them."""
    runs = Runs()
    for _ in range(2):
        await start_worker(runs.run, prefetch=10, key_lanes=LANES)
    names = Names(queue_name)
    assert not await exists(connection, names.key_lane(0))  # none until a job has a key
    enqueued: dict[str, list[str]] = defaultdict(list)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("sync", {}, message_id="first", key="k0")
        enqueued["k0"].append("first")
        await wait_for(lambda: "first" in runs.done, 20, "the first job with a key")
        for i in range(6):
            for k in range(8):
                job_id = f"k{k}-{i}"
                await client.enqueue("sync", {}, message_id=job_id, key=f"k{k}")
                enqueued[f"k{k}"].append(job_id)
    await wait_for(lambda: len(runs.done) == 49, 30, "every job")
    assert runs.overlaps == []
    assert dict(runs.started) == dict(enqueued)
    assert runs.most_keys > 1
    assert sorted(runs.done) == sorted(j for ids in enqueued.values() for j in ids)

    async def both_wait_on_every_lane() -> bool:
        # One worker consumes each lane at a time; the other waits beside it, having found the
        # lanes that the first declared.
        # (A passive declare counts only the active one.)
        lanes = [await api_queue(names.key_lane(i), "consumer_details") for i in range(LANES)]
        return all(len(lane.get("consumer_details", [])) == 2 for lane in lanes)

    await wait_for(both_wait_on_every_lane, 15, "both workers on every lane")


async def test_a_retry_rejoins_the_end_of_its_keys_line(
    start_worker: StartWorker, queue_name: str
) -> None:
    """Job a of key k fails once; b and c of the same key, enqueued after it, run while a
    waits in its tier, and a's second attempt comes after them, as attempt 2 of 2."""
    attempts: list[tuple[str, int, int]] = []

    async def handler(job: Job) -> None:
        attempts.append((str(job.message_id), job.attempt, job.max_attempts))
        if job.message_id == "a" and job.attempt == 1:
            raise ConnectionError("down")

    await start_worker(handler, key_lanes=LANES, max_retries=1, retry_delay_ms=1_500)
    async with Client(AMQP_URL, queue_name) as client:
        for job_id in "abc":
            await client.enqueue("sync", {}, message_id=job_id, key="k")
    await wait_for(lambda: len(attempts) == 4, 20, "a's second attempt")
    assert attempts == [("a", 1, 2), ("b", 1, 2), ("c", 1, 2), ("a", 2, 2)]


async def test_a_foreign_producers_key_header_is_honoured_and_a_bad_one_fails_the_job(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Jobs published straight to the queue with the ricochet-key header run one at a time
    with job.key set; one whose header is 300 bytes fails at once, its reason naming it."""
    runs = Runs()
    await start_worker(runs.run, prefetch=10, key_lanes=LANES)
    for i in range(5):
        await publish(channel, queue_name, "{}", headers={KEY: "acct-1"}, message_id=f"f{i}")
    await publish(channel, queue_name, "{}", headers={KEY: "x" * 300}, message_id="too-long")
    await wait_for(lambda: len(runs.done) == 5, 20, "the foreign jobs")
    assert runs.overlaps == []
    assert runs.started == {"acct-1": [f"f{i}" for i in range(5)]}
    (failed,) = await take(channel, Names(queue_name).failed, 1)
    assert failed.message_id == "too-long"
    assert failed.headers["failed-kind"] == "permanent"
    assert KEY in str(failed.headers["failed-reason"])


async def test_a_types_key_function_gives_the_key_and_one_that_cannot_fails_the_job(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """router.handler(key=...) derives the key from the payload: the jobs of one integration
    never overlap; a payload the function cannot read fails its job at once."""
    runs = Runs()
    router = Router()

    @router.handler("poll", key=lambda payload: f"integration-{payload['integration']}")
    async def poll(job: Job) -> None:
        await runs.run(job, 0.05)

    await start_worker(router, prefetch=10, key_lanes=LANES)
    async with Client(AMQP_URL, queue_name) as client:
        for i in range(8):
            await client.enqueue("poll", {"integration": i % 2}, message_id=f"p{i}")
        await client.enqueue("poll", {"nothing": 1}, message_id="keyless")
    await wait_for(lambda: len(runs.done) == 8, 20, "the polls")
    assert runs.overlaps == []
    assert set(runs.started) == {"integration-0", "integration-1"}
    (failed,) = await take(channel, Names(queue_name).failed, 1)
    assert failed.message_id == "keyless"
    assert "key" in str(failed.headers["failed-reason"])


async def test_a_stopped_worker_hands_its_lanes_to_another(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Worker one holds every lane (it subscribed first) and runs key k's first job when it is
    stopped; worker two, waiting beside it, takes the lanes and runs the rest of k's jobs in
    order, none beside another."""
    runs = Runs()
    first = await start_worker(runs.run, key_lanes=LANES)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("sync", {}, message_id="warm", key="k")
        await wait_for(lambda: "warm" in runs.done, 20, "the lanes declared")
        second = await start_worker(runs.run, key_lanes=LANES)
        for i in range(4):
            await client.enqueue("sync", {}, message_id=f"j{i}", key="k")
    await first.stop()
    await wait_for(lambda: len(runs.done) == 5, 20, "the jobs after the stop")
    assert runs.started["k"] == ["warm", *(f"j{i}" for i in range(4))]
    assert runs.overlaps == []
    assert second.gauge("ricochet_key_lanes_busy") == 0


@pytest.mark.parametrize("key", ["", "x" * 256, "é" * 128, 7])
async def test_a_key_that_cannot_be_one_is_refused_before_anything_is_sent(
    channel: AbstractChannel, queue_name: str, key: object
) -> None:
    """Empty, over 255 bytes in UTF-8, or not a str: InvalidJob naming the key, and the queue
    gets nothing; the header cannot be set through headers either."""
    await channel.declare_queue(queue_name, durable=True)
    async with Client(AMQP_URL, queue_name) as client:
        with pytest.raises(InvalidJob, match="key"):
            await client.enqueue("sync", {}, key=key)  # type: ignore[arg-type]
        with pytest.raises(InvalidJob, match=KEY):
            await client.enqueue("sync", {}, headers={KEY: "k"})
    await wait_depth(channel, queue_name, 0)


async def test_a_foreign_backlog_with_a_key_in_the_queue_runs_in_its_order(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """Jobs with the key header published to the queue itself before the lanes exist: one
    worker of prefetch 10 declares the lanes, sends the jobs on to their lane in the order it
    takes them, and runs them one at a time, in that order."""
    await declare(connection, make_settings(queue_name))
    ids = [f"b{i}" for i in range(10)]
    for job_id in ids:
        await publish(channel, queue_name, "{}", headers={KEY: "k"}, message_id=job_id)
    runs = Runs()
    await start_worker(runs.run, prefetch=10, key_lanes=LANES)
    await wait_for(lambda: len(runs.done) == len(ids), 20, "the backlog")
    assert runs.started == {"k": ids}
    assert runs.overlaps == []


async def test_the_client_declares_the_lanes_with_the_first_job_and_a_worker_finds_them(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """A worker runs before any job has a key; the client's first job with a key declares the
    queue's lanes (the client's count) and goes straight to its lane, where the worker finds it
    within its look for lanes."""
    runs = Runs()
    await start_worker(runs.run, key_lanes=LANES)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("sync", {}, message_id="one", key="k")
    assert await exists(connection, Names(queue_name).key_lane(15))  # the client's default 16
    await wait_for(lambda: runs.done == ["one"], 15, "the job found in its lane")


async def test_lanes_the_broker_refuses_fail_the_job_saying_why_and_refuse_the_enqueue(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Q.keys declared by someone else as a direct exchange: a job with the key header sent to
    the queue fails at once, its reason naming the exchange; the client refuses to enqueue a job
    with a key (NotConfirmed, nothing sent)."""
    await channel.declare_exchange(f"{queue_name}.keys", "direct", durable=True)
    runs = Runs()
    await start_worker(runs.run, key_lanes=LANES)
    await publish(channel, queue_name, "{}", headers={KEY: "k"}, message_id="refused")
    (failed,) = await take(channel, Names(queue_name).failed, 1)
    assert failed.message_id == "refused"
    assert f"{queue_name}.keys" in str(failed.headers["failed-reason"])
    async with Client(AMQP_URL, queue_name) as client:
        with pytest.raises(NotConfirmed, match="conflicts"):
            await client.enqueue("sync", {}, key="k")
    assert runs.done == []
    await wait_depth(channel, queue_name, 0)


async def test_the_first_declaration_fixes_the_lane_count(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A worker of 4 lanes declares them with the queue's first job with a key; a client of the
    default 16 then declares no lane more (a fifth would take keys from the lanes that hold
    their earlier jobs), and every job it sends runs."""
    runs = Runs()
    await start_worker(runs.run, key_lanes=LANES)
    await publish(channel, queue_name, "{}", headers={KEY: "k"}, message_id="first")
    await wait_for(lambda: runs.done == ["first"], 20, "the first job")
    async with Client(AMQP_URL, queue_name) as client:
        for i in range(12):
            await client.enqueue("sync", {}, message_id=f"c{i}", key=f"k{i}")
    await wait_for(lambda: len(runs.done) == 13, 20, "every job")
    assert not await exists(connection, Names(queue_name).key_lane(LANES))


async def test_a_paused_worker_runs_no_job_from_its_lanes(
    start_worker: StartWorker, queue_name: str
) -> None:
    """Four failures pause the worker for 3 s (SPEC 12: it takes no new job); jobs with a key
    enqueued meanwhile start only once the pause has ended."""
    ran: list[tuple[str, float]] = []

    async def handler(job: Job) -> None:
        ran.append((str(job.type), time.monotonic()))
        if job.type == "fail":
            raise ConnectionError("down")

    pausing = {"pause_failure_ratio": 0.5, "pause_min_jobs": 4, "pause_window_s": 5, "pause_s": 3}
    worker = await start_worker(handler, key_lanes=LANES, max_retries=0, **pausing)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("sync", {}, key="warm")  # the lanes, declared and consumed
        await wait_for(lambda: len(ran) == 1, 20, "the lanes")
        for _ in range(4):
            await client.enqueue("fail", {})
        await wait_for(lambda: worker.gauge("ricochet_worker_paused") == 1, 10, "the pause")
        paused_at = time.monotonic()
        for i in range(3):
            await client.enqueue("sync", {}, key=f"p{i}")
    await wait_for(lambda: len(ran) == 8, 20, "the jobs after the pause")
    assert all(at >= paused_at + 2 for kind, at in ran[5:] if kind == "sync")
