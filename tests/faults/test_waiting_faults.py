"""Faults of `ricochet waiting` (SPEC 23, 26): `waiting show` killed (-9), or its connection
dropped by the broker, in the middle of its read of a tier; a worker killed between its retries'
nacks and their journal entries; and a cancel racing the end of a running job.

Every job is accounted for: after the fault, each one waits where it waited, once (none lost,
none doubled, none sent on to its queue early), and a list shows it or counts it unrecorded; a
job cancelled while it runs ends once."""

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from ricochet import Client, Job, Router
from ricochet.broker.record import declare_recorded
from ricochet.log import merge_job_fields
from ricochet.names import Names
from ricochet.ops.waiting import list_waiting
from structlog.testing import capture_logs

from tests.broker import Broker
from tests.faults.harness import PUBLISH_BATCH, TALLIES, Tally
from tests.support import (
    InProcessWorker,
    close_connections,
    consumers,
    depth,
    in_tier,
    make_settings,
    ricochet_env,
    spawn,
    wait_for,
)

JOBS = 20_000  # enough that a show still holds the tier when the fault hits it
# None falls due during the row, however slow the machine (a 60 s tier sent 2,415 jobs on to the
# main queue while the row read the tier back with four suites on two cores): one found there
# came early.
TIER_MS = 3_600_000
# Retries a worker makes right before it is killed: a few, the last a moment before the kill.
KILLED_RETRIES = 5


async def waiting_jobs(channel: AbstractChannel, queue: str, jobs: int, at_ms: int) -> list[str]:
    """Jobs in tier 1, as the worker sends them there, with the journal's entry of the retry
    (at_ms: when, by the entry)."""
    ids = [f"w{i:05d}" for i in range(jobs)]
    for start in range(0, jobs, PUBLISH_BATCH):
        await in_tier(channel, queue, ids[start : start + PUBLISH_BATCH], at_ms=at_ms)
    return ids


async def _all_of(channel: AbstractChannel, queue: str) -> Counter[str]:
    """Every message of a queue, taken, once the broker counts the returned ones as ready."""
    previous = -1
    while (now := await depth(channel, queue)) != previous:
        previous = now
        await asyncio.sleep(0.3)
    taken: Counter[str] = Counter()
    if now == 0:
        return taken
    # A consumer, not 20,000 gets one at a time (minutes on a busy machine).
    all_taken = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        taken[str(message.message_id)] += 1
        if taken.total() >= now:
            all_taken.set()

    source = await channel.declare_queue(queue, passive=True)
    tag = await source.consume(on_message, no_ack=True)
    try:
        await asyncio.wait_for(all_taken.wait(), 120)
    except TimeoutError:
        raise AssertionError(f"only {taken.total()} of {now} messages of {queue} came") from None
    finally:
        await source.cancel(tag)
    return taken


@pytest.mark.parametrize("fault", ["kill -9", "dropped connection"])
@pytest.mark.timeout(360)  # 20,000 jobs in, a read, 20,000 back out: minutes when busy
async def test_a_show_cut_off_midway_leaves_every_job_waiting(
    fault_broker: Broker,
    connection: AbstractConnection,
    queue_name: str,
    tmp_path: Path,
    fault: str,
) -> None:
    """A show of a job the journal does not know reads the tier; what it held goes back to the
    tier: every job waits there once, none is lost, none doubled, none in the main queue before
    its time."""
    names = Names(queue_name)
    settings = make_settings(queue_name, amqp_url=fault_broker.amqp_url, log_format="json")
    await declare_recorded(connection, settings.model_copy(update={"retry_delays_ms": (TIER_MS,)}))
    channel = await connection.channel(publisher_confirms=True)
    ids = await waiting_jobs(channel, queue_name, JOBS, at_ms=int(time.time() * 1000))
    # The command reads the tier's delay from the broker: its own settings say nothing of it.
    proc = spawn(["waiting", "show", "unknown"], ricochet_env(settings), tmp_path / "show.log")
    await wait_for(lambda: _reading(connection, names.tier(1)), 60, "the show to read the tier")
    proc.send_signal(signal.SIGSTOP)  # held in the middle of its read, whatever the fault
    if fault == "kill -9":
        proc.kill()
    else:
        closed = await asyncio.to_thread(close_connections, queue_name, "waiting", fault_broker)
        proc.send_signal(signal.SIGCONT)
        assert closed == 1
    code = await asyncio.to_thread(proc.wait, 60)
    assert code != 0, "the show finished before the fault: make JOBS larger"

    await wait_for(lambda: _no_consumer(connection, names.tier(1)), 30, "the show's consumers")
    await _each_waiting_once(channel, names, ids, f"ricochet waiting show reading, {fault}")
    await channel.close()


