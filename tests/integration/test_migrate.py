"""`ricochet migrate` (SPEC 25) on a vhost that an earlier release really used.

The earlier release is this repository's last commit before the shared waiting objects, run from
its history: its worker and commands leave a waiting job in Q's own delay levels and a cancel in
Q.cancels. migrate refuses while that worker is connected; then it moves the cancel and keeps the
levels while they hold jobs; the job runs once, the cancelled one never, and a second migrate
retires the levels and records that nothing is left. Each test has a vhost of its own: migrate
acts on the whole vhost."""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection
from ricochet import Job
from ricochet.broker.legacy import is_migrated, older_workers_connected
from ricochet.broker.management import open_api, vhost
from ricochet.names import DELAY_LEVELS, SHARED, Names

from tests.broker import BROKER
from tests.support import (
    ROOT,
    StartWorker,
    exists,
    make_settings,
    ricochet_env,
    run_cli,
    spawn,
    wait_for,
)

# The last commit with per-queue delay levels and cancel stores (SPEC 18 came after it).
EARLIER = "2f4e776"
# The earlier release's default first retry delay, which its worker declared the tiers with:
# this version's worker keeps the shape (the tiers hold no job to keep an older delay for).
EARLIER_DELAY_MS = 30_000
# The two jobs' delay: they must still be in the old levels when migrate runs, after five CLI
# runs and two workers' starts (over 30 s on a loaded host).
DUE_S = 60


@pytest.fixture(scope="module")
def earlier_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The earlier release's package, from the repository's history."""
    where = tmp_path_factory.mktemp("earlier")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", EARLIER, "app"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where / "app"


def earlier_env(app: Path, url: str, queue: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RICOCHET_")}
    env.update(
        PYTHONPATH=str(app),
        PYTHONUNBUFFERED="1",
        RICOCHET_AMQP_URL=url,
        RICOCHET_QUEUE=queue,
        RICOCHET_MANAGEMENT_URL=BROKER.management_url,
        RICOCHET_HTTP_PORT="0",
    )
    return env


def earlier(args: list[str], env: dict[str, str]) -> str:
    """Run one command of the earlier release; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "ricochet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(env["PYTHONPATH"]).parent,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def held_in_levels(connection: AbstractConnection, queue: str) -> int:
    channel = await connection.channel()
    try:
        total = 0
        for k in range(DELAY_LEVELS):
            level = await channel.declare_queue(Names(queue).delay(k), passive=True)
            total += level.declaration_result.message_count or 0
        return total
    finally:
        await channel.close()


async def older_listed(url: str) -> bool:
    """Whether the management API lists a worker of an earlier version (it lists a new
    connection a few seconds late): migrate refuses by that list."""
    async with open_api(BROKER.management_url, url) as api:
        return await older_workers_connected(api, vhost(url)) > 0


def migrate(url: str, queue: str, *args: str) -> tuple[int, dict[str, Any]]:
    """Run this version's `ricochet migrate --json`: its exit code, and its JSON (or stderr)."""
    done = run_cli(["migrate", "--json", *args], ricochet_env(make_settings(queue, amqp_url=url)))
    return done.returncode, json.loads(done.stdout) if done.stdout.startswith("{") else {
        "stderr": done.stderr
    }


@pytest.mark.timeout(300)  # CLI runs and a job due a minute out: minutes when loaded
async def test_migrate_moves_what_an_earlier_release_left(
    earlier_app: Path, start_worker: StartWorker, queue_name: str
) -> None:
    ran: list[tuple[str | None, int]] = []

    async def handler(job: Job) -> None:
        ran.append((job.message_id, job.attempt))

    n = Names(queue_name)
    async with BROKER.scratch_vhost() as url:
        env = earlier_env(earlier_app, url, queue_name)
        old_worker = spawn(["worker"], env, earlier_app.parent / "worker.log")
        try:
            async with await aio_pika.connect(url) as connection:
                await wait_for(lambda: exists(connection, n.delay(0)), 30, "the earlier topology")
                for message_id in ("waiting", "cancelled"):
                    earlier(
                        ["publish", "--delay", str(DUE_S), "--message-id", message_id, "{}"], env
                    )
                earlier(["cancel", "cancelled"], env)
                await wait_for(
                    lambda: held_in_levels(connection, queue_name), 30, "jobs in the old levels"
                )
                await wait_for(lambda: older_listed(url), 30, "the API to list the earlier worker")
                code, refused = migrate(url, queue_name)
                assert code == 1
                assert "worker(s) of an earlier ricochet are connected" in str(refused["stderr"])
                assert await exists(connection, n.cancels)
        finally:
            old_worker.terminate()
            assert old_worker.wait(30) == 0

        async def older_gone() -> bool:  # the API lists connections a few seconds late
            return not await older_listed(url)

        # Upgraded: this version's worker declares the shared store, and honours Q.cancels.
        first = await start_worker(handler, amqp_url=url, retry_delay_ms=EARLIER_DELAY_MS)
        await wait_for(older_gone, 60, "the API to show the earlier worker gone")
        code, moved = migrate(url, queue_name)
        assert code == 1, moved  # the levels still hold the two jobs
        assert "steps" in moved, moved
        steps = {step["what"]: step for step in moved["steps"]}
        assert steps["cancel store"]["done"], moved
        assert "1 cancel(s) moved" in steps["cancel store"]["detail"]
        assert not steps["delay levels"]["done"]
        await first.stop()
        # A start after it finds the cancel in the shared store alone: Q.cancels is gone.
        worker = await start_worker(handler, amqp_url=url, retry_delay_ms=EARLIER_DELAY_MS)
        try:
            await wait_for(lambda: ("waiting", 1) in ran, DUE_S + 30, "the waiting job")
            await wait_for(lambda: worker.count("cancelled") == 1, 20, "the cancelled job")

            async def all_done() -> bool:  # the API's figures lag the levels' emptying
                return migrate(url, queue_name)[0] == 0

            await wait_for(all_done, 30, "migrate to retire the emptied levels")
            async with await aio_pika.connect(url) as connection:
                assert await is_migrated(connection)
                assert not await exists(connection, n.cancels)
                for k in range(DELAY_LEVELS):
                    assert not await exists(connection, n.delay(k))
        finally:
            await worker.stop()  # before its vhost goes
    assert ran == [("waiting", 1)]


async def test_migrate_deletes_the_record_of_retries_an_earlier_release_kept() -> None:
    """Earlier releases recorded each retry's reason in the stream ricochet.retries (the journal
    holds it now): a dry run says it would go, a run deletes it and records the vhost migrated."""
    async with BROKER.scratch_vhost() as url, await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        stream = {"x-queue-type": "stream", "x-max-age": "2D"}
        await channel.declare_queue(SHARED.retries, durable=True, arguments=dict(stream))
        code, dry = migrate(url, "jobs", "--dry-run")
        assert code == 0, dry
        assert {s["what"]: s["detail"] for s in dry["steps"]} == {
            "record of retries": "would be deleted"
        }
        assert await exists(connection, SHARED.retries)
        code, done = migrate(url, "jobs")
        assert code == 0, done
        steps = {s["what"]: s for s in done["steps"]}
        assert steps["record of retries"]["done"], done
        assert not await exists(connection, SHARED.retries)
        assert await is_migrated(connection)
