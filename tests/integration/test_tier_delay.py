"""A tier that keeps an older delay (it held jobs when the settings changed) is shown with the
delay the broker applies, everywhere, and is declared again with the new one once empty."""

import asyncio
import contextlib
import datetime as dt
import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker import redeclaring
from ricochet.broker.declare import declare
from ricochet.broker.record import declare_recorded
from ricochet.names import Names
from structlog.testing import capture_logs

from tests.broker import BROKER
from tests.support import (
    api_queue,
    consumers,
    done_ids,
    log_events,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    spawn,
    wait_for,
)

# What tier 1 waits when the worker starts (it holds a job then): long enough for the job to be
# there still once a worker process has started on a busy machine.
OLD_MS = 30_000
NEW_MS = 1_000  # what the worker's settings say


def _lines(output: Path) -> list[dict[str, Any]]:
    """The worker's whole JSON log lines so far."""
    return log_events(output.read_text()) if output.exists() else []


def _retried(output: Path, message_id: str) -> dict[str, Any] | None:
    for line in _lines(output):
        if line.get("event") == "job failed, retrying" and line.get("message_id") == message_id:
            return line
    return None


def _cli(args: list[str], env: dict[str, str]) -> str:
    done = run_cli([*args, "--json"], env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _tier_delays(env: dict[str, str]) -> dict[str, int | None]:
    """The delay of each queue as `ricochet status --json` shows it."""
    status = json.loads(_cli(["status"], env))
    return {row["name"]: row["delay_ms"] for row in status["queues"]}


def _waiting(env: dict[str, str]) -> list[dict[str, Any]]:
    """The rows of `ricochet waiting --json`, one JSON object a line."""
    return [json.loads(line) for line in _cli(["waiting"], env).splitlines()]


def _ttl_is(queue: str, ttl_ms: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        arguments = (await api_queue(queue, "arguments")).get("arguments") or {}
        return bool(arguments.get("x-message-ttl") == ttl_ms)

    return check


async def test_a_kept_tier_shows_its_delay_and_is_declared_again_once_empty(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str, tmp_path: Path
) -> None:
    """Tier 1 holds a job while a worker starts with a shorter delay: the retry log line,
    `status` and `waiting` show the delay tier 1 really has; once it is empty the worker declares
    it again with the new delay, says so, and the next retry waits that."""
    n = Names(queue_name)
    await declare_recorded(
        connection, make_settings(queue_name, max_retries=2, retry_delay_ms=OLD_MS)
    )
    await publish(channel, n.tier(1), "{}", message_id="parked")
    after = make_settings(
        queue_name, max_retries=2, retry_delay_ms=NEW_MS, handler="tests.handlers:flaky"
    )
    env = ricochet_env(after)
    output = tmp_path / "worker.log"
    with spawn(["worker"], env, output) as worker:
        try:
            await wait_for(lambda: consumers(connection, queue_name), 30, "the worker to consume")
            [kept] = [
                line
                for line in _lines(output)
                if line.get("event") == "tier keeps its old delay until it drains"
            ]
            assert (kept["queue"], kept["wanted_delay_ms"]) == (n.tier(1), NEW_MS)
            await publish(channel, queue_name, json.dumps({"fail": 1}), message_id="first")
            await wait_for(lambda: _retried(output, "first"), 20, "the first retry")
            retried = _retried(output, "first")
            assert retried is not None
            assert (retried["tier"], retried["delay_ms"]) == (n.tier(1), OLD_MS)
            failed_at = dt.datetime.fromisoformat(retried["timestamp"]).timestamp()

            tiers = await asyncio.to_thread(_tier_delays, env)
            assert (tiers[n.tier(1)], tiers[n.tier(2)]) == (OLD_MS, 2 * NEW_MS)
            rows = await asyncio.to_thread(_waiting, env)
            looked = time.time() - failed_at
            assert [r["message_id"] for r in rows].count("first") == 1, (looked, rows)
            [row] = [r for r in rows if r["message_id"] == "first"]
            due = dt.datetime.fromisoformat(row["due_at"]).timestamp()
            # Due when tier 1's delay has run since the job came: 30 s, not 1 s, after its failure.
            assert failed_at + OLD_MS / 1000 - 1 < due < failed_at + OLD_MS / 1000 + 1

            def redeclared() -> list[int]:
                return [
                    line["delay_ms"]
                    for line in _lines(output)
                    if line.get("event") == "tier redeclared" and line.get("queue") == n.tier(1)
                ]

            async def shown_new() -> bool:
                return (await asyncio.to_thread(_tier_delays, env))[n.tier(1)] == NEW_MS

            await wait_for(redeclared, 45, "tier 1 declared again")
            await wait_for(_ttl_is(n.tier(1), NEW_MS), 10, "the API to show tier 1's new delay")
            assert redeclared() == [NEW_MS]
            # The record is written again once the tier is routed to again.
            await wait_for(shown_new, 20, "status to show tier 1's new delay")

            await publish(channel, queue_name, json.dumps({"fail": 1}), message_id="second")
            await wait_for(lambda: _retried(output, "second"), 20, "the second job's retry")
            second = _retried(output, "second")
            assert second is not None
            assert second["delay_ms"] == NEW_MS
            # It comes back after the new delay, well before the old one would have run.
            back_by = time.monotonic() + OLD_MS / 1000 - 1

            def succeeded() -> bool:
                return "second" in done_ids(_lines(output))

            await wait_for(succeeded, OLD_MS / 1000 - 1, "the second job back after 1 s")
            assert time.monotonic() < back_by
            # Every job is accounted for: the parked one and the first came back and succeeded.
            assert {"parked", "first"} <= done_ids(_lines(output))
        finally:
            worker.send_signal(signal.SIGTERM)
            await asyncio.to_thread(worker.wait, 30)


@contextlib.asynccontextmanager
async def lock_held_elsewhere(n: Names) -> AsyncIterator[None]:
    """The lock for declaring the queue's tiers again, held by another connection (an exclusive
    queue, as a declarer takes it) until the block ends."""
    other = await aio_pika.connect(BROKER.amqp_url)
    try:
        holder = await other.channel()
        await holder.declare_queue(
            n.redeclaring, exclusive=True, arguments={"x-queue-type": "classic"}
        )
        yield
    finally:
        await other.close()


async def test_a_tier_is_declared_again_by_one_declarer_at_a_time(
    connection: AbstractConnection, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another connection holds the lock for declaring the queue's tiers again, a declare
    with another delay leaves even an empty tier as it is, saying why; once that connection is
    gone (the broker deletes its lock with it), the next declare declares the tier again."""
    monkeypatch.setattr(redeclaring, "LOCK_WAIT_S", 1.0)
    n = Names(queue_name)
    await declare(connection, make_settings(queue_name, max_retries=1, retry_delay_ms=OLD_MS))
    after = make_settings(queue_name, max_retries=1, retry_delay_ms=NEW_MS)
    async with lock_held_elsewhere(n):
        with capture_logs() as logs:
            declared = await declare(connection, after)
    assert declared.kept == {n.tier(1): OLD_MS}
    [kept] = [log for log in logs if log["event"] == "tier keeps its old delay until it drains"]
    assert (kept["queue"], kept["reason"]) == (n.tier(1), "another declarer holds the lock")
    assert await _ttl_is(n.tier(1), OLD_MS)()

    assert (await declare(connection, after)).kept == {}
    assert await _ttl_is(n.tier(1), NEW_MS)()


@pytest.mark.timing
async def test_a_declare_waits_for_the_lock_once(
    connection: AbstractConnection, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another connection holds the lock, a declare whose three tiers all differ waits
    for it once, not once per tier, and keeps each tier as it is, saying why."""
    monkeypatch.setattr(redeclaring, "LOCK_WAIT_S", 3.0)
    n = Names(queue_name)
    await declare(connection, make_settings(queue_name, max_retries=3, retry_delay_ms=OLD_MS))
    after = make_settings(queue_name, max_retries=3, retry_delay_ms=NEW_MS)
    async with lock_held_elsewhere(n):
        started = time.monotonic()
        with capture_logs() as logs:
            declared = await declare(connection, after)
        took_s = time.monotonic() - started
    tiers = [n.tier(k) for k in (1, 2, 3)]
    assert sorted(declared.kept) == tiers
    kept = [log for log in logs if log["event"] == "tier keeps its old delay until it drains"]
    assert [(k["queue"], k["reason"]) for k in kept] == [
        (tier, "another declarer holds the lock") for tier in tiers
    ]
    assert took_s < 2 * redeclaring.LOCK_WAIT_S, took_s
