"""Cancel reaches every job (SPEC 23): one still in the backlog is acked as cancelled when it is
delivered, and one running sees job.cancelled within a second (an async handler that asked for it
is interrupted at once), then ends cancelled: acked, logged, counted, never retried nor failed."""

import asyncio
import signal
import time
from pathlib import Path

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Client, Job, Router
from ricochet.broker.declare import declare

from tests.support import (
    AMQP_URL,
    StartWorker,
    consumers,
    depth,
    make_settings,
    publish,
    ricochet_env,
    spawn,
    wait_for,
)

# How soon a running job must see its cancel (SPEC 23).
SEEN_WITHIN_S = 1.0


async def test_jobs_in_the_backlog_are_acked_as_cancelled(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """Jobs cancelled while they wait in the queue with no worker (the client's with a given
    id, one whose id the client made up, another producer's) never run; one enqueued after its
    cancel returned runs, and so does one nobody cancelled."""
    await declare(connection, make_settings(queue_name))
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("job", {}, message_id="given")
        made_up = await client.enqueue("job", {})
        await publish(channel, queue_name, "{}", message_id="foreign", type="job")
        await client.enqueue("job", {}, message_id="kept")
        for message_id in ("given", made_up, "foreign", "again"):
            await client.cancel(message_id)
        await client.enqueue("job", {}, message_id="again")
    ran: list[str] = []

    async def handle(job: Job) -> None:
        ran.append(str(job.message_id))

    worker = await start_worker(handle)
    await wait_for(lambda: sorted(ran) == ["again", "kept"], 10, "the two jobs not cancelled")
    await wait_for(lambda: worker.count("cancelled") == 3, 10, "three jobs acked as cancelled")
    await wait_for(lambda: worker.count("succeeded") == 2, 10, "two jobs succeeded")
    assert await depth(channel, queue_name) == 0
    assert await depth(channel, f"{queue_name}.failed") == 0


class Running:
    """Handlers that run until their job is cancelled, noting when each saw it."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.started = asyncio.Event()
        self.seen_at: dict[str, float] = {}
        self.attempts: list[int] = []

    def sync(self, job: Job) -> None:
        """A sync handler, as the README shows: look at the flag between steps."""
        self.attempts.append(job.attempt)
        self._started()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if job.cancelled:
                self.seen_at["sync"] = time.monotonic()
            job.raise_if_cancelled()
            time.sleep(0.01)

    async def flag(self, job: Job) -> None:
        self.attempts.append(job.attempt)
        self.started.set()
        for _ in range(2000):  # a handler's steps, the flag looked at between them
            if job.cancelled:
                self.seen_at["flag"] = time.monotonic()
            job.raise_if_cancelled()
            await asyncio.sleep(0.01)

    async def interrupted(self, job: Job) -> None:
        self.attempts.append(job.attempt)
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.seen_at["interrupted"] = time.monotonic()
            raise

    def _started(self) -> None:
        self._loop.call_soon_threadsafe(self.started.set)


@pytest.mark.parametrize("kind", ["sync", "flag", "interrupted"])
async def test_a_running_job_ends_cancelled(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, kind: str
) -> None:
    """A cancel of a running job: the handler sees it within a second (a sync handler by the
    flag, an async one by the flag or, with interrupt=True, at once in its await), and the job
    ends cancelled whatever give_up_on says: counted, not retried, not in the failed queue."""
    running = Running()
    router = Router()
    router.handler("job", give_up_on=(Exception,), interrupt=kind == "interrupted")(
        getattr(running, kind)
    )
    worker = await start_worker(router, retry_delays_ms="100")
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("job", {}, message_id="long")
        await asyncio.wait_for(running.started.wait(), 10)
        await client.cancel("long")
        cancelled_at = time.monotonic()
    await wait_for(lambda: worker.count("cancelled") == 1, 10, "the job to end cancelled")
    assert running.seen_at[kind] - cancelled_at < SEEN_WITHIN_S
    await asyncio.sleep(0.5)  # a retry would come back within 100 ms
    assert running.attempts == [1]
    assert (worker.count("failed"), worker.count("retried")) == (0, 0)
    assert await depth(channel, f"{queue_name}.failed") == 0


async def test_a_job_that_fails_after_its_cancel_is_not_retried(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A handler that never looks at job.cancelled fails once its cancel has returned: the
    failure goes to its tier as any other, and its retry is dropped as cancelled when it comes
    due, never run; the worker records nothing at that failure that could spare it."""
    attempts: list[int] = []
    cancel_returned = asyncio.Event()

    async def handle(job: Job) -> None:
        attempts.append(job.attempt)
        await asyncio.wait_for(cancel_returned.wait(), 10)
        raise ConnectionError("a failure that ignores the cancel")

    worker = await start_worker(handle, retry_delays_ms="100")
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("job", {}, message_id="ignores")
        await wait_for(lambda: attempts == [1], 10, "the job to start")
        await client.cancel("ignores")
        cancel_returned.set()
    await wait_for(lambda: worker.count("cancelled") == 1, 10, "its retry dropped as cancelled")
    assert (attempts, worker.count("retried"), worker.count("succeeded")) == ([1], 1, 0)
    assert await depth(channel, f"{queue_name}.failed") == 0


async def test_a_cancel_after_the_job_ended_changes_nothing(
    start_worker: StartWorker, queue_name: str
) -> None:
    """A job that succeeded, then a cancel of its id: nothing more happens to it; the same id
    enqueued again later runs."""
    ran: list[int] = []

    async def handle(job: Job) -> None:
        ran.append(job.attempt)

    worker = await start_worker(handle)
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("job", {}, message_id="done")
        await wait_for(lambda: worker.count("succeeded") == 1, 10, "the job to succeed")
        await client.cancel("done")
        await asyncio.sleep(0.5)
        await client.enqueue("job", {}, message_id="done")
    await wait_for(lambda: worker.count("succeeded") == 2, 10, "the new job to run")
    assert (ran, worker.count("cancelled")) == ([1, 1], 0)


async def test_a_cancel_reaches_the_job_in_whichever_worker_process_runs_it(
    connection: AbstractConnection, queue_name: str, tmp_path: Path
) -> None:
    """`ricochet worker` with two processes, four running jobs spread over them: each sees its
    cancel within a second, in the process that runs it, and ends cancelled."""
    settings = make_settings(
        queue_name, processes=2, prefetch=2, handler="tests.handlers:until_cancelled", http_port=0
    )
    env = ricochet_env(settings, TEST_JOURNAL=str(tmp_path / "journal"))
    ids = [f"long-{i}" for i in range(4)]
    with spawn(["worker"], env, tmp_path / "worker.log", start_new_session=True) as worker:
        try:
            await wait_for(lambda: _consumers_are(connection, queue_name, 2), 30, "both processes")
            async with Client(AMQP_URL, queue_name) as client:
                for message_id in ids:
                    await client.enqueue("long", {}, message_id=message_id)
                await wait_for(lambda: len(_journal(tmp_path, "start")) == 4, 20, "four starts")
                cancelled_at = {}
                for message_id in ids:
                    await client.cancel(message_id)
                    cancelled_at[message_id] = time.time()
            await wait_for(lambda: len(_journal(tmp_path, "seen")) >= 4, 10, "four cancels seen")
            started, seen = _journal(tmp_path, "start"), _journal(tmp_path, "seen")
            assert len({pid for pid, _ in started.values()}) == 2  # both processes ran some
            for message_id in ids:
                pid, at = seen[message_id]
                assert pid == started[message_id][0]
                assert float(at) - cancelled_at[message_id] < SEEN_WITHIN_S
            await wait_for(
                lambda: (tmp_path / "worker.log").read_text().count('"job cancelled"') == 4,
                10,
                "four jobs ended cancelled",
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            await asyncio.to_thread(worker.wait, 60)


async def _consumers_are(connection: AbstractConnection, queue: str, n: int) -> bool:
    return await consumers(connection, queue) == n


def _journal(tmp_path: Path, event: str) -> dict[str, tuple[str, str]]:
    """message_id -> (pid, the rest) of the journal's lines of an event (the first of each id)."""
    found: dict[str, tuple[str, str]] = {}
    path = tmp_path / "journal"
    for line in path.read_text().splitlines() if path.exists() else []:
        words = line.split()
        if words[0] == event:
            found.setdefault(words[-2], (words[1], words[2]))
    return found
