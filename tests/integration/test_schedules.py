"""Recurring jobs (SPEC 22) on the real broker: each occurrence enqueued once, at its time, by
whichever worker leads the queue's schedules, and taken over when the leader's connection goes."""

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aio_pika.abc import AbstractConnection
from ricochet import Job, Router
from ricochet.broker.declare import declare
from ricochet.broker.schedule_store import read_states
from structlog.testing import capture_logs

from tests.schedules import (
    EVERY_S,
    assert_unbroken,
    forge_state,
    leads,
    now_ms,
    occurrence_ms,
    ticked,
)
from tests.support import (
    StartWorker,
    answers,
    close_connections,
    free_port,
    journal,
    make_settings,
    ricochet_env,
    run_cli,
    spawn,
    wait_for,
)


def ticking(name: str = "tick", every: float = EVERY_S) -> tuple[Router, list[tuple[str, int]]]:
    """A router with one schedule, whose handler notes (message_id, the time it ran in ms)."""
    router, ran = Router(), []
    router.schedule(name, "tick", every=every, payload={"n": 1})

    @router.handler("tick")
    async def tick(job: Job) -> None:
        assert job.payload == {"n": 1}
        ran.append((str(job.message_id), now_ms()))

    return router, ran


@pytest.mark.timing
async def test_occurrences_are_enqueued_at_their_time(start_worker: StartWorker) -> None:
    """Each occurrence falls on a multiple of the period since the epoch, runs once, no earlier
    than its time and within 1 s after it on an idle worker; a new schedule catches up nothing
    from before its first worker started."""
    router, ran = ticking()
    started_ms = now_ms()
    worker = await start_worker(router)
    await wait_for(lambda: len(ran) >= 4, 15, "four occurrences")
    ids = [message_id for message_id, _ in ran]
    assert len(ids) == len(set(ids))
    assert_unbroken(ids, EVERY_S * 1000)
    assert occurrence_ms(ids[0]) >= started_ms - EVERY_S * 1000
    for message_id, at in ran:
        late_ms = at - occurrence_ms(message_id)
        assert 0 <= late_ms <= 1000, (message_id, late_ms)
    assert worker.gauge("ricochet_schedules_leading") == 1


