"""Faults of the key lanes (SPEC 28, one job per key at a time): the worker process holding a
queue's lanes killed with kill -9 beside another, and the broker restarted while jobs wait in the
lanes.

Two `ricochet worker` processes run the jobs of 8 keys, enqueued by one Client once the queue's
first job with a key has run from its 4 lanes (the client sends each job straight to its lane,
in its key's order). The handler (tests/faults/timed.py) notes each run's key, process
and times, and each row checks across both processes, besides FaultRun's account of every id:

- no two jobs of a key ran at the same time (a run whose process was killed ends at the kill);
- each key's jobs started in the order they were enqueued, a job run again (at least once)
  right after its own first run: its lane gives it back first;
- only a job a lane had handed out at the fault ran again, at most one a lane."""

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Callable

from tests.faults.harness import FaultRun, WorkerProcess
from tests.faults.timed import TimedRun, timed_runs
from tests.support import ricochet_env, wait_for

LANES = 4  # few quorum queues: each costs the broker 3 file handles on 3.x
KEYS = [f"k{i}" for i in range(8)]
HANDOVER_S = 10  # a killed worker's lanes pass to the other worker within this long


def check_keys(
    runs: list[TimedRun], enqueued: dict[str, list[str]], killed: dict[int, int]
) -> dict[str, list[str]]:
    """Assert that no two jobs of a key overlapped and that each key's jobs started in their
    enqueue order, a job run again right after its own first run; a run with no end is one
    whose process was killed (killed: pid -> when the signal was sent), and ends there. Returns
    each key's starts, in order."""
    starts: dict[str, list[TimedRun]] = defaultdict(list)
    for r in runs:
        if r.end_ns is None:
            assert r.pid in killed, f"{r.message_id} never ended in process {r.pid}, not killed"
            assert r.start_ns < killed[r.pid]
            r.end_ns = killed[r.pid]
        starts[r.key].append(r)
    overlaps = [
        (key, a.message_id, b.message_id)
        for key, line in starts.items()
        for a, b in itertools.pairwise(line)
        if b.start_ns < (a.end_ns or 0)
    ]
    assert not overlaps, f"jobs of a key ran at the same time: {overlaps[:5]}"
    order = {key: [r.message_id for r in line] for key, line in starts.items()}
    for key, ids in order.items():
        collapsed = [m for i, m in enumerate(ids) if i == 0 or ids[i - 1] != m]
        assert collapsed == enqueued[key], f"{key} started out of order: {ids}"
    assert set(order) == set(enqueued)
    return order


def last_started(runs: list[TimedRun], before_ns: int, pid: int | None = None) -> set[str]:
    """Each key's last job started before this time (in this process): the one its lane had
    handed out, the only one of the key that may run again after a fault then."""
    last: dict[str, str] = {}
    for r in runs:
        if r.start_ns < before_ns and (pid is None or r.pid == pid):
            last[r.key] = r.message_id
    return set(last.values())


def reruns(runs: list[TimedRun]) -> list[TimedRun]:
    """The runs of a job after its first."""
    seen: set[str] = set()
    again = []
    for r in runs:
        if r.message_id in seen:
            again.append(r)
        seen.add(r.message_id)
    return again


def ran_again(runs: list[TimedRun]) -> set[str]:
    return {r.message_id for r in reruns(runs)}


def keyed_worker(run: FaultRun, log: str) -> WorkerProcess:
    """A worker process of the run with a log of its own (not started)."""
    env = ricochet_env(run.settings, TEST_JOURNAL=str(run.journal_path))
    worker = WorkerProcess(env, run.tmp_path / log)
    run.workers.append(worker)
    return worker


def consumes_lanes(worker: WorkerProcess) -> bool:
    return any(e["event"] == "consuming key lanes" for e in worker.events())


async def two_workers_on_the_lanes(
    run: FaultRun, per_key: int, sleep_s: float
) -> tuple[WorkerProcess, WorkerProcess, dict[str, list[str]]]:
    """Worker a, then a first job with a key, whose client declares the queue's lanes: a finds
    them and runs it, and holds every lane (it consumes them first); then worker b, waiting on
    every lane beside a; then per_key jobs of each key (an even number), enqueued two of a key
    at a time, the keys interleaved, each working sleep_s.
    The workers, and each key's ids in their enqueue order."""
    first = keyed_worker(run, "a.log").start()
    await run.wait_consumers(1)
    await run.enqueue_keyed([("warm", KEYS[0])], {"sleep_s": 0})
    await wait_for(lambda: "warm" in run.done(), 30, "the first job with a key")
    # Logged once a consumes every lane: the first may have handed it the job before.
    await wait_for(lambda: consumes_lanes(first), 30, "worker a consuming the lanes")
    second = keyed_worker(run, "b.log").start()
    await wait_for(lambda: consumes_lanes(second), 30, "worker b waiting on the lanes")
    enqueued: dict[str, list[str]] = {key: [] for key in KEYS}
    enqueued[KEYS[0]].append("warm")
    # Two jobs of a key at a time, the keys interleaved: a lane holds jobs of one key one behind
    # the other (a lane that handed out two at once would run them together) and of its other
    # keys between.
    pairs = range(0, per_key, 2)
    jobs = [(f"{key}-{i}", key) for pair in pairs for key in KEYS for i in (pair, pair + 1)]
    for message_id, key in jobs:
        enqueued[key].append(message_id)
    await run.enqueue_keyed(jobs, {"sleep_s": sleep_s})
    return first, second, enqueued


