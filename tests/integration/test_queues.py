"""One worker for the whole application: several queues, each with its own prefetch, none holding
the others back (SPEC 19)."""

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Client, InvalidJob, Job
from ricochet.broker.declare import declare
from ricochet.names import Names

from tests.integration.failures import publish_failed
from tests.support import (
    AMQP_URL,
    StartWorker,
    answers,
    consumers,
    delete_topology,
    free_port,
    log_events,
    make_settings,
    publish,
    readiness_at_each_log_line,
    ricochet_env,
    run_cli,
    spawn,
    take,
    wait_for,
)


@pytest.fixture
async def queues(queue_name: str, connection: AbstractConnection) -> AsyncIterator[list[str]]:
    """Three queue names of the test's own; their topologies are deleted afterwards. A test
    names this fixture first, so that its workers stop before the deletion (a worker still
    running would declare its queues again)."""
    names = [f"{queue_name}-{part}" for part in ("a", "b", "c")]
    yield names
    for name in names:
        await delete_topology(connection, name)


class Concurrency:
    """An async handler that records, per queue, which jobs ran and how many ran at once."""

    def __init__(self, hold_s: float = 0.3) -> None:
        self.hold_s = hold_s
        self.running: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.ran: dict[str, list[str]] = defaultdict(list)
        self.release: dict[str, asyncio.Event] = {}

    async def __call__(self, job: Job) -> None:
        self.running[job.queue] += 1
        self.most[job.queue] = max(self.most[job.queue], self.running[job.queue])
        try:
            gate = self.release.get(job.queue)
            if gate is not None:
                await gate.wait()
            await asyncio.sleep(self.hold_s)
            if job.payload.get("fail"):
                raise ConnectionError("transient trouble")
            self.ran[job.queue].append(str(job.message_id))
        finally:
            self.running[job.queue] -= 1


async def test_one_worker_consumes_each_queue_with_its_own_prefetch(
    queues: list[str],
    start_worker: StartWorker,
    channel: AbstractChannel,
) -> None:
    """RICOCHET_QUEUES=a=1,b=3,c: every job runs once, as a job of the queue it was sent to,
    with no more of a queue's jobs at once than its prefetch (c has RICOCHET_PREFETCH's 32);
    the metrics count each queue under its own label."""
    a, b, c = queues
    handler = Concurrency()
    worker = await start_worker(handler, queues=f"{a}=1,{b}=3,{c}")
    sent = {name: [f"{name}-{i}" for i in range(5)] for name in queues}
    for name, ids in sent.items():
        for message_id in ids:
            await publish(channel, name, json.dumps({}), message_id=message_id)
    await wait_for(
        lambda: all(sorted(handler.ran[n]) == sorted(sent[n]) for n in queues), 30, "every job"
    )
    assert dict(handler.most) == {a: 1, b: 3, c: 5}
    for name in queues:
        assert worker.metrics.registry.get_sample_value(
            "ricochet_jobs_total", {"queue": name, "outcome": "succeeded"}
        ) == len(sent[name])
        assert worker.gauge_of(name, "ricochet_worker_consuming") == 1


async def test_a_full_paused_or_failing_queue_holds_no_other_back(
    queues: list[str],
    start_worker: StartWorker,
    channel: AbstractChannel,
) -> None:
    """Queue a's only slot is held by a job that does not end, b's jobs all fail until b
    pauses: c's jobs run all the while, and the pause is b's alone."""
    a, b, c = queues
    handler = Concurrency(hold_s=0.05)
    handler.release[a] = asyncio.Event()
    worker = await start_worker(
        handler,
        queues=f"{a}=1,{b},{c}",
        pause_failure_ratio=0.5,
        pause_min_jobs=4,
        pause_s=60,
        max_retries=0,
    )
    await publish(channel, a, json.dumps({}), message_id="a-stuck")
    await publish(channel, a, json.dumps({}), message_id="a-next")
    for i in range(6):
        await publish(channel, b, json.dumps({"fail": True}), message_id=f"b-{i}")
    await wait_for(
        lambda: worker.gauge_of(b, "ricochet_worker_paused") == 1, 30, "queue b to pause"
    )
    ids = [f"c-{i}" for i in range(10)]
    for message_id in ids:
        await publish(channel, c, json.dumps({}), message_id=message_id)
    await wait_for(lambda: sorted(handler.ran[c]) == sorted(ids), 30, "c's jobs")
    assert worker.gauge_of(a, "ricochet_worker_paused") == 0
    assert worker.gauge_of(c, "ricochet_worker_paused") == 0
    assert handler.ran[a] == []  # a-next waits behind the stuck job: a's prefetch is 1
    handler.release[a].set()
    await wait_for(lambda: sorted(handler.ran[a]) == ["a-next", "a-stuck"], 30, "a's jobs")


