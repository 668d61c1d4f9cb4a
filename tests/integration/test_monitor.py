"""The monitor against the real broker: logging, the webhook, rate limits and the threshold."""

import asyncio
import json
import math
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import aiohttp
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.declare import declare
from ricochet.broker.record import declare_recorded
from ricochet.monitor.backlog import failed_at_s
from ricochet.monitor.monitor import Monitor, run_monitor
from ricochet.names import Names
from ricochet.observe.metrics import Metrics
from ricochet.observe.webhook import Webhook
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from structlog.testing import capture_logs

from tests.integration.failures import publish_failed
from tests.support import (
    StartWebhook,
    answers,
    depth,
    free_port,
    http_status,
    make_settings,
    ricochet_env,
    spawn,
    take,
    wait_depth,
    wait_for,
)


class InProcessMonitor:
    """A Monitor running as a task of the test's event loop, with quick webhook retries."""

    def __init__(self, settings: Settings) -> None:
        self.metrics = Metrics(settings.queue)
        self.lifecycle = Lifecycle()
        self.webhook = Webhook(
            settings.alert_webhook_url, self.metrics, first_retry_s=0.05, max_retry_s=0.2
        )
        self.monitor = Monitor(settings, self.metrics, self.lifecycle, self.webhook)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> "InProcessMonitor":
        self.task = asyncio.create_task(self.monitor.serve())

        async def ready() -> bool:
            assert self.task is not None
            if self.task.done():
                self.task.result()
            return self.lifecycle.ready

        await wait_for(ready, 20, "the monitor to consume")
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.lifecycle.request_stop()
        await asyncio.wait_for(self.task, 30)

    def alerts(self, event: str) -> float:
        value: float | None = self.metrics.registry.get_sample_value(
            "ricochet_alerts_total", {"queue": self.metrics.queues[0], "event": event}
        )
        return value or 0.0


# The start_monitor fixture: `await start_monitor(**settings)`.
StartMonitor = Callable[..., Awaitable[InProcessMonitor]]


@pytest.fixture
async def start_monitor(
    queue_name: str, connection: AbstractConnection
) -> AsyncIterator[StartMonitor]:
    monitors: list[InProcessMonitor] = []

    async def start(**overrides: Any) -> InProcessMonitor:
        """A monitor beside a topology a worker has declared (its tiers are the worker's)."""
        settings = make_settings(queue_name, **overrides)
        await declare_recorded(connection, settings)
        monitor = await InProcessMonitor(settings).start()
        monitors.append(monitor)
        return monitor

    yield start
    for monitor in monitors:
        if monitor.task is not None and not monitor.task.done():
            await monitor.stop()


async def test_monitor_logs_each_failure_and_leaves_the_failed_queue(
    queue_name: str, channel: AbstractChannel
) -> None:
    """`ricochet monitor` logs one ERROR line per failure with its fields, removes nothing from
    Q.failed, and exits 0 on SIGTERM."""
    settings = make_settings(queue_name)
    proc = spawn(["monitor"], ricochet_env(settings))
    stdout = proc.stdout
    assert stdout is not None
    try:
        lines: list[dict[str, Any]] = []

        async def logged(event: str, n: int) -> None:
            while sum(1 for line in lines if line.get("event") == event) < n:
                text = await asyncio.wait_for(asyncio.to_thread(stdout.readline), 20)
                assert text, f"monitor exited: {proc.stderr.read() if proc.stderr else ''}"
                lines.append(json.loads(text))

        await logged("monitoring", 1)
        await publish_failed(channel, queue_name, "m1", ValueError("no rows"))
        await publish_failed(channel, queue_name, "m2", KeyError("id"), job_type="mail")
        await logged("job failed", 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=30)
        rc = proc.returncode
    failed = [line for line in lines if line.get("event") == "job failed"]
    assert [(f["level"], f["message_id"], f["type"], f["reason"]) for f in failed] == [
        ("error", "m1", "report", "ValueError: no rows"),
        ("error", "m2", "mail", "KeyError: 'id'"),
    ]
    assert all(f["kind"] == "permanent" and f["retry_count"] == 0 for f in failed)
    assert all(f["failed_at"].endswith("+00:00") for f in failed)
    assert rc == 0, stderr
    assert await depth(channel, Names(queue_name).failed) == 2
    kept = await take(channel, Names(queue_name).failed, 2)
    assert [m.message_id for m in kept] == ["m1", "m2"]


