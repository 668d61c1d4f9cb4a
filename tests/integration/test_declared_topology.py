"""The topology lives in the broker: commands that only read it need the broker's URL and the
queue's name, show the tiers the worker declared, and leave them as they are."""

import asyncio
import json
import os
import signal
from typing import Any

from aio_pika.abc import AbstractConnection
from ricochet.names import Names

from tests.broker import BROKER
from tests.support import api_queue, exists, free_port, make_settings, ricochet_env, run_cli, spawn


def bare_env(queue: str, **extra: str) -> dict[str, str]:
    """An environment with no RICOCHET_* setting but the broker's URL and the queue's name."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    env |= {"RICOCHET_AMQP_URL": BROKER.amqp_url, "RICOCHET_QUEUE": queue, **extra}
    env["PYTHONPATH"] = ricochet_env(make_settings(queue))["PYTHONPATH"]
    return env


async def tier_arguments(queue: str) -> dict[int, dict[str, Any]]:
    n = Names(queue)
    found = {k: await api_queue(n.tier(k), "arguments") for k in (1, 2, 3)}
    return {k: q["arguments"] for k, q in found.items() if q}


async def test_status_monitor_and_doctor_read_the_declared_tiers(
    connection: AbstractConnection, queue_name: str
) -> None:
    """A classic topology with two tiers of 1.5 s and 3 s, declared with the worker's settings;
    status, monitor and doctor run with nothing but URL and queue: status shows those tiers,
    the monitor leaves them as they are, doctor finds them consistent."""
    declared_with = make_settings(
        queue_name, queue_type="classic", max_retries=2, retry_delay_ms=1500
    )
    declared = run_cli(["topology"], ricochet_env(declared_with))
    assert declared.returncode == 0, declared.stderr
    before = await tier_arguments(queue_name)
    assert sorted(before) == [1, 2]

    status = run_cli(["status", "--json"], bare_env(queue_name))
    assert status.returncode == 0, status.stderr
    rows = {q["name"]: q for q in json.loads(status.stdout)["queues"]}
    n = Names(queue_name)
    assert rows[n.tier(1)]["delay_ms"] == 1500
    assert rows[n.tier(2)]["delay_ms"] == 3000
    assert n.tier(3) not in rows

    monitor = spawn(["monitor"], bare_env(queue_name, RICOCHET_HTTP_PORT=str(free_port())))
    stdout = monitor.stdout
    assert stdout is not None
    try:
        while True:
            text = await asyncio.wait_for(asyncio.to_thread(stdout.readline), 30)
            assert text, f"monitor exited: {monitor.stderr.read() if monitor.stderr else ''}"
            if json.loads(text).get("event") == "monitoring":
                break
    finally:
        monitor.send_signal(signal.SIGTERM)
        await asyncio.to_thread(monitor.communicate, timeout=30)
    assert monitor.returncode == 0
    assert await tier_arguments(queue_name) == before
    assert not await exists(connection, n.tier(3))

    doctor = run_cli(["doctor", "--json"], bare_env(queue_name, **management_env()))
    checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    # No worker consumes in this test: that check may fail (or warn while the management API
    # has no figures yet for the new queue), and no other.
    assert {name for name, c in checks.items() if c["status"] == "fail"} <= {"consumers"}
    assert checks["stale tiers"]["status"] == "ok", checks["stale tiers"]


def management_env() -> dict[str, str]:
    return {"RICOCHET_MANAGEMENT_URL": BROKER.management_url}
