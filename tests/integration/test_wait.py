"""Shaping the wait end to end: schedules, RetryLater, explicit ladders, jitter and cancels, all
held by the broker (SPEC section 15)."""

import asyncio
import datetime as dt
import itertools
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job, RetryLater
from ricochet.broker.cancels import publish_cancel
from ricochet.broker.plan import LANES
from ricochet.names import Names

from tests.support import (
    StartWorker,
    api_queue,
    close_connections,
    depth,
    exists,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    take,
    wait_for,
)

# Every row here asserts how late a wait ends: run apart from the other tests' load.
pytestmark = pytest.mark.timing


QUEUE_TYPES = ["quorum", "classic"]
# An idle worker runs a due job within this of its time (SPEC section 15).
ON_TIME_S = 1.0
# The late bounds hold on an idle worker; CI runs three suites on two cores, and one broker's
# restart can starve another for seconds. What holds under any load (the attempts, no start
# before its time) is asserted on every try; the late bound on one of this many, which a wait
# made late by the code, not by the machine, fails every time.
ON_TIME_TRIES = 3
# What a wait may read short by. In one CI run on a loaded virtual machine a tier's 1.5 s read
# 1.497 s and a jitter lane's 1.0 s 0.999 s, timed by the wall clock; the broker times a TTL by
# its own clock, in milliseconds. A wrong tier or lane is off by 100 ms or more.
CLOCK_SLACK_S = 0.01