async def test_webhook_gets_job_failed_after_a_retry(
    queue_name: str, channel: AbstractChannel, webhook: StartWebhook, start_monitor: StartMonitor
) -> None:
    """A webhook that answers 500 first gets the job.failed alert again, and the delivered
    alert carries every field of the contract."""
    server = await webhook([500, 200])
    monitor = await start_monitor(alert_webhook_url=server.url, alert_failed_threshold=100)
    await publish_failed(channel, queue_name, "m1", ValueError("no rows"))

    async def delivered() -> bool:
        return monitor.alerts("job.failed") == 1

    await wait_for(delivered, 20, "the alert to be delivered")
    assert len(server.requests) == 2
    assert server.requests[0] == server.requests[1]
    body = server.requests[1]
    assert body == {
        "event": "job.failed",
        "queue": queue_name,
        "message_id": "m1",
        "type": "report",
        "reason": "ValueError: no rows",
        "kind": "permanent",
        "retry_count": 0,
        "failed_at": body["failed_at"],
        "suppressed": 0,
    }


async def test_repeated_failures_of_one_reason_are_rate_limited(
    queue_name: str, channel: AbstractChannel, webhook: StartWebhook, start_monitor: StartMonitor
) -> None:
    """A burst of one reason gives one alert at once and one when the interval has passed,
    counting the failures in between as suppressed; another reason is alerted on its own."""
    server = await webhook([200])
    await start_monitor(
        alert_webhook_url=server.url, alert_interval_s=1, alert_failed_threshold=100
    )
    for i in range(5):
        await publish_failed(channel, queue_name, f"a{i}", ValueError("no rows"))
    await publish_failed(channel, queue_name, "b0", KeyError("id"))

    async def both_edges() -> bool:
        return len(server.delivered("job.failed")) >= 3

    await wait_for(both_edges, 20, "the burst's two alerts")
    await asyncio.sleep(2.5)  # two more intervals: nothing else is due
    alerts = [(a["message_id"], a["suppressed"]) for a in server.delivered("job.failed")]
    assert sorted(alerts) == [("a0", 0), ("a4", 3), ("b0", 0)]


async def test_threshold_and_recovered_fire_once_each(
    queue_name: str, channel: AbstractChannel, webhook: StartWebhook, start_monitor: StartMonitor
) -> None:
    """Q.failed reaching the threshold alerts once, however long it stays there; falling back
    below alerts recovered once."""
    server = await webhook([200])
    monitor = await start_monitor(
        alert_webhook_url=server.url, alert_interval_s=1, alert_failed_threshold=3
    )
    for i in range(4):
        await publish_failed(channel, queue_name, f"m{i}", ValueError(f"error {i}"))

    async def alerted(event: str) -> bool:
        return monitor.alerts(event) == 1

    await wait_for(lambda: alerted("failed_queue.threshold"), 20, "the threshold alert")
    await asyncio.sleep(2.2)  # stays above for two more checks
    await take(channel, Names(queue_name).failed, 2)
    await wait_for(lambda: alerted("failed_queue.recovered"), 20, "the recovered alert")
    await asyncio.sleep(2.2)
    crossings = [
        (a["event"], a["threshold"])
        for a in server.requests
        if a["event"].startswith("failed_queue.")
    ]
    assert crossings == [("failed_queue.threshold", 3), ("failed_queue.recovered", 3)]
    assert server.delivered("failed_queue.threshold")[0]["depth"] >= 3
    assert server.delivered("failed_queue.recovered")[0]["depth"] == 2


async def test_an_event_is_acked_only_once_its_alert_is_out(
    queue_name: str, channel: AbstractChannel, webhook: StartWebhook, start_monitor: StartMonitor
) -> None:
    """A monitor stopped (or crashing) while the webhook has not taken a failure's alert leaves
    the event in Q.failed.events: the next monitor alerts on it, nothing is lost."""
    server = await webhook([200], hang_on="job.failed")
    monitor = await start_monitor(
        alert_webhook_url=server.url, alert_failed_threshold=100, shutdown_timeout_s=0.2
    )
    with capture_logs() as logs:
        await publish_failed(channel, queue_name, "m1", ValueError("no rows"))

        async def logged() -> bool:
            return any(log["event"] == "job failed" for log in logs)

        await wait_for(logged, 20, "the failure to be logged")
        await monitor.stop()
    # A quorum queue returns a closed channel's unacked messages a moment after the close.
    await wait_depth(channel, Names(queue_name).events, 1)
    await asyncio.sleep(0.5)
    assert await depth(channel, Names(queue_name).events) == 1


