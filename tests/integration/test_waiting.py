"""`ricochet waiting` (SPEC 23, 26): the jobs RabbitMQ holds for a later attempt, listed from the
journal and the depths of where they wait, never by reading those queues; `waiting show` reads
one job where it waits. Looking loses, duplicates and delays nothing."""

import asyncio
import contextlib
import datetime as dt
import json
import re
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import aio_pika
import aiohttp
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from prometheus_client import CollectorRegistry
from ricochet import Client, Job, Router
from ricochet.broker.amqp import broker_version
from ricochet.broker.declare import declare
from ricochet.broker.plan import delivery_limit_policy_command, plan
from ricochet.errors import RetryLater
from ricochet.headers import RETRIES
from ricochet.monitor.console import Console
from ricochet.names import Names
from ricochet.ops import waiting_scan
from ricochet.ops.jobs import JobHistory, Read, read_jobs
from ricochet.ops.waiting import list_waiting, show_waiting
from ricochet.service.http import serve_http

from tests.broker import BROKER
from tests.support import (
    AMQP_URL,
    StartWorker,
    api_queue,
    consumers,
    depth,
    free_port,
    in_tier,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    wait_for,
)

TOKEN = "console-token-for-tests-0123"
# How late a job may come back for having been looked at (SPEC 23), and for a wait on an idle
# worker at all (SPEC 15): the worker's latency counts too.
LATE_S = 1.0
# How soon a retry is listed (SPEC 26: within 1 s), a look after.
FRESH_S = 1.0


class Attempts:
    """A router whose jobs fail as their type says, recording when each attempt started."""

    def __init__(self) -> None:
        self.started: dict[str, list[tuple[int, float]]] = {}
        self.router = Router()
        self.router.handler("flaky")(self.flaky)
        self.router.handler("later")(self.later)
        self.router.handler("fine")(self.fine)

    def note(self, job: Job) -> None:
        self.started.setdefault(str(job.message_id), []).append((job.attempt, time.time()))

    async def flaky(self, job: Job) -> None:
        self.note(job)
        if job.attempt == 1:
            raise ConnectionError("database unreachable")

    async def later(self, job: Job) -> None:
        self.note(job)
        if job.attempt == 1:
            raise RetryLater(job.payload.get("after", 30), "rate limited")

    async def fine(self, job: Job) -> None:
        self.note(job)

    def attempts(self, message_id: str) -> list[int]:
        return [attempt for attempt, _ in self.started.get(message_id, [])]


