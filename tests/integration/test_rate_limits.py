"""Rate limits per job type (SPEC 28), end to end on the broker of the run: a limit shared by
every worker (adding one does not raise it), a limited job spending no attempt, other types
going on, workers that disagree applying the lowest, and the gauges of the leader."""

import asyncio
import json
import time

from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Client, Job, Router
from ricochet.ops.checks import rate_limits_check
from ricochet.ops.doctor import read_rates
from ricochet.ops.status import read_status
from ricochet.worker.rate_limits import FORGET_S
from structlog.testing import capture_logs

from tests.support import (
    AMQP_URL,
    StartWorker,
    exists,
    make_settings,
    publish,
    wait_depth,
    wait_for,
)


class Starts:
    """When each job started (monotonic seconds), by type, and its attempt."""

    def __init__(self) -> None:
        self.at: dict[str, list[float]] = {}
        self.attempts: list[int] = []

    async def __call__(self, job: Job) -> None:
        self.at.setdefault(str(job.type), []).append(time.monotonic())
        self.attempts.append(job.attempt)

    def count(self, job_type: str) -> int:
        return len(self.at.get(job_type, []))


def most_in_a_second(starts: list[float]) -> int:
    """The most starts within any window of one second."""
    return max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)


async def enqueue(queue: str, job_type: str, jobs: int) -> None:
    async with Client(AMQP_URL, queue) as client:
        await asyncio.gather(*(client.enqueue(job_type, {}) for _ in range(jobs)))


async def test_a_limit_is_shared_by_every_worker_and_spends_no_attempt(
    start_worker: StartWorker, queue_name: str
) -> None:
    """4 jobs a second with a burst of 1 over two workers of prefetch 10: 12 jobs take at least
    (12 - 1) / 4 s, never more than 4 + 1 (+ 1 a loaded loop delayed) within a second, each on
    its first attempt;
    a type without a limit, enqueued behind them, runs at once."""
    starts = Starts()
    for _ in range(2):
        await start_worker(starts, prefetch=10, rate_limits="mail=4/s")
    await enqueue(queue_name, "mail", 12)
    await enqueue(queue_name, "other", 5)
    await wait_for(lambda: starts.count("other") == 5, 10, "the other type's jobs")
    assert starts.count("mail") < 12  # the others did not wait for the limited ones
    await wait_for(lambda: starts.count("mail") == 12, 30, "the limited jobs")
    mail = sorted(starts.at["mail"])
    assert mail[-1] - mail[0] >= (12 - 1) / 4 - 0.5
    # The tokens allow 4 + 1; a start that a loaded event loop held back a moment can fall in
    # the next token's second (6 once, on two loaded cores), where the pace above still holds.
    assert most_in_a_second(mail) <= 6
    assert set(starts.attempts) == {1}


async def test_workers_that_disagree_apply_the_lowest_limit(
    start_worker: StartWorker, queue_name: str
) -> None:
    """One worker limits the type to 20/s, the other (by its handler's rate=) to 2/s with a
    burst of 2: the leader refills at 2/s, whichever of them leads, and its gauges say so."""
    starts = Starts()
    router = Router()
    router.handler("sync", rate="2/s", burst=2)(starts)
    fast = await start_worker(starts, rate_limits="sync=20/s")
    slow = await start_worker(router)

    def gauge(name: str) -> float:
        sample = {"queue": queue_name, "type": "sync"}
        return max(w.metrics.registry.get_sample_value(name, sample) or 0.0 for w in (fast, slow))

    # The leader learns the other's limit from its announcement, within a round of reading.
    await wait_for(lambda: gauge("ricochet_rate_limit_per_second") == 2.0, 15, "the lowest")
    await enqueue(queue_name, "sync", 9)
    found = rate_limits_check(queue_name, await read_rates(make_settings(queue_name)))
    assert found.status == "warn"
    assert "workers disagree (sync: 2/s:2, 20/s): the lowest applies" in found.detail
    await wait_for(lambda: starts.count("sync") == 9, 30, "the jobs")
    sync = sorted(starts.at["sync"])
    assert sync[-1] - sync[0] >= (9 - 2) / 2 - 0.5  # 2/s after a burst of 2
    assert most_in_a_second(sync) <= 2 + 2 + 1


