"""The fault suite's bookkeeping: real worker processes, N jobs with unique ids, and at the end an
account of every id: completed (handled and acked), in the failed queue, or lost."""

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from ricochet import Client
from ricochet.broker.cancels import publish_cancel
from ricochet.broker.connection import close_quietly
from ricochet.broker.declare import declare
from ricochet.broker.plan import plan
from ricochet.names import Names
from ricochet.settings import Settings

from tests.support import (
    consumers,
    depth,
    journal,
    log_events,
    logged_ids,
    make_settings,
    ricochet_env,
    spawn,
    take,
    wait_for,
)

# Longer than any wait of the rows (a schedule, a RetryLater) in the shared levels.
QUIET_S = 6
PUBLISH_BATCH = 200  # confirms awaited together, so publishing N jobs takes a moment, not minutes


@dataclass(frozen=True)
class Tally:
    """One fault's figures, as docs/faults.md reports them."""

    fault: str
    published: int
    completed: int
    failed: int
    lost: int
    duplicates: int
    cancelled: int = 0  # cancelled on purpose while waiting, and never run afterwards


TALLIES: list[Tally] = []


class WorkerProcess:
    """`python -m ricochet worker` with the run's settings; output appended to one log file."""

    def __init__(self, env: dict[str, str], output: Path) -> None:
        self._env = env
        self.output = output
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    def start(self) -> "WorkerProcess":
        self.proc = spawn(["worker"], self._env, self.output)
        self.starts += 1
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no drain, no close; the broker notices the dead connection."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def events(self) -> list[dict[str, Any]]:
        """Its JSON log lines so far, in order."""
        return log_events(self.output.read_text() if self.output.exists() else "")

    async def terminate(self, timeout_s: float = 30) -> int:
        """SIGTERM, then the exit code once the worker has drained."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, timeout_s)


class Supervisor:
    """Restarts a worker whenever it dies, as a container's restart policy would."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> "Supervisor":
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    def __exit__(self, *_: Any) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _watch(self) -> None:
        while True:
            if not self.worker.alive:
                self.worker.start()
            await asyncio.sleep(0.1)