async def test_a_queue_deleted_under_the_worker_leaves_the_others_consuming(
    queues: list[str],
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
) -> None:
    """Queue a is deleted: the worker says so and declares it again, while b's jobs run on
    without a reconnect."""
    a, b, _ = queues
    handler = Concurrency(hold_s=0.05)
    worker = await start_worker(handler, queues=f"{a},{b}")
    with readiness_at_each_log_line(lambda: worker.lifecycle.ready) as lines:
        await channel.queue_delete(a)
        ids = [f"b-{i}" for i in range(5)]
        for message_id in ids:
            await publish(channel, b, json.dumps({}), message_id=message_id)
        await wait_for(lambda: sorted(handler.ran[b]) == sorted(ids), 20, "b's jobs")
        await wait_for(lambda: consumers(connection, a), 20, "a consumed again")
    cancelled = [line for line in lines if line["event"] == "consumer cancelled by the broker"]
    assert len(cancelled) == 1
    assert not any("reconnecting" in line["event"] for line in lines)
    await publish(channel, a, json.dumps({}), message_id="a-after")
    await wait_for(lambda: handler.ran[a] == ["a-after"], 20, "a's job after it came back")


async def test_a_failed_copy_names_its_own_queue(
    queues: list[str],
    start_worker: StartWorker,
    channel: AbstractChannel,
) -> None:
    """A job of b that fails ends in b's failed queue, naming b as its original queue."""
    a, b, _ = queues
    await start_worker(Concurrency(hold_s=0), queues=f"{a},{b}", max_retries=0)
    await publish(channel, b, json.dumps({"fail": True}), message_id="b-fails")
    (copy,) = await take(channel, Names(b).failed, 1)
    assert copy.message_id == "b-fails"
    assert (copy.headers or {})["original-queue"] == b


async def test_the_client_sends_to_the_queue_it_is_told(
    queues: list[str],
    start_worker: StartWorker,
) -> None:
    """enqueue(..., queue=) and cancel(..., queue=) name another queue than the client's; a
    name no ricochet queue can have is refused before anything is sent."""
    a, b, _ = queues
    handler = Concurrency(hold_s=0)
    await start_worker(handler, queues=f"{a},{b}")
    async with Client(AMQP_URL, a) as client:
        await client.enqueue("demo", {}, message_id="to-b", queue=b)
        await client.enqueue("demo", {}, message_id="to-a")
        await client.enqueue("demo", {}, message_id="later", queue=b, delay=3)
        await client.cancel("later", queue=b)
        for bad in ("", "amq.x", "ricochet.delay.1", f"{b}.failed", "a b"):
            with pytest.raises(InvalidJob, match="queue"):
                await client.enqueue("demo", {}, queue=bad)
            with pytest.raises(InvalidJob, match="queue"):
                await client.cancel("x", queue=bad)
    await wait_for(lambda: handler.ran[b] == ["to-b"] and handler.ran[a] == ["to-a"], 20, "jobs")
    await asyncio.sleep(4)  # "later" came due meanwhile, and was dropped as cancelled
    assert handler.ran[b] == ["to-b"]