async def test_one_worker_leads_however_many_run(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """Three workers of the queue enqueue each occurrence once between them; the state recorded
    in the broker names the last one."""
    router, ran = ticking()
    workers = [await start_worker(router) for _ in range(3)]
    await wait_for(lambda: len(ran) >= 5, 20, "five occurrences")
    ids = [message_id for message_id, _ in ran]
    assert len(ids) == len(set(ids)), ids
    assert_unbroken(ids, EVERY_S * 1000)
    assert sorted(w.gauge("ricochet_schedules_leading") or 0 for w in workers) == [0, 0, 1]
    state = (await read_states(connection, [queue_name]))[queue_name]["tick"]
    assert state.last_ms is not None
    assert state.last_ms >= occurrence_ms(ids[-1]) - EVERY_S * 1000


async def test_the_lead_is_taken_again_when_the_leaders_connection_closes(
    queue_name: str, connection: AbstractConnection, tmp_path: Path
) -> None:
    """The broker closes the leading process's connection: a process (the other, or the same
    one connected again) leads within 10 s, and the occurrences form an unbroken sequence;
    one enqueued twice keeps its message_id."""
    settings = make_settings(queue_name, handler="tests.handlers:ticks")
    journal_path = tmp_path / "journal"
    env = ricochet_env(settings, TEST_JOURNAL=str(journal_path))
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = spawn(["worker"], env, logs[0])
    await wait_for(lambda: leads(*logs) == 1, 30, "a leader")
    second = spawn(["worker"], env, logs[1])
    try:
        await wait_for(lambda: '"consuming"' in logs[1].read_text(), 30, "a follower")
        await asyncio.sleep(2)
        closed_ms = now_ms()
        assert close_connections(queue_name, pid=first.pid) == 1
        await wait_for(lambda: leads(*logs) == 2, 10, "a new leader")
        await asyncio.sleep(3)
    finally:
        for process in (second, first):
            process.terminate()
            assert process.wait(30) == 0
    runs = ticked(journal_path)
    ids = [message_id for message_id, _ in runs]
    assert_unbroken(ids, EVERY_S * 1000)
    assert max(occurrence_ms(i) for i in ids) > closed_ms + 2000
    for message_id, at in runs:
        due_ms = occurrence_ms(message_id)
        if due_ms >= closed_ms:
            assert at - due_ms <= 10_000, (message_id, at - due_ms)


async def test_the_schedules_command_and_the_console_list_each_schedule(
    queue_name: str, connection: AbstractConnection, tmp_path: Path
) -> None:
    """`ricochet schedules --json` prints SPEC 22's keys per schedule, last_at null until the
    leader enqueued one, then its time; the monitor's console shows the same on /schedules."""
    port = free_port()
    settings = make_settings(queue_name, handler="tests.handlers:ticks", http_port=port)
    env = ricochet_env(settings, TEST_JOURNAL=str(tmp_path / "journal"))
    listed = run_cli(["schedules", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    (before,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert set(before) == {"name", "job_type", "rule", "timezone", "next_at", "last_at"}
    assert (before["name"], before["job_type"], before["rule"]) == ("tick", "tick", 1)
    assert (before["timezone"], before["last_at"]) == ("UTC", None)
    assert occurrence_ms("x@" + before["next_at"]) % 1000 == 0
    worker = spawn(
        ["worker"],
        ricochet_env(
            settings.model_copy(update={"http_port": 0}), TEST_JOURNAL=str(tmp_path / "journal")
        ),
        tmp_path / "worker.log",
    )
    monitor = spawn(["monitor"], env, tmp_path / "monitor.log")
    try:
        await wait_for(lambda: journal(tmp_path / "journal"), 30, "an occurrence to run")
        listed = run_cli(["schedules", "--json"], env)
        (after,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert after["last_at"] is not None
        assert occurrence_ms("tick@" + after["last_at"]) <= occurrence_ms("x@" + after["next_at"])
        await wait_for(lambda: answers(port, "/healthz", 200), 30, "the monitor's HTTP server")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/schedules") as response,
        ):
            assert response.status == 200
            page = await response.text()
        assert "tick" in page
        assert "1 recurring job" in page
    finally:
        for process in (monitor, worker):
            process.terminate()
            assert process.wait(30) == 0


async def test_an_absurd_or_future_state_stops_no_schedule(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """SPEC 24: the store holds, for one schedule of the queue, a last occurrence of 10**18 ms
    (past any date) and, for another, one an hour ahead. The first is ignored (logged) and starts
    afresh, the second counts as now (logged); every schedule of the queue, those two and one
    with no state, enqueues each occurrence on time."""
    router, ran = Router(), []
    names = ("absurd", "ahead", "fresh")
    for name in names:
        router.schedule(name, "tick", every=EVERY_S)

    @router.handler("tick")
    async def tick(job: Job) -> None:
        ran.append((str(job.message_id), now_ms()))

    await declare(connection, make_settings(queue_name))
    await forge_state(connection, queue_name, {"absurd": 10**18, "ahead": now_ms() + 3_600_000})
    with capture_logs() as logs:
        await start_worker(router)

        def each_three() -> bool:
            return all(sum(m.startswith(f"{n}@") for m, _ in ran) >= 3 for n in names)

        await wait_for(each_three, 15, "three occurrences of each schedule")
    for name in names:
        mine = [(m, at) for m, at in ran if m.startswith(f"{name}@")]
        assert_unbroken([m for m, _ in mine], EVERY_S * 1000)
        for message_id, at in mine:
            assert 0 <= at - occurrence_ms(message_id) <= 1000, (message_id, at)
    events = [(e["event"], e.get("schedules"), e.get("schedule")) for e in logs]
    assert (
        "schedule state recorded cannot be read: ignored, the schedule starts afresh",
        ["absurd"],
        None,
    ) in events
    assert ("schedule state ahead of the clock: counted as now", None, "ahead") in events
