"""Faults of the worker process: killed, stopped mid-batch, poisoned, stuck in a handler; and of
a parent's worker processes (RICOCHET_PROCESSES): one killed, the parent killed, a handler that
crashes its process on import or at every job, a handler that wedges its process holding the
GIL."""

import asyncio
import contextlib
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.faults.harness import FaultRun, Supervisor, WorkerProcess, progress
from tests.support import (
    answers,
    consumers,
    depth,
    free_port,
    publish,
    statuses_seen,
    wait_depth,
    wait_for,
)

JOBS = 2000


async def test_kill_9_mid_batch_then_restart(fault_run: Callable[..., FaultRun]) -> None:
    """SIGKILL while jobs are in flight, then a new worker: every job completes; only the jobs
    that were in flight at the kill may run twice."""
    run = fault_run("kill -9 mid-batch", prefetch=32)
    await run.publish(JOBS, sleep_s=0.002)
    worker = await run.start_worker()
    await progress(run, JOBS // 4)
    worker.kill()
    await run.start_worker()
    tally = await run.account()
    assert tally.duplicates <= 32  # at most the unacked deliveries of the killed worker


async def test_sigterm_mid_batch_finishes_in_flight_jobs(
    fault_run: Callable[..., FaultRun],
) -> None:
    """SIGTERM mid-batch: the worker exits 0 after the jobs it started have finished, and a new
    worker completes the rest without running any finished job again."""
    run = fault_run("SIGTERM mid-batch", prefetch=16)
    await run.publish(JOBS // 2, sleep_s=0.02)
    worker = await run.start_worker()
    await progress(run, JOBS // 8)
    assert await worker.terminate() == 0
    assert run.started() == set(run.done())  # nothing started was abandoned
    await run.start_worker()
    tally = await run.account()
    assert tally.duplicates == 0


async def test_poison_job_that_kills_its_worker(fault_run: Callable[..., FaultRun]) -> None:
    """A job that kills the worker process whenever it runs: restarted each time, the worker
    moves it to the failed queue as poison after the limit, and every other job completes."""
    run = fault_run("poison job kills the worker (quorum)", prefetch=32)
    before = await run.publish(150, sleep_s=0.01)
    [poison] = await run.publish(1, poison=True)
    after = await run.publish(150, sleep_s=0.01)
    worker = run.worker()
    with Supervisor(worker):
        await run.until_settled(timeout_s=120)
    await run.account(expected_failed={poison})
    assert run.failed[poison] == "poison"
    assert worker.starts >= 6  # it really was handled (and killed its worker) each time
    assert set(before + after) <= set(run.done())


async def test_handler_hanging_past_the_timeout(fault_run: Callable[..., FaultRun]) -> None:
    """Jobs that hang past the handler timeout are retried, then failed as exhausted; the worker
    keeps handling every other job meanwhile."""
    run = fault_run("handler hangs past the timeout", handler_timeout_s=0.3, max_retries=1)
    hung = await run.publish(5, hang_s=30)
    await run.publish(500, sleep_s=0.001)
    await run.start_worker()
    await run.account(expected_failed=set(hung))
    assert set(run.failed.values()) == {"exhausted"}
    log = run.workers[0].output.read_text()
    assert "HandlerTimeout: handler ran longer than 0.3 s" in log


async def test_sync_handlers_hanging_past_the_timeout(fault_run: Callable[..., FaultRun]) -> None:
    """Sync jobs that hang past the timeout, twice as many as the prefetch: their threads stay
    taken, yet every other sync job runs and completes; only the hung ones fail (exhausted)."""
    run = fault_run(
        "sync handlers hang past the timeout",
        handler="tests.handlers:fault_sync",
        handler_timeout_s=0.3,
        max_retries=1,
        prefetch=4,
    )
    hung = await run.publish(8, hang_s=30)
    await run.publish(300, sleep_s=0.001)
    await run.start_worker()
    await run.account(expected_failed=set(hung))
    assert set(run.failed.values()) == {"exhausted"}


async def test_jobs_waiting_in_tiers_across_changed_settings(
    fault_run: Callable[..., FaultRun],
) -> None:
    """Jobs wait in the tiers while the worker restarts with fewer tiers and other delays: each
    job completes or fails exactly once, none is lost or copied."""
    # Tier 1 waits 10 s: long enough that all 400 first failures are in it at once, however
    # slowly a busy machine fails them (with 1.5 s, the first came back before the last failed).
    run = fault_run("retry settings changed between restarts", max_retries=3, retry_delay_ms=10_000)
    flaky = await run.publish(300, fail=1)
    doomed = await run.publish(100, fail=10)
    worker = await run.start_worker()

    channel = await run.connection.channel()
    await wait_depth(channel, run.names.tier(1), 400, timeout_s=30)
    await channel.close()
    assert await worker.terminate() == 0
    await run.start_worker(max_retries=1, retry_delay_ms=200)
    tally = await run.account(expected_failed=set(doomed))
    assert set(flaky) <= set(run.done())
    assert tally.duplicates == 0


async def test_a_kept_tier_declared_again_while_jobs_fail_into_it(
    fault_run: Callable[..., FaultRun],
) -> None:
    """Tier 1 holds jobs when a worker of two processes starts with a shorter delay, and jobs
    keep failing into it in bursts at uneven gaps, so that it empties and fills again while both
    processes look every 2 s whether to declare it again: it is declared again once empty, and
    every job completes, none lost. Classic queues: the private node has no management API,
    which a quorum tier's deletion asks."""
    run = fault_run(
        "a kept tier declared again while jobs fail into it",
        queue_type="classic",
        max_retries=2,
        retry_delay_ms=1_500,
    )
    await run.publish(20, fail=1)  # declares tier 1 with 1.5 s; they wait in Q for the worker
    fed = asyncio.Event()

    async def feed_tier_1() -> None:
        """Keep tier 1 holding jobs (each back in Q after 1.5 s) until the worker declared."""
        channel = await run.connection.channel(publisher_confirms=True)
        while not fed.is_set():
            message_id = f"fed-{len(run.published)}"
            await publish(channel, run.names.tier(1), b"{}", message_id=message_id)
            run.published.append(message_id)
            await asyncio.sleep(0.1)
        await channel.close()

    feeder = asyncio.create_task(feed_tier_1())
    await asyncio.sleep(2)
    worker = run.worker(retry_delay_ms=200, processes=2).start()
    await run.wait_consumers(2)
    fed.set()
    await feeder
    events = worker.events()
    assert any(e["event"] == "tier keeps its old delay until it drains" for e in events)
    gaps = random.Random(27)
    for _ in range(15):
        await run.publish(10, fail=1)
        await asyncio.sleep(gaps.uniform(0.3, 3.0))

    def redeclared() -> bool:
        return any(
            e["event"] == "tier redeclared" and e["queue"] == run.names.tier(1)
            for e in worker.events()
        )

    await wait_for(redeclared, 30, "tier 1 declared again")
    await run.account()


def worker_processes(parent: WorkerProcess) -> list[psutil.Process]:
    """The parent's worker processes (multiprocessing's resource tracker is none of them)."""
    assert parent.proc is not None
    found = []
    for child in psutil.Process(parent.proc.pid).children():
        # One just killed is a zombie until the parent reaps it: no longer one of them.
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
    return found


def restarts_logged(worker: WorkerProcess) -> list[dict[str, Any]]:
    """The parent's lines about a worker process that died, in order."""
    return [e for e in worker.events() if e["event"] == "worker process died, starting another"]


async def test_kill_9_of_one_worker_process(fault_run: Callable[..., FaultRun]) -> None:
    """SIGKILL of one of two worker processes mid-batch: the parent starts another, the jobs
    the dead one held run again, and nothing is lost."""
    run = fault_run("kill -9 of one worker process of two", prefetch=16, processes=2)
    await run.publish(JOBS // 2, sleep_s=0.01)
    worker = run.worker().start()
    await run.wait_consumers(2)
    await progress(run, JOBS // 8)
    victim = worker_processes(worker)[0]
    victim.kill()
    await wait_for(lambda: victim.pid not in {p.pid for p in worker_processes(worker)}, 10)
    await run.wait_consumers(2)  # another process took its place
    tally = await run.account()
    assert tally.duplicates <= 16  # at most the unacked deliveries of the killed process
    [died] = restarts_logged(worker)
    assert (died["child_pid"], died["signal"]) == (victim.pid, "SIGKILL")


async def test_kill_9_of_the_parent(fault_run: Callable[..., FaultRun]) -> None:
    """SIGKILL of the parent mid-batch: its worker processes stop consuming at once and drain,
    every job they had not finished goes back to the queue, and a new worker completes them."""
    run = fault_run("kill -9 of the parent of two worker processes", prefetch=16, processes=2)
    await run.publish(JOBS // 2, sleep_s=0.02)
    worker = run.worker().start()
    await run.wait_consumers(2)
    await progress(run, JOBS // 8)
    orphans = worker_processes(worker)
    worker.kill()

    async def none_consume() -> bool:
        return await consumers(run.connection, run.settings.queue) == 0

    await wait_for(none_consume, 5, "no consumer left on the queue")
    _, alive = await asyncio.to_thread(psutil.wait_procs, orphans, 15)
    assert not alive, "worker processes outlived their parent"
    channel = await run.connection.channel()
    # Whatever was not done is back in the queue: the processes drained and acked what they ran.
    assert await depth(channel, run.settings.queue) == len(run.published) - len(run.done())
    await channel.close()
    await run.start_worker(processes=1)
    tally = await run.account()
    assert tally.duplicates == 0


async def test_handler_crashing_its_process_on_import(
    fault_run: Callable[..., FaultRun], tmp_path: Path
) -> None:
    """A handler whose import crashes the process: the parent starts its processes again with
    waits that grow, /healthz answers 503, and no job is taken; once the import works again
    every job completes."""
    broken = tmp_path / "dependency-missing"
    broken.touch()
    port = free_port()
    run = fault_run(
        "handler crashes its process on import",
        handler="tests.crashing_handler:handle",
        processes=2,
        http_port=port,
    )
    ids = await run.publish(50, sleep_s=0.01)
    worker = run.worker({"TEST_CRASH_ON_IMPORT": str(broken)}).start()
    async with statuses_seen(port, "/healthz") as seen:
        await wait_for(lambda: 503 in seen, 30, "/healthz 503 in the crash loop")
        waits = [line["restart_in_s"] for line in restarts_logged(worker)]
        assert max(waits) >= 1.0, waits  # the parent backs off
        assert worker.alive
        channel = await run.connection.channel()
        assert await depth(channel, run.settings.queue) == len(ids)  # nothing taken, nothing lost
        await channel.close()
        broken.unlink()
        await run.wait_consumers(2, timeout_s=60)
        # Healthy again once a process of each place has lived STABLE_S.
        await wait_for(lambda: answers(port, "/healthz", 200), 30, "/healthz 200 again")
    await run.account()


async def test_handler_crashing_its_process_at_every_job(
    fault_run: Callable[..., FaultRun],
) -> None:
    """A handler that kills its process at every job: the parent backs off, /healthz answers
    503, and each job ends in the failed queue as poison; none is lost."""
    port = free_port()
    # Two jobs within one prefetch travel together: each death sends both to the other process.
    run = fault_run(
        "handler crashes its process at every job", prefetch=2, processes=2, http_port=port
    )
    poison = await run.publish(2, poison=True)
    worker = run.worker()
    async with statuses_seen(port, "/healthz") as seen:
        worker.start()
        await run.until_settled(timeout_s=110)
        assert 503 in seen
    await run.account(expected_failed=set(poison))
    assert set(run.failed.values()) == {"poison"}
    waits = [line["restart_in_s"] for line in restarts_logged(worker)]
    assert max(waits) >= 1.0, waits


async def test_worker_processes_wedged_holding_the_gil(
    fault_run: Callable[..., FaultRun],
) -> None:
    """Two jobs whose sync handler holds the GIL in C for 60 s on its first run, among 600 that
    work, on two processes: the parent kills each process they wedge within the handler
    timeout + 10 s of its last beat, /readyz answers 503 meanwhile, and every job completes, the
    two wedging ones on their second run."""
    port = free_port()
    timeout_s = 2
    run = fault_run(
        "worker processes wedged holding the GIL",
        handler="tests.handlers:wedging",
        handler_timeout_s=timeout_s,
        prefetch=8,
        processes=2,
        http_port=port,
    )
    worker = run.worker().start()
    await run.wait_consumers(2)
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    async with statuses_seen(port, "/readyz") as seen:
        await run.publish(300, sleep_s=0.01)
        wedging = await run.publish(2, wedge_s=60)
        await run.publish(300, sleep_s=0.01)
        await run.until_settled(timeout_s=120)
    tally = await run.account()
    assert 503 in seen
    assert set(wedging) <= set(run.done())
    killed = [e for e in worker.events() if e["event"].startswith("worker process stopped making")]
    # Two wedging jobs taken by one process before either holds the GIL wedge it once.
    assert 1 <= len(killed) <= 2, killed
    assert all(e["silent_s"] < timeout_s + 10 for e in killed), killed
    assert len(restarts_logged(worker)) == len(killed)
    assert tally.duplicates <= 8 * len(killed)  # at most the unacked jobs of the killed