def pid(worker: WorkerProcess) -> int:
    assert worker.proc is not None
    return worker.proc.pid


async def test_kill_9_of_the_worker_holding_the_key_lanes(
    fault_run: Callable[..., FaultRun],
) -> None:
    """Worker a holds the 4 lanes and runs 8 keys' jobs (6 each, 0.25 s), worker b waiting on
    every lane beside it; a is killed with kill -9 once a third are done. b takes every lane
    within 10 s and runs the rest: every job done, only a's last job of a key run twice (at
    most one per lane), no two jobs of a key at once, each key's jobs started in their order."""
    run = fault_run(
        "key lanes: the worker holding them killed with kill -9",
        handler="tests.faults.timed:timed",
        key_lanes=LANES,
    )
    first, second, enqueued = await two_workers_on_the_lanes(run, per_key=6, sleep_s=0.25)

    def a_busy() -> bool:
        runs = timed_runs(run.journal_path)
        running = [r for r in runs if r.pid == pid(first) and r.end_ns is None]
        return bool(running) and len(run.done()) >= len(run.published) // 3

    await wait_for(a_busy, 60, "a third of the jobs done, and one running on worker a")
    killed_ns = time.monotonic_ns()
    first.kill()
    # a's runs alone: b may take a lane and start its next job before this read.
    runs_at_kill = timed_runs(run.journal_path)
    in_flight = {r.message_id for r in runs_at_kill if r.pid == pid(first) and r.end_ns is None}
    tally = await run.account()

    runs = timed_runs(run.journal_path)
    check_keys(runs, enqueued, {pid(first): killed_ns})
    # b ran nothing before the kill: a was every lane's single active consumer.
    assert {r.pid for r in runs if r.start_ns < killed_ns} == {pid(first)}
    after = [r for r in runs if r.start_ns >= killed_ns]
    assert after
    assert {r.pid for r in after} == {pid(second)}
    handover_s = (after[0].start_ns - killed_ns) / 1e9
    assert handover_s <= HANDOVER_S, f"b took the lanes {handover_s:.1f} s after the kill"
    again = ran_again(runs)
    assert in_flight, "no job was running on a at the kill"
    assert in_flight <= again <= last_started(runs, killed_ns, pid(first))
    # Run again: the jobs a was running, and any it had done but not yet acked (done twice).
    assert tally.duplicates <= len(again) <= LANES
    print(
        f"keys kill -9: {tally.published} jobs, {len(in_flight)} running at the kill, "
        f"{len(again)} ran again ({tally.duplicates} done twice); b took the lanes "
        f"{handover_s:.3f} s after the kill"
    )


async def test_broker_restarted_while_jobs_wait_in_the_key_lanes(
    fault_run: Callable[..., FaultRun], restart_ctl: Callable[..., str]
) -> None:
    """Two workers run 8 keys' jobs (8 each, 0.3 s) from 4 lanes; once an eighth are done,
    `rabbitmqctl stop_app`, two seconds, `start_app`, with most jobs waiting in the lanes. Both
    processes connect again and every job is done: only a job a lane had handed out at the
    stop runs twice (at most one per lane), no two jobs of a key at once, each key's jobs
    started in their order."""
    run = fault_run(
        "key lanes: broker restarted while jobs wait in them",
        handler="tests.faults.timed:timed",
        key_lanes=LANES,
    )
    first, second, enqueued = await two_workers_on_the_lanes(run, per_key=8, sleep_s=0.3)
    await wait_for(lambda: len(run.done()) >= len(run.published) // 8, 60, "an eighth done")
    await asyncio.to_thread(restart_ctl, "stop_app")
    waiting = len(run.published) - len({r.message_id for r in timed_runs(run.journal_path)})
    await asyncio.sleep(2)
    # The app is down: a job started before this was handed out before the stop, one started
    # after it after the restart.
    down_ns = time.monotonic_ns()
    await asyncio.to_thread(restart_ctl, "start_app")
    await run.reconnect()
    tally = await run.account()

    runs = timed_runs(run.journal_path)
    check_keys(runs, enqueued, {})
    # The jobs run on until the app stops (rabbitmqctl takes a second or two to start).
    assert waiting >= len(run.published) // 4, f"only {waiting} jobs waited in the lanes"
    again = ran_again(runs)
    assert again <= last_started(runs, down_ns)
    assert all(r.start_ns > down_ns for r in reruns(runs))
    assert tally.duplicates <= len(again) <= LANES
    for worker in (first, second):
        assert worker.starts == 1  # the same processes connected again
        assert any(e["event"] == "connection lost, reconnecting" for e in worker.events())
    after = [r for r in runs if r.start_ns > down_ns]
    print(
        f"keys restart: {tally.published} jobs, {waiting} waiting in the lanes at the stop, "
        f"{len(again)} ran again ({tally.duplicates} done twice); the first ran "
        f"{(after[0].start_ns - down_ns) / 1e9:.1f} s after start_app was called; after it, "
        f"processes {sorted({r.pid for r in after})} ran lane jobs (a={pid(first)})"
    )
