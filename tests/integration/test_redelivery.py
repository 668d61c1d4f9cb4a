"""Jobs that come back redelivered after a reconnect: run side by side, a poison suspect alone."""

import asyncio
import json
import time
from collections import defaultdict
from dataclasses import dataclass

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job
from ricochet.broker.declare import declare

from tests.support import (
    StartWorker,
    close_connections,
    depth,
    make_settings,
    publish,
    wait_depth,
    wait_for,
)

QUEUE_TYPES = ["quorum", "classic"]
JOBS = 8
RUN_S = 1.0


@dataclass
class Run:
    """One run of a job's handler: when it started and, once it has, ended."""

    start: float
    end: float | None = None


class Timed:
    """Async handler that records each run of each job: it works for RUN_S seconds, a job's first
    run only once `release` is set (the test cuts the connection under it meanwhile)."""

    def __init__(self, hold_first: bool = True) -> None:
        self.runs: dict[str | None, list[Run]] = defaultdict(list)
        self.release = asyncio.Event()
        if not hold_first:
            self.release.set()

    async def __call__(self, job: Job) -> None:
        runs = self.runs[job.message_id]
        run = Run(time.monotonic())
        runs.append(run)
        if len(runs) == 1:
            await self.release.wait()
        await asyncio.sleep(RUN_S)
        run.end = time.monotonic()

    def started(self, ids: list[str], times: int) -> bool:
        return all(len(self.runs[m]) >= times for m in ids)

    def ended(self, ids: list[str], times: int) -> bool:
        return self.started(ids, times) and all(self.runs[m][times - 1].end for m in ids)


def most_at_once(runs: list[Run]) -> int:
    """The largest number of these runs that were going on at one moment."""
    edges = sorted([(r.start, 1) for r in runs] + [(r.end or r.start, -1) for r in runs])
    at_once = most = 0
    for _, step in edges:  # at equal times an end (-1) sorts before a start
        at_once += step
        most = max(most, at_once)
    return most


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_redelivered_backlog_runs_side_by_side_after_a_reconnect(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """The broker closes the worker's connection while it runs a full prefetch of jobs: they come
    back redelivered, returned once, and run side by side again, not one at a time; /readyz says
    503 (ricochet_worker_recovering 1) until the worker subscribes once more."""
    handler = Timed()
    worker = await start_worker(handler, prefetch=JOBS, queue_type=queue_type)
    ids = [f"j{i}" for i in range(JOBS)]
    for message_id in ids:
        await publish(channel, queue_name, json.dumps({}), message_id=message_id)
    await wait_for(lambda: handler.started(ids, 1), 20, "every job to start")
    assert await asyncio.to_thread(close_connections, queue_name) == 1
    handler.release.set()  # the first runs end on a dead channel: their acks never reach it

    await wait_for(lambda: handler.started(ids, 2), 30, "every job to run again")
    ready_meanwhile = worker.lifecycle.ready
    recovering_meanwhile = worker.gauge("ricochet_worker_recovering")
    await wait_for(lambda: handler.ended(ids, 2), 30, "every job's second run to end")
    assert most_at_once([handler.runs[m][1] for m in ids]) == JOBS
    assert (ready_meanwhile, recovering_meanwhile) == (False, 1)
    await wait_for(lambda: worker.lifecycle.ready, 20, "the worker to subscribe")
    assert worker.gauge("ricochet_worker_recovering") == 0

    async def empty() -> bool:
        return await depth(channel, queue_name) == 0

    await wait_for(empty, 20, "every job to be acked")


async def test_a_job_returned_more_than_once_runs_alone(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A quorum-queue job the broker counts returned three times may be what crashes its worker:
    it runs with no other job beside it, while the jobs returned once run side by side."""
    await declare(connection, make_settings(queue_name))
    await publish(channel, queue_name, json.dumps({}), message_id="suspect")
    await _return_all(connection, channel, queue_name, 1)
    await _return_all(connection, channel, queue_name, 1)
    others = [f"j{i}" for i in range(JOBS - 1)]
    for message_id in others:
        await publish(channel, queue_name, json.dumps({}), message_id=message_id)
    # The suspect's third return, the others' first.
    await _return_all(connection, channel, queue_name, JOBS)

    handler = Timed(hold_first=False)
    await start_worker(handler, prefetch=JOBS, ready=False)
    await wait_for(lambda: handler.ended([*others, "suspect"], 1), 30, "every job to run")
    [suspect] = handler.runs["suspect"]
    assert _alone(suspect, [handler.runs[m][0] for m in others])
    assert most_at_once([handler.runs[m][0] for m in others]) > 1


def _alone(run: Run, others: list[Run]) -> bool:
    """Whether no other run was going on at any moment of this one."""
    assert run.end is not None
    return all(o.end is not None and (o.end <= run.start or o.start >= run.end) for o in others)


async def _return_all(
    connection: AbstractConnection, channel: AbstractChannel, queue: str, n: int
) -> None:
    """Take the queue's n messages unacked, then close the channel: the broker counts a return
    on each."""
    held = await connection.channel()
    declared = await held.declare_queue(queue, passive=True)
    for _ in range(n):
        assert await declared.get(fail=False) is not None
    await held.close()
    await wait_depth(channel, queue, n)
