"""The first hour (SPEC 27): `ricochet worker` as the README runs it, from the folder of the
handler, with the options a person types; commands that say one line when the broker is not
there; an application's script that prints only its own output."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.plan import PLAN_FIELDS
from ricochet.names import Names
from ricochet.settings import variable_name

from tests.support import (
    SPAWNED,
    depth,
    exists,
    log_events,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    wait_depth,
    wait_for,
)

# The console script that `pip install` puts beside the interpreter: what a user runs.
RICOCHET = Path(sys.executable).parent / "ricochet"
# A handler module as a newcomer writes it, in the folder they run the worker from.
HANDLER = """
from pathlib import Path

from ricochet import Job, Router

router = Router()


@router.handler("welcome.send")
def send(job: Job) -> None:
    Path("ran").write_text(job.message_id)
"""
CLOSED_PORT_URL = "amqp://guest:guest@127.0.0.1:1/"


def _user_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing into the repository."""
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


def _run(
    args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> "subprocess.CompletedProcess[str]":
    """Run a command to completion, its output captured."""
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _start(args: list[str], env: dict[str, str], cwd: Path) -> "subprocess.Popen[str]":
    with (cwd / "out.log").open("w") as log:
        proc = subprocess.Popen(
            [str(RICOCHET), *args],
            cwd=cwd,
            env=_user_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    SPAWNED.append(proc)
    return proc


def _ran(folder: Path) -> str | None:
    """What the handler wrote to ran, if it has made the file."""
    ran = folder / "ran"
    return ran.read_text() if ran.exists() else None


async def _runs_a_job(
    proc: "subprocess.Popen[str]", channel: AbstractChannel, folder: Path, queue: str
) -> None:
    """A job published to queue is run by the worker proc started in folder, which then stops."""
    log = folder / "out.log"
    await wait_for(lambda: '"consuming"' in log.read_text() or proc.poll() is not None, 60)
    assert proc.poll() is None, log.read_text()
    await publish(channel, queue, b"{}", type="welcome.send", message_id="first-job")
    # write_text makes the file before it writes to it: read until the id is there.
    await wait_for(lambda: _ran(folder) == "first-job", 30, "the job to write its id to ran")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, log.read_text()
    assert await depth(channel, Names(queue).failed) == 0


async def test_worker_imports_the_handler_from_the_current_folder(
    channel: AbstractChannel, queue_name: str, tmp_path: Path
) -> None:
    """`RICOCHET_HANDLER=welcome:router ricochet worker` (the console script) run in the folder
    that holds welcome.py imports it, and the job succeeds."""
    (tmp_path / "welcome.py").write_text(HANDLER)
    env = ricochet_env(make_settings(queue_name, handler="welcome:router"))
    proc = _start(["worker"], env, tmp_path)
    await _runs_a_job(proc, channel, tmp_path, queue_name)


async def test_worker_options_override_their_variables(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str, tmp_path: Path
) -> None:
    """--handler, --queues, --processes, --prefetch and --log-level beat the variables: a worker
    whose environment names a handler that does not exist, another queue, 3 processes and
    prefetch 1 runs the job of the options' queue with the options' handler, at DEBUG."""
    (tmp_path / "welcome.py").write_text(HANDLER)
    env = ricochet_env(
        make_settings(queue_name),
        RICOCHET_HANDLER="no.such.module:router",
        RICOCHET_QUEUES=f"{queue_name}.other",
        RICOCHET_PROCESSES="3",
        RICOCHET_PREFETCH="1",
        RICOCHET_LOG_LEVEL="ERROR",
    )
    options = ["--handler", "welcome:router", "--queues", queue_name, "--processes", "1"]
    options += ["--prefetch", "7", "--log-level", "debug"]
    proc = _start(["worker", *options], env, tmp_path)
    await _runs_a_job(proc, channel, tmp_path, queue_name)
    log = log_events((tmp_path / "out.log").read_text())
    assert any(line["level"] == "debug" for line in log)
    [consuming] = [line for line in log if line["event"] == "consuming"]
    assert (consuming["queue"], consuming["prefetch"]) == (queue_name, 7)
    assert "starting worker processes" not in {line["event"] for line in log}
    assert not await exists(connection, f"{queue_name}.other")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--handler", "welcome", "--handler 'welcome' is invalid: allowed module.path:attribute"),
        ("--queues", "a,a", "--queues is invalid: entry 'a': the queue is listed twice"),
        ("--processes", "0", "--processes '0' is invalid: allowed 1-256, or auto"),
        ("--prefetch", "0", "--prefetch '0' is invalid: allowed 1-65535"),
        ("--log-level", "loud", "--log-level 'LOUD' is invalid: allowed one of DEBUG, INFO"),
    ],
)
def test_an_invalid_worker_option_exits_2(
    queue_name: str, tmp_path: Path, option: str, value: str, message: str
) -> None:
    """An option out of bounds: exit 2 and one line naming the option, as for a variable."""
    env = _user_env(ricochet_env(make_settings(queue_name)))
    result = _run([str(RICOCHET), "worker", option, value], env, tmp_path)
    assert result.returncode == 2, result
    assert result.stderr.startswith(f"ricochet: {message}"), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_worker_help_lists_its_options() -> None:
    """`ricochet worker --help` names each option and the variable it overrides."""
    result = _run([str(RICOCHET), "worker", "--help"])
    assert result.returncode == 0, result
    for name in ("handler", "queues", "processes", "prefetch", "log-level"):
        assert f"--{name}" in result.stdout
        assert variable_name(name.replace("-", "_")) in result.stdout


