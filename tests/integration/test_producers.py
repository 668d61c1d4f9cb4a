"""The documentation's enqueueing examples (docs/examples), run as they stand against the broker
and a real worker: the front page's handler and enqueue, ricochet's Client in FastAPI, its
SyncClient in Flask, and three producers that know only the wire contract (pika, Node.js
amqplib, amqp-publish)."""

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Job
from ricochet.broker.declare import declare
from ricochet.broker.publish import confirming_channel
from ricochet.broker.schedule_store import Entry, read_states, write_state
from ricochet.names import Names

from tests.support import AMQP_URL, ROOT, StartWorker, make_settings, take, take_waiting, wait_for

EXAMPLES = ROOT / "docs" / "examples"
NODE_PROJECT = ROOT / "tests" / "node"


class Jobs:
    """The handler: records every attempt; a payload with "fail" fails transiently."""

    def __init__(self) -> None:
        self.attempts: list[Job] = []

    def __call__(self, job: Job) -> None:
        self.attempts.append(job)
        if job.payload.get("fail"):
            raise ConnectionError("the report service is down")

    def of(self, key: str) -> list[Job]:
        """Attempts of the job whose payload has this "key" field."""
        return [j for j in self.attempts if j.payload.get("key") == key]


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """amqplib from npm, as the lockfile pins it, installed once into the tests' own folder."""
    modules = NODE_PROJECT / "node_modules"
    if not (modules / "amqplib").exists():
        npm = shutil.which("npm")
        if npm is None:
            raise AssertionError("npm is needed to run the Node.js example")
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_PROJECT, check=True, timeout=300
        )
    return modules


