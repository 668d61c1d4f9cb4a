"""Faults while jobs wait on a ladder of their own (SPEC 21): their type's, or the job's own
retry-delays-ms header; these waits are held in the shared delay levels.

Every job is accounted for: 0 lost, and no cancelled job runs after its cancel."""

from collections.abc import Callable

import aio_pika

from tests.broker import Broker
from tests.faults.harness import FaultRun
from tests.handlers import LADDER_MS
from tests.support import close_connections, wait_for

# Per ladder: the fewest jobs that keep some of them in flight and the rest waiting.
JOBS = 150


def ladder_run(fault_run: Callable[..., FaultRun], name: str) -> FaultRun:
    """A run whose worker's own ladder (100 ms tiers) is not the one these jobs wait on."""
    run = fault_run(name, handler="tests.handlers:ladders", prefetch=32)
    # Their waits are in the shared levels, where only time tells that they are over.
    run.waits_in_levels = True
    return run


async def publish_both(run: FaultRun) -> tuple[list[str], list[str]]:
    """JOBS that fail once on their type's ladder, and JOBS of a type without one that fail
    once on their own ladder (the header), both waiting LADDER_MS."""
    typed = await run.publish(JOBS, type="laddered", fail=1)
    first = len(run.published)
    own = [f"own-ladder-{first + i}" for i in range(JOBS)]
    await run.publish_messages(
        [
            aio_pika.Message(
                b'{"type": "plain", "fail": 1}',
                message_id=message_id,
                headers={"retry-delays-ms": str(LADDER_MS)},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            for message_id in own
        ]
    )
    return typed, own


async def until_waiting(run: FaultRun, ids: list[str]) -> None:
    """Until every job's first attempt has started (and most wait out their ladder's delay)."""
    await wait_for(lambda: set(ids) <= run.started(), 60, f"{len(ids)} first attempts")


async def test_kill_9_while_jobs_wait_on_their_type_s_and_their_own_ladder(
    fault_run: Callable[..., FaultRun],
) -> None:
    """SIGKILL while jobs wait on their type's ladder and on their own: each comes back from
    the delay levels and completes on the next worker, on its second attempt."""
    run = ladder_run(fault_run, "kill -9, jobs on a type's and a job's ladder")
    typed, own = await publish_both(run)
    worker = await run.start_worker()
    await until_waiting(run, typed + own)
    worker.kill()
    await run.start_worker()
    tally = await run.account()
    assert tally.duplicates <= 32
    assert run.starts()[typed[-1]] >= 2  # it waited, then ran again


async def test_connection_drops_while_jobs_wait_on_their_type_s_and_their_own_ladder(
    fault_run: Callable[..., FaultRun], fault_broker: Broker
) -> None:
    """The broker closes the worker's connection while jobs wait on their type's ladder and
    on their own: the worker reconnects and every job completes."""
    run = ladder_run(fault_run, "connection drops, jobs on a type's and a job's ladder")
    typed, own = await publish_both(run)
    await run.start_worker()
    await until_waiting(run, typed + own)
    assert close_connections(run.settings.queue, "worker", fault_broker) >= 1
    tally = await run.account()
    assert tally.duplicates <= 32


async def test_cancels_of_jobs_waiting_on_a_ladder_hold_through_kill_9_and_a_drop(
    fault_run: Callable[..., FaultRun], fault_broker: Broker
) -> None:
    """Half the jobs waiting on their type's ladder and half of those on their own are
    cancelled; the worker is killed, and its successor loses its connection: no cancelled job
    runs again, every other completes."""
    run = ladder_run(fault_run, "cancel, jobs on a type's and a job's ladder")
    typed, own = await publish_both(run)
    worker = await run.start_worker()
    await until_waiting(run, typed + own)
    cancelled = typed[::2] + own[::2]
    await run.cancel(cancelled)
    worker.kill()
    await run.start_worker()
    assert close_connections(run.settings.queue, "worker", fault_broker) >= 1
    tally = await run.account()  # it fails on a cancelled job started after its cancel returned
    # A job whose wait ran out before the cancels had all gone out (3 s was too short for 31 of
    # 150 on a loaded machine) completed before its cancel; the successor honoured the others.
    assert tally.cancelled >= len(cancelled) // 2, "too few still waited to prove the kill"
