"""The replay procedures with the stock tools, run exactly as docs/stock-tools.md writes them."""

import os
import shlex
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.amqp import broker_version
from ricochet.broker.declare import declare
from ricochet.names import Names

from tests.broker import BROKER
from tests.docs_procedure import run_procedure
from tests.integration.failures import publish_failed
from tests.recorder import Recorder
from tests.support import ROOT, StartWorker, depth, make_settings, take, wait_for

PAGE = ROOT / "docs" / "stock-tools.md"


async def run(name: str, queue: str, cwd: Path) -> None:
    """Run the page's procedure NAME for queue in cwd, the folder of the tools it calls, which
    come first on PATH."""
    env = {
        **os.environ,
        "RICOCHET_QUEUE": queue,
        "VHOST": urllib.parse.quote(BROKER.vhost, safe=""),
        "PATH": f"{cwd}:{os.environ['PATH']}",
    }
    await run_procedure(PAGE, name, env, cwd)


def on_path(folder: Path, name: str, command: list[str]) -> Path:
    """A command `name` in folder that runs `command` with its arguments: the tools, pointed at
    the broker under test as a user's configuration would."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    program = shutil.which(command[0]) or command[0]
    script.write_text(f'#!/bin/sh\nexec {shlex.join([program, *command[1:]])} "$@"\n')
    script.chmod(0o755)
    return folder


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """A folder for PATH with rabbitmqctl for the broker under test, in the tests' vhost."""
    return on_path(tmp_path / "bin", "rabbitmqctl", [*BROKER.ctl, "-p", BROKER.vhost])


def management_port() -> int:
    return urllib.parse.urlsplit(BROKER.management_url).port or 15672


@pytest.fixture
def rabbitmqadmin(tools: Path, connection: AbstractConnection) -> Path:
    """rabbitmqadmin v1, downloaded from the broker's management plugin, on PATH. RabbitMQ 4.3
    no longer serves it, as docs/stock-tools.md says: the v1 procedure is not for those brokers."""
    url = urllib.parse.urljoin(BROKER.management_url, "cli/rabbitmqadmin")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            (tools / "rabbitmqadmin.py").write_bytes(response.read())
    except urllib.error.HTTPError as error:
        version = broker_version(connection)
        if error.code != 404 or version is None or version < (4, 3):
            raise
        pytest.skip(f"RabbitMQ {version} does not serve rabbitmqadmin v1 (the docs: use v2)")
    port = management_port()
    # The broker's user: guest on a local broker, the stack's own on a compose one.
    broker = urllib.parse.urlsplit(BROKER.amqp_url)
    user = ["-u", urllib.parse.unquote(broker.username or "guest")]
    user += ["-p", urllib.parse.unquote(broker.password or "guest")]
    return on_path(
        tools,
        "rabbitmqadmin",
        ["python3", str(tools / "rabbitmqadmin.py"), "-P", str(port), "-V", BROKER.vhost, *user],
    )


@pytest.fixture
def rabbitmqadmin_v2(tools: Path) -> Path:
    """rabbitmqadmin v2 (Debian's rabbitmqadmin-ng, which make test-brokers provides) on PATH,
    talking to the broker under test."""
    command = os.environ.get("RICOCHET_TEST_RABBITMQADMIN_V2")
    if not command:
        pytest.skip("no rabbitmqadmin v2 here: make test-brokers runs this test on every broker")
    where = ["--host", "127.0.0.1", "--port", str(management_port()), "--vhost", BROKER.vhost]
    return on_path(tools, "rabbitmqadmin", [*shlex.split(command), *where])


async def test_rabbitmqadmin_moves_one_job_back_with_a_full_budget(
    queue_name: str,
    connection: AbstractConnection,
    channel: AbstractChannel,
    start_worker: StartWorker,
    rabbitmqadmin: Path,
) -> None:
    """The rabbitmqadmin procedure of docs/stock-tools.md takes the oldest copy off Q.failed and
    puts the job on Q with its body and properties; the worker handles it as attempt 1 of a full
    budget."""
    names = Names(queue_name)
    recorder = Recorder()
    await declare(connection, make_settings(queue_name, max_retries=2))
    await publish_failed(channel, queue_name, "m1", ValueError("no rows"))
    await publish_failed(channel, queue_name, "m2", ValueError("no rows"))
    await run("rabbitmqadmin-one", queue_name, rabbitmqadmin)
    assert await depth(channel, names.failed) == 1
    await start_worker(recorder, max_retries=2)
    await wait_for(lambda: "m1" in recorder.succeeded, 20, "the job to be handled")
    first = recorder.seen["m1"][0]
    assert (first.attempt, first.max_attempts) == (1, 3)
    assert first.headers["failed-reason"] == "ValueError: no rows"  # rides along, harmless
    assert "x-delivery-count" not in first.headers or first.headers["x-delivery-count"] == 0
    kept = await take(channel, names.failed, 1)
    assert kept[0].message_id == "m2"


@pytest.mark.parametrize(
    ("name", "tool", "shovel", "moves"),
    [
        ("shovel-all", "tools", "replay-{q}", 5),
        ("rabbitmqadmin-v2-all", "rabbitmqadmin_v2", "replay-{q}", 5),
        ("rabbitmqadmin-v2-one", "rabbitmqadmin_v2", "replay-one-{q}", 1),
    ],
)
async def test_shovel_moves_failed_jobs_back(
    request: pytest.FixtureRequest,
    queue_name: str,
    connection: AbstractConnection,
    channel: AbstractChannel,
    name: str,
    tool: str,
    shovel: str,
    moves: int,
) -> None:
    """The shovel procedures of docs/stock-tools.md (rabbitmqctl, rabbitmqadmin v2) move the
    oldest copies of Q.failed to Q, all of them or one, body and properties intact, and remove
    themselves."""
    path: Path = request.getfixturevalue(tool)
    names = Names(queue_name)
    await declare(connection, make_settings(queue_name))
    ids = [f"m{i}" for i in range(5)]
    for message_id in ids:
        await publish_failed(channel, queue_name, message_id, ValueError("no rows"))
    shovel = shovel.format(q=queue_name)
    try:
        await run(name, queue_name, path)

        async def moved() -> bool:
            return await depth(channel, queue_name) == moves

        await wait_for(moved, 30, f"the shovel to move {moves} copies")
        await wait_for(lambda: shovel not in _parameters(), 30, "the shovel to delete itself")
    finally:
        _clear_shovel(shovel)
    assert await depth(channel, names.failed) == len(ids) - moves
    jobs = await take(channel, queue_name, moves)
    assert [str(m.message_id) for m in jobs] == ids[:moves]
    assert all(m.type == "report" and m.content_type == "application/json" for m in jobs)
    assert all(m.body == f'{{"id": "{m.message_id}"}}'.encode() for m in jobs)
    assert all("x-death" not in (m.headers or {}) for m in jobs)


def _parameters() -> str:
    return BROKER.rabbitmqctl("list_parameters", "-q")


def _clear_shovel(name: str) -> None:
    """Remove the shovel if a failed test left it behind (it deletes itself when done)."""
    BROKER.rabbitmqctl("clear_parameter", "shovel", name, check=False)