@dataclass
class FaultRun:
    """One fault test's queue, journal, workers and failed copies."""

    name: str
    connection: AbstractConnection
    settings: Settings
    tmp_path: Path
    published: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # message_id -> failed-kind
    copies: Counter[str] = field(default_factory=Counter)  # failed copies per message_id
    cancelled: set[str] = field(default_factory=set)
    # Cancelled ids enqueued again after their cancel: each new job runs, the cancelled one not.
    enqueued_again: set[str] = field(default_factory=set)
    workers: list[WorkerProcess] = field(default_factory=list)
    waits_in_levels: bool = False  # whether some jobs were scheduled or asked a RetryLater
    keyed: bool = False  # whether some jobs have a key: the queue's key lanes hold them too
    # The rate-limited types of its workers: their jobs wait in Q.limited.TYPE too (SPEC 28).
    rate_types: tuple[str, ...] = ()
    # For each cancelled id, the journal's lines once its cancel had returned.
    journal_at_cancel: dict[str, int] = field(default_factory=dict)

    @property
    def names(self) -> Names:
        return Names(self.settings.queue)

    @property
    def journal_path(self) -> Path:
        return self.tmp_path / "journal"

    def worker(self, extra_env: dict[str, str] | None = None, **overrides: Any) -> WorkerProcess:
        """A worker process (not started); overrides change the run's settings from now on,
        extra_env is this process's alone."""
        self.settings = self.settings.model_copy(update=overrides)
        env = ricochet_env(self.settings, TEST_JOURNAL=str(self.journal_path), **(extra_env or {}))
        worker = WorkerProcess(env, self.tmp_path / "worker.log")
        self.workers.append(worker)
        return worker

    async def start_worker(self, **overrides: Any) -> WorkerProcess:
        """Start a worker and wait until it consumes."""
        worker = self.worker(**overrides).start()
        await self.wait_consumers(1)
        return worker

    async def wait_consumers(self, n: int, timeout_s: float = 60) -> None:
        """Until n workers consume. A start reads the stores first: on two loaded cores, with a
        broker's 30,000 cancels to read, it once took more than 30 s."""

        async def enough() -> bool:
            return await consumers(self.connection, self.settings.queue) >= n

        await wait_for(enough, timeout_s, f"{n} consumer(s) on {self.settings.queue}")

    async def publish(self, n: int, **payload: Any) -> list[str]:
        """Publish n persistent jobs with unique ids and this payload, confirmed."""
        stem = re.sub(r"\W+", "-", self.name).strip("-")
        ids = [f"{stem}-{len(self.published) + i}" for i in range(n)]
        await self.publish_ids(ids, payload)
        return ids

    async def publish_ids(self, ids: list[str], payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        await self.publish_messages(
            [
                aio_pika.Message(body, message_id=i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                for i in ids
            ]
        )

    async def publish_messages(self, messages: list[aio_pika.Message]) -> None:
        """Publish messages (each with its message_id set) to the main queue, confirmed."""
        if not self.published:
            await declare(self.connection, self.settings)
        channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        for start in range(0, len(messages), PUBLISH_BATCH):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        message, routing_key=self.settings.queue, mandatory=True
                    )
                    for message in messages[start : start + PUBLISH_BATCH]
                )
            )
        await channel.close()
        self.published.extend(m.message_id or "" for m in messages)
        # Scheduled, or asking a RetryLater: some of its jobs wait in the shared levels.
        self.waits_in_levels |= any(
            "run-at" in (m.headers or {}) or b'"later"' in m.body for m in messages
        )

    async def enqueue_keyed(self, jobs: list[tuple[str, str]], payload: dict[str, Any]) -> None:
        """Enqueue these (message_id, key) jobs with this payload, in this order, with one
        Client, each confirmed before the next: once the queue has key lanes, the client sends
        them straight to their lanes, in that order (SPEC 28). The client is given the run's
        count of lanes, as its workers are, in case it declares them."""
        lanes = {"RICOCHET_KEY_LANES": str(self.settings.key_lanes)}
        with mock.patch.dict(os.environ, lanes):
            async with Client(self.settings.amqp_url, self.settings.queue) as client:
                for message_id, key in jobs:
                    await client.enqueue("keyed", payload, message_id=message_id, key=key)
                    self.published.append(message_id)
        self.keyed = True

    async def cancel(self, ids: list[str]) -> None:
        """Cancel these jobs (the record `ricochet cancel` writes, for each): none of them may run
        from now on. Published side by side on one channel: one at a time, each on a channel of
        its own, 150 took seconds on a loaded broker, long enough for the jobs whose cancels came
        last to come back from their tier and run first (15 of 150 once, in CI)."""
        await publish_cancel(self.connection, self.names, *ids)
        self.cancelled.update(ids)
        self.cancel_returned(ids)

    def cancel_returned(self, ids: list[str]) -> None:
        """Note where the journal stands as the cancels of these ids have returned: a start of
        theirs logged after it is one a cancel should have stopped."""
        lines = len(journal(self.journal_path))
        self.journal_at_cancel.update(dict.fromkeys(ids, lines))

    async def enqueue_again(self, ids: list[str]) -> None:
        """Enqueue cancelled ids again as new jobs (with the AMQP timestamp a producer sets), a
        second after their cancel, which covers what was published up to its own second: each
        runs as a first attempt, while the cancelled job of its id never runs."""
        await asyncio.sleep(1.1)
        now = dt.datetime.now(dt.UTC)
        await self.publish_messages(
            [
                aio_pika.Message(
                    b"{}",
                    message_id=message_id,
                    timestamp=now,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                for message_id in ids
            ]
        )
        self.cancelled -= set(ids)
        self.enqueued_again.update(ids)

    async def reconnect(self) -> None:
        """A new connection for the test, after a fault that closed the old one."""
        await close_quietly(self.connection)
        self.connection = await aio_pika.connect(self.settings.amqp_url)

    async def _quiet(self, drained: Callable[[], Awaitable[bool]]) -> None:
        """Until no attempt of this run has started for QUIET_S with its queues drained: longer
        than any wait of these rows in the shared levels, where its jobs cannot be counted; and
        for a limited type, whose job moving between the queue and its waiting queue is for a
        moment in neither (held by a worker), and must run before the workers stop."""
        if not self.waits_in_levels and not self.rate_types:
            return
        seen = len(journal(self.journal_path))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            await asyncio.sleep(QUIET_S)
            now = len(journal(self.journal_path))
            if now == seen and await drained():
                return
            seen = now

    def logged(self, event: str) -> set[str]:
        """The message_ids of the lines of this event in every worker's output so far."""
        return logged_ids([line for worker in self.workers for line in worker.events()], event)

    def done(self) -> Counter[str]:
        """How often each id's handler completed (more than once: a duplicate)."""
        return Counter(m for event, m, _ in journal(self.journal_path) if event == "done")

    def started(self) -> set[str]:
        return set(self.starts())

    def starts(self) -> Counter[str]:
        """How often each id's handler was started."""
        return Counter(m for event, m, _ in journal(self.journal_path) if event == "start")

    async def collect_failed(self, channel: AbstractChannel) -> None:
        """Take the failed copies that arrived so far (the test owns its failed queue)."""
        queue = await channel.declare_queue(self.names.failed, passive=True)
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            kind = (message.headers or {}).get("failed-kind")
            self.failed[message.message_id or ""] = str(kind)
            self.copies[message.message_id or ""] += 1

    async def until_settled(self, timeout_s: float = 90) -> None:
        """Wait until every published id completed or is in the failed queue."""
        channel = await self.connection.channel()

        async def settled() -> bool:
            await self.collect_failed(channel)
            return set(self.published) - self.cancelled <= set(self.done()) | set(self.failed)

        try:
            await wait_for(settled, timeout_s, f"every job of {self.name} to settle")
        finally:
            with contextlib.suppress(Exception):
                await channel.close()

    def _waiting_queues(self) -> list[str]:
        """The run's own queues where its jobs wait: the main queue, its tiers and lanes, and
        its key lanes once it has jobs with a key, and its limited types' waiting queues. The
        delays' levels are shared by every queue of the vhost (other tests' jobs may wait
        there): its jobs in the levels are waited for by time (quiet)."""
        declared = plan(self.settings)
        keys = range(self.settings.key_lanes) if self.keyed else range(0)
        return [
            self.names.queue,
            *(spec.name for spec in [*declared.tiers, *declared.lanes]),
            *map(self.names.key_lane, keys),
            *map(self.names.limited, self.rate_types),
        ]

    async def settle(self) -> None:
        """Until every id completed or is in the failed queue and, while a worker runs, the
        run's queues are drained: a duplicate still waiting runs before the workers stop."""
        await self.until_settled()
        if not any(worker.alive for worker in self.workers):
            return
        channel = await self.connection.channel()
        # A job that was waiting (a RetryLater, a schedule, a tier) when its worker was killed
        # may wait a second time as a duplicate after its first copy settled: the running
        # worker takes it when it comes back, before the queues are checked.
        longest_s = max((spec.delay_ms or 0 for spec in plan(self.settings).tiers), default=0)

        async def drained() -> bool:
            for queue in self._waiting_queues():
                if await depth(channel, queue):
                    return False
            return True

        await wait_for(drained, longest_s / 1000 + 30, "the waiting queues to drain")
        await self._quiet(drained)
        await channel.close()

    def kill_workers(self) -> None:
        """Kill (-9) the run's worker processes still alive: after a test, none may go on."""
        for worker in self.workers:
            if worker.alive:
                worker.kill()

    async def account(
        self, expected_failed: set[str] | None = None, any_failed: bool = False
    ) -> Tally:
        """Stop the workers, check that no queue still holds a job, and count every id; only
        the expected ids may be in the failed queue, unless any_failed."""
        await self.settle()
        channel = await self.connection.channel()
        declared = plan(self.settings)
        for worker in self.workers:
            if worker.alive:
                assert await worker.terminate() == 0, worker.output.read_text()[-3000:]
        if self.cancelled:  # a cancelled job leaves when it comes due: wait for the longest
            await asyncio.sleep(max(spec.delay_ms or 0 for spec in declared.tiers) / 1000 + 1)
        for queue in self._waiting_queues():
            assert await depth(channel, queue) == 0, f"{queue} still holds jobs"
        await self.collect_failed(channel)
        await channel.close()
        done = self.done()
        published = set(self.published)
        # Since its cancel returned, no cancelled job has started: neither one of a cancelled id,
        # nor a retry of one whose id was enqueued again (whose new job starts as a first attempt).
        ran_after_cancel = {
            message_id
            for line, (event, message_id, attempt) in enumerate(journal(self.journal_path))
            if event == "start"
            and line >= self.journal_at_cancel.get(message_id, line + 1)
            and (
                message_id in self.cancelled or (message_id in self.enqueued_again and attempt > 1)
            )
        }
        assert not ran_after_cancel, f"cancelled jobs ran: {sorted(ran_after_cancel)[:10]}"
        lost = published - set(done) - set(self.failed) - self.cancelled
        if not any_failed:
            assert set(self.failed) == (expected_failed or set()), self.failed
        tally = Tally(
            fault=self.name,
            published=len(published),
            completed=len(published & set(done)),
            failed=len(published & set(self.failed)),
            lost=len(lost),
            # A job handled twice, failed twice, or both handled and failed.
            duplicates=sum(n - 1 for n in done.values())
            + sum(n - 1 for n in self.copies.values())
            + len(set(done) & set(self.failed)),
            cancelled=len(published & self.cancelled - set(done) - set(self.failed)),
        )
        TALLIES.append(tally)
        assert not lost, f"lost {len(lost)} jobs: {sorted(lost)[:10]}"
        return tally


@dataclass
class QueuesRun:
    """One worker consuming several queues (RICOCHET_QUEUES), with a FaultRun for each queue:
    its jobs are published to its queue, journaled by the jobs consumed from it (in its own
    folder of tmp_path: the worker's TEST_JOURNAL names the job's queue), and counted on their
    own."""

    tmp_path: Path
    runs: list[FaultRun]

    def worker(self) -> WorkerProcess:
        """A worker process (not started) consuming every run's queue, each with its prefetch."""
        first = self.runs[0]
        queues = tuple((run.settings.queue, run.settings.prefetch) for run in self.runs)
        settings = first.settings.model_copy(update={"queues": queues})
        journals = self.tmp_path / "{queue}" / "journal"
        worker = WorkerProcess(
            ricochet_env(settings, TEST_JOURNAL=str(journals)), self.tmp_path / "worker.log"
        )
        for run in self.runs:
            run.workers.append(worker)
        return worker

    async def start_worker(self) -> WorkerProcess:
        """Start a worker and wait until it consumes every queue."""
        worker = self.worker().start()
        for run in self.runs:
            await run.wait_consumers(1)
        return worker

    async def account(self, *runs: FaultRun) -> list[Tally]:
        """Count these runs' ids (every run's when none are named), each queue on its own: all
        settled and their queues drained while the worker runs, so that a duplicate of any queue
        runs before it stops; then no queue's journal may name a job of another queue."""
        runs = runs or tuple(self.runs)
        for run in runs:
            await run.settle()
        tallies = [await run.account() for run in runs]
        for run in runs:
            strays = set(run.starts()) - set(run.published)
            assert not strays, f"{run.settings.queue} ran other queues' jobs: {sorted(strays)[:5]}"
        return tallies


async def stopped_when(
    proc: "subprocess.Popen[str]",
    predicate: Callable[[], Awaitable[bool]],
    timeout_s: float,
    what: str,
    slice_s: float = 0.02,
) -> None:
    """Let proc run in slices of slice_s, held (SIGSTOP) between them, until predicate holds while
    it is held: it is then held at that point of its work (SIGCONT lets it go on), however soon
    it would have ended. A fault row so needs no more work in the process than a few slices."""
    deadline = time.monotonic() + timeout_s
    while True:
        proc.send_signal(signal.SIGSTOP)
        if await predicate():
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.send_signal(signal.SIGCONT)
            raise AssertionError(f"{what}: not seen (exit code {proc.poll()})")
        proc.send_signal(signal.SIGCONT)
        await asyncio.sleep(slice_s)


async def take_all(channel: AbstractChannel, queue: str) -> list[AbstractIncomingMessage]:
    """Every message of a queue, taken, once the broker counts the returned ones as ready."""
    previous = -1
    while (now := await depth(channel, queue)) != previous:
        previous = now
        await asyncio.sleep(0.3)
    return await take(channel, queue, now)


async def publish_mixed(run: FaultRun, jobs: int, sleep_s: float = 0.002) -> None:
    """Nine in ten jobs succeed at once, one in ten fails once and goes through tier 1."""
    for _ in range(10):
        await run.publish(jobs // 10 - jobs // 100, sleep_s=sleep_s)
        await run.publish(jobs // 100, sleep_s=sleep_s, fail=1)


async def progress(run: FaultRun, jobs: int, timeout_s: float = 60) -> None:
    """Wait until the run's handlers have completed at least this many jobs."""
    await wait_for(lambda: len(run.done()) >= jobs, timeout_s, f"{jobs} jobs done")


def fault_settings(queue: str, url: str, **overrides: Any) -> Settings:
    """Settings of a fault run: the private node, the journaling handler, short delays."""
    values: dict[str, Any] = {
        "amqp_url": url,
        "handler": "tests.handlers:fault",
        "retry_delay_ms": 100,
        "max_retries": 2,
        "shutdown_timeout_s": 10,
        "connect_timeout_s": 30,
    }
    values.update(overrides)
    return make_settings(queue, **values)
