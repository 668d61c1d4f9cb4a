"""Faults of the worker process: killed, stopped mid-batch, poisoned, stuck in a handler."""

from collections.abc import Callable

from tests.faults.harness import FaultRun, Supervisor, progress
from tests.support import wait_depth

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
    run = fault_run("retry settings changed between restarts", max_retries=3, retry_delay_ms=1500)
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