@pytest.mark.timing  # within 10 s: a busy machine's Python start alone took 6 s
@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["topology"],
        ["publish", "{}"],
        ["cancel", "some-job"],
        ["replay"],
        ["failed", "list"],
        ["waiting"],
    ],
)
def test_a_command_says_in_one_line_that_the_broker_does_not_answer(
    queue_name: str, tmp_path: Path, command: list[str]
) -> None:
    """Against a closed port a command (every one but the waiting services) prints one line
    within 10 s, and exits 1."""
    env = _user_env(ricochet_env(make_settings(queue_name, amqp_url=CLOSED_PORT_URL)))
    started = time.monotonic()
    result = _run([str(RICOCHET), *command], env, tmp_path)
    took_s = time.monotonic() - started
    assert result.returncode == 1, result
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("ricochet: broker amqp://guest:***@127.0.0.1:1/ does not answer")
    assert took_s < 10


@pytest.mark.timing
async def test_doctor_says_in_one_line_that_the_broker_does_not_answer(
    connection: AbstractConnection, queue_name: str, tmp_path: Path
) -> None:
    """doctor against a broker that answers neither AMQP nor HTTP: one line within 10 s, exit 2
    (SPEC 13); with the API answering but not AMQP, a warning among its findings instead."""
    # No retry setting given: doctor reads the declared ones over AMQP, which does not answer.
    given_plan = {variable_name(name) for name in PLAN_FIELDS}
    down = make_settings(queue_name, amqp_url=CLOSED_PORT_URL)
    env = {k: v for k, v in _user_env(ricochet_env(down)).items() if k not in given_plan}

    def doctor(*args: str, **extra: str) -> "subprocess.CompletedProcess[str]":
        return _run([str(RICOCHET), "doctor", *args], {**env, **extra}, tmp_path)

    started = time.monotonic()
    result = await asyncio.to_thread(doctor, RICOCHET_MANAGEMENT_URL="http://127.0.0.1:1/")
    assert result.returncode == 2, result
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("ricochet: the management API at http://127.0.0.1:1/api/ is")
    assert time.monotonic() - started < 10
    half = await asyncio.to_thread(doctor, "--json")
    assert half.stderr == ""
    [found] = [c for c in json.loads(half.stdout)["checks"] if c["check"] == "declared settings"]
    assert found["status"] == "warn"
    assert "does not answer" in found["detail"]
    assert not await exists(connection, queue_name)


SCRIPT = """
import logging
import sys

from ricochet import SyncClient

if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.DEBUG, format="app-log %(name)s %(message)s")
print("before")
with SyncClient(sys.argv[2], sys.argv[3]) as jobs:
    print("enqueued", jobs.enqueue("welcome.send", {"to": "x"}, message_id="lib-1"))
"""


@pytest.mark.parametrize("logging_configured", [False, True])
async def test_an_applications_script_prints_only_its_own_output(
    channel: AbstractChannel, queue_name: str, tmp_path: Path, logging_configured: bool
) -> None:
    """A script enqueueing through the client prints what it prints, and no line of
    ricochet's, unless it configured logging itself: then ricochet's lines go through it."""
    settings = make_settings(queue_name)
    topology = await asyncio.to_thread(run_cli, ["topology"], ricochet_env(settings))
    assert topology.returncode == 0, topology
    (tmp_path / "script.py").write_text(SCRIPT)
    mode = "configured" if logging_configured else "bare"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    command = [sys.executable, "script.py", mode, settings.amqp_url, queue_name]
    result = await asyncio.to_thread(_run, command, env, tmp_path)
    assert result.returncode == 0, result
    assert result.stdout.splitlines() == ["before", "enqueued lib-1"]
    if logging_configured:
        assert "app-log ricochet.connection event='connected'" in result.stderr
    else:
        assert result.stderr == ""
    await wait_depth(channel, queue_name, 1)
