"""Faults of the monitor's index of the journal (SPEC 26): the monitor killed with kill -9 while
it builds its index, and its API asked while the broker is stopped. The index is memory only:
a new monitor builds it again from the journal, and one that lost the broker answers from what
it holds and goes on reading once the broker is back. Every job id is accounted for, as the
workers ran it and as the index shows it."""

import asyncio
import json
import subprocess
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.broker import BROKER
from tests.faults.harness import FaultRun, progress
from tests.faults.node import Node
from tests.support import answers, free_port, ricochet_env, spawn, wait_for

JOBS = 200


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        body: dict[str, Any] = json.loads(answer.read())
        return body


async def indexed(base: str, queue: str) -> tuple[dict[str, str], bool]:
    """Every job of the queue in the monitor's index, by id, with its state; and whether the
    index said it was complete."""
    states: dict[str, str] = {}
    cursor = ""
    while True:
        listed = await asyncio.to_thread(
            _get, f"{base}/api/jobs?queue={queue}&limit=500{cursor and f'&before={cursor}'}"
        )
        states.update({row["message_id"]: row["state"] for row in listed["jobs"]})
        if listed["next"] is None:
            return states, listed["complete"]
        cursor = listed["next"]


async def stopped(monitor: "subprocess.Popen[str]") -> None:
    """SIGTERM, and the monitor's clean exit."""
    monitor.terminate()
    assert await asyncio.to_thread(monitor.wait, 30) == 0


def all_succeeded(base: str, queue: str, ids: list[str]) -> Callable[[], Any]:
    async def check() -> bool:
        try:
            states, complete = await indexed(base, queue)
        except OSError:
            return False
        return complete and all(states.get(m) == "succeeded" for m in ids)

    return check


async def test_the_monitor_killed_while_it_builds_its_index(
    fault_run: Callable[..., FaultRun],
) -> None:
    """Jobs run, then a monitor starts and is killed with kill -9 as soon as it answers, while
    it reads the journal; a second monitor builds the index again and shows every job
    succeeded."""
    run = fault_run("monitor kill -9 while it builds its index")
    ids = await run.publish(JOBS)
    await run.start_worker()
    await progress(run, JOBS)
    port = free_port()
    env = ricochet_env(run.settings, RICOCHET_HTTP_PORT=str(port))
    first = spawn(["monitor"], env, run.tmp_path / "monitor-1.log")
    await wait_for(lambda: answers(port, "/healthz", 200), 30, "the first monitor's port")
    first.kill()
    await asyncio.to_thread(first.wait, 30)
    second = spawn(["monitor"], env, run.tmp_path / "monitor-2.log")
    try:
        await wait_for(lambda: answers(port, "/healthz", 200), 30, "the second monitor's port")
        base = f"http://127.0.0.1:{port}"
        await wait_for(all_succeeded(base, run.settings.queue, ids), 60, "every job indexed")
    finally:
        await stopped(second)
    await run.account()


@pytest.mark.skipif(
    BROKER.private,
    reason="restarts its broker: runs on the fault suite's private node only (make faults), "
    "never on a broker of the matrix, which others may be using",
)
async def test_the_index_asked_while_the_broker_is_stopped(
    fault_run: Callable[..., FaultRun], node: Node
) -> None:
    """With the index built, `rabbitmqctl stop_app` for a few seconds: the API answers from
    memory meanwhile (every job of before, succeeded), and once the broker is back the index
    reads on: jobs run after the restart show succeeded too."""
    run = fault_run("index asked while the broker is stopped")
    before = await run.publish(JOBS // 2)
    await run.start_worker()
    await progress(run, len(before))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = ricochet_env(run.settings, RICOCHET_HTTP_PORT=str(port))
    monitor = spawn(["monitor"], env, run.tmp_path / "monitor.log")
    try:
        await wait_for(lambda: answers(port, "/healthz", 200), 30, "the monitor's port")
        await wait_for(all_succeeded(base, run.settings.queue, before), 60, "the jobs before")
        await asyncio.to_thread(node.ctl, "stop_app")
        try:
            states, _ = await indexed(base, run.settings.queue)
            assert {states.get(m) for m in before} == {"succeeded"}
            asked = await asyncio.to_thread(_get, f"{base}/api/jobs/{before[0]}")
            assert asked["state"] == "succeeded"
        finally:
            await asyncio.to_thread(node.ctl, "start_app")
        await run.reconnect()
        after = await run.publish(JOBS // 2)
        await progress(run, JOBS)
        await wait_for(all_succeeded(base, run.settings.queue, after), 90, "the jobs after")
    finally:
        await stopped(monitor)
    await run.account()