async def test_a_held_back_event_waits_for_the_alert_that_counts_it(
    queue_name: str, channel: AbstractChannel, webhook: StartWebhook, start_monitor: StartMonitor
) -> None:
    """Failures whose reasons differ only by ids are one reason: the first is alerted at once,
    the others held back; the latest stays unacked until the alert that counts it goes out,
    the ones before it are acked."""
    server = await webhook([200])
    monitor = await start_monitor(
        alert_webhook_url=server.url,
        alert_interval_s=30,
        alert_failed_threshold=100,
        shutdown_timeout_s=0.2,
    )
    with capture_logs() as logs:
        for i in range(4):
            await publish_failed(channel, queue_name, f"m{i}", KeyError(f"order-{1000 + i}"))

        async def all_logged_and_first_alerted() -> bool:
            logged = sum(1 for log in logs if log["event"] == "job failed")
            return logged == 4 and monitor.alerts("job.failed") == 1

        await wait_for(all_logged_and_first_alerted, 20, "four failures logged, one alerted")
        await monitor.stop()
    assert [a["message_id"] for a in server.requests] == ["m0"]
    await wait_depth(channel, Names(queue_name).events, 1)
    await asyncio.sleep(0.5)  # and no more come back
    assert await depth(channel, Names(queue_name).events) == 1
    (left,) = await take(channel, Names(queue_name).events, 1)
    assert left.message_id == "m3"


