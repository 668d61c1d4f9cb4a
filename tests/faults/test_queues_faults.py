"""Faults of one worker consuming several queues (SPEC 19): killed, its connection dropped, or
one of its queues deleted, with jobs in flight on every queue at once.

Every job id is counted per queue: each ran in its own queue, none is lost, and a job that ran
twice was in flight when the fault came (at least once)."""

import asyncio
import time
from collections.abc import Callable

from ricochet.worker.redeclare import CONFLICT_MAX_WAIT_S, JITTER_S

from tests.breakage import declare_plain, delete_queue
from tests.broker import Broker
from tests.faults.harness import FaultRun, QueuesRun
from tests.support import close_connections, consumers, log_events, wait_for

# Three queues of seed 001's shape, each with its own prefetch.
PREFETCH = {"a": 2, "b": 5, "c": 10}
# A job works this long, and each queue gets this many jobs per place of its prefetch: every
# queue is busy for about 6 s, long enough for rabbitmqctl to find and close a connection.
SLEEP_S = 0.5
JOBS_PER_PLACE = 12
# Two queues for a conflict: a healthy one busy for about 6 s, and one put in conflict once its
# first batch is done, given its second batch once mended.
CONFLICT = {"a": 5, "b": 5}
CONFLICT_BATCH = 20


async def publish_all(queues: QueuesRun) -> None:
    for run in queues.runs:
        await run.publish(run.settings.prefetch * JOBS_PER_PLACE, sleep_s=SLEEP_S)


def in_flight(run: FaultRun) -> set[str]:
    """The run's jobs started and not (yet) done."""
    return run.started() - set(run.done())


async def until_busy(queues: QueuesRun) -> None:
    """Until every queue has jobs in flight and has done a sixth of its jobs."""

    def busy() -> bool:
        return all(
            in_flight(run) and len(run.done()) >= len(run.published) // 6 for run in queues.runs
        )

    await wait_for(busy, 30, "jobs in flight on every queue")


def ran_again(run: FaultRun) -> set[str]:
    """The run's jobs started more than once."""
    return {message_id for message_id, n in run.starts().items() if n > 1}


def worker_events(queues: QueuesRun) -> list[dict[str, object]]:
    """The JSON log lines of the queues' workers (one log file), in order."""
    return log_events((queues.tmp_path / "worker.log").read_text())


async def test_kill_9_with_jobs_in_flight_on_3_queues(
    fault_queues: Callable[..., QueuesRun],
) -> None:
    """SIGKILL of a worker of 3 queues with jobs in flight on all 3, then a new worker: each
    queue's jobs all complete in that queue; only those delivered to the killed worker run
    twice, at most its prefetch of them per queue."""
    queues = fault_queues("kill -9, jobs in flight on 3 queues", PREFETCH)
    await publish_all(queues)
    worker = await queues.start_worker()
    await until_busy(queues)
    worker.kill()
    killed = {run.name: (in_flight(run), run.started()) for run in queues.runs}
    assert all(running for running, _ in killed.values()), killed  # in flight on every queue
    await queues.start_worker()
    tallies = await queues.account()
    for run, tally in zip(queues.runs, tallies, strict=True):
        running, started = killed[run.name]
        assert running <= ran_again(run) <= started
        assert tally.duplicates <= run.settings.prefetch


async def test_connection_dropped_with_jobs_in_flight_on_3_queues(
    fault_queues: Callable[..., QueuesRun], fault_broker: Broker
) -> None:
    """The broker closes the connection of a worker of 3 queues with jobs in flight on all 3:
    the same process connects again and each queue's jobs all complete in that queue; the jobs
    in flight at the drop run again, at most the prefetch of them per queue."""
    queues = fault_queues("connection dropped, jobs in flight on 3 queues", PREFETCH)
    await publish_all(queues)
    worker = await queues.start_worker()
    await until_busy(queues)
    first = queues.runs[0].settings.queue  # the worker's connection is named after it
    assert await asyncio.to_thread(close_connections, first, "worker", fault_broker) == 1
    started = {run.name: run.started() for run in queues.runs}
    tallies = await queues.account()
    for run, tally in zip(queues.runs, tallies, strict=True):
        again = ran_again(run)
        assert again, f"{run.name}: no job was in flight at the drop"
        assert again <= started[run.name]
        assert tally.duplicates <= run.settings.prefetch
    assert worker.starts == 1  # the same process connected again
    assert any(line["event"] == "connection lost, reconnecting" for line in worker_events(queues))


