"""The journal (SPEC 26): every change of a job's state is written to ricochet.journal, and
`ricochet job` / `ricochet jobs` read it back: where a job is, each attempt, its result."""

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Client, Job, PermanentError, Router
from ricochet.names import SHARED

from tests.support import (
    AMQP_URL,
    StartWorker,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    wait_for,
)


def _cli(queue: str, *args: str) -> tuple[int, str, str]:
    done = run_cli(list(args), ricochet_env(make_settings(queue)))
    return done.returncode, done.stdout, done.stderr


async def _job(queue: str, message_id: str) -> dict[str, Any] | None:
    code, out, _ = await asyncio.to_thread(_cli, queue, "job", message_id, "--json")
    return json.loads(out) if code == 0 else None


async def _state_is(queue: str, message_id: str, state: str) -> bool:
    shown = await _job(queue, message_id)
    return shown is not None and shown["state"] == state


def _ended(queue: str, message_id: str, state: str) -> Callable[[], Awaitable[bool]]:
    return lambda: _state_is(queue, message_id, state)


def _router(flaked: set[str]) -> Router:
    router = Router()

    @router.handler("ok")
    async def ok(job: Job) -> dict[str, int]:
        job.progress(50)
        return {"emails": 42}

    @router.handler("flaky")
    async def flaky(job: Job) -> str:
        if job.message_id not in flaked:
            flaked.add(str(job.message_id))
            raise ConnectionError("the mail server hung up")
        return "done"

    @router.handler("bad")
    async def bad(job: Job) -> None:
        raise PermanentError("no such account")

    @router.handler("private", keep_result=False)
    def private(job: Job) -> str:
        return "a secret"

    @router.handler("huge")
    def huge(job: Job) -> str:
        return "x" * 10_000

    return router


