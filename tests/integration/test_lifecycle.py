"""Worker lifecycle: SIGTERM drain, dropped connections, changed settings across restarts."""

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import DeliveryError
from ricochet.broker.amqp import broker_version
from ricochet.broker.declare import declare
from ricochet.broker.plan import plan
from ricochet.names import Names
from ricochet.ops.doctor import read_state
from ricochet.service.process import Lifecycle, keep_connected
from structlog.testing import capture_logs

from tests.breakage import unbind_exchange
from tests.broker import BROKER
from tests.recorder import Recorder
from tests.support import (
    StartWorker,
    api_queue,
    close_connections,
    consumers,
    depth,
    exists,
    figures_known,
    journal,
    make_settings,
    publish,
    ricochet_env,
    spawn,
    take,
    wait_depth,
    wait_for,
)


async def test_sigterm_lets_the_job_in_flight_finish(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str, tmp_path: Path
) -> None:
    """SIGTERM mid-job: the job finishes and is acked, the next one is not started, exit code 0."""
    log = tmp_path / "journal"
    output = tmp_path / "worker.log"
    settings = make_settings(queue_name, handler="tests.handlers:slow", prefetch=1)
    with spawn(["worker"], ricochet_env(settings, TEST_JOURNAL=str(log)), output) as worker:
        await wait_for(lambda: consumers(connection, queue_name), 20, "the worker to consume")
        await publish(channel, queue_name, json.dumps({"sleep_s": 1.5}), message_id="inflight")
        await publish(channel, queue_name, json.dumps({"sleep_s": 0}), message_id="waiting")
        await wait_for(lambda: ("start", "inflight", 1) in journal(log), 10, "the job to start")
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.wait, 20)
    assert code == 0, output.read_text()
    assert '"event":"draining"' in output.read_text()
    assert journal(log) == [("start", "inflight", 1), ("done", "inflight", 1)]
    # The finished job was acked; the one never started is still in the queue.
    await wait_depth(channel, queue_name, 1)
    [left] = await take(channel, queue_name, 1)
    assert left.message_id == "waiting"
    assert await depth(channel, queue_name) == 0