@pytest.mark.parametrize("journal", ["on", "off"])
@pytest.mark.timeout(120)
async def test_a_worker_killed_after_its_retries_leaves_each_listed_or_counted(
    fault_broker: Broker,
    connection: AbstractConnection,
    queue_name: str,
    tmp_path: Path,
    journal: str,
) -> None:
    """A worker killed (-9) right after sending jobs to their tier, its last retries' journal
    entries perhaps unwritten (with the journal off, none is): a list shows each job with the
    reason it failed, or counts it unrecorded in its tier, never hides one; each waits there
    once, none lost, doubled or sent on early."""
    settings = make_settings(
        queue_name,
        amqp_url=fault_broker.amqp_url,
        handler="tests.handlers:fault",
        prefetch=1,  # one job at a time: each retry is sent before the next job comes
        retry_delay_ms=TIER_MS,
        max_retries=1,
        journal=journal,
    )
    await declare_recorded(connection, settings)
    ids = [f"k{i}" for i in range(KILLED_RETRIES)]
    env = ricochet_env(settings, TEST_JOURNAL=str(tmp_path / "journal"))
    async with Client(fault_broker.amqp_url, queue_name) as client:
        for message_id in ids:
            await client.enqueue("job", {"fail": 1}, message_id=message_id)
        await client.enqueue("job", {"poison": True}, message_id="poison")  # kills the worker
    with spawn(["worker"], env, tmp_path / "worker.log") as worker:
        code = await asyncio.to_thread(worker.wait, 60)
    assert code == -signal.SIGKILL, f"the worker ended with {code}, not killed by the poison"

    names = Names(queue_name)
    channel = await connection.channel(publisher_confirms=True)
    found = await list_waiting(connection, settings)
    listed = Counter(str(row.message_id) for row in found.rows)
    fault = f"worker killed right after its retries (journal {journal}), then a look"
    await _each_waiting_once(channel, names, ids, fault, left_in_queue=["poison"])
    await channel.close()
    assert set(listed) <= set(ids), listed
    assert set(listed.values()) <= {1}
    assert len(listed) + found.unrecorded.get(names.tier(1), 0) == len(ids), found
    if journal == "off":
        assert not listed
    assert all(row.attempt == 2 for row in found.rows)
    assert {row.reason for row in found.rows} <= {"ConnectionError: flaky on attempt 1"}


async def _each_waiting_once(
    channel: AbstractChannel,
    names: Names,
    ids: list[str],
    fault: str,
    left_in_queue: list[str] | None = None,
) -> None:
    """Every job of ids is in tier 1 once, tallied: none lost, none doubled, none in the main
    queue (but those left_in_queue) before its time."""
    in_tier = await _all_of(channel, names.tier(1))
    early = await _all_of(channel, names.queue) - Counter(left_in_queue or [])
    everywhere = in_tier + early
    lost = set(ids) - set(everywhere)
    duplicates = sum(n - 1 for n in everywhere.values())
    TALLIES.append(
        Tally(
            fault=fault,
            published=len(ids),
            completed=0,
            failed=0,
            lost=len(lost),
            duplicates=duplicates,
        )
    )
    assert not lost, sorted(lost)[:10]
    assert duplicates == 0
    assert not early, f"{len(early)} jobs sent on before their time"
    assert sorted(in_tier) == ids