async def test_each_job_s_life_is_read_back_by_ricochet_job(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A job enqueued by the client, one that fails once then succeeds, one that fails for good,
    one whose type keeps no result, one whose result is too large, one from another producer:
    `ricochet job ID --json` says where each is, with its attempts, result and progress."""
    await start_worker(_router(set()), max_retries=2)
    async with Client(AMQP_URL, queue_name) as client:
        for job_type in ("ok", "flaky", "bad", "private", "huge"):
            await client.enqueue(job_type, {}, message_id=f"{job_type}-1")
    await publish(channel, queue_name, "{}", message_id="foreign-1", type="ok")

    for message_id, state in [
        ("ok-1", "succeeded"),
        ("flaky-1", "succeeded"),
        ("bad-1", "failed"),
        ("private-1", "succeeded"),
        ("huge-1", "succeeded"),
        ("foreign-1", "succeeded"),
    ]:
        await wait_for(_ended(queue_name, message_id, state), 20, message_id)

    ok = await _job(queue_name, "ok-1")
    assert ok is not None
    assert ok["queue"] == queue_name
    assert ok["type"] == "ok"
    assert ok["result"] == {"emails": 42}
    assert ok["progress"] == 50
    assert [a["outcome"] for a in ok["attempts"]] == ["succeeded"]
    assert ok["attempts"][0]["started_at"] <= ok["attempts"][0]["ended_at"]
    assert next(e["event"] for e in ok["events"]) == "enqueued"

    flaky = await _job(queue_name, "flaky-1")
    assert flaky is not None
    assert [(a["attempt"], a["outcome"]) for a in flaky["attempts"]] == [
        (1, "retrying"),
        (2, "succeeded"),
    ]
    assert "the mail server hung up" in flaky["attempts"][0]["reason"]
    assert flaky["result"] == "done"

    bad = await _job(queue_name, "bad-1")
    assert bad is not None
    assert "no such account" in bad["attempts"][-1]["reason"]

    private = await _job(queue_name, "private-1")
    assert private is not None
    assert private["result"] is None
    assert "a secret" not in str(private)

    huge = await _job(queue_name, "huge-1")
    assert huge is not None
    assert huge["result"] is None
    assert huge["result_truncated"] is True
    assert huge["result_bytes"] == 10_002

    foreign = await _job(queue_name, "foreign-1")
    assert foreign is not None
    # Known from its first delivery (no enqueue of the client's): a short attempt is written as
    # its end alone, which says when it started.
    assert "enqueued" not in [e["event"] for e in foreign["events"]]
    assert foreign["attempts"][0]["started_at"] is not None
    assert foreign["attempts"][0]["process"]

    code, _, err = await asyncio.to_thread(_cli, queue_name, "job", "never-enqueued")
    assert code == 1
    assert "no job 'never-enqueued' in the journal" in err


async def test_a_waiting_job_shows_when_it_is_due(
    start_worker: StartWorker, queue_name: str
) -> None:
    """A job in its retry tier is waiting, with the time the broker sends it back; a job
    scheduled for later is waiting until then."""
    flaked: set[str] = set()
    await start_worker(_router(flaked), max_retries=2, retry_delay_ms=60_000)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("flaky", {}, message_id="in-tier")
        await client.enqueue("ok", {}, message_id="later", delay=600)
    await wait_for(lambda: _state_is(queue_name, "in-tier", "waiting"), 20, "in its tier")
    shown = await _job(queue_name, "in-tier")
    assert shown is not None
    assert shown["due_at"] is not None
    assert shown["attempts"][0]["outcome"] == "retrying"
    later = await _job(queue_name, "later")
    assert later is not None
    assert later["state"] == "waiting"
    assert later["due_at"] is not None


async def test_jobs_lists_newest_first_a_page_at_a_time(
    start_worker: StartWorker, queue_name: str
) -> None:
    """`ricochet jobs --json` gives rows newest first and a cursor; the next page holds the
    rest, none twice; --state chooses."""
    await start_worker(_router(set()), max_retries=0)
    async with Client(AMQP_URL, queue_name) as client:
        for n in range(5):
            await client.enqueue("ok", {}, message_id=f"job-{n}")
            await asyncio.sleep(0.01)
        await client.enqueue("bad", {}, message_id="bad-0")

    async def listed(*args: str) -> list[dict[str, Any]]:
        code, out, err = await asyncio.to_thread(
            _cli, queue_name, "jobs", "--queue", queue_name, "--json", *args
        )
        assert code == 0, err
        return [json.loads(line) for line in out.splitlines()]

    async def all_ended() -> bool:
        rows = await listed("--limit", "10")
        return sorted(r["state"] for r in rows[:-1]) == ["failed"] + ["succeeded"] * 5

    await wait_for(all_ended, 20, "six jobs ended")
    first = await listed("--limit", "4")
    assert len(first) == 5
    assert first[-1]["next"] is not None
    rest = await listed("--limit", "4", "--before", first[-1]["next"])
    assert rest[-1] == {"next": None}
    ids = [r["message_id"] for r in first[:-1] + rest[:-1]]
    assert sorted(ids) == sorted(["bad-0", *(f"job-{n}" for n in range(5))])
    ats = [r["at"] for r in first[:-1] + rest[:-1]]
    assert ats == sorted(ats, reverse=True)
    failed = await listed("--state", "failed")
    assert [r["message_id"] for r in failed[:-1]] == ["bad-0"]
    assert set(failed[0]) >= {"message_id", "queue", "type", "state", "attempt", "at"}


async def test_the_journal_stream_deleted_while_a_worker_runs(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """The stream deleted under a running worker: jobs run on, the entries that found no stream
    are counted dropped, the stream is declared again and later entries are written. (The jobs
    come from another producer: a client's own entries could find the stream gone first, and
    declare it again before the worker writes.)"""
    worker = await start_worker(_router(set()))
    await publish(channel, queue_name, "{}", message_id="before", type="ok")
    await wait_for(_ended(queue_name, "before", "succeeded"), 20, "before")
    deleting = await connection.channel()
    await deleting.queue_delete(SHARED.journal)
    await deleting.close()
    for n in range(3):
        await publish(channel, queue_name, "{}", message_id=f"after-{n}", type="ok")
    await wait_for(lambda: worker.count("succeeded") == 4, 20, "every job ran")

    def dropped() -> float:
        return worker.metrics.registry.get_sample_value("ricochet_journal_dropped_total") or 0

    await wait_for(lambda: dropped() > 0, 10, "entries counted dropped")
    await publish(channel, queue_name, "{}", message_id="later", type="ok")
    await wait_for(_ended(queue_name, "later", "succeeded"), 20, "written again")


async def test_journal_off_writes_nothing(start_worker: StartWorker, queue_name: str) -> None:
    """RICOCHET_JOURNAL=off: the worker runs the job and writes no entry."""
    worker = await start_worker(_router(set()), journal="off")
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("ok", {}, message_id="quiet")
    await wait_for(lambda: worker.count("succeeded") == 1, 20, "the job ran")
    await asyncio.sleep(0.5)
    assert worker.metrics.registry.get_sample_value("ricochet_journal_entries_total") == 0
    shown = await _job(queue_name, "quiet")
    assert shown is not None
    assert [e["event"] for e in shown["events"]] == ["enqueued"]


async def test_a_replay_and_a_discard_are_written(
    start_worker: StartWorker, queue_name: str
) -> None:
    """`ricochet replay` and `ricochet failed discard` write what they took: the replayed job
    shows its replay between its two failures, then its discard."""
    await start_worker(_router(set()))
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("bad", {}, message_id="twice")
    await wait_for(_ended(queue_name, "twice", "failed"), 20, "the first failure")
    code, _, err = await asyncio.to_thread(
        _cli, queue_name, "replay", "--message-id", "twice", "--queue", queue_name
    )
    assert code == 0, err

    async def failed_again() -> bool:
        shown = await _job(queue_name, "twice")
        return shown is not None and [e["event"] for e in shown["events"]].count("failed") == 2

    await wait_for(failed_again, 20, "the replayed job to fail again")
    code, _, err = await asyncio.to_thread(
        _cli,
        queue_name,
        "failed",
        "discard",
        "--message-id",
        "twice",
        "--yes",
        "--queue",
        queue_name,
    )
    assert code == 0, err
    shown = await _job(queue_name, "twice")
    assert shown is not None
    events = [e["event"] for e in shown["events"]]
    assert events[-1] == "discarded"
    assert events.index("replayed") < len(events) - 2
    assert shown["state"] == "failed"