@dataclass
class Clock:
    """Async handler recording each attempt's wall-clock time (to compare with a run-at) and
    monotonic time (for the gaps, which the wall clock's own steps would move). Payload {"later":
    [s, ...]} raises RetryLater(s) on attempt 1, 2, ...; {"fail": N} fails attempts 1..N
    transiently."""

    runs: dict[str | None, list[tuple[int, float, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    async def __call__(self, job: Job) -> None:
        self.runs[job.message_id].append((job.attempt, time.time(), time.monotonic()))
        payload = job.payload
        later = payload.get("later", [])
        if job.attempt <= len(later):
            raise RetryLater(later[job.attempt - 1])
        if job.attempt <= payload.get("fail", 0):
            raise ConnectionError(f"transient trouble on attempt {job.attempt}")

    def times(self, message_id: str) -> list[float]:
        return [at for _, at, _ in self.runs[message_id]]

    def attempts(self, message_id: str) -> list[int]:
        return [attempt for attempt, _, _ in self.runs[message_id]]

    def gaps(self, message_id: str) -> list[float]:
        """Seconds between one attempt's start and the next's."""
        started = [at for _, _, at in self.runs[message_id]]
        return [b - a for a, b in itertools.pairwise(started)]


def iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat()


async def ran(clock: Clock, message_id: str, times: int = 1, timeout_s: float = 20) -> None:
    await wait_for(
        lambda: len(clock.runs[message_id]) >= times, timeout_s, f"{message_id} x{times}"
    )


def gaps_of(
    clock: Clock, channel: AbstractChannel, queue: str, payload: dict[str, Any], attempts: int
) -> Callable[[str], Awaitable[list[float]]]:
    """A try for on_time_once: a job of this payload, run attempts times (numbered 1, 2, ...);
    the gaps between its attempts."""

    async def one_try(message_id: str) -> list[float]:
        await publish(channel, queue, json.dumps(payload), message_id=message_id)
        await ran(clock, message_id, attempts)
        assert clock.attempts(message_id) == list(range(1, attempts + 1))
        return clock.gaps(message_id)

    return one_try


async def on_time_once(
    one_try: Callable[[str], Awaitable[list[float]]], bounds: list[tuple[float, float]]
) -> None:
    """Run one_try (given a fresh message id, it returns the waits it measured) until each wait
    falls within its bounds, ON_TIME_TRIES at most; none may fall short on any try."""
    late = []
    for n in range(ON_TIME_TRIES):
        waits = await one_try(f"try-{n}")
        assert len(waits) == len(bounds)
        assert all(
            wait >= least - CLOCK_SLACK_S for wait, (least, _) in zip(waits, bounds, strict=True)
        ), waits
        if all(wait <= most for wait, (_, most) in zip(waits, bounds, strict=True)):
            return
        late.append(waits)
    pytest.fail(f"late on every try, against {bounds}: {late}")


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_scheduled_jobs_run_on_time_whatever_else_waits(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """A run-at header holds a job until its time, and no later than a second after, as its
    first attempt; one due in a week does not hold back one due in a second, nor one in the past,
    which runs at once."""
    clock = Clock()
    await start_worker(clock, queue_type=queue_type)

    async def one_try(prefix: str) -> list[float]:
        """How late the job in the past, and those due in 3, 1 and 0.3 s, ran."""
        now = time.time()
        due = {"3s": now + 3, "1s": now + 1, "0.3s": now + 0.3, "past": now - 60}
        for name, at in {"week": now + 7 * 86_400, **due}.items():
            headers = {"run-at": iso(at)}
            await publish(channel, queue_name, "{}", message_id=prefix + name, headers=headers)
        await ran(clock, prefix + "3s")
        assert prefix + "week" not in clock.runs
        assert all(clock.attempts(prefix + name) == [1] for name in due)
        return [clock.times(prefix + "past")[0] - now] + [
            clock.times(prefix + name)[0] - at for name, at in due.items() if name != "past"
        ]

    await on_time_once(one_try, [(0, ON_TIME_S)] * 4)


async def test_a_run_at_that_cannot_be_read_fails_at_once_as_permanent(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """No time zone, not a time at all, or further ahead than a cancel is kept (31 days, where
    the client allows 30): the job goes to the failed queue without running, saying why."""
    clock = Clock()
    await start_worker(clock)
    far = iso(time.time() + 40 * 86_400)
    values = {"naive": "2030-01-01T10:00:00", "word": "tomorrow", "far": far}
    for message_id, value in values.items():
        await publish(channel, queue_name, "{}", message_id=message_id, headers={"run-at": value})
    copies = await take(channel, Names(queue_name).failed, 3)
    assert {c.message_id for c in copies} == set(values)
    for copy in copies:
        assert copy.headers["failed-kind"] == "permanent"
        assert copy.headers["failed-exception"] == "ricochet.errors.InvalidSchedule"
    reasons = {c.message_id: str(c.headers["failed-reason"]) for c in copies}
    assert "is more than 31 days ahead" in reasons["far"]
    assert "is not an ISO-8601 date-time" in reasons["word"]
    assert not clock.runs


async def test_nothing_but_the_broker_holds_a_waiting_job(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A worker takes a scheduled job and stops; the job still runs on time on another worker
    started later."""
    clock = Clock()
    first = await start_worker(clock)
    at = time.time() + 3
    await publish(channel, queue_name, "{}", message_id="held", headers={"run-at": iso(at)})

    async def taken() -> bool:
        return await depth(channel, queue_name) == 0

    await wait_for(taken, 10, "the job taken into the delays")
    await first.stop()
    await asyncio.sleep(1)
    await start_worker(clock)
    await ran(clock, "held")
    assert 0 <= clock.times("held")[0] - at <= ON_TIME_S


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_retry_later_waits_its_time_and_spends_an_attempt(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """RetryLater(after): the next attempt starts no earlier than after, and no later than
    after + max(1 s, 10 %) on an idle worker; it counts as a retry, on every broker."""
    clock = Clock()
    await start_worker(clock, queue_type=queue_type, max_retries=3)
    one_try = gaps_of(clock, channel, queue_name, {"later": [1.5, 0.2]}, attempts=3)
    await on_time_once(one_try, [(1.5, 1.5 + 1.0), (0.2, 0.2 + 1.0)])


async def test_retry_later_on_the_last_attempt_fails_as_exhausted(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """With no attempt left, a RetryLater sends the job to the failed queue as exhausted."""
    clock = Clock()
    await start_worker(clock, max_retries=1)
    await publish(channel, queue_name, json.dumps({"later": [0.2, 0.2]}), message_id="spent")
    (copy,) = await take(channel, Names(queue_name).failed, 1)
    assert copy.headers["failed-kind"] == "exhausted"
    assert copy.headers["retry-count"] == 1
    assert "ricochet-retries" not in copy.headers  # a replay gets a full budget again
    assert copy.headers["original-routing-key"] == queue_name  # not the key of its wait
    assert clock.attempts("spent") == [1, 2]


async def test_a_retry_after_retry_later_waits_in_the_tier_of_its_attempt(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Attempt 1 asks to wait 0.2 s; attempt 2 fails: it waits tier 2's delay (1.5 s), not
    tier 1's, and tier 3's after that."""
    clock = Clock()
    await start_worker(clock, retry_delays_ms="100,1500,200")
    one_try = gaps_of(clock, channel, queue_name, {"later": [0.2], "fail": 3}, attempts=4)
    await on_time_once(one_try, [(0.2, 1.2), (1.5, 2.5), (0.2, 1.2)])


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_an_explicit_ladder_sets_each_tier_and_the_budget(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """RICOCHET_RETRY_DELAYS_MS=100,1200,100: three tiers waiting those delays, then failed."""
    clock = Clock()
    await start_worker(clock, queue_type=queue_type, retry_delays_ms="100,1200,100")

    async def one_try(message_id: str) -> list[float]:
        await publish(channel, queue_name, json.dumps({"fail": 9}), message_id=message_id)
        (copy,) = await take(channel, Names(queue_name).failed, 1)
        assert copy.message_id == message_id
        assert copy.headers["retry-count"] == 3
        return clock.gaps(message_id)

    await on_time_once(one_try, [(0.1, 0.8), (1.2, 2.0), (0.1, 0.8)])


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_jitter_spreads_jobs_failing_together(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """200 jobs failing at once with jitter 0.5 on a 2 s tier come back after 1-2 s, and the
    10th to 90th percentile of their waits covers at least half of the 1 s spread."""
    clock = Clock()
    await start_worker(
        clock, queue_type=queue_type, retry_delays_ms="2000", retry_jitter=0.5, prefetch=200
    )
    ids = [f"herd-{i}" for i in range(200)]
    for message_id in ids:
        await publish(channel, queue_name, json.dumps({"fail": 1}), message_id=message_id)
    for message_id in ids:
        await ran(clock, message_id, 2, timeout_s=30)
    waits = sorted(gap for m in ids for gap in clock.gaps(m))
    assert waits[0] >= 1.0 - CLOCK_SLACK_S
    assert waits[-1] <= 2.0 + 0.5
    deciles = statistics.quantiles(waits, n=10)
    assert deciles[-1] - deciles[0] >= 0.5 * 2.0 * 0.5, deciles


async def cancel(connection: AbstractConnection, queue: str, message_id: str) -> None:
    await publish_cancel(connection, Names(queue), message_id)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_a_cancelled_job_never_runs_again(
    start_worker: StartWorker,
    channel: AbstractChannel,
    connection: AbstractConnection,
    queue_name: str,
    queue_type: str,
) -> None:
    """Cancelled while scheduled, in a retry tier, or waiting out a RetryLater: when it comes
    due it is acked as cancelled, and counted; other jobs and unknown ids change nothing."""
    clock = Clock()
    worker = await start_worker(clock, queue_type=queue_type, retry_delays_ms="1500")
    at = iso(time.time() + 1.5)
    await publish(channel, queue_name, "{}", message_id="scheduled", headers={"run-at": at})
    await publish(channel, queue_name, json.dumps({"fail": 1}), message_id="in-tier")
    await publish(channel, queue_name, json.dumps({"later": [1.5]}), message_id="later")
    await publish(channel, queue_name, "{}", message_id="kept", headers={"run-at": at})
    await ran(clock, "in-tier")
    await ran(clock, "later")
    for message_id in ("scheduled", "in-tier", "later", "unknown"):
        await cancel(connection, queue_name, message_id)
    await wait_for(lambda: worker.count("cancelled") == 3, 10, "three cancelled jobs")
    await ran(clock, "kept")
    await asyncio.sleep(0.5)
    assert "scheduled" not in clock.runs
    assert clock.attempts("in-tier") == [1]
    assert clock.attempts("later") == [1]
    assert worker.count("failed") == 0


async def test_a_worker_started_after_a_cancel_honours_it(
    start_worker: StartWorker,
    channel: AbstractChannel,
    connection: AbstractConnection,
    queue_name: str,
) -> None:
    """The cancel is made while no worker runs; a worker started afterwards drops the job."""
    clock = Clock()
    first = await start_worker(clock)
    await publish(
        channel, queue_name, "{}", message_id="late", headers={"run-at": iso(time.time() + 2.5)}
    )
    await publish(channel, queue_name, "{}", message_id="marker")
    await ran(clock, "marker")
    await first.stop()
    await cancel(connection, queue_name, "late")
    second = await start_worker(clock)
    await wait_for(lambda: second.count("cancelled") == 1, 10, "the cancelled job")
    assert "late" not in clock.runs


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_restarting_with_jitter_on_or_off_loses_and_duplicates_nothing(
    start_worker: StartWorker,
    channel: AbstractChannel,
    connection: AbstractConnection,
    queue_name: str,
    queue_type: str,
) -> None:
    """Jobs waiting in a tier when a worker restarts with jitter, and in the lanes when it
    restarts without jitter and with another ladder, each come back once; the lanes go once
    they are empty."""
    clock = Clock()
    n = Names(queue_name)
    plain = {"queue_type": queue_type, "retry_delays_ms": "1500,1500"}
    jittered = {**plain, "retry_jitter": 0.5}
    batches = {
        "on": [f"on-{i}" for i in range(30)],
        "off": [f"off-{i}" for i in range(30)],
    }
    for before, after, ids in (
        (plain, jittered, batches["on"]),
        (jittered, {"queue_type": queue_type, "retry_delays_ms": "1000"}, batches["off"]),
    ):
        worker = await start_worker(clock, **before)
        for message_id in ids:
            await publish(channel, queue_name, json.dumps({"fail": 1}), message_id=message_id)
        for message_id in ids:
            await ran(clock, message_id)
        await worker.stop()
        restarted = await start_worker(clock, **after)
        for message_id in ids:
            await ran(clock, message_id, 2)
        await restarted.stop()
    await asyncio.sleep(1)
    for message_id in [*batches["on"], *batches["off"]]:
        assert clock.attempts(message_id) == [1, 2], message_id

    async def lanes_empty() -> bool:
        # A quorum lane keeps a job it dead-lettered until its queue confirms it: RabbitMQ 4.3
        # took seconds after the jobs ran again, and refused to delete the lane meanwhile.
        found = [await api_queue(n.lane(1, i), "messages,messages_dlx") for i in range(1, LANES)]
        return all(not q.get("messages") and not q.get("messages_dlx") for q in found)

    await wait_for(lanes_empty, 30, "the lanes to hold nothing, as the broker counts")
    await start_worker(clock, queue_type=queue_type, retry_delays_ms="1000")
    assert not await exists(connection, n.lane(1, 1))
    assert not await exists(connection, n.tier(2))


async def test_ricochet_cancel_drops_a_scheduled_job(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """`ricochet cancel ID` needs only the broker and the queue; the job never runs, and an
    unknown id is accepted and changes nothing."""
    clock = Clock()
    worker = await start_worker(clock)
    at = iso(time.time() + 8)  # two CLI runs before it: seconds each on a busy machine
    for message_id in ("doomed", "spared"):
        await publish(channel, queue_name, "{}", message_id=message_id, headers={"run-at": at})
    env = ricochet_env(make_settings(queue_name))
    env = {k: v for k, v in env.items() if not k.startswith("RICOCHET_RETRY")}
    for message_id in ("doomed", "never-published"):
        done = await asyncio.to_thread(run_cli, ["cancel", message_id], env)
        assert (done.returncode, done.stdout) == (0, f"cancelled {message_id}\n"), done.stderr
    await ran(clock, "spared")
    await wait_for(lambda: worker.count("cancelled") == 1, 10, "the cancelled job")
    assert "doomed" not in clock.runs


async def test_a_worker_that_reconnects_reads_the_cancel_store_again(
    start_worker: StartWorker,
    channel: AbstractChannel,
    connection: AbstractConnection,
    queue_name: str,
) -> None:
    """The worker's connection closed by the broker: it starts over (reading the store again,
    from its snapshot), and a cancel made then is honoured. (The store is shared by every
    queue of the vhost: a test never deletes it.)"""
    clock = Clock()
    worker = await start_worker(clock)
    assert await asyncio.to_thread(close_connections, queue_name) >= 1
    await wait_for(
        lambda: worker.gauge("ricochet_worker_consuming") == 1, 20, "the worker consuming again"
    )
    at = iso(time.time() + 1.5)
    await publish(channel, queue_name, "{}", message_id="after", headers={"run-at": at})
    await cancel(connection, queue_name, "after")
    await wait_for(lambda: worker.count("cancelled") == 1, 10, "the cancelled job")
    assert "after" not in clock.runs