async def test_the_commands_take_a_queue_and_status_and_doctor_all(
    queues: list[str],
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """`topology` declares each queue of RICOCHET_QUEUES; publish, status, failed and doctor
    take --queue; status and doctor --all cover every ricochet queue the broker holds, what the
    queues share shown once; a --queue no ricochet queue can have exits 2."""
    a, b, _ = queues
    env = ricochet_env(make_settings(queue_name, queues=f"{a},{b}=2"))
    declared = run_cli(["topology"], env)
    assert declared.returncode == 0, declared.stderr
    assert declared.stdout.count("shared by every ricochet queue") == 1
    sent = run_cli(["publish", "--queue", b, "--message-id", "on-b", "{}"], env)
    assert sent.returncode == 0, sent.stderr
    (job,) = await take(channel, b, 1)
    assert job.message_id == "on-b"
    status = run_cli(["status", "--queue", b, "--json"], env)
    names = {row["name"] for row in json.loads(status.stdout)["queues"]}
    assert {b, Names(b).failed} <= names
    assert a not in names
    every = run_cli(["status", "--all", "--json"], env)
    rows = [row["name"] for row in json.loads(every.stdout)["queues"]]
    assert {a, b, Names(a).failed, Names(b).failed} <= set(rows)
    assert len(rows) == len(set(rows))  # the shared delay levels once
    assert queue_name not in rows  # not declared: the worker's queues are a and b
    listed = run_cli(["failed", "list", "--queue", a], env)
    assert listed.returncode == 0, listed.stderr
    assert f"0 of 0 copies in {Names(a).failed}" in listed.stderr
    doctor = run_cli(["doctor", "--all", "--json"], env)
    checks = json.loads(doctor.stdout)["checks"]
    assert len(checks) == len({json.dumps(c, sort_keys=True) for c in checks})
    assert any(a in c["detail"] or a in c["check"] for c in checks)
    assert any(b in c["detail"] or b in c["check"] for c in checks)
    for command in (["status"], ["publish", "{}"], ["failed", "list"], ["doctor"]):
        refused = run_cli([*command, "--queue", "ricochet.delay.3"], env)
        assert refused.returncode == 2, refused
        assert "--queue 'ricochet.delay.3' is invalid" in refused.stderr


async def test_the_monitor_and_its_console_cover_every_queue(
    queues: list[str],
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
    tmp_path: Path,
) -> None:
    """`ricochet monitor` with RICOCHET_QUEUES=a,b logs b's failed job naming b; the console
    shows one queue's failed jobs at a time (?queue=; its first queue when not told, here where
    RICOCHET_QUEUE is neither), links between them, refuses a queue it does not watch, and
    replays a copy into its own queue."""
    a, b, _ = queues
    port = free_port()
    token = "console-token-for-tests-0123"
    settings = make_settings(queue_name, queues=f"{a},{b}", http_port=port, console_token=token)
    out = tmp_path / "monitor.log"
    for name in (a, b):  # as their worker would
        await declare(connection, make_settings(name))
    monitor = spawn(["monitor"], ricochet_env(settings), out)
    try:
        await wait_for(lambda: answers(port, "/readyz", 200), 30, "the monitor to be ready")
        await wait_for(lambda: consumers(connection, Names(b).events), 20, "b consumed")
        await publish_failed(channel, b, "b-failed", KeyError("recipient"))

        def logged() -> list[dict[str, Any]]:
            lines = log_events(out.read_text())
            return [x for x in lines if x["event"] == "job failed" and x["queue"] == b]

        await wait_for(logged, 20, "the monitor's line for b's failed job")
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/failed") as first:
                html = await first.text()
            assert f"0 failed jobs of <code>{a}</code>" in html
            assert f'href="/failed?queue={b}"' in html
            async with session.get(f"{base}/failed?queue={b}") as page:
                html = await page.text()
            assert f"1 failed job of <code>{b}</code>" in html
            assert f'href="/failed/b-failed?queue={b}"' in html
            async with session.get(f"{base}/failed?queue=elsewhere") as other:
                assert other.status == 404
            form = {"message_id": "b-failed", "queue": b, "token": token}
            async with session.post(
                f"{base}/failed/actions/replay", data=form, allow_redirects=False
            ) as replayed:
                assert replayed.status == 303, await replayed.text()
                assert replayed.headers["Location"] == f"/failed?queue={b}&replayed=1"
    finally:
        monitor.terminate()
        await asyncio.to_thread(monitor.communicate, timeout=30)
    (job,) = await take(channel, b, 1)
    assert job.message_id == "b-failed"