async def test_connection_closed_by_broker_loses_nothing(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """The broker closes the worker's connection twice mid-stream; it reconnects and every job
    still succeeds at least once, with nothing left in any queue."""
    recorder = Recorder()
    worker = await start_worker(recorder, prefetch=10, max_retries=2, retry_delay_ms=20)
    ids = [f"j{i}" for i in range(150)]
    for message_id in ids:
        body = {"sleep_s": 0.01, "fail": 1 if message_id.endswith("7") else 0}
        await publish(channel, queue_name, json.dumps(body), message_id=message_id)
    for progress in (20, 40):

        def progressed(p: int = progress) -> bool:
            return len(recorder.succeeded) > p

        await wait_for(progressed, 20, "progress")
        assert await asyncio.to_thread(close_connections, queue_name) == 1
        await wait_for(lambda: worker.lifecycle.ready, 20, "the worker to reconnect")

    await wait_for(lambda: set(recorder.succeeded) == set(ids), 60, "every job to succeed")
    n = Names(queue_name)
    await wait_for(lambda: _empty(channel, n.queue), 20, "the main queue to empty")
    assert await depth(channel, n.failed) == 0


async def _empty(channel: AbstractChannel, queue: str) -> bool:
    return await depth(channel, queue) == 0


async def test_changed_retry_settings_between_restarts(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """Jobs wait in tier 1 while the worker restarts with fewer tiers and other delays: the busy
    tier keeps its delay until it drains, the stale tier goes, and every job ends in the failed
    queue exactly once."""
    n = Names(queue_name)
    # Tier 1 waits 10 s: all 20 are in it at once however slowly a busy machine fails them.
    first = await start_worker(Recorder(), max_retries=3, retry_delay_ms=10_000)
    # The next start deletes an empty tier once the management API shows it empty.
    await wait_for(figures_known(n.tier(2), n.tier(3)), 30, "the API's figures for the tiers")
    ids = [f"m{i}" for i in range(20)]
    for message_id in ids:
        await publish(channel, queue_name, json.dumps({"fail": "always"}), message_id=message_id)
    await wait_depth(channel, n.tier(1), len(ids))
    await first.stop()

    recorder = Recorder()
    await start_worker(recorder, max_retries=2, retry_delay_ms=100)
    assert not await exists(connection, n.tier(3))  # empty and no longer wanted: removed
    assert await depth(channel, n.tier(1)) == len(ids)  # busy: kept, jobs still waiting in it
    copies = await take(channel, n.failed, len(ids), timeout_s=30)
    assert sorted(m.message_id or "" for m in copies) == sorted(ids)
    await asyncio.sleep(0.5)
    assert await depth(channel, n.failed) == 0  # no duplicate arrived after the last copy
    for message_id in ids:
        assert recorder.attempts(message_id) == [2, 3]
    assert {c.headers["retry-count"] for c in copies} == {2}


async def test_new_delays_apply_to_empty_tiers_and_wait_for_busy_ones(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """Declaring again with other delays: the empty tier is redeclared with its new delay; the
    tier that holds a job keeps its old delay and the job, with a warning naming both."""
    n = Names(queue_name)
    before = make_settings(queue_name, max_retries=2, retry_delay_ms=60_000)
    after = make_settings(queue_name, max_retries=2, retry_delay_ms=100)
    await declare(connection, before)
    await publish(channel, n.tier(1), "{}", message_id="waiting")  # 60 s before it moves on
    with capture_logs() as logs:
        await declare(connection, after)

    # Declaring a queue with the arguments it has succeeds; with others, the broker refuses.
    ch = await connection.channel()
    version = broker_version(connection)
    await ch.declare_queue(
        n.tier(1), durable=True, arguments=plan(before, version).tiers[0].arguments
    )
    await ch.declare_queue(
        n.tier(2), durable=True, arguments=plan(after, version).tiers[1].arguments
    )
    await ch.close()
    assert await depth(channel, n.tier(1)) == 1
    events = {(log["event"], log["queue"]): log for log in logs if "queue" in log}
    kept = events[("tier keeps its old delay until it drains", n.tier(1))]
    assert (kept["log_level"], kept["wanted_delay_ms"], kept["messages"]) == ("warning", 100, 1)
    assert events[("tier redeclared", n.tier(2))]["delay_ms"] == 200


async def test_nacks_during_a_tier_change_are_never_dropped(
    connection: AbstractConnection, queue_name: str
) -> None:
    """While a start reconciles tier 1 (its delay changed), the dead-letters other workers'
    nacks make keep a route: each one published meanwhile to Q.dlx (as the broker does when
    it dead-letters) is routed somewhere, never returned as unroutable."""
    n = Names(queue_name)
    await declare(connection, make_settings(queue_name, max_retries=2, retry_delay_ms=60_000))
    publisher = await connection.channel(publisher_confirms=True, on_return_raises=True)
    dlx = await publisher.get_exchange(n.dlx, ensure=False)
    done = asyncio.Event()
    routed, returned = 0, 0

    async def nack_meanwhile() -> None:
        nonlocal routed, returned
        while not done.is_set():
            try:
                await dlx.publish(aio_pika.Message(b"{}"), routing_key=n.queue, mandatory=True)
                routed += 1
            except DeliveryError:
                returned += 1

    nacks = asyncio.create_task(nack_meanwhile())
    await asyncio.sleep(0.05)
    for delay_ms in (100, 60_000, 100):
        await declare(connection, make_settings(queue_name, max_retries=2, retry_delay_ms=delay_ms))
    done.set()
    await nacks
    await publisher.close()
    assert routed > 0
    assert returned == 0
    # The hold is gone once the declaration is over: a first dead-letter goes to tier 1 only.
    settings = make_settings(queue_name, max_retries=2, retry_delay_ms=100)
    state = await read_state(BROKER.management_url, BROKER.amqp_url, plan(settings))
    first = [b["destination"] for b in state.bindings if b["source"] == n.first_tier_exchange]
    assert first == [n.tier(1)]


@pytest.mark.parametrize(
    "change", [{"max_retries": 1}, {"retry_delay_ms": 70}], ids=["fewer-tiers", "other-delay"]
)
async def test_a_tier_with_dead_letters_in_flight_is_kept(
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
    change: dict[str, int],
) -> None:
    """A quorum tier whose expired jobs wait for their dead-letters to be confirmed (their route
    back to Q is gone, so they are neither ready nor unacked) is not deleted by a start that
    retires it or changes its delay: each job is still in the tier, or back in Q once the start
    has restored the route and the broker retried the dead-letter."""
    n = Names(queue_name)
    first: dict[str, Any] = {"queue_type": "quorum", "max_retries": 2}
    before = make_settings(queue_name, **first)
    await declare(connection, before)
    await unbind_exchange(channel, n.return_exchange, n.return_to_queue)
    ids = [f"m{i}" for i in range(3)]
    for message_id in ids:
        await publish(channel, n.tier(2), "{}", message_id=message_id)

    async def stranded() -> bool:
        return (await api_queue(n.tier(2))).get("messages_dlx") == len(ids)

    await wait_for(stranded, 30, "the tier's jobs to wait for their dead-letters")
    assert await depth(channel, n.tier(2)) == 0  # a passive declare counts ready jobs only

    await declare(connection, make_settings(queue_name, **(first | change)))
    # Neither deleted nor redeclared: the tier is there with its old arguments.
    kept = plan(before, broker_version(connection)).tiers[1].arguments
    assert (await api_queue(n.tier(2))).get("arguments") == kept

    async def accounted() -> bool:
        in_tier = (await api_queue(n.tier(2))).get("messages", 0)
        return bool(in_tier + await depth(channel, n.queue) == len(ids))

    await wait_for(accounted, 30, "every job in the tier or back in Q")


async def test_stuck_sync_handler_does_not_block_exit(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str, tmp_path: Path
) -> None:
    """A sync job still running when the drain timeout ends: the worker exits 0 anyway and the
    job goes back to the queue for another worker."""
    log, output = tmp_path / "journal", tmp_path / "worker.log"
    settings = make_settings(queue_name, handler="tests.handlers:stuck", shutdown_timeout_s=0.5)
    with spawn(["worker"], ricochet_env(settings, TEST_JOURNAL=str(log)), output) as worker:
        await wait_for(lambda: consumers(connection, queue_name), 20, "the worker to consume")
        await publish(channel, queue_name, "{}", message_id="stuck")
        await wait_for(lambda: ("start", "stuck", 1) in journal(log), 10, "the job to start")
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 15) == 0
    assert "jobs unfinished at shutdown go back to the queue" in output.read_text()
    await wait_depth(channel, queue_name, 1)


SLOW_S = 10


async def test_reconnect_while_a_redelivered_job_runs_keeps_one_consumer(
    start_worker: StartWorker,
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue_name: str,
) -> None:
    """A redelivered job is still running when the broker drops the connection: once it ends,
    the worker consumes the queue with one subscription, not one per connection it had."""
    recorder = Recorder()
    settings = make_settings(queue_name)
    await declare(connection, settings)
    # Long enough that the broker's close (rabbitmqctl, seconds on a loaded machine) lands while
    # it runs: a job done before the close is acked and never runs again.
    await publish(channel, queue_name, json.dumps({"sleep_s": SLOW_S}), message_id="slow")
    # Taken and given back unacked: the worker fetches it redelivered before it subscribes.
    held = await connection.channel()
    queue = await held.declare_queue(queue_name, passive=True)
    assert await queue.get(fail=False) is not None
    await held.close()
    worker = await start_worker(recorder, ready=False)
    await wait_for(lambda: recorder.seen["slow"], 10, "the redelivered job to start")
    assert await asyncio.to_thread(close_connections, queue_name) == 1
    await wait_for(lambda: worker.lifecycle.ready, 20, "the worker to reconnect")
    await wait_for(lambda: len(recorder.seen["slow"]) == 2, 20 + SLOW_S, "the job to run again")
    await asyncio.sleep(SLOW_S + 0.5)  # both runs of the job have ended
    assert await consumers(connection, queue_name) == 1


async def test_a_second_stop_ends_a_service_stuck_while_connected(queue_name: str) -> None:
    """A service stuck once connected (a declare the broker never answers): the first stop
    request cannot end it, the second does, and keep_connected returns."""
    lifecycle = Lifecycle()
    started = asyncio.Event()

    async def stuck(connection: AbstractConnection) -> None:
        started.set()
        await asyncio.Event().wait()

    settings = make_settings(queue_name)
    task = asyncio.create_task(keep_connected(lifecycle, settings, "tests stuck", stuck))
    await asyncio.wait_for(started.wait(), 20)
    lifecycle.request_stop("SIGTERM")
    await asyncio.sleep(0.5)
    assert not task.done()
    lifecycle.request_stop("SIGTERM")
    await asyncio.wait_for(task, 10)