def run_example(command: list[str], queue: str, **env: str) -> None:
    """Run an example program as a user would, pointed at the test's queue."""
    done = subprocess.run(
        command,
        env={**os.environ, "RICOCHET_AMQP_URL": AMQP_URL, "RICOCHET_QUEUE": queue, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# The command line of a producer example: job type, JSON payload, then, if given, the message id
# and the max-retries header.
def pika_command(job: list[str]) -> list[str]:
    return [sys.executable, str(EXAMPLES / "pika_producer.py"), *job]


def amqplib_command(job: list[str]) -> list[str]:
    return ["node", str(EXAMPLES / "amqplib_producer.js"), *job]


@pytest.mark.parametrize("command", [pika_command, amqplib_command], ids=["pika", "amqplib"])
async def test_a_foreign_producers_jobs_run(
    command: Callable[[list[str]], list[str]],
    queue_name: str,
    channel: AbstractChannel,
    start_worker: StartWorker,
    node_modules: Path,
) -> None:
    """A job runs as published; one that keeps failing lands in Q.failed with its headers after
    the retries its max-retries header allows; one without a message_id runs too."""
    jobs = Jobs()
    await start_worker(jobs, max_retries=3, retry_delay_ms=50)
    env = {"NODE_PATH": str(node_modules)}
    run_example(command(["report", '{"key": "ok"}', "ok-1"]), queue_name, **env)
    run_example(
        command(["report", '{"key": "bad", "fail": true}', "bad-1", "1"]), queue_name, **env
    )
    run_example(command(["report", '{"key": "anon"}']), queue_name, **env)

    [copy] = await take(channel, Names(queue_name).failed, 1)
    await wait_for(lambda: len(jobs.of("anon")) == 1, 20, "the job without a message_id")
    [ok] = jobs.of("ok")
    assert (ok.type, ok.message_id, ok.attempt, ok.content_type) == (
        "report",
        "ok-1",
        1,
        "application/json",
    )
    assert [(j.message_id, j.attempt, j.max_attempts) for j in jobs.of("bad")] == [
        ("bad-1", 1, 2),
        ("bad-1", 2, 2),
    ]
    [anon] = jobs.of("anon")
    assert (anon.type, anon.message_id, anon.attempt) == ("report", None, 1)

    assert (copy.message_id, copy.type, copy.delivery_mode) == ("bad-1", "report", 2)
    assert json.loads(copy.body) == {"key": "bad", "fail": True}
    headers = copy.headers or {}
    assert headers["max-retries"] == 1
    assert (headers["failed-kind"], headers["retry-count"]) == ("exhausted", 1)
    assert headers["failed-reason"] == "ConnectionError: the report service is down"


async def test_amqp_publish_jobs_run_without_type_or_message_id(
    queue_name: str, channel: AbstractChannel, start_worker: StartWorker
) -> None:
    """amqp-publish sets neither type nor message_id: the type comes from the body, the job
    runs with no message_id, and a failing one reaches Q.failed under an id of its own."""
    if shutil.which("amqp-publish") is None:
        raise AssertionError("amqp-publish is needed: make tools installs Debian's amqp-tools")
    jobs = Jobs()
    await start_worker(jobs, max_retries=3, retry_delay_ms=50)
    script = ["sh", str(EXAMPLES / "amqp_publish.sh")]
    run_example([*script, '{"type": "report", "key": "ok"}'], queue_name)
    run_example([*script, '{"type": "report", "key": "bad", "fail": true}'], queue_name)

    [copy] = await take(channel, Names(queue_name).failed, 1)
    [ok] = jobs.of("ok")
    assert (ok.type, ok.message_id, ok.attempt, ok.max_attempts) == ("report", None, 1, 2)
    assert [(j.message_id, j.attempt) for j in jobs.of("bad")] == [(None, 1), (None, 2)]
    assert copy.type is None
    assert json.loads(copy.body) == {"type": "report", "key": "bad", "fail": True}
    headers = copy.headers or {}
    assert headers["max-retries"] in (b"1", "1")  # a string header, as amqp-publish sends
    assert (headers["failed-kind"], headers["retry-count"]) == ("exhausted", 1)
    # The copy is published with an id, so that replay and the failed-queue commands name it.
    assert copy.message_id


def load_example(name: str) -> ModuleType:
    """Import an example module from its file, afresh (its module-level client reads the
    environment at import)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def client_env(queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RICOCHET_AMQP_URL", AMQP_URL)
    monkeypatch.setenv("RICOCHET_QUEUE", queue_name)


async def test_the_fastapi_example(
    queue_name: str, connection: AbstractConnection, start_worker: StartWorker, client_env: None
) -> None:
    """The app's lifespan opens the Client; a request enqueues the job, confirmed, which the
    worker runs with the id, type and retry budget the app gave it."""
    from fastapi.testclient import TestClient

    jobs = Jobs()
    await start_worker(jobs, max_retries=10)
    app = load_example("fastapi_app").app

    def request() -> tuple[int, dict[str, str]]:
        with TestClient(app) as http:  # runs the lifespan: the client connects and closes
            response = http.post("/invoices/42/send")
            return response.status_code, response.json()

    assert await asyncio.to_thread(request) == (202, {"job": "invoice-42-send"})
    await wait_for(lambda: len(jobs.attempts) == 1, 20, "the invoice job")
    [job] = jobs.attempts
    assert (job.type, job.message_id, job.payload) == (
        "invoice.send",
        "invoice-42-send",
        {"invoice_id": 42},
    )
    assert job.max_attempts == 6


async def test_the_flask_example(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, client_env: None
) -> None:
    """The module's SyncClient enqueues from a request, scheduled a minute ahead."""
    await declare(connection, make_settings(queue_name))
    example = load_example("flask_app")

    def request() -> tuple[int, Any]:
        response = example.app.test_client().post("/reports/r-7")
        return response.status_code, response.get_json()

    status, body = await asyncio.to_thread(request)
    await asyncio.to_thread(example.jobs.close)
    assert status == 202
    message = await take_waiting(channel, body["job"])
    assert (message.message_id, message.type) == (body["job"], "report")
    assert json.loads(message.body) == {"report_id": "r-7"}
    assert "run-at" in (message.headers or {})


async def test_the_front_page_example(
    queue_name: str, channel: AbstractChannel, start_worker: StartWorker, client_env: None
) -> None:
    """README.md's handler and enqueue (docs/examples/welcome.py): a welcome with an address
    runs and is acked; one without goes to the failed queue at once, as permanent, with the
    message id the enqueue chose."""
    example = load_example("welcome")
    worker = await start_worker(example.router)
    assert await example.sign_up(1, "ada@example.com") == "welcome-1"
    assert await example.sign_up(2, "no address") == "welcome-2"
    await wait_for(lambda: worker.count("succeeded") == 1, 20, "the welcome with an address")
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert copy.message_id == "welcome-2"
    assert copy.headers["failed-kind"] == "permanent"
    assert copy.headers["failed-reason"] == "PermanentError: no address: retrying cannot help"


async def test_the_maintenance_schedules_run(
    start_worker: StartWorker, connection: AbstractConnection, queue_name: str
) -> None:
    """docs/recurring.md's example (docs/examples/maintenance.py), the stale check every 15
    minutes and the relaunch of failed syncs every 30: a worker that starts after three of each
    were missed with no worker running enqueues the latest of each once, as the state recorded
    in the broker says, and runs them."""
    example = load_example("maintenance")
    now_ms = time.time_ns() // 1_000_000
    latest = {s.name: s.rule.at_or_before(now_ms) for s in example.router.schedules}
    # What the last leader recorded: three occurrences of each before the latest were enqueued.
    recorded = {
        s.name: Entry(latest[s.name] - 3 * s.rule.period_ms, 0) for s in example.router.schedules
    }
    channel = await confirming_channel(connection)
    await write_state(channel, queue_name, recorded)
    await channel.close()
    worker = await start_worker(example.router)
    await wait_for(lambda: worker.count("succeeded") == 2, 20, "both maintenance jobs")
    await asyncio.sleep(1)
    assert worker.count("succeeded") == 2
    for schedule in example.router.schedules:
        labels = {"queue": queue_name, "schedule": schedule.name}
        enqueued = worker.metrics.registry.get_sample_value(
            "ricochet_schedule_occurrences_total", labels
        )
        assert enqueued == 1
    states = (await read_states(connection, [queue_name]))[queue_name]
    assert {name: entry.last_ms for name, entry in states.items()} == latest