async def test_one_queue_deleted_with_jobs_in_flight_on_3_queues(
    fault_queues: Callable[..., QueuesRun],
) -> None:
    """Queue a is deleted under a worker of 3 queues with jobs in flight on all 3: the worker
    says its consumer of a was cancelled and declares a again, and b's and c's jobs all
    complete, none run twice, on the same connection. A job sent to a again runs."""
    queues = fault_queues("one queue deleted, jobs in flight on 3 queues", PREFETCH)
    deleted, *others = queues.runs
    await publish_all(queues)
    worker = await queues.start_worker()
    await until_busy(queues)
    channel = await deleted.connection.channel()
    await channel.queue_delete(deleted.settings.queue)
    await channel.close()

    async def consumed_again() -> bool:
        return await consumers(deleted.connection, deleted.settings.queue) == 1

    await wait_for(consumed_again, 30, "the deleted queue declared and consumed again")
    [again] = await deleted.publish(1)
    await wait_for(lambda: again in deleted.done(), 30, "a job of the queue declared again")
    tallies = await queues.account(*others)
    assert [tally.duplicates for tally in tallies] == [0, 0]
    assert not any(ran_again(run) for run in others)
    events = worker_events(queues)
    resubscribing = (
        "consumer cancelled by the broker",
        "not consuming: declaring the topology again before subscribing again",
    )
    said = [(line["event"], line["queue"]) for line in events if line["event"] in resubscribing]
    assert said == [(event, deleted.settings.queue) for event in resubscribing]
    assert not any(line["event"] == "connection lost, reconnecting" for line in events)
    assert worker.starts == 1


async def test_one_queue_declared_again_in_conflict_with_jobs_in_flight_on_2_queues(
    fault_queues: Callable[..., QueuesRun],
) -> None:
    """Queue b, its first jobs done, is deleted and declared again as a plain classic queue
    while a's jobs are in flight: the worker reports b in conflict and declares it again with
    backoff, and every job of a completes, none twice, on the same connection. Once the conflict
    is mended (b deleted), the worker declares and consumes b again, and b's next jobs all
    complete: every id of both queues is accounted for."""
    queues = fault_queues("one queue declared again in conflict, jobs on 2 queues", CONFLICT)
    healthy, conflict = queues.runs
    await healthy.publish(healthy.settings.prefetch * JOBS_PER_PLACE, sleep_s=SLEEP_S)
    await conflict.publish(CONFLICT_BATCH)
    worker = await queues.start_worker()
    await wait_for(lambda: len(conflict.done()) == CONFLICT_BATCH, 30, "b's first jobs done")
    await until_busy(QueuesRun(queues.tmp_path, [healthy]))
    b = conflict.settings.queue
    await declare_plain(conflict.connection, b)

    def tries() -> list[dict[str, object]]:
        said = (line for line in worker_events(queues) if line.get("queue") == b)
        return [line for line in said if line["event"] == "queue in conflict, declaring it again"]

    await wait_for(tries, 20, "b reported in conflict")
    await healthy.until_settled()  # every job of a, while b is in conflict
    assert worker.alive
    assert len(tries()) >= 2  # declared again, with backoff, until mended
    mended_at = time.monotonic()
    await delete_queue(conflict.connection, b)
    await conflict.wait_consumers(1)
    consumed_after_s = time.monotonic() - mended_at
    await conflict.publish(CONFLICT_BATCH)
    tallies = await queues.account()
    assert [tally.duplicates for tally in tallies] == [0, 0]
    assert not ran_again(healthy)
    events = worker_events(queues)
    assert not any(line["event"] == "connection lost, reconnecting" for line in events)
    assert {line["queue"] for line in events if line["level"] == "error"} == {b}
    assert worker.starts == 1
    assert consumed_after_s < CONFLICT_MAX_WAIT_S + JITTER_S + 5  # the backoff's cap, and some
