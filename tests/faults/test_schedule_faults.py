"""Faults of recurring jobs (SPEC 22): the leading worker process killed, its connection dropped,
or the broker restarted, with a schedule `every` 1 s and two worker processes; the state the
leader recorded forged into the future before it is killed (SPEC 24); and the monitor killed in
the middle of a relaunch of failed jobs.

A schedule's accounting: every occurrence a leader logged as enqueued ran (or was still queued
when the workers stopped), the occurrences that ran form an unbroken sequence of the period
(the follower ran throughout, so its catch-up enqueues every one missed since the last enqueued:
no gap is allowed), each ran within SPEC 22's 10 s of falling due (or of the broker coming
back), and one that ran twice did so around the fault, under its one message_id."""

import asyncio
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.declare import declare
from ricochet.delivery.retry import FailureKind
from ricochet.names import Names

from tests.broker import Broker
from tests.faults.harness import (
    PUBLISH_BATCH,
    TALLIES,
    FaultRun,
    Tally,
    WorkerProcess,
    fault_settings,
    take_all,
)
from tests.integration.failures import publish_failed
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
    close_connections,
    consumers,
    depth,
    log_events,
    logged_ids,
    ricochet_env,
    spawn,
    wait_for,
)

PERIOD_MS = EVERY_S * 1000
TAKEOVER_MS = 10_000  # SPEC 22: another process leads within 10 s of the broker closing
HOLD_S = 3  # the leader held still before its fault: occurrences fall due meanwhile
AFTER_S = 3  # occurrences run after the takeover before the workers stop
COPIES = 4000  # failed copies: enough that a relaunch is still going when the kill lands


def leads_taken(run: FaultRun) -> int:
    """How many times the run's worker processes took the lead of its schedules."""
    return leads(*(w.output for w in run.workers))


def ran(run: FaultRun) -> list[tuple[str, int]]:
    """(message_id, when it ran, ms) of each occurrence the handler ran, in order."""
    return ticked(run.journal_path)


@dataclass(frozen=True)
class Occurrences:
    """What became of a run's occurrences once its workers stopped."""

    runs: list[tuple[str, int]]  # (message_id, when it ran, ms) of each run, in order
    queued: list[str]  # enqueued, never run

    @property
    def done(self) -> Counter[str]:
        """How often each occurrence ran."""
        return Counter(message_id for message_id, _ in self.runs)

    @property
    def ids(self) -> set[str]:
        """Every occurrence enqueued: run or still queued."""
        return set(self.done) | set(self.queued)


async def stop(run: FaultRun) -> Occurrences:
    """Stop the workers (each exits 0 once drained), then take what they left queued."""
    for worker in run.workers:
        if worker.alive:
            assert await worker.terminate() == 0, worker.output.read_text()[-3000:]
    channel = await run.connection.channel()
    queued = [str(m.message_id) for m in await take_all(channel, run.settings.queue)]
    await channel.close()
    return Occurrences(ran(run), queued)


def record_tally(run: FaultRun, seen: Occurrences) -> Tally:
    """The run's figures, recorded for the report; none may be lost: every occurrence a leader
    logged as enqueued ran or is queued. An occurrence that ran twice, or ran and is queued
    again, is a duplicate."""
    done, queued = seen.done, seen.queued
    lost = run.logged("schedule occurrence enqueued") - seen.ids
    figures = Tally(
        fault=run.name,
        published=len(seen.ids),
        completed=len(done),
        failed=0,
        lost=len(lost),
        duplicates=sum(done.values()) - len(done) + len(set(done) & set(queued)),
    )
    TALLIES.append(figures)
    assert not lost, sorted(lost)
    return figures


async def two_workers(run: FaultRun) -> tuple[WorkerProcess, WorkerProcess]:
    """The leader (started first, and leading) and a follower, each its own process and log;
    once two occurrences have run."""
    env = ricochet_env(run.settings, TEST_JOURNAL=str(run.journal_path))
    leader = WorkerProcess(env, run.tmp_path / "leader.log").start()
    run.workers.append(leader)
    await wait_for(lambda: leads_taken(run) == 1, 30, "a leader")
    follower = WorkerProcess(env, run.tmp_path / "follower.log").start()
    run.workers.append(follower)
    await run.wait_consumers(2)
    seen = len(ran(run))
    await wait_for(lambda: len(ran(run)) >= seen + 2, 10, "two occurrences with both running")
    return leader, follower


async def after_takeover(run: FaultRun) -> None:
    """Until a second lead is taken (within SPEC 22's 10 s), then until the occurrences falling
    due AFTER_S s later have run."""
    await wait_for(lambda: leads_taken(run) >= 2, TAKEOVER_MS / 1000, "a new leader")
    until_ms = now_ms() + AFTER_S * PERIOD_MS

    def ran_until() -> bool:
        return any(occurrence_ms(m) >= until_ms for m, _ in ran(run))

    await wait_for(ran_until, AFTER_S + 10, "occurrences after the takeover")


