"""The retry shape per job type and per job (SPEC 21), end to end: a type's or a job's ladder
sets each wait and the budget, its waits held by the broker in the shared delay levels, with
cancel, jitter and the lateness bound of section 15; a type's timeout replaces the worker's."""

import asyncio
import importlib
import itertools
import json
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aio_pika.abc import AbstractChannel
from ricochet import Client, Job, Router, SyncClient
from ricochet.headers import WAITING_SINCE
from ricochet.names import Names
from structlog.testing import capture_logs

from tests.support import (
    AMQP_URL,
    StartWorker,
    depth,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    take,
    wait_for,
)

# Rows here assert how late each wait of a ladder ends: run apart from the other tests' load.
pytestmark = pytest.mark.timing


QUEUE_TYPES = ["quorum", "classic"]
# Section 15: a wait ends no earlier than asked, and no later than max(1 s, 10 %) after it on an
# idle worker.
LATE_S = 1.0
# The worker's own ladder in these tests: long enough that a wait taken from it instead of the
# type's or the job's would fail the test.
WORKER_DELAY_MS = 60_000


@dataclass
class Runs:
    """A handler recording each attempt (attempt, max_attempts, wall-clock time) by message_id;
    payload {"fail": N} fails attempts 1..N transiently, {"fail": "always"} every one."""

    seen: dict[str | None, list[tuple[int, int, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # How long each attempt after a wait in the delays waited, by message_id: from the time its
    # copy says it began (the handler's failure and the worker's logging left out) to its start.
    waited: dict[str | None, list[float]] = field(default_factory=lambda: defaultdict(list))

    async def __call__(self, job: Job) -> None:
        now = time.time()
        self.seen[job.message_id].append((job.attempt, job.max_attempts, now))
        since_ms = job.headers.get(WAITING_SINCE)
        if isinstance(since_ms, int):
            self.waited[job.message_id].append(now - since_ms / 1000)
        fail = job.payload.get("fail", 0)
        if fail == "always" or job.attempt <= fail:
            raise ConnectionError(f"transient trouble on attempt {job.attempt}")

    def attempts(self, message_id: str) -> list[tuple[int, int]]:
        return [(attempt, most) for attempt, most, _ in self.seen[message_id]]

    def gaps(self, message_id: str) -> list[float]:
        return [b - a for (_, _, a), (_, _, b) in itertools.pairwise(self.seen[message_id])]


def router_of(runs: Runs, **types: dict[str, object]) -> Router:
    router = Router()
    for job_type, policy in types.items():
        router.handler(job_type, **policy)(runs)  # type: ignore[arg-type]
    return router


def assert_waited(runs: Runs, message_id: str, delays_ms: list[int]) -> None:
    """Each attempt after the first began no earlier than its delay after the one before, and
    its wait in the delays lasted at most the lateness bound more than that delay (the bound is
    on the wait: an attempt's own failure, on a machine shared with other suites, is not it)."""
    gaps, waited = runs.gaps(message_id), runs.waited[message_id]
    assert len(gaps) == len(waited) == len(delays_ms), (gaps, waited)
    for gap, wait, delay_ms in zip(gaps, waited, delays_ms, strict=True):
        delay_s = delay_ms / 1000
        assert delay_s <= gap, (gaps, delays_ms)
        assert wait <= delay_s + max(LATE_S, delay_s / 10), (waited, delays_ms)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_a_type_s_ladder_sets_each_wait_and_the_budget(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """A type with retry_delays_ms=(300, 1200, 300) on a worker of one 60 s tier: four attempts
    that count 1-4 of 4, each retry after its own delay, then the failed queue as exhausted with
    an exact retry count; the worker's tier holds nothing. A type without a ladder of its own
    keeps the worker's budget."""
    runs = Runs()
    router = router_of(runs, email={"retry_delays_ms": (300, 1200, 300)}, plain={})
    await start_worker(router, queue_type=queue_type, max_retries=1, retry_delay_ms=WORKER_DELAY_MS)
    always = json.dumps({"fail": "always"})
    await publish(channel, queue_name, always, message_id="email", type="email")
    await publish(channel, queue_name, always, message_id="plain", type="plain")
    names = Names(queue_name)
    (copy,) = await take(channel, names.failed, 1, timeout_s=20)
    assert copy.message_id == "email"
    assert runs.attempts("email") == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert_waited(runs, "email", [300, 1200, 300])
    assert copy.headers["failed-kind"] == "exhausted"
    assert copy.headers["retry-count"] == 3
    assert copy.headers["original-routing-key"] == queue_name  # not the key of its wait
    assert "ricochet-retries" not in copy.headers  # a replay gets a full budget again
    # The worker's ladder: one retry, waiting in its tier.
    assert runs.attempts("plain") == [(1, 2)]
    assert await depth(channel, names.tier(1)) == 1


async def test_a_job_s_ladder_beats_its_type_s_and_max_retries_lowers_it(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """enqueue(retry_delays_ms=...) on the Client and the SyncClient: the job's ladder beats
    its type's (60 s waits) and the worker's; a job's max_retries lowers its budget."""
    runs = Runs()
    router = router_of(runs, email={"retry_delays_ms": (WORKER_DELAY_MS,) * 5})
    await start_worker(router, max_retries=1, retry_delay_ms=WORKER_DELAY_MS)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue(
            "email", {"fail": 2}, message_id="own", retry_delays_ms=[200, 700, 200]
        )
    sync = SyncClient(AMQP_URL, queue_name)
    try:
        await asyncio.to_thread(
            sync.enqueue,
            "email",
            {"fail": "always"},
            message_id="lowered",
            retry_delays_ms=(200, 200, 200),
            max_retries=1,
        )
    finally:
        await asyncio.to_thread(sync.close)
    (copy,) = await take(channel, Names(queue_name).failed, 1, timeout_s=20)
    assert copy.message_id == "lowered"
    assert copy.headers["retry-count"] == 1
    assert copy.headers["retry-delays-ms"] == "200,200,200"  # kept for a replay
    await wait_for(lambda: len(runs.seen["own"]) == 3, 20, "the job's three attempts")
    assert runs.attempts("own") == [(1, 4), (2, 4), (3, 4)]
    assert_waited(runs, "own", [200, 700])
    assert runs.attempts("lowered") == [(1, 2), (2, 2)]


@pytest.mark.parametrize("value", ["soon", "5000,", "9", ",".join(["100"] * 26)])
async def test_a_ladder_header_that_cannot_be_read_fails_the_job_as_permanent(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, value: str
) -> None:
    """A retry-delays-ms header from another producer that is not 1-25 comma-separated delays
    of 10-86,400,000 ms: the job fails at once as permanent, its reason naming the header, and
    its handler never runs; the worker goes on with the next job."""
    runs = Runs()
    await start_worker(router_of(runs, email={}))
    headers = {"retry-delays-ms": value}
    await publish(channel, queue_name, "{}", message_id="bad", type="email", headers=headers)
    await publish(channel, queue_name, "{}", message_id="next", type="email")
    (copy,) = await take(channel, Names(queue_name).failed, 1)
    assert copy.headers["failed-kind"] == "permanent"
    assert "retry-delays-ms header" in str(copy.headers["failed-reason"])
    assert copy.headers["retry-delays-ms"] == value
    await wait_for(lambda: "next" in runs.seen, 10, "the next job")
    assert "bad" not in runs.seen


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_a_cancel_reaches_a_job_waiting_on_its_type_s_or_its_own_ladder(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """Jobs waiting 1.5 s on their type's ladder and on their own are cancelled while they
    wait: when due they are acked as cancelled and never run again; a job beside them that is
    not cancelled runs its retry."""
    runs = Runs()
    router = router_of(runs, email={"retry_delays_ms": (1_500,)})
    worker = await start_worker(router, queue_type=queue_type, retry_delay_ms=WORKER_DELAY_MS)
    async with Client(AMQP_URL, queue_name) as client:
        for message_id in ("type-ladder", "kept"):
            await client.enqueue("email", {"fail": 1}, message_id=message_id)
        await client.enqueue("email", {"fail": 1}, message_id="own", retry_delays_ms=[1_500])
        for message_id in ("type-ladder", "own", "kept"):
            await wait_for(lambda m=message_id: m in runs.seen, 10, message_id)  # type: ignore[misc]
        await client.cancel("type-ladder")
        await client.cancel("own")
    await wait_for(lambda: worker.count("cancelled") == 2, 10, "two cancelled jobs")
    await wait_for(lambda: len(runs.seen["kept"]) == 2, 10, "the job not cancelled")
    await asyncio.sleep(0.5)
    assert runs.attempts("type-ladder") == [(1, 2)]
    assert runs.attempts("own") == [(1, 2)]
    assert worker.count("failed") == 0


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_jitter_spreads_the_waits_of_a_type_s_ladder(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """200 jobs of a type with a 2 s ladder failing at once, with RICOCHET_RETRY_JITTER=0.5:
    each is given a wait of 1-2 s, the 10th to 90th percentile of them covering at least half of
    the 1 s spread, and waits it out in the delays, from when its copy began waiting."""
    runs = Runs()
    router = router_of(runs, email={"retry_delays_ms": (2_000,)})
    ids = [f"herd-{i}" for i in range(200)]
    with capture_logs() as logs:
        await start_worker(
            router,
            queue_type=queue_type,
            retry_delay_ms=WORKER_DELAY_MS,
            retry_jitter=0.5,
            prefetch=200,
        )
        body = json.dumps({"fail": 1})
        for message_id in ids:
            await publish(channel, queue_name, body, message_id=message_id, type="email")
        await wait_for(
            lambda: all(len(runs.seen[m]) == 2 for m in ids), 30, "every job's second attempt"
        )
    given = sorted(e["delay_ms"] / 1000 for e in logs if e["event"] == "job failed, retrying")
    assert len(given) == len(ids)
    assert given[0] >= 1.0
    assert given[-1] <= 2.0
    deciles = statistics.quantiles(given, n=10)
    assert deciles[-1] - deciles[0] >= 0.5 * 2.0 * 0.5, deciles
    waits = sorted(w for waited in runs.waited.values() for w in waited)
    assert len(waits) == len(ids)
    assert waits[0] >= 1.0
    # 200 jobs due within one second are no idle worker's (LATE_S), least of all on a machine
    # shared with other suites (1.5 s late seen): the bound left is that no wait came from the
    # worker's own ladder.
    assert waits[-1] < 2.0 + WORKER_DELAY_MS / 1000 / 10


async def test_a_type_s_timeout_replaces_the_worker_s(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A type with timeout_s=0.3 fails an attempt that runs longer as a transient
    HandlerTimeout; a type without one runs as long as the worker's 30 s allow."""
    router = Router()

    @router.handler("quick", timeout_s=0.3, max_retries=0)
    @router.handler("patient", max_retries=0)
    async def sleeper(job: Job) -> None:
        await asyncio.sleep(1.0)

    worker = await start_worker(router, handler_timeout_s=30)
    await publish(channel, queue_name, "{}", message_id="quick", type="quick")
    await publish(channel, queue_name, "{}", message_id="patient", type="patient")
    (copy,) = await take(channel, Names(queue_name).failed, 1)
    assert copy.message_id == "quick"
    assert copy.headers["failed-reason"] == "HandlerTimeout: handler ran longer than 0.3 s"
    assert copy.headers["failed-kind"] == "exhausted"
    await wait_for(lambda: worker.count("succeeded") == 1, 10, "the patient job")


async def test_the_readme_s_ladders_per_type_run(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """The retry shapes' backoff table (docs/examples/backoff.py): its router has each type's ladder
    and timeout, a worker runs its jobs, and `topology` and `status` list the types with them
    when RICOCHET_HANDLER names it."""
    backoff = importlib.import_module("docs.examples.backoff")
    shapes = {
        job_type: (route.retry_delays_ms, route.timeout_s)
        for job_type in backoff.router.types
        if (route := backoff.router.route(job_type)) is not None
    }
    assert shapes == {
        "email.send": ((5_000, 10_000), None),
        "oauth.refresh": ((60_000, 120_000), None),
        "embeddings": ((2_000, 4_000), 120.0),
    }
    worker = await start_worker(backoff.router)
    for job_type in shapes:
        await publish(channel, queue_name, "{}", message_id=job_type, type=job_type)
    await wait_for(lambda: worker.count("succeeded") == 3, 10, "the example's three jobs")

    env = ricochet_env(make_settings(queue_name), RICOCHET_HANDLER="docs.examples.backoff:router")
    status = run_cli(["status", "--json"], env)
    assert status.returncode == 0, status.stderr
    types = {t["type"]: t for t in json.loads(status.stdout)["types"]}
    assert types["email.send"] == {
        "type": "email.send",
        "retry_delays_ms": [5_000, 10_000],
        "max_retries": None,
        "timeout_s": None,
    }
    assert types["embeddings"]["timeout_s"] == 120.0
    dry = run_cli(["topology", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert any(
        line.split() == ["email.send", "5s,", "10s", "-", "the", "worker's"] for line in lines
    )
    assert any(line.split() == ["embeddings", "2s,", "4s", "-", "120s"] for line in lines)


def test_a_bad_ladder_stops_the_worker_at_start(queue_name: str, tmp_path: Path) -> None:
    """A handler registered with a ladder out of bounds: the worker exits 2 naming it, before
    it touches the broker."""
    (tmp_path / "badladder.py").write_text(
        "from ricochet import Router\n"
        "router = Router()\n"
        "@router.handler('email', retry_delays_ms=[5])\n"
        "def send(job): ...\n"
    )
    env = ricochet_env(make_settings(queue_name), RICOCHET_HANDLER="badladder:router")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    result = run_cli(["worker"], env)
    assert result.returncode == 2
    assert "retry_delays_ms for job type 'email' is invalid" in result.stderr
