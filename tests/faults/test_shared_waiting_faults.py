"""Faults while jobs wait in the delays' levels that every queue of a vhost shares (SPEC 18): the
broker restarted while three queues' jobs wait there, a queue deleted while its jobs wait beside
another queue's, a queue deleted while its jobs wait on every route (the levels and its own retry
tier), a queue deleted while jobs the client scheduled wait with no worker running, and a
worker killed with `kill -9` during the move from the per-queue levels of earlier versions.

Every job id is accounted for: completed, in ricochet.orphans (a deleted queue's), or lost."""

import asyncio
import datetime as dt
import json
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from ricochet import Client, SyncClient
from ricochet.broker.connection import close_quietly
from ricochet.broker.declare import declare
from ricochet.broker.management import vhost
from ricochet.headers import RETRY_DELAYS
from ricochet.names import DELAY_LEVELS, SHARED, Names, delay_key

from tests.broker import BROKER, Broker
from tests.faults.harness import QUIET_S, TALLIES, FaultRun, Tally, fault_settings
from tests.faults.node import Node
from tests.integration.test_legacy_levels import declare_legacy_levels, declare_legacy_store
from tests.support import (
    api_queue,
    delete_topology,
    depth,
    exists,
    journal,
    orphans_tally,
    ricochet_env,
    run_cli,
    spawn,
    wait_for,
)


class Runs:
    """FaultRuns on queues of the test's own (Q-0, Q-1, ... for the test's Q) on one broker, each
    with its own connection, journal and worker log; after the test their workers are killed and
    their queues deleted."""

    def __init__(self, broker: Broker, stem: str, tmp_path: Path) -> None:
        self.broker = broker
        self.stem = stem
        self.tmp_path = tmp_path
        self.made: list[FaultRun] = []

    async def make(self, name: str, **overrides: Any) -> FaultRun:
        queue = f"{self.stem}-{len(self.made)}"
        path = self.tmp_path / str(len(self.made))
        path.mkdir()
        connection = await aio_pika.connect(
            self.broker.amqp_url, client_properties={"connection_name": "tests"}
        )
        run = FaultRun(
            name, connection, fault_settings(queue, self.broker.amqp_url, **overrides), path
        )
        self.made.append(run)
        return run

    async def close(self) -> None:
        for run in self.made:
            for worker in run.workers:
                if worker.alive:
                    worker.kill()
        # A fault may have closed the runs' connections: clean up on a fresh one.
        async with await aio_pika.connect(self.broker.amqp_url) as cleanup:
            for run in self.made:
                await delete_topology(cleanup, run.settings.queue)
        for run in self.made:
            await close_quietly(run.connection)


@pytest.fixture
async def runs(fault_broker: Broker, queue_name: str, tmp_path: Path) -> AsyncIterator[Runs]:
    """Runs on the faults' broker: the private node, or the matrix's broker under test."""
    made = Runs(fault_broker, queue_name, tmp_path)
    yield made
    await made.close()


@pytest.fixture
async def broker_runs(queue_name: str, tmp_path: Path) -> AsyncIterator[Runs]:
    """Runs on the broker under test itself, with its management API (the private node has
    none); for faults of the workers alone, which never disturb the broker."""
    made = Runs(BROKER, queue_name, tmp_path)
    yield made
    await made.close()


def own_ids(run: FaultRun, n: int) -> list[str]:
    """n new job ids that name the run's queue, so that no other test's jobs share them (in
    ricochet.orphans, say)."""
    first = len(run.published)
    return [f"{run.settings.queue}-{first + i}" for i in range(n)]