def waiting(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    done = run_cli(["waiting", *args, "--json"], env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def own(unrecorded: dict[str, int], queue: str) -> dict[str, int]:
    """The unrecorded counts of the queue's own tiers: the levels of the delays are the vhost's,
    and may hold jobs of tests run before in it, as old as no read of the journal reaches."""
    return {place: n for place, n in unrecorded.items() if place.startswith(f"{queue}.")}


def due(row: dict[str, Any]) -> float:
    text = row["due_at"]
    assert text.endswith("Z")
    return dt.datetime.fromisoformat(text).timestamp()


async def test_the_waiting_jobs_of_every_kind_are_listed(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A job in a retry tier, one waiting out a RetryLater and a scheduled one are listed with
    their type, queue, next attempt, due time and the reason of their last failure; --type,
    --message-id and --limit choose among them, before the subcommand or after it, and `waiting
    show` prints one whole, or exits 1 for an id that does not wait."""
    # Waits far longer than the commands below take on a loaded machine (seconds each): none
    # comes due, and so none leaves the view, before the last has looked.
    attempts = Attempts()
    await start_worker(attempts.router, retry_delays_ms="60000")
    async with Client(AMQP_URL, queue_name) as client:
        failed_at = time.time()
        await client.enqueue("flaky", {}, message_id="in-tier")
        await client.enqueue("later", {"after": 90}, message_id="retry-later")
        await client.enqueue("fine", {}, message_id="scheduled", delay=120)
        await client.cancel("scheduled")
    await wait_for(lambda: len(attempts.started) == 2, 10, "the two first attempts")
    env = ricochet_env(make_settings(queue_name))
    rows: list[dict[str, Any]] = []

    async def all_three() -> bool:  # each entry written within moments (later on a loaded machine)
        rows[:] = await asyncio.to_thread(waiting, env)
        return len(rows) == 3

    # Each look reads the journal of the suite's vhost back an hour: seconds each, late in a run.
    await wait_for(all_three, 90, "the three jobs in the journal")
    by_id = {row["message_id"]: row for row in rows}
    assert set(by_id) == {"in-tier", "retry-later", "scheduled"}
    assert [row["message_id"] for row in rows] == ["in-tier", "retry-later", "scheduled"]
    for row in rows:
        assert set(row) == {
            *("message_id", "type", "queue", "attempt", "due_at", "reason", "cancelled")
        }
        assert row["queue"] == queue_name
    assert [row["cancelled"] for row in rows] == [False, False, True]
    assert [(r["type"], r["attempt"], r["reason"]) for r in rows] == [
        ("flaky", 2, "ConnectionError: database unreachable"),
        ("later", 2, "RetryLater: rate limited"),
        ("fine", 1, None),
    ]
    for message_id, wait_s in (("in-tier", 60), ("retry-later", 90), ("scheduled", 120)):
        assert failed_at + wait_s - 2 <= due(by_id[message_id]) <= failed_at + wait_s + 2
    chosen = await asyncio.to_thread(waiting, env, "--type", "later")
    assert [row["message_id"] for row in chosen] == ["retry-later"]
    chosen = await asyncio.to_thread(waiting, env, "--message-id", "scheduled")
    assert [row["message_id"] for row in chosen] == ["scheduled"]
    chosen = await asyncio.to_thread(waiting, env, "--limit", "1")
    assert [row["message_id"] for row in chosen] == ["in-tier"]
    shown = await asyncio.to_thread(run_cli, ["waiting", "show", "retry-later"], env)
    assert shown.returncode == 0, shown.stderr
    assert "attempt:    2 (the next)" in shown.stdout
    assert "ricochet.delay." in shown.stdout
    missing = await asyncio.to_thread(run_cli, ["waiting", "show", "no-such-job"], env)
    assert missing.returncode == 1
    assert "no waiting job" in missing.stderr
    # Options given before the subcommand count as those after it.
    elsewhere = ricochet_env(make_settings(f"{queue_name}-unused"))
    before = ["waiting", "--queue", queue_name, "--type", "later", "--json", "list"]
    listed = await asyncio.to_thread(run_cli, before, elsewhere)
    assert [json.loads(line)["message_id"] for line in listed.stdout.splitlines()] == [
        "retry-later"
    ], listed.stderr
    before = ["waiting", "--queue", queue_name, "--json", "show", "scheduled"]
    shown = await asyncio.to_thread(run_cli, before, elsewhere)
    assert json.loads(shown.stdout)["message_id"] == "scheduled", shown.stderr
    refused = await asyncio.to_thread(run_cli, ["waiting", "--limit", "1", "show", "x"], env)
    assert refused.returncode == 2
    assert "--limit choose rows of `waiting list`" in refused.stderr
    assert await depth(channel, queue_name) == 0


@pytest.mark.timing  # each job back at most LATE_S + 0.5 s after its due time
@pytest.mark.timeout(300)  # 25 runs of the command: more than 120 s on two loaded cores, once
async def test_looking_often_sends_nothing_on_early_and_loses_nothing(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """25 looks at jobs waiting in a tier and in the delays (more than RabbitMQ 4's default
    delivery limit of 20): each job comes back once, when it is due, not before, and at most a
    second after, though some fall due while a look holds them."""
    attempts = Attempts()
    await start_worker(attempts.router, retry_delays_ms="6000")
    ids = [f"tier-{i}" for i in range(5)] + [f"later-{i}" for i in range(5)]
    failed_at: dict[str, float] = {}
    async with Client(AMQP_URL, queue_name) as client:
        for message_id in ids:
            kind = "flaky" if message_id.startswith("tier") else "later"
            await client.enqueue(kind, {"after": 6}, message_id=message_id)
    await wait_for(lambda: all(attempts.attempts(i) == [1] for i in ids), 10, "first attempts")
    for message_id in ids:
        failed_at[message_id] = attempts.started[message_id][0][1]
    env = ricochet_env(make_settings(queue_name))
    looks = 0
    while looks < 25 or any(len(attempts.attempts(i)) < 2 for i in ids):
        rows = await asyncio.to_thread(waiting, env)
        looks += 1
        assert len(rows) <= len(ids)
        assert looks < 200, "the jobs never came back"
    await wait_for(lambda: all(attempts.attempts(i) == [1, 2] for i in ids), 10, "second tries")
    for message_id in ids:
        back = attempts.started[message_id][1][1] - failed_at[message_id]
        assert 6 - 0.1 <= back <= 6 + LATE_S + 0.5, (message_id, back)
    await asyncio.sleep(1)
    assert all(attempts.attempts(i) == [1, 2] for i in ids)


async def test_the_console_shows_the_waiting_jobs_and_cancels_one(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """GET /waiting groups the waiting jobs by the reason of their last failure (a reason that
    holds a script is shown as text); GET /api/waiting lists them as `ricochet waiting --json`
    does, which asks it when RICOCHET_MONITOR_URL is set (and reads the journal itself when the
    monitor does not answer); a cancel form with the console's token cancels one job, which
    never runs again, and without the token is refused."""
    attempts = Attempts()
    script = "<script>alert('x')</script>"

    async def hostile(job: Job) -> None:
        attempts.note(job)
        if job.attempt == 1:
            raise ConnectionError(script)

    attempts.router.handler("hostile")(hostile)
    await start_worker(attempts.router, retry_delays_ms="30000")  # waiting through every look
    async with Client(AMQP_URL, queue_name) as client:
        for i in range(2):
            await client.enqueue("flaky", {}, message_id=f"flaky-{i}")
        await client.enqueue("hostile", {}, message_id="hostile")
    await wait_for(lambda: len(attempts.started) == 3, 10, "the first attempts")
    await asyncio.sleep(FRESH_S)  # their retries in the journal
    port = free_port()
    settings = make_settings(queue_name, console_token=TOKEN)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    routes = Console(settings, Journal(await read_jobs(connection, since))).routes()
    async with (
        serve_http("127.0.0.1", port, CollectorRegistry(), lambda: True, routes),
        aiohttp.ClientSession() as session,
    ):
        base = f"http://127.0.0.1:{port}"
        async with session.get(f"{base}/waiting?queue={queue_name}") as page:
            assert page.status == 200
            html = await page.text()
        assert "3 waiting jobs" in html
        assert "ConnectionError: database unreachable" in html
        assert script not in html
        assert "&lt;script&gt;" in html
        assert html.count('action="/waiting/cancel"') == 3
        async with session.get(f"{base}/api/waiting?queue={queue_name}&type=flaky") as api:
            assert api.status == 200
            answer = await api.json()
        assert [row["message_id"] for row in answer["jobs"]] == ["flaky-0", "flaky-1"]
        assert answer["read"] == "the monitor's index"
        assert own(answer["unrecorded"], queue_name) == {}
        asked = ricochet_env(make_settings(queue_name), RICOCHET_MONITOR_URL=f"{base}/")
        done = await asyncio.to_thread(run_cli, ["waiting", "--json"], asked)
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == 3
        assert "read the monitor's index" in done.stderr
        nobody = ricochet_env(
            make_settings(queue_name), RICOCHET_MONITOR_URL=f"http://127.0.0.1:{free_port()}/"
        )
        done = await asyncio.to_thread(run_cli, ["waiting", "--json"], nobody)
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == 3
        assert "did not answer" in done.stderr
        assert "read the journal since" in done.stderr
        form = {"message_id": "flaky-0", "queue": queue_name}
        async with session.post(f"{base}/waiting/cancel", data={**form, "token": "no"}) as refused:
            assert refused.status == 403
        for no_id in ("", "x" * 256):
            bad = {"message_id": no_id, "queue": queue_name, "token": TOKEN}
            async with session.post(f"{base}/waiting/cancel", data=bad) as refused:
                assert refused.status == 400
                assert "message_id" in await refused.text()
        async with session.post(
            f"{base}/waiting/cancel", data={**form, "token": TOKEN}, allow_redirects=False
        ) as cancelled:
            assert cancelled.status == 303
            assert "cancelled=flaky-0" in cancelled.headers["Location"]
        async with session.get(f"{base}/waiting?queue={queue_name}") as page:
            html = await page.text()
        marked = html.split("flaky-0</a>", 1)[1].split("</tr>", 1)[0]
        assert "(cancelled)" in marked
        assert html.count("(cancelled)") == 1
    await wait_for(lambda: attempts.attempts("flaky-1") == [1, 2], 50, "the job not cancelled")
    await wait_for(lambda: attempts.attempts("hostile") == [1, 2], 50, "the hostile job")
    await asyncio.sleep(0.5)
    assert attempts.attempts("flaky-0") == [1]


async def test_a_list_reads_no_queue_and_counts_the_jobs_the_journal_does_not_know(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """The jobs of a tier with their journal entries are listed from those entries, with the
    due time the broker applies: the tier never delivers them (none comes out marked
    redelivered). A job the journal does not know (published there by hand) is counted as
    unrecorded in its tier, in the JSON run's last line on stderr."""
    names = Names(queue_name)
    settings = make_settings(queue_name, retry_delays_ms="60000")
    await declare(connection, settings)
    at_ms = int(time.time() * 1000) - 5_000
    recorded = [f"recorded-{i}" for i in range(5)]
    await in_tier(channel, queue_name, recorded, at_ms=at_ms, reason="503 from the bank")
    unknown = aio_pika.Message(b"{}", message_id="unknown", type="job", headers={RETRIES: 1})
    await channel.default_exchange.publish(unknown, names.tier(1))
    found = await list_waiting(connection, settings)
    assert [(r.message_id, r.type, r.attempt, r.reason) for r in found.rows] == [
        (message_id, "job", 2, "503 from the bank") for message_id in recorded
    ]
    assert all(r.due_at.timestamp() == (at_ms + 60_000) / 1000 for r in found.rows)
    assert own(found.unrecorded, queue_name) == {names.tier(1): 1}
    assert found.complete
    env = ricochet_env(make_settings(queue_name))  # the tier's delay is the broker's
    done = await asyncio.to_thread(run_cli, ["waiting", "--json"], env)
    assert done.returncode == 0, done.stderr
    assert f"5 waiting jobs of {queue_name}, " in done.stderr
    assert f", 1 unrecorded in {names.tier(1)}" in done.stderr
    assert await _redelivered(channel, names.tier(1)) == dict.fromkeys(
        [*recorded, "unknown"], False
    )


@pytest.mark.timing  # listed within FRESH_S of the failure, as SPEC 26 says (1 s), plus a look
async def test_a_retry_is_listed_within_a_second(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """A job sent to its tier is listed by a look begun a second after its attempt failed."""
    attempts = Attempts()
    await start_worker(attempts.router, retry_delays_ms="60000")
    settings = make_settings(queue_name)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("flaky", {}, message_id="fresh")
    await wait_for(lambda: attempts.attempts("fresh") == [1], 10, "the first attempt")
    await asyncio.sleep(FRESH_S)
    found = await list_waiting(connection, settings)
    assert [(r.message_id, r.attempt) for r in found.rows] == [("fresh", 2)]
    assert own(found.unrecorded, queue_name) == {}


async def _redelivered(channel: AbstractChannel, queue: str) -> dict[str, bool]:
    """Every message of queue, taken: whether the queue had delivered it before."""
    source = await channel.get_queue(queue, ensure=False)
    taken = {}
    while (message := await source.get(no_ack=True, fail=False)) is not None:
        taken[str(message.message_id)] = bool(message.redelivered)
    return taken


async def test_a_tier_under_a_delivery_limit_is_listed_and_a_show_says_how_to_lift_it(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """A tier declared before ricochet lifted RabbitMQ 4's delivery limit (as an older ricochet
    did) keeps 4's default of 20: a list, which reads no tier, lists its job; a show, which
    reads it, refuses and says how to lift it, and once the policy it gives is applied, shows
    the job. RabbitMQ 3 has no default limit: the show reads it at once."""
    names = Names(queue_name)
    old = plan(make_settings(queue_name, retry_delays_ms="60000"))  # without x-delivery-limit
    await declare(connection, make_settings(queue_name, retry_delays_ms="60000"))
    await channel.queue_delete(names.tier(1))
    await channel.declare_queue(names.tier(1), durable=True, arguments=old.tiers[0].arguments)
    await in_tier(channel, queue_name, ["held"], at_ms=int(time.time() * 1000))
    env = ricochet_env(make_settings(queue_name))
    assert [row["message_id"] for row in await asyncio.to_thread(waiting, env)] == ["held"]
    version = broker_version(connection)
    assert version is not None
    done = await asyncio.to_thread(run_cli, ["waiting", "show", "held"], env)
    if version < (4, 0):
        assert done.returncode == 0, done.stderr
        assert f"waits in:   {names.tier(1)}" in done.stdout
        return
    assert done.returncode == 1
    assert "delivery limit" in done.stderr
    command = delivery_limit_policy_command(names)
    assert command in done.stderr
    program, *args = shlex.split(command)
    assert program == "rabbitmqctl"
    BROKER.rabbitmqctl(*args)
    try:
        await wait_for(lambda: _limit_is(names.tier(1), -1), 20, "the policy to apply to the tier")
        done = await asyncio.to_thread(run_cli, ["waiting", "show", "held"], env)
        assert done.returncode == 0, done.stderr
        assert "reason:     ValueError: down" in done.stdout
    finally:
        BROKER.rabbitmqctl("clear_policy", f"{queue_name}.no-delivery-limit", check=False)
    assert await depth(channel, names.tier(1)) == 1


async def test_a_tier_under_a_delivery_limit_no_job_reaches_is_read(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """The policy docs/waiting-jobs.md gives RabbitMQ 3.10 (a delivery limit of a billion on the
    tiers, so that a job handed back goes to its queue's head) is no limit a show must refuse,
    on any broker: it shows the tier's job and leaves it there."""
    names = Names(queue_name)
    await declare(connection, make_settings(queue_name, retry_delays_ms="60000"))
    await publish(channel, names.tier(1), "{}", message_id="held", type="job")
    async with returns_at_head(names.tier(1)):
        env = ricochet_env(make_settings(queue_name))
        done = await asyncio.to_thread(run_cli, ["waiting", "show", "held", "--json"], env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["waits_in"] == names.tier(1)
    assert await depth(channel, names.tier(1)) == 1


@contextlib.asynccontextmanager
async def returns_at_head(tier: str) -> AsyncIterator[None]:
    """docs/waiting-jobs.md's policy (a job handed back goes to its queue's head) on one tier, for
    the time of the block. rabbitmqctl runs in a thread: it starts an Erlang VM (0.6-0.9 s, more
    on a loaded machine), and meanwhile the loop runs the test's consumers, which time the jobs."""
    policy = f"{tier}.returns-at-head"
    pattern = f"^{re.escape(tier)}$"
    limit = 1_000_000_000  # docs/waiting-jobs.md's: a billion looks
    definition = json.dumps({"delivery-limit": limit})
    args = ("set_policy", "--apply-to", "queues", policy, pattern, definition)
    await asyncio.to_thread(BROKER.rabbitmqctl, *args)
    try:
        await wait_for(lambda: _limit_is(tier, limit), 20, "the policy to apply to the tier")
        yield
    finally:
        await asyncio.to_thread(BROKER.rabbitmqctl, "clear_policy", policy, check=False)


async def _limit_is(queue: str, limit: int) -> bool:
    found = await api_queue(queue, "effective_policy_definition")
    definition = found.get("effective_policy_definition")
    return isinstance(definition, dict) and definition.get("delivery-limit") == limit


@pytest.mark.timing  # no later than an unread queue's jobs, by more than a show may make it
async def test_a_tier_whose_jobs_leave_by_the_hundred_is_read_as_they_leave(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str, monkeypatch: Any
) -> None:
    """A show of a job the journal does not know reads every place it may wait, and holds no
    more of the jobs that leave soon than SOON_MOST (with one consumer's room beside it), so the
    queue has time to send them on: it reads on as they leave, finds the job, and every job
    leaves once, when it is due: no later than the jobs of a queue nobody looks at, due at the
    same times, by more than the show may make it (SPEC 23); on a loaded machine both come late
    alike."""
    monkeypatch.setattr(waiting_scan, "SOON_MOST", 60)
    monkeypatch.setattr(waiting_scan, "PER_CONSUMER", 20)
    # The tier's TTL: its jobs still wait when the look reaches it, on a loaded machine too (at
    # 4 s, three suites on two cores, the first 240 had left by then).
    delay_ms = 8_000
    settings = make_settings(queue_name, retry_delays_ms=str(delay_ms))
    unread = f"{queue_name}.unread"
    await declare(connection, settings)
    await declare(connection, make_settings(unread, retry_delays_ms=str(delay_ms)))
    tier = Names(queue_name).tier(1)
    came: dict[str, list[float]] = {}

    async def take(message: AbstractIncomingMessage) -> None:
        came.setdefault(str(message.message_id), []).append(time.time())
        await message.ack()

    for main in (queue_name, unread):
        await (await channel.get_queue(main, ensure=False)).consume(take)
    # (when they are due, the ids looked at, the unread queue's ids), a batch each 0.2 s
    batches: list[tuple[float, list[str], list[str]]] = []
    # docs/waiting-jobs.md's policy: without it a job handed back goes last on RabbitMQ 3.10, and
    # on 4.0 in a tier declared with no delivery limit (-1); 4.3 puts it first either way. It
    # stays until every job has left, as on a broker where it is set once for all.
    async with returns_at_head(tier):
        for batch in range(10):  # 300 jobs, leaving over 2 s; 5 of the unread queue's beside
            at_ms = int(time.time() * 1000)
            read_ids = [f"dense-{batch}-{i}" for i in range(30)]
            unread_ids = [f"unread-{batch}-{i}" for i in range(5)]
            await in_tier(channel, queue_name, read_ids, at_ms=at_ms, delay_ms=delay_ms)
            await in_tier(channel, unread, unread_ids, at_ms=at_ms, delay_ms=delay_ms)
            batches.append(((at_ms + delay_ms) / 1000, read_ids, unread_ids))
            await asyncio.sleep(0.2)
        # One job the journal does not know, last in the tier: a show of it reads every job.
        lost = aio_pika.Message(
            b"{}", message_id="unknown", type="job", headers={RETRIES: 1}, timestamp=time.time()
        )
        await channel.default_exchange.publish(lost, tier)
        async with Watch(lambda: consumers(connection, tier)) as most_consumers:
            shown = await show_waiting(connection, settings, "unknown")
        jobs = 1 + sum(len(read_ids) + len(unread_ids) for _, read_ids, unread_ids in batches)
        await wait_for(lambda: len(came) == jobs, 15, "every job to leave its tier")
    assert 1 <= most_consumers.most <= 60 // 20 + 1
    assert [one.waiting.message_id for one in shown] == ["unknown"]
    await asyncio.sleep(0.5)
    assert all(len(times) == 1 for times in came.values()), came
    for due_s, read_ids, unread_ids in batches:
        read = [came[message_id][0] for message_id in read_ids]
        not_read = [came[message_id][0] for message_id in unread_ids]
        assert min(read) >= due_s - 0.1, (read_ids[0], read)
        assert max(read) <= max(not_read) + LATE_S, (read_ids[0], read, not_read)


class Journal:
    """The monitor's index as the list reads it, from a read of the journal."""

    complete = True

    def __init__(self, read: Read) -> None:
        self._read = read

    def jobs(self) -> Iterable[JobHistory]:
        return self._read.jobs.values()


class Watch:
    """The largest value a reading gave, read every 50 ms while the block runs. The readings end
    between two reads, never in one: a reading cancelled in its channel's close leaves that
    channel half closed, and the broker then closes the whole connection (seen on 4.0.5)."""

    def __init__(self, read: Callable[[], Awaitable[int]]) -> None:
        self._read = read
        self._task: asyncio.Future[None] | None = None
        self._done = asyncio.Event()
        self.most = 0

    async def _watch(self) -> None:
        while not self._done.is_set():
            self.most = max(self.most, await self._read())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), 0.05)

    async def __aenter__(self) -> "Watch":
        self._task = asyncio.ensure_future(self._watch())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._done.set()
        await self._task
