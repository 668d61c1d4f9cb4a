"""Faults of the broker: dropped connections, a restarted app, resource alarms, a failed queue
that refuses copies, and a webhook that never answers the monitor."""

import asyncio
import json
import re
import signal
from collections.abc import Callable

import pytest
from aio_pika.abc import AbstractConnection
from ricochet.broker.declare import declare

from tests.faults.harness import FaultRun, progress, publish_mixed
from tests.faults.node import Node
from tests.support import close_connections, depth, free_port, ricochet_env, spawn, wait_for


async def test_connections_closed_repeatedly_under_load(
    fault_run: Callable[..., FaultRun], node: Node
) -> None:
    """The broker closes the worker's connection eight times while jobs flow and wait in tiers:
    the worker reconnects each time and every job completes."""
    run = fault_run("broker closes the connection 8 times", prefetch=4)
    await run.start_worker()
    closed = 0
    while closed < 8:
        # Each round publishes the jobs it waits for: however many the worker ran while the last
        # close took its time (a CLI call of seconds), 50 more are always within reach.
        enough = len(run.done()) + 50
        await publish_mixed(run, 300, sleep_s=0.02)
        await progress(run, enough)
        closed += await asyncio.to_thread(
            close_connections, run.settings.queue, "worker", node.broker
        )
    await run.account()
    assert run.workers[0].starts == 1  # the same process reconnected every time


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_broker_app_stopped_and_started_under_load(
    fault_run: Callable[..., FaultRun], node: Node, queue_type: str
) -> None:
    """`rabbitmqctl stop_app` for two seconds while jobs flow and wait in tiers, then
    `start_app`: the worker waits, reconnects and every job completes."""
    run = fault_run(f"broker app stopped and started ({queue_type})", queue_type=queue_type)
    await publish_mixed(run, 2000)
    await run.start_worker()
    await progress(run, 400)
    await asyncio.to_thread(node.ctl, "stop_app")
    await asyncio.sleep(2)
    await asyncio.to_thread(node.ctl, "start_app")
    await run.reconnect()
    await run.account()
    assert "connection lost, reconnecting" in run.workers[0].output.read_text()


ALARMS = {
    "memory": (
        ("set_vm_memory_high_watermark", "0.0000001"),
        ("set_vm_memory_high_watermark", "0.4"),
    ),
    "disk": (("set_disk_free_limit", "100000GB"), ("set_disk_free_limit", "50MB")),
}


def worker_blocked(node: Node, queue: str) -> bool:
    """True when the broker has blocked the worker's connection (it tried to publish)."""
    listed = node.ctl("list_connections", "client_properties", "state", "--no-table-headers")
    return any(
        f"ricochet worker {queue} " in line and "blocked" in line for line in listed.splitlines()
    )


@pytest.mark.parametrize("alarm", ALARMS)
async def test_resource_alarm_under_load(
    fault_run: Callable[..., FaultRun], node: Node, alarm: str
) -> None:
    """A memory or disk alarm raised while jobs flow blocks the worker as soon as it publishes a
    failed copy; it waits, and once the alarm clears it resumes and loses nothing."""
    raise_alarm, clear_alarm = ALARMS[alarm]
    run = fault_run(f"{alarm} alarm raised and cleared under load")
    doomed: list[str] = []
    for _ in range(10):
        await run.publish(150, sleep_s=0.002)
        doomed += await run.publish(10, sleep_s=0.002, fail="permanent")
    await run.start_worker()
    await progress(run, 200)
    try:
        await asyncio.to_thread(node.ctl, *raise_alarm)
        await wait_for(
            lambda: asyncio.to_thread(worker_blocked, node, run.settings.queue),
            30,
            "the broker to block the worker",
        )
        stalled = len(run.done())
        await asyncio.sleep(2)
        assert len(run.done()) - stalled <= run.settings.prefetch  # it waits, at most its prefetch
    finally:
        await asyncio.to_thread(node.ctl, *clear_alarm)
    await run.account(expected_failed=set(doomed))


async def break_failed_queue(run: FaultRun, node: Node, refusal: str) -> None:
    """Make the broker refuse failed copies: no failed queue (returned), or a full one (nacked)."""
    channel = await run.connection.channel()
    if refusal == "unroutable":
        await channel.queue_delete(run.names.failed)
    else:
        pattern = f"^{re.escape(run.names.failed)}$"
        limit = json.dumps({"max-length": 0, "overflow": "reject-publish"})
        await asyncio.to_thread(
            node.ctl, "set_policy", "--apply-to", "queues", "refuse", pattern, limit
        )
    await channel.close()


async def repair_failed_queue(run: FaultRun, node: Node, refusal: str) -> None:
    if refusal == "unroutable":
        await declare(run.connection, run.settings)  # declaring makes the queue again
    else:
        await asyncio.to_thread(node.ctl, "clear_policy", "refuse")


@pytest.mark.parametrize("refusal", ["unroutable", "nacked"])
async def test_failed_copy_refused_by_the_broker(
    fault_run: Callable[..., FaultRun], node: Node, connection: AbstractConnection, refusal: str
) -> None:
    """While the broker refuses failed copies, the failing jobs stay unacked in the main queue
    (never acked, never lost, never announced) and the others carry on; once it accepts them
    again, each job is in the failed queue once, with its real reason."""
    # A quorum queue's length limit is applied a little late; a classic queue's refuses at once.
    queue_type = "classic" if refusal == "nacked" else "quorum"
    run = fault_run(f"failed copy {refusal} ({queue_type})", queue_type=queue_type)
    await run.publish(200, sleep_s=0.001)
    worker = await run.start_worker()
    await break_failed_queue(run, node, refusal)  # after the worker declared the topology
    doomed = await run.publish(10, fail="permanent")
    await progress(run, 200)

    def refusals() -> int:
        return worker.output.read_text().count("copy not confirmed, the job stays in the queue")

    await wait_for(lambda: refusals() >= 20, 30, "the copies to be refused and tried again")
    channel = await connection.channel()
    assert await depth(channel, run.names.events) == 0  # nothing announced that is not kept
    await channel.close()
    await repair_failed_queue(run, node, refusal)
    await run.account(expected_failed=set(doomed))
    assert set(run.failed.values()) == {"permanent"}


async def test_monitor_with_the_webhook_down_for_the_whole_run(
    fault_run: Callable[..., FaultRun], connection: AbstractConnection
) -> None:
    """Nothing listens at the webhook's address: the monitor still logs every failure, leaves the
    failed queue as it is, and stops cleanly on SIGTERM."""
    run = fault_run("webhook down for the whole run (monitor)")
    doomed = await run.publish(50, fail="permanent")
    monitor_settings = run.settings.model_copy(
        update={
            "alert_webhook_url": f"http://127.0.0.1:{free_port()}/alerts",
            "alert_interval_s": 1,
            "alert_failed_threshold": 10,
        }
    )
    output = run.tmp_path / "monitor.log"
    with spawn(["monitor"], ricochet_env(monitor_settings), output) as monitor:
        await run.start_worker()

        def logged() -> int:
            return output.read_text().count('"event":"job failed"')

        await wait_for(lambda: logged() >= len(doomed), 60, "the monitor to log every failure")
        channel = await connection.channel()
        assert await depth(channel, run.names.failed) == len(doomed)
        await channel.close()
        await wait_for(lambda: "alert not delivered" in output.read_text(), 60, "alerts to fail")
        assert monitor.poll() is None
        monitor.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(monitor.wait, 30) == 0
    assert logged() == len(doomed)
    await run.account(expected_failed=set(doomed))
