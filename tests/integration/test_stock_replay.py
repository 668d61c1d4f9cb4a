"""The README's replay procedures with the stock tools, run exactly as the README writes them."""

import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from app.topology import Names, declare
from tests.integration.failures import publish_failed
from tests.recorder import Recorder
from tests.support import ROOT, depth, make_settings, take, wait_for

RABBITMQADMIN_URL = "http://127.0.0.1:15672/cli/rabbitmqadmin"


def procedure(name: str) -> str:
    """The shell block that follows `<!-- procedure: NAME -->` in the README."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- procedure: {name} -->\n```sh\n(.*?)```", readme, re.DOTALL)
    assert found, f"README has no procedure {name}"
    return found.group(1)


def run_procedure(name: str, queue: str, cwd: Path) -> None:
    env = {**os.environ, "RICOCHET_QUEUE": queue, "PATH": f"{cwd}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", procedure(name)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def rabbitmqadmin(tmp_path: Path) -> Path:
    """rabbitmqadmin downloaded from the management plugin, on PATH in tmp_path."""
    script = tmp_path / "rabbitmqadmin"
    with urllib.request.urlopen(RABBITMQADMIN_URL, timeout=10) as response:
        script.write_bytes(response.read())
    script.chmod(0o755)
    return tmp_path


async def test_rabbitmqadmin_moves_one_job_back_with_a_full_budget(
    queue_name: str,
    connection: AbstractConnection,
    channel: AbstractChannel,
    start_worker: Any,
    rabbitmqadmin: Path,
) -> None:
    """The README's rabbitmqadmin procedure takes the oldest copy off Q.failed and puts the job
    on Q with its body and properties; the worker handles it as attempt 1 of a full budget."""
    names = Names(queue_name)
    recorder = Recorder()
    await declare(connection, make_settings(queue_name, max_retries=2))
    await publish_failed(channel, queue_name, "m1", ValueError("no rows"))
    await publish_failed(channel, queue_name, "m2", ValueError("no rows"))
    run_procedure("rabbitmqadmin-one", queue_name, rabbitmqadmin)
    assert await depth(channel, names.failed) == 1
    await start_worker(recorder, max_retries=2)
    await wait_for(lambda: "m1" in recorder.succeeded, 20, "the job to be handled")
    first = recorder.seen["m1"][0]
    assert (first.attempt, first.max_attempts) == (1, 3)
    assert first.headers["failed-reason"] == "ValueError: no rows"  # rides along, harmless
    assert "x-delivery-count" not in first.headers or first.headers["x-delivery-count"] == 0
    kept = await take(channel, names.failed, 1)
    assert kept[0].message_id == "m2"


async def test_shovel_moves_every_failed_job_back(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """The README's shovel procedure moves every copy of Q.failed to Q, body and properties
    intact, and removes itself when done."""
    names = Names(queue_name)
    await declare(connection, make_settings(queue_name))
    ids = [f"m{i}" for i in range(5)]
    for message_id in ids:
        await publish_failed(channel, queue_name, message_id, ValueError("no rows"))
    shovel = f"replay-{queue_name}"
    try:
        run_procedure("shovel-all", queue_name, ROOT)

        async def moved() -> bool:
            return await depth(channel, queue_name) == len(ids)

        await wait_for(moved, 30, "the shovel to move every copy")
        await wait_for(lambda: shovel not in _parameters(), 30, "the shovel to delete itself")
    finally:
        _clear_shovel(shovel)
    assert await depth(channel, names.failed) == 0
    jobs = await take(channel, queue_name, len(ids))
    assert sorted(str(m.message_id) for m in jobs) == ids
    assert all(m.type == "report" and m.content_type == "application/json" for m in jobs)
    assert all(m.body == f'{{"id": "{m.message_id}"}}'.encode() for m in jobs)
    assert all("x-death" not in (m.headers or {}) for m in jobs)


def _parameters() -> str:
    return subprocess.run(
        ["rabbitmqctl", "list_parameters", "-q"], capture_output=True, text=True, check=True
    ).stdout


def _clear_shovel(name: str) -> None:
    """Remove the shovel if a failed test left it behind (it deletes itself when done)."""
    subprocess.run(["rabbitmqctl", "clear_parameter", "shovel", name], capture_output=True)