async def _reading(connection: AbstractConnection, queue: str) -> bool:
    return await consumers(connection, queue) > 0


async def _no_consumer(connection: AbstractConnection, queue: str) -> bool:
    return await consumers(connection, queue) == 0


class Racing:
    """A handler that finishes (succeeds, or fails) at about the moment its cancel is read."""

    def __init__(self, finish_after_s: dict[str, float]) -> None:
        self.finish_after_s = finish_after_s
        self.started: set[str] = set()
        self.router = Router()
        self.router.handler("race")(self.race)

    async def race(self, job: Job) -> None:
        message_id = str(job.message_id)
        self.started.add(message_id)
        await asyncio.sleep(self.finish_after_s[message_id])
        job.raise_if_cancelled()
        if message_id.startswith("fails") and job.attempt == 1:
            raise ConnectionError("the job's own failure, racing its cancel")


@pytest.mark.parametrize("ending", ["succeeds", "fails"])
async def test_a_cancel_racing_the_end_of_a_running_job_ends_it_once(
    fault_broker: Broker, connection: AbstractConnection, queue_name: str, ending: str
) -> None:
    """Jobs cancelled while they run, each finishing (by a success, or a failure whose retry
    succeeds) a few milliseconds before or after its cancel is read: each ends once, cancelled
    or as it finished (a failed one's retry is cancelled when it comes due), never twice, never
    in the failed queue."""
    ids = [f"{ending}-{i:02d}" for i in range(40)]
    # Finishing from 0.5 s to 2.06 s after they start, while the cancels go out from 0.6 s on
    # (on a busy machine the 40 cancels take a second or more to go out and be read).
    racing = Racing({message_id: 0.5 + 0.04 * i for i, message_id in enumerate(ids)})
    settings = make_settings(
        queue_name, amqp_url=fault_broker.amqp_url, retry_delays_ms="500", prefetch=64
    )
    worker = InProcessWorker(settings, racing.router)
    with capture_logs(processors=[merge_job_fields]) as logs:
        await worker.start()
        try:
            async with Client(fault_broker.amqp_url, queue_name) as client:
                for message_id in ids:
                    await client.enqueue("race", {}, message_id=message_id)
                await wait_for(lambda: racing.started >= set(ids), 20, "every job to start")
                await asyncio.sleep(0.6)  # the first ones have finished, the others finish soon
                for message_id in ids:
                    await client.cancel(message_id)

            def ended() -> bool:
                return worker.count("succeeded") + worker.count("cancelled") >= len(ids)

            try:
                await wait_for(ended, 60, "every job to end")  # slow on a loaded machine
            except AssertionError:
                print(*logs, sep="\n")
                raise
            await asyncio.sleep(1)  # a retry would be back within 500 ms, and end again
        finally:
            await worker.stop()
    endings: Counter[tuple[str, str]] = Counter(
        (str(e["event"]), str(e.get("message_id")))
        for e in logs
        if e["event"] in ("job succeeded", "job cancelled", "job failed")
    )
    by_id = Counter(message_id for _, message_id in endings.elements())
    channel = await connection.channel()
    in_failed = await depth(channel, Names(queue_name).failed)
    await channel.close()
    cancelled = sum(n for (event, _), n in endings.items() if event == "job cancelled")
    TALLIES.append(
        Tally(
            fault=f"cancel racing a running job that {ending}",
            published=len(ids),
            completed=sum(n for (event, _), n in endings.items() if event == "job succeeded"),
            failed=in_failed,
            lost=len(set(ids) - set(by_id)),
            duplicates=sum(n - 1 for n in by_id.values()),
            cancelled=cancelled,
        )
    )
    assert by_id == Counter(ids), by_id - Counter(ids) or Counter(ids) - by_id
    assert in_failed == 0
    assert cancelled >= 1