async def test_depth_alert_is_not_held_behind_job_alerts(
    queue_name: str, channel: AbstractChannel, webhook: StartWebhook, start_monitor: StartMonitor
) -> None:
    """A webhook that never answers job alerts does not delay the failed queue's threshold
    alert: it is delivered while the job alert still waits."""
    server = await webhook([200], hang_on="job.failed")
    await start_monitor(
        alert_webhook_url=server.url,
        alert_interval_s=1,
        alert_failed_threshold=1,
        shutdown_timeout_s=0.2,
    )
    await publish_failed(channel, queue_name, "m1", ValueError("no rows"))

    async def threshold_alerted() -> bool:
        return bool(server.delivered("failed_queue.threshold"))

    await wait_for(threshold_alerted, 8, "the threshold alert")


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_monitor_survives_a_dead_webhook(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """With nothing listening at the webhook and a delivery queue that overflows, every failure
    is still logged and consumed, alerts are dropped or given up with warnings (their events
    acked), and the monitor keeps running and stops cleanly."""
    settings = make_settings(
        queue_name,
        alert_webhook_url=f"http://127.0.0.1:{unused_port()}/hook",
        alert_failed_threshold=100,
    )
    await declare(connection, settings)
    metrics = Metrics(queue_name)
    lifecycle = Lifecycle()
    hook = Webhook(settings.alert_webhook_url, metrics, first_retry_s=0.05, queue_size=2)
    task = asyncio.create_task(Monitor(settings, metrics, lifecycle, hook).serve())
    with capture_logs() as logs:
        await wait_for(lambda: asyncio.sleep(0, lifecycle.ready), 20, "the monitor to consume")
        for i, word in enumerate(["one", "two", "three", "four", "five", "six"]):
            await publish_failed(channel, queue_name, f"m{i}", ValueError(f"error {word}"))

        async def consumed() -> bool:
            return sum(1 for log in logs if log["event"] == "job failed") == 6

        await wait_for(consumed, 20, "six failures logged")

        async def gave_up() -> bool:
            events = [log["event"] for log in logs]
            dropped = events.count("alert dropped: delivery queue full")
            return events.count("alert not delivered") == 6 - dropped

        await wait_for(gave_up, 20, "every alert queued to be given up")
        await asyncio.sleep(0.2)  # the events of alerts given up are acked
        assert not task.done()
        assert lifecycle.ready
        lifecycle.request_stop()
        await asyncio.wait_for(task, 30)
    events = [log["event"] for log in logs]
    assert "alert dropped: delivery queue full" in events
    assert "webhook failed, retrying" in events
    assert await depth(channel, Names(queue_name).events) == 0
    assert await depth(channel, Names(queue_name).failed) == 6


async def test_monitor_serves_http_with_its_alert_count(
    queue_name: str, channel: AbstractChannel, webhook: StartWebhook
) -> None:
    """The monitor answers /healthz and /readyz on RICOCHET_HTTP_PORT, and its /metrics counts
    the alerts the webhook accepted."""
    server = await webhook([200])
    port = free_port()
    settings = make_settings(
        queue_name, http_port=port, alert_webhook_url=server.url, alert_failed_threshold=100
    )
    monitor = asyncio.create_task(run_monitor(settings, Metrics(queue_name)))
    try:
        await wait_for(lambda: answers(port, "/readyz", 200), 20, "/readyz to answer 200")
        assert await http_status(port, "/healthz") == 200
        await publish_failed(channel, queue_name, "m1", ValueError("no rows"))

        async def counted() -> bool:
            return f'ricochet_alerts_total{{event="job.failed",queue="{queue_name}"}} 1.0' in (
                await metrics_text(port)
            )

        await wait_for(counted, 20, "the delivered alert on /metrics")
    finally:
        if not monitor.done():
            os.kill(os.getpid(), signal.SIGTERM)  # run_monitor's own handler: a graceful stop
        await asyncio.wait_for(monitor, 30)


async def metrics_text(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


async def test_monitor_exports_depths_and_the_oldest_failed_copy(
    start_monitor: StartMonitor, queue_name: str, channel: AbstractChannel
) -> None:
    """Every stage's depth and consumers are exported, and the oldest failed copy's failure time
    follows the failed queue: when its head is taken, it is the next copy's."""
    with capture_logs() as logs:
        monitor = await start_monitor(alert_interval_s=1)
        for i in range(3):
            await publish_failed(channel, queue_name, f"m{i}", ValueError("no rows"))
            await asyncio.sleep(0.2)  # distinct failure times
        await wait_for(lambda: len([e for e in logs if e["event"] == "job failed"]) == 3)
    failed_at = [failed_at_s(e["failed_at"], 0) for e in logs if e["event"] == "job failed"]
    q = {"queue": queue_name}

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = monitor.metrics.registry.get_sample_value(name, {**q, **labels})
        return value

    def oldest_is(at_s: float) -> bool:
        return sample("ricochet_failed_oldest_timestamp_seconds") == at_s

    # A depth check may have run while only the first copy was there: wait for one after all 3.
    await wait_for(
        lambda: sample("ricochet_queue_messages", stage="failed") == 3, 10, "a check after all 3"
    )
    await wait_for(lambda: oldest_is(failed_at[0]), 10, "the first failure as the oldest")
    assert sample("ricochet_queue_messages", stage="failed") == 3
    assert sample("ricochet_queue_messages", stage="tier_3") == 0
    assert sample("ricochet_queue_consumers", stage="main") == 0
    assert sample("ricochet_queue_consumers", stage="failed_events") == 1
    await take(channel, Names(queue_name).failed, 1)  # as a replay does: the head
    await wait_for(lambda: oldest_is(failed_at[1]), 10, "the second failure as the oldest")


async def test_depth_checks_keep_one_channel(
    start_monitor: StartMonitor,
    queue_name: str,
    connection: AbstractConnection,
    channel: AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The depth checks read on one channel, opened again only after the broker closed it (a
    missing queue): a tick costs no channel, and depths are read again once the failed queue is
    back."""
    opened: list[AbstractConnection] = []
    open_channel = aio_pika.Connection.channel

    def counted(self: aio_pika.Connection, *args: Any, **kwargs: Any) -> Any:
        if self is not connection:  # the monitor's, not the test's own
            opened.append(self)
        return open_channel(self, *args, **kwargs)

    monkeypatch.setattr(aio_pika.Connection, "channel", counted)
    monitor = await start_monitor(alert_interval_s=1)
    failed = Names(queue_name).failed

    def failed_depth() -> float | None:
        value: float | None = monitor.metrics.registry.get_sample_value(
            "ricochet_queue_messages", {"queue": queue_name, "stage": "failed"}
        )
        return value

    async def failed_copies_read(n: int) -> None:
        """Add a failed copy, and wait for a depth check to read the failed queue's n copies."""
        await publish_failed(channel, queue_name, f"m{n}", ValueError("no rows"))
        await wait_for(lambda: failed_depth() == n, 10, f"a depth check to read {n} copies")

    await wait_for(lambda: failed_depth() == 0, 10, "the first depth check")
    opened_at_first_check = len(opened)
    for n in (1, 2, 3):
        await failed_copies_read(n)
    assert len(opened) == opened_at_first_check, "a depth check opened a channel"

    await channel.queue_delete(failed)
    await wait_for(lambda: math.isnan(failed_depth() or 0), 10, "the failed queue read as missing")
    await declare(connection, make_settings(queue_name))
    await failed_copies_read(1)
    opened_once_back = len(opened)
    for n in (2, 3):
        await failed_copies_read(n)
    assert len(opened) == opened_once_back, "a depth check opened a channel"