async def account_occurrences(run: FaultRun, fault_ms: int, back_ms: int) -> Tally:
    """Stop the workers and account for every occurrence (see the module's docstring); fault_ms
    is when the fault came, back_ms when the broker was whole again."""
    seen = await stop(run)
    runs, done, ids = seen.runs, seen.done, seen.ids
    assert all(i.startswith("tick@") for i in ids), sorted(ids)[:5]
    assert_unbroken(list(ids), PERIOD_MS)  # on the period's grid, no gap
    # Those that fell due while no leader could enqueue them: the new leader's catch-up.
    missed = range(-(-fault_ms // PERIOD_MS) * PERIOD_MS, back_ms, PERIOD_MS)
    assert len(missed) >= 2, "the fault was too short to miss occurrences"
    assert set(missed) <= {occurrence_ms(m) for m in ids}
    late = {m: at - max(occurrence_ms(m), back_ms) for m, at in runs}
    assert max(late.values()) <= TAKEOVER_MS, max(late.items(), key=lambda kv: kv[1])
    twice = {m for m, n in done.items() if n > 1}
    around = range(fault_ms - TAKEOVER_MS, back_ms + TAKEOVER_MS)
    assert all(occurrence_ms(m) in around for m in twice), sorted(twice)
    figures = record_tally(run, seen)
    # SPEC 22: one may be enqueued twice around a takeover (the one a leader enqueued and
    # could not record); a leader whose connection is gone enqueues nothing more.
    assert figures.duplicates <= 1, sorted(twice)
    return figures


def ticking(fault_run: Callable[..., FaultRun], name: str) -> FaultRun:
    """A run whose workers run tests.handlers:ticks, a schedule `tick` every second."""
    return fault_run(name, handler="tests.handlers:ticks")


async def hold(worker: WorkerProcess) -> int:
    """Stop the process (SIGSTOP) for HOLD_S, its connection and lead still open, so that some
    occurrences fall due that it cannot enqueue; returns when it was stopped."""
    assert worker.proc is not None
    held_ms = now_ms()
    worker.proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(HOLD_S)
    return held_ms


async def test_kill_9_of_the_leader(fault_run: Callable[..., FaultRun]) -> None:
    """The leading process, held still for 3 s, is killed with SIGKILL: the follower leads
    within 10 s and enqueues every occurrence missed since the last one enqueued; none is lost
    or skipped."""
    run = ticking(fault_run, "schedules: the leader killed with kill -9")
    leader, _ = await two_workers(run)
    held_ms = await hold(leader)
    killed_ms = now_ms()
    leader.kill()
    await after_takeover(run)
    await account_occurrences(run, held_ms, killed_ms)


async def test_connection_of_the_leader_dropped(
    fault_run: Callable[..., FaultRun], fault_broker: Broker
) -> None:
    """The broker closes the connection of the leading process, held still for 3 s: the
    follower leads within 10 s and enqueues every occurrence missed since the last one
    enqueued, and the old leader connects again; none is lost or skipped."""
    run = ticking(fault_run, "schedules: the leader's connection dropped")
    leader, _ = await two_workers(run)
    assert leader.proc is not None
    held_ms = await hold(leader)
    closed = await asyncio.to_thread(
        close_connections, run.settings.queue, "worker", fault_broker, leader.proc.pid
    )
    # After the close, not before the call: two rabbitmqctl runs took seconds on a loaded host,
    # and the held leader enqueued nothing meanwhile.
    closed_ms = now_ms()
    leader.proc.send_signal(signal.SIGCONT)
    assert closed == 1
    await after_takeover(run)
    await account_occurrences(run, held_ms, closed_ms)
    assert [w.starts for w in run.workers] == [1, 1]  # the leader connected again, not restarted


async def test_state_forged_into_the_future_then_the_leader_killed(
    fault_run: Callable[..., FaultRun],
) -> None:
    """The leader is held still, a record saying its last occurrence is an hour ahead is written
    to the store (as anyone with write access to the vhost could), and the leader is killed with
    SIGKILL: the follower leads within 10 s, logs the state as ahead of the clock and counts it
    as now, and enqueues every occurrence from then on, each within 1 s of falling due, instead
    of none for an hour. The occurrences the forged record hid (from the hold to the takeover)
    are the only ones not run: each is accounted for as hidden, none lost elsewhere."""
    run = ticking(fault_run, "schedules: the state forged an hour ahead, the leader killed")
    leader, follower = await two_workers(run)
    held_ms = await hold(leader)
    forged = now_ms() + 3_600_000
    await forge_state(run.connection, run.settings.queue, {"tick": forged})
    killed_ms = now_ms()
    leader.kill()
    await after_takeover(run)
    [clamp] = [
        e
        for e in follower.events()
        if e["event"] == "schedule state ahead of the clock: counted as now"
    ]
    assert (clamp["schedule"], clamp["recorded_last"]) == ("tick", forged)
    led_ms = clamp["now"]
    assert killed_ms <= led_ms <= killed_ms + TAKEOVER_MS
    seen = await stop(run)
    runs, ids = seen.runs, seen.ids
    times = sorted(occurrence_ms(i) for i in ids)
    before = [t for t in times if t < led_ms]
    after = [t for t in times if t > led_ms]
    # Up to the hold, and from the takeover on, an unbroken sequence; between them, hidden.
    assert before
    assert max(before) <= held_ms, (before[-3:], held_ms)
    assert after == list(range(after[0], after[-1] + 1, PERIOD_MS)), after
    assert after[0] == (led_ms // PERIOD_MS + 1) * PERIOD_MS
    hidden = range(max(before) + PERIOD_MS, after[0], PERIOD_MS)
    assert set(times) == set(range(times[0], times[-1] + 1, PERIOD_MS)) - set(hidden)
    assert len(hidden) <= (led_ms - held_ms) // PERIOD_MS + 1
    late = {m: at - occurrence_ms(m) for m, at in runs if occurrence_ms(m) > led_ms}
    assert max(late.values()) <= PERIOD_MS, max(late.items(), key=lambda kv: kv[1])
    figures = record_tally(run, seen)
    assert figures.duplicates == 0, figures


async def test_broker_restarted(
    fault_run: Callable[..., FaultRun], restart_ctl: Callable[..., str]
) -> None:
    """`rabbitmqctl stop_app`, two seconds, `start_app`: both processes connect again, one leads
    and enqueues the occurrences that fell due while the broker was away; none is lost or
    skipped, each runs within 10 s of the broker's return."""
    run = ticking(fault_run, "schedules: the broker restarted")
    await two_workers(run)
    fault_ms = now_ms()
    await asyncio.to_thread(restart_ctl, "stop_app")
    await asyncio.sleep(2)
    await asyncio.to_thread(restart_ctl, "start_app")
    back_ms = now_ms()
    await run.reconnect()
    await after_takeover(run)
    await account_occurrences(run, fault_ms, back_ms)


async def test_kill_9_of_the_monitor_mid_relaunch(
    fault_broker: Broker, connection: AbstractConnection, queue_name: str, tmp_path: Path
) -> None:
    """The monitor relaunches 4,000 exhausted copies (RICOCHET_RELAUNCH_INTERVAL_S=10) and is
    killed with SIGKILL once some are back in the queue: every copy is in exactly one place, in
    the failed queue as it was or in the queue replayed once, and each one logged as replayed
    really moved."""
    fault = "relaunch: the monitor killed mid-way"
    names = Names(queue_name)
    settings = fault_settings(
        queue_name,
        fault_broker.amqp_url,
        relaunch_interval_s=10,
        relaunch_kinds="exhausted",
        relaunch_max=3,
    )
    await declare(connection, settings)
    channel = await connection.channel(publisher_confirms=True)
    ids = [f"r{i:05d}" for i in range(COPIES)]
    for start in range(0, COPIES, PUBLISH_BATCH):
        await asyncio.gather(
            *(
                publish_failed(channel, queue_name, i, TimeoutError(), kind=FailureKind.EXHAUSTED)
                for i in ids[start : start + PUBLISH_BATCH]
            )
        )
    log = tmp_path / "monitor.log"
    monitor = spawn(["monitor"], ricochet_env(settings), log)
    try:
        await wait_for(lambda: _replayed_some(channel, queue_name), 40, "a relaunch under way")
    finally:
        monitor.kill()
        monitor.wait(10)
    assert "failed jobs relaunched" not in log.read_text(), "it finished: make COPIES larger"

    async def released() -> bool:
        return await consumers(connection, names.failed) == 0

    await wait_for(released, 30, "the monitor's consumer to go")
    in_failed = await take_all(channel, names.failed)
    in_main = await take_all(channel, queue_name)
    await channel.close()
    everywhere = Counter(str(m.message_id) for m in [*in_failed, *in_main])
    logged = logged_ids(log_events(log.read_text()), "replayed")
    moved = {str(m.message_id) for m in in_main}
    tally = Tally(
        fault=fault,
        published=COPIES,
        completed=len(moved),
        failed=len(in_failed),
        lost=len(set(ids) - set(everywhere)),
        duplicates=sum(everywhere.values()) - len(everywhere),
    )
    TALLIES.append(tally)
    assert (tally.lost, tally.duplicates) == (0, 0), tally
    assert set(everywhere) == set(ids)
    assert 0 < len(moved) < COPIES
    assert logged <= moved
    assert {(m.headers or {}).get("replay-count") for m in in_main} == {1}
    assert {(m.headers or {}).get("failed-kind") for m in in_failed} == {"exhausted"}


async def _replayed_some(channel: AbstractChannel, queue: str) -> bool:
    return await depth(channel, queue) > 0