def run_at(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat()


def scheduled(due: dict[str, float]) -> list[aio_pika.Message]:
    """Jobs (id: its time, by time.time()) with that run-at."""
    return [
        aio_pika.Message(
            b"{}",
            message_id=message_id,
            headers={"run-at": run_at(at)},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        for message_id, at in due.items()
    ]


async def lateness(
    runs: list[FaultRun], due: dict[str, float], attempt: int, timeout_s: float
) -> dict[str, float]:
    """How late each job's attempt started (s) after its due time (id: time.time()), by
    watching the runs' journals until every one has started."""
    late: dict[str, float] = {}

    def all_started() -> bool:
        now = time.time()
        for run in runs:
            for event, message_id, n in journal(run.journal_path):
                if event == "start" and n == attempt and message_id in due:
                    late.setdefault(message_id, now - due[message_id])
        return set(due) <= set(late)

    await wait_for(all_started, timeout_s, f"{len(due)} jobs to start attempt {attempt}")
    return late


async def start_workers(runs: list[FaultRun]) -> None:
    """A worker on each run's queue, each consuming before the next starts: workers that start
    at the same moment take turns at the cancel store's snapshot (each holds it for a get and
    a requeue), and on a busy machine wait for it (up to 2 s) beside the broker's restart."""
    for run in runs:
        await run.start_worker()


# ---------------------------------------------------------------------------------------------
# A broker restart while jobs of three queues wait in the shared levels.

RESTART_JOBS = 10  # a queue; three queues
# The jobs of each queue come due one every half second from 6 s after their publication: the
# first while the app is down or starting again, the last after it runs again. (From 3 s, a busy
# machine's rabbitmqctl had not yet seen every job in the levels when the first came due; from
# 6 s, not on CI's, where suites run beside each other: the app stops a second before the first
# is due, however soon the levels held them all.)
RESTART_FIRST_DUE_S = 12
RESTART_SPACING_S = 0.5


def messages_in(node: Node, queues: list[str]) -> int:
    """The messages (ready and unacked) these queues hold, by rabbitmqctl."""
    listed = node.ctl("list_queues", "name", "messages", "--no-table-headers")
    held = dict(line.split("\t") for line in listed.splitlines() if "\t" in line)
    return sum(int(held.get(queue, 0)) for queue in queues)


def confirm_timeout_s(node: Node) -> float:
    """The node's dead_letter_worker_publisher_confirm_timeout: how long the broker's
    at-least-once dead-letter worker waits for a confirm before it sends a job again."""
    setting = node.ctl(
        "eval", "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout)."
    )
    found = re.search(r"\{ok,\s*(\d+)\}", setting)
    return int(found.group(1)) / 1000 if found else 180.0  # RabbitMQ's default


@pytest.mark.skipif(
    BROKER.private,
    reason="restarts its broker: runs on the fault suite's private node only (make faults), "
    "never on a broker of the matrix, which others may be using",
)
@pytest.mark.timeout(300)
async def test_broker_restart_while_three_queues_jobs_wait_in_the_shared_levels(
    runs: Runs, node: Node
) -> None:
    """Three queues, each with a worker and 10 jobs scheduled 12 to 16.5 s ahead, all waiting in
    the shared levels; `rabbitmqctl stop_app` a second before the first is due, one second,
    `start_app`, so that some come due while the app is down or starting and the others after:
    the workers reconnect and every job of every queue runs, none lost.

    How late a job may run is bounded by the node's dead_letter_worker_publisher_confirm_timeout
    (read from the node; RabbitMQ's default is 180 s): a job that a level's at-least-once
    dead-letter worker had sent on, unconfirmed when the app stopped, is sent again only once
    that timeout has passed. The wait allows for it, plus 30 s."""
    queues = [
        await runs.make(f"broker restart, jobs of 3 queues in the shared levels ({i}/3)")
        for i in (1, 2, 3)
    ]
    await start_workers(queues)
    first_due = time.time() + RESTART_FIRST_DUE_S
    due: dict[str, float] = {}
    for run in queues:
        ids = own_ids(run, RESTART_JOBS)
        ours = {message_id: first_due + i * RESTART_SPACING_S for i, message_id in enumerate(ids)}
        await run.publish_messages(scheduled(ours))
        due |= ours
    names = [run.settings.queue for run in queues]
    await wait_for(
        lambda: asyncio.to_thread(lambda: messages_in(node, names) == 0),
        RESTART_FIRST_DUE_S,
        "the workers to send every job to wait in the levels",
    )
    assert time.time() < first_due, "the app stops after jobs came due: schedule them later"
    await asyncio.sleep(max(0.0, first_due - 1 - time.time()))
    await asyncio.to_thread(node.ctl, "stop_app")
    await asyncio.sleep(1)
    await asyncio.to_thread(node.ctl, "start_app")
    for run in queues:
        await run.reconnect()
    bound_s = confirm_timeout_s(node) + 30
    await lateness(queues, due, 1, max(due.values()) - time.time() + bound_s)
    assert all("connection lost, reconnecting" in r.workers[0].output.read_text() for r in queues)
    await asyncio.gather(*(run.account() for run in queues))


# ---------------------------------------------------------------------------------------------
# A queue deleted while its jobs wait, beside another queue's jobs in the same level.

# 100 units of 100 ms: every job waits in ricochet.delay.6, .5 and .2, and leaves from .2. Its
# worker's drain and the queue's delete come first, which took 3.4 s once on two loaded cores.
LATER_S = 10
# More than the 32 jobs (dead_letter_worker_consumer_prefetch) that the broker's dead-letter
# worker of a level keeps checked out: had the deleted queue's jobs no way out, they would stop
# that level for every queue.
ORPHANED = 40
OTHERS = 10
ON_TIME_S = 5  # how late the other queue's jobs may run (over 2 s seen with four suites at once)


def later_whole(run: FaultRun) -> Callable[[AbstractIncomingMessage], None]:
    """Asserts that an orphan is one of the run's RetryLater jobs, whole, with its route."""

    def check(message: AbstractIncomingMessage) -> None:
        assert message.routing_key == delay_key(round(LATER_S * 1000), run.settings.queue)
        assert json.loads(message.body) == {"later": LATER_S}  # the job, whole

    return check


async def take_orphans(
    run: FaultRun,
    ids: list[str],
    taken: Counter[str],
    whole: Callable[[AbstractIncomingMessage], None],
) -> None:
    """Take the copies of these ids in ricochet.orphans, counted in taken, and have `whole` look
    at each."""
    channel = await run.connection.channel()
    try:
        for message in await orphans_tally(channel, taken, ids):
            whole(message)
    finally:
        await channel.close()


async def all_in_orphans(
    run: FaultRun,
    ids: list[str],
    whole: Callable[[AbstractIncomingMessage], None],
    since: float,
    wait_s: float,
) -> tuple[Counter[str], float]:
    """Take these ids' copies from ricochet.orphans until every one has come (wait_s + 30 s at
    most), then once more after QUIET_S, where a late copy would show: the copies counted, and
    the seconds from `since` (time.monotonic()) until the last had come."""
    orphaned: Counter[str] = Counter()

    async def all_orphaned() -> bool:
        await take_orphans(run, ids, orphaned, whole)
        return set(ids) <= set(orphaned)

    await wait_for(all_orphaned, wait_s + 30, f"the {len(ids)} jobs in {SHARED.orphans}")
    after_s = time.monotonic() - since
    await asyncio.sleep(QUIET_S)
    await take_orphans(run, ids, orphaned, whole)
    return orphaned, after_s


async def test_a_queue_deleted_while_its_jobs_wait_beside_another_queues(runs: Runs) -> None:
    """Two queues with a worker each. 40 jobs of the first ask a 3 s RetryLater and wait in the
    shared levels; its worker stops and the queue is deleted; then 10 jobs of the second do
    the same, behind them in the same levels. The 40 come due with no queue to go to: each ends
    in ricochet.orphans, whole and once, none lost, none run; the second queue's 10 run on
    time, at most 5 s after their due time."""
    gone = await runs.make(f"queue deleted with {ORPHANED} jobs waiting (in ricochet.orphans)")
    stays = await runs.make(f"{OTHERS} jobs of another queue in the same level, on time")
    await start_workers([gone, stays])
    doomed = own_ids(gone, ORPHANED)
    waiting_since = time.monotonic()  # none of them can come due before LATER_S from here
    await gone.publish_ids(doomed, {"later": LATER_S})
    await wait_for(lambda: set(doomed) <= gone.started(), 20, "the first queue's jobs to start")
    assert await gone.workers[0].terminate() == 0  # it drains: every job sent to wait, acked
    channel = await gone.connection.channel()
    assert await depth(channel, gone.settings.queue) == 0
    await channel.queue_delete(gone.settings.queue)  # as an operator does: rabbitmqctl, the UI
    await channel.close()
    assert time.monotonic() - waiting_since < LATER_S, "deleted after its jobs came due"

    others = own_ids(stays, OTHERS)
    published = time.time()  # none of them can come due before LATER_S from here
    await stays.publish_ids(others, {"later": LATER_S})
    late = await lateness([stays], dict.fromkeys(others, published + LATER_S), 2, LATER_S + 60)
    assert max(late.values()) <= ON_TIME_S, late

    orphaned: Counter[str] = Counter()

    async def all_orphaned() -> bool:
        await take_orphans(gone, doomed, orphaned, later_whole(gone))
        return set(doomed) <= set(orphaned)

    await wait_for(all_orphaned, 30, f"the {ORPHANED} jobs in {SHARED.orphans}")
    await stays.account()  # it waits for the journal to go quiet: late copies would show
    await take_orphans(gone, doomed, orphaned, later_whole(gone))
    assert not gone.done()
    assert {attempt for _, _, attempt in journal(gone.journal_path)} == {1}  # none came back
    tally = Tally(
        fault=gone.name,
        published=len(doomed),
        completed=0,
        failed=len(orphaned),  # in ricochet.orphans, where a job whose queue is gone ends
        lost=len(set(doomed) - set(orphaned)),
        duplicates=sum(n - 1 for n in orphaned.values()),
    )
    TALLIES.append(tally)
    assert tally.lost == 0, tally
    assert tally.duplicates == 0, tally


# ---------------------------------------------------------------------------------------------
# A queue deleted while its jobs wait on every route a job may wait on.

ROUTE_JOBS = 10  # a route; four routes
ROUTE_WAIT_S = 5  # every job's wait: the queue is deleted within it
ROW_HEADER = "x-fault-row"  # the producer's own header, which every orphan keeps


def on_each_route(ids: list[str], due: float) -> list[aio_pika.Message]:
    """ROUTE_JOBS jobs a route, in turn: scheduled (run-at), a RetryLater, a failure retried by
    a ladder of the job's own, a failure retried by the worker's tier; all of ROUTE_WAIT_S."""
    wait_ms = str(ROUTE_WAIT_S * 1000)
    routes: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"run-at": run_at(due)}, {}),
        ({}, {"later": ROUTE_WAIT_S}),
        ({RETRY_DELAYS: wait_ms}, {"fail": 1}),
        ({}, {"fail": 1}),
    ]
    return [
        aio_pika.Message(
            json.dumps(payload).encode(),
            message_id=message_id,
            headers={**headers, ROW_HEADER: message_id},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        for message_id, (headers, payload) in zip(
            ids, [route for route in routes for _ in range(ROUTE_JOBS)], strict=True
        )
    ]


def with_its_header(message: AbstractIncomingMessage) -> None:
    assert (message.headers or {}).get(ROW_HEADER) == message.message_id


async def test_a_queue_deleted_while_jobs_wait_on_every_route(broker_runs: Runs) -> None:
    """A worker sends 40 jobs to wait 5 s, 10 on each route: a schedule, a RetryLater, a ladder
    of the job's own (both in the shared levels) and the worker's retry tier (the queue's own);
    it stops and the queue alone is deleted, as an operator deletes it, its tiers and exchanges
    left. Each job ends in ricochet.orphans once, with its headers, none lost, none run again.

    It runs on the broker under test: deleting a queue of its own never disturbs the broker."""
    run = await broker_runs.make(
        f"queue deleted with {4 * ROUTE_JOBS} jobs waiting on 4 routes (in ricochet.orphans)",
        retry_delay_ms=ROUTE_WAIT_S * 1000,
        max_retries=1,
    )
    await run.start_worker()
    ids = own_ids(run, 4 * ROUTE_JOBS)
    failing = ids[ROUTE_JOBS:]
    waiting_since = time.monotonic()  # none of them can come due before ROUTE_WAIT_S from here
    await run.publish_messages(on_each_route(ids, time.time() + ROUTE_WAIT_S))
    await wait_for(lambda: set(failing) <= run.started(), 20, "the failing jobs to start")
    assert await run.workers[0].terminate() == 0  # it drains: every job sent to wait, acked
    channel = await run.connection.channel()
    assert await depth(channel, run.settings.queue) == 0
    await channel.queue_delete(run.settings.queue)
    await channel.close()
    assert time.monotonic() - waiting_since < ROUTE_WAIT_S, "deleted after its jobs came due"

    orphaned, orphaned_after_s = await all_in_orphans(
        run, ids, with_its_header, waiting_since, ROUTE_WAIT_S
    )
    assert not run.done()
    assert {attempt for _, _, attempt in journal(run.journal_path)} == {1}  # none came back
    tally = Tally(
        fault=f"{run.name}, all in {orphaned_after_s:.1f} s",
        published=len(ids),
        completed=0,
        failed=len(orphaned),  # in ricochet.orphans, where a job whose queue is gone ends
        lost=len(set(ids) - set(orphaned)),
        duplicates=sum(n - 1 for n in orphaned.values()),
    )
    TALLIES.append(tally)
    assert tally.lost == 0, tally
    assert tally.duplicates == 0, tally


# ---------------------------------------------------------------------------------------------
# A queue deleted while jobs the client scheduled wait, no worker ever running.

CLIENT_JOBS = 40  # half by Client, half by SyncClient
CLIENT_WAIT_S = 3  # every job's delay: the queue is deleted within it


async def test_a_queue_deleted_while_jobs_the_client_scheduled_wait_with_no_worker(
    broker_runs: Runs,
) -> None:
    """The topology is declared (`ricochet topology`) and no worker ever runs. A client of
    another queue enqueues 40 jobs due in 3 s to this one (20 by Client, 20 by SyncClient); the
    queue is deleted through the management API at once. Each job ends in ricochet.orphans
    once, with its headers, none lost: the client sent each to wait in the shared levels, as a
    worker would, so none was in the queue when it went."""
    run = await broker_runs.make(
        f"queue deleted with {CLIENT_JOBS} jobs the client scheduled, no worker (in the orphans)"
    )
    queue = run.settings.queue
    await declare(run.connection, run.settings)
    ids = own_ids(run, CLIENT_JOBS)
    run.published.extend(ids)
    by_async, by_sync = ids[: CLIENT_JOBS // 2], ids[CLIENT_JOBS // 2 :]
    waiting_since = time.monotonic()  # none of them can come due before CLIENT_WAIT_S from here
    async with Client(run.settings.amqp_url, f"{queue}-other") as client:
        for message_id in by_async:
            await client.enqueue(
                "job",
                {},
                message_id=message_id,
                delay=CLIENT_WAIT_S,
                queue=queue,
                headers={ROW_HEADER: message_id},
            )
    with SyncClient(run.settings.amqp_url, f"{queue}-other") as sync:
        for message_id in by_sync:
            await asyncio.to_thread(
                sync.enqueue,
                "job",
                {},
                message_id=message_id,
                delay=CLIENT_WAIT_S,
                queue=queue,
                headers={ROW_HEADER: message_id},
            )
    # as an operator deletes it in the management UI: the queue alone
    where = f"queues/{quote(vhost(run.settings.amqp_url), safe='')}/{quote(queue, safe='')}"
    status, reply = BROKER.api("DELETE", where)
    assert status == 204, reply
    assert time.monotonic() - waiting_since < CLIENT_WAIT_S, "deleted after its jobs came due"

    orphaned, orphaned_after_s = await all_in_orphans(
        run, ids, with_its_header, waiting_since, CLIENT_WAIT_S
    )
    tally = Tally(
        fault=f"{run.name}, all in {orphaned_after_s:.1f} s",
        published=len(ids),
        completed=0,
        failed=len(orphaned),  # in ricochet.orphans, where a job whose queue is gone ends
        lost=len(set(ids) - set(orphaned)),
        duplicates=sum(n - 1 for n in orphaned.values()),
    )
    TALLIES.append(tally)
    assert tally.lost == 0, tally
    assert tally.duplicates == 0, tally


# ---------------------------------------------------------------------------------------------
# kill -9 during the move from the per-queue levels of earlier versions.

MIGRATION_JOBS = 20
# Ahead of their publication: past two workers' starts and two runs of migrate (15 s were too
# few on two loaded cores).
MIGRATION_DUE_S = 30
# When the first `ricochet migrate` is killed: about when it has connected and reads the old
# store, on an idle machine (wherever it lands, the next run must finish the move).
MIGRATE_KILLED_AFTER_S = 1.0


async def levels_exist(run: FaultRun) -> list[bool]:
    n = run.names
    return [await exists(run.connection, n.delay(k)) for k in range(DELAY_LEVELS)]


def migrate(run: FaultRun) -> tuple[int, dict[str, Any]]:
    done = run_cli(["migrate", "--json"], ricochet_env(run.settings))
    assert done.stdout.startswith("{"), done.stderr
    return done.returncode, json.loads(done.stdout)


async def test_kill_9_of_a_worker_and_of_migrate_while_old_objects_hold_jobs_and_cancels(
    broker_runs: Runs,
) -> None:
    """An earlier version's objects: its per-queue levels (Q.delay.0-24) hold 20 jobs scheduled
    15 s ahead, and its cancel store (Q.cancels) cancels half of them. A worker of this version
    starts (it honours both) and is killed with `kill -9`; another starts. `ricochet migrate` is
    killed with `kill -9` a second after it started, and run again: the cancels are moved and the
    old store deleted, the levels kept while they hold jobs; once the management API shows them
    empty, a third run retires all 25. Every job not cancelled runs once, no cancelled one runs.

    It runs on the broker under test, not the private node: migrate reads the broker's
    management API, which the private node does not serve."""
    run = await broker_runs.make("kill -9 of a worker and of migrate, old levels and store")
    n = Names(run.settings.queue)
    levels = [n.delay(k) for k in range(DELAY_LEVELS)]
    await run.publish_messages([])  # Q and its return exchange, as an upgrade finds them
    channel = await run.connection.channel(publisher_confirms=True)
    await declare_legacy_levels(channel, n.queue)
    await declare_legacy_store(channel, n.queue)
    entry = await channel.get_exchange(n.delay_entry, ensure=False)
    due = time.time() + MIGRATION_DUE_S
    # An earlier version's key: the levels' 25 digits alone.
    old_key = delay_key(MIGRATION_DUE_S * 1000, n.queue).removesuffix(f".{n.queue}")
    ids = own_ids(run, MIGRATION_JOBS)
    for message in scheduled(dict.fromkeys(ids, due)):
        await entry.publish(message, old_key)
    run.published.extend(ids)
    cancelled = ids[::2]
    for message_id in cancelled:
        record = aio_pika.Message(b"", message_id=message_id, type="cancel", timestamp=time.time())
        await channel.default_exchange.publish(record, n.cancels)
    run.cancelled.update(cancelled)
    run.cancel_returned(cancelled)
    await channel.close()
    try:
        killed = run.worker().start()
        await run.wait_consumers(1)
        killed.kill()
        run.worker().start()
        await run.wait_consumers(1)
        first = spawn(["migrate"], ricochet_env(run.settings))
        await asyncio.sleep(MIGRATE_KILLED_AFTER_S)
        first.kill()
        first.wait(10)
        code, kept = migrate(run)
        assert code == 1, kept  # the levels hold the jobs not cancelled yet
        assert not await exists(run.connection, n.cancels)
        assert [s["done"] for s in kept["steps"] if s["what"] == "delay levels"] == [False]
        assert time.time() < due, "migrate ran after the jobs came due: schedule them later"
        assert all(await levels_exist(run))
        wanted = set(ids) - set(cancelled)
        await wait_for(lambda: wanted <= set(run.done()), MIGRATION_DUE_S + 30, "every job to run")

        async def empty_by_the_api() -> bool:  # its figures lag some seconds behind
            figures = [await api_queue(level, "messages,messages_dlx") for level in levels]
            return all(f.get("messages") == 0 and not f.get("messages_dlx") for f in figures)

        await wait_for(empty_by_the_api, 30, "the API to show the old levels empty")

        async def retired() -> bool:  # 4.0.5 may still count a job of theirs over AMQP a moment
            code, done = await asyncio.to_thread(migrate, run)
            return code == 0 and all(s["done"] for s in done["steps"])

        await wait_for(retired, 30, "`ricochet migrate` to retire the old levels")
        assert not any(await levels_exist(run))
        tally = await run.account()
    finally:
        # Migrated is the vhost's: the other tests of this process read old stores still.
        cleanup = await run.connection.channel()
        await cleanup.queue_delete(SHARED.migrated)
        await cleanup.close()
    assert tally.cancelled == len(cancelled)