async def test_the_leader_counts_the_jobs_waiting_for_a_token(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """A backlog over a limit of 1/s: the leader's ricochet_rate_limited_jobs counts the jobs
    that wait for a token, and falls as they run; `ricochet status` shows the limit applied and
    the jobs waiting for it."""
    starts = Starts()
    worker = await start_worker(starts, prefetch=20, rate_limits="report=1/s")
    await enqueue(queue_name, "report", 8)
    sample = {"queue": queue_name, "type": "report"}

    def held() -> float:
        return worker.metrics.registry.get_sample_value("ricochet_rate_limited_jobs", sample) or 0

    await wait_for(lambda: held() >= 4, 10, "jobs waiting for a token")
    first = held()
    await wait_for(lambda: held() < first, 10, "the count falling")
    rows = await read_status(connection, make_settings(queue_name))
    (row,) = [r for r in rows if r.role.startswith("rate limit")]
    assert (row.name, row.role) == (f"{queue_name}.limited.report", "rate limit report 1/s")
    assert row.messages is not None
    assert 0 < row.messages < 8


async def test_limits_that_cannot_be_declared_are_said_and_hold_no_job(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """Q.rates declared by someone else with other arguments: the worker says once that its
    limits are not applied, and the limited jobs run rather than wait for tokens that never
    come."""
    await channel.declare_queue(f"{queue_name}.rates", durable=True)
    starts = Starts()
    with capture_logs() as logs:
        await start_worker(starts, rate_limits="mail=1/m")
        await enqueue(queue_name, "mail", 3)
        await wait_for(lambda: starts.count("mail") == 3, 10, "the jobs, unlimited")
    assert [e["event"] for e in logs].count("rate limits not applied") == 1


async def test_a_new_leader_releases_the_jobs_of_a_type_nobody_limits_any_more(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """Worker a limits mail to 1 a minute and leads; worker b limits only sms. With a stopped
    and mail's jobs waiting for tokens, b takes the lead and applies a's recorded limit for as
    long as an announcement counts (FORGET_S: some worker might still limit mail), then, none
    having come, lets mail's jobs all run. Before b leads, status says a's limit is
    unapplied."""
    starts = Starts()
    first = await start_worker(starts, rate_limits="mail=1/m")
    await enqueue(queue_name, "mail", 4)
    await wait_for(lambda: starts.count("mail") == 1, 10, "the first mail job")
    # Stopped once the other three wait for tokens: one still being gated would go back to the
    # queue, and b, which does not limit mail, would run it (4.3, once in CI).
    channel = await connection.channel()
    await wait_depth(channel, f"{queue_name}.limited.mail", 3)
    await channel.close()
    await first.stop()
    rows = await read_status(connection, make_settings(queue_name))
    assert [r.role for r in rows if r.role.startswith("rate limit")] == [
        "rate limit mail 1/m, unapplied: no leader"
    ]
    await start_worker(starts, rate_limits="sms=1/s")
    await asyncio.sleep(FORGET_S / 2)
    # a's limit still holds: b's bucket starts full (one token), a's last one went at the start.
    assert starts.count("mail") == 2
    await wait_for(lambda: starts.count("mail") == 4, FORGET_S + 15, "mail's jobs released")
    assert set(starts.attempts) == {1}


async def test_jobs_of_a_key_and_a_limited_type_keep_their_order(
    start_worker: StartWorker, queue_name: str
) -> None:
    """Six jobs of one key, their type limited to 4 a second: each waits for a token in its
    lane rather than go back behind the next ones, so they start in order, at the limit."""
    order: list[str] = []
    stamps: list[float] = []

    async def handler(job: Job) -> None:
        order.append(str(job.message_id))
        stamps.append(time.monotonic())

    await start_worker(handler, rate_limits="sync=4/s", key_lanes=2)
    async with Client(AMQP_URL, queue_name) as client:
        for i in range(6):
            await client.enqueue("sync", {}, message_id=f"s{i}", key="k")
    await wait_for(lambda: len(order) == 6, 20, "the jobs of the key")
    assert order == [f"s{i}" for i in range(6)]
    assert most_in_a_second(stamps) <= 5


async def test_forged_tokens_and_announcements_change_nothing(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """Ten tokens a producer publishes into Q.tokens.mail behind the leader's (the broker
    vouches no user for them) start no job, and its announcement of a higher limit is not
    applied: 1 a minute starts one job in 5 s."""
    starts = Starts()
    worker = await start_worker(starts, rate_limits="mail=1/m")
    tokens = f"{queue_name}.tokens.mail"
    # The leader declares it once it leads, after the worker consumes: a passive declare of a
    # queue not there yet would close the channel.
    await wait_for(lambda: exists(connection, tokens), 30, f"{tokens}, which the leader declares")
    await wait_depth(channel, tokens, 1)  # the leader's first token
    for _ in range(10):
        await publish(channel, f"{queue_name}.tokens.mail", "")
    forged = {"process": "x", "limits": {"mail": [100, 1, 10]}}
    await publish(channel, f"{queue_name}.rates", json.dumps(forged))
    await enqueue(queue_name, "mail", 6)
    await asyncio.sleep(5)
    assert starts.count("mail") == 1
    sample = {"queue": queue_name, "type": "mail"}
    per_s = worker.metrics.registry.get_sample_value("ricochet_rate_limit_per_second", sample)
    assert per_s == 1 / 60
