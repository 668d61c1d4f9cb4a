"""ricochet doctor against the real broker: each way of breaking the topology is named, exit codes
follow SPEC section 13, and doctor itself changes nothing on the broker."""

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet import Client
from ricochet.broker.declare import declare
from ricochet.broker.plan import TTL
from ricochet.handlers.job import Job
from ricochet.headers import KEY
from ricochet.names import Names
from ricochet.settings import Settings

from tests.breakage import add_policy, fill, redeclare, remove_policy, unbind, unbind_exchange
from tests.broker import BROKER
from tests.support import (
    AMQP_URL,
    StartWorker,
    api_queue,
    exists,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    wait_for,
)

Findings = dict[str, dict[str, str]]
# A new queue's figures (depth, consumers) reach the management API within some seconds.
FIGURES_TIMEOUT_S = 30


def run_doctor(settings: Settings) -> tuple[int, Findings]:
    """`ricochet doctor --json`: its exit code and its checks by name."""
    result = run_cli(["doctor", "--json"], ricochet_env(settings))
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"ok", "checks"}
    assert report["ok"] is (result.returncode == 0)
    for check in report["checks"]:
        assert set(check) == {"check", "status", "detail"}
        assert check["status"] in ("ok", "warn", "fail")
    statuses = [c["status"] for c in report["checks"]]
    assert statuses == sorted(statuses, key=["fail", "warn", "ok"].index), "failures first"
    return result.returncode, {c["check"]: c for c in report["checks"]}


def definitions(queue: str) -> dict[str, list[Any]]:
    """The broker's definitions of this queue's topology: queues, exchanges, bindings, policies."""

    def ours(name: str) -> bool:
        return name == queue or name.startswith(f"{queue}.")

    status, answer = BROKER.api("GET", f"definitions/{quote(BROKER.vhost, safe='')}")
    assert status == 200, answer
    picked = {
        "queues": [q for q in answer["queues"] if ours(q["name"])],
        "exchanges": [x for x in answer["exchanges"] if ours(x["name"])],
        "bindings": [b for b in answer["bindings"] if ours(b["source"]) or ours(b["destination"])],
        "policies": [p for p in answer.get("policies", []) if re.escape(queue) in p["pattern"]],
    }
    return {kind: sorted(items, key=json.dumps) for kind, items in picked.items()}


async def doctor_finds(
    settings: Settings, check: str, status: str, says: str, expect_exit: int | None = 1
) -> Findings:
    """Run doctor until `check` has this status and says this, and it exits with `expect_exit`
    (the API's figures lag, the other rows' too), and see that running it changed none of the
    topology's definitions."""
    before = definitions(settings.queue)
    deadline = time.monotonic() + FIGURES_TIMEOUT_S
    while True:
        code, found = await asyncio.to_thread(run_doctor, settings)
        row = found[check]
        exited = expect_exit is None or code == expect_exit
        if row["status"] == status and says in row["detail"] and exited:
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"doctor did not find {status} {says!r}, exit {expect_exit}: exit {code}, {found}"
            )
        await asyncio.sleep(1)
    assert definitions(settings.queue) == before
    return found


@pytest.fixture
def policies() -> Iterator[Callable[[str, dict[str, Any]], str]]:
    """Add policies that apply to one queue: `policies(queue, definition)`; removed afterwards."""
    added: list[str] = []

    def add(queue: str, definition: dict[str, Any]) -> str:
        added.append(add_policy(queue, definition))
        return added[-1]

    yield add
    for name in added:
        remove_policy(name)


async def test_declared_topology_with_a_worker_passes(
    connection: AbstractConnection, queue_name: str, start_worker: StartWorker
) -> None:
    """The topology a worker declares, with that worker consuming: no check fails, exit 0."""

    async def succeed(job: Job) -> None:
        return None

    await start_worker(succeed)
    found = await doctor_finds(
        make_settings(queue_name), "consumers", "ok", "1 consumers", expect_exit=0
    )
    assert [c for c in found.values() if c["status"] == "fail"] == []


async def test_absent_topology_is_named_and_not_declared(
    connection: AbstractConnection, queue_name: str
) -> None:
    """Nothing declared: every queue and exchange is missing (exit 1), and doctor declares none."""
    code, found = run_doctor(make_settings(queue_name))
    assert code == 1
    n = Names(queue_name)
    for check in (f"queue {n.queue}", f"queue {n.tier(1)}", f"exchange {n.dlx}"):
        assert found[check]["status"] == "fail"
        assert "missing: `ricochet topology` declares it" in found[check]["detail"]
    assert not await exists(connection, queue_name)
    assert definitions(queue_name) == {
        "queues": [],
        "exchanges": [],
        "bindings": [],
        "policies": [],
    }


async def test_removed_binding_is_named(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """The binding that brings retried jobs back to the main queue, removed by hand, is named."""
    settings = make_settings(queue_name)
    n = (await declare(connection, settings)).names
    await unbind(channel, n.return_to_queue, n.queue)
    await doctor_finds(
        settings, "bindings", "fail", f"1 missing; {n.return_to_queue} -> queue {n.queue};"
    )


async def test_tier_with_another_delay_is_named(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """A tier declared with another TTL than the settings give it fails, naming both delays."""
    settings = make_settings(queue_name, retry_delay_ms=1000)
    tier = (await declare(connection, settings)).tiers[0]
    await redeclare(channel, tier.name, {**tier.arguments, TTL: 5000})
    await doctor_finds(
        settings, f"queue {tier.name}", "fail", "waits 5s, the settings say 1s and it is empty"
    )


async def test_policy_on_the_failed_queue_is_named(
    connection: AbstractConnection,
    queue_name: str,
    policies: Callable[[str, dict[str, Any]], str],
) -> None:
    """A policy capping the failed queue's length is named with what it does."""
    settings = make_settings(queue_name)
    n = (await declare(connection, settings)).names
    name = policies(n.failed, {"max-length": 100})
    await doctor_finds(
        settings, "policies", "fail", f"{n.failed}: policy {name!r} sets max-length=100"
    )


async def test_a_policy_set_a_moment_before_is_reported_at_once(
    connection: AbstractConnection,
    queue_name: str,
    policies: Callable[[str, dict[str, Any]], str],
) -> None:
    """SPEC 24: a delivery-limit policy set on the failed queue, then doctor run once at once,
    reports the policy's value: doctor reads the policy definitions, which are current, not the
    queue's statistics, which show a new policy only a stats interval later."""
    settings = make_settings(queue_name)
    n = (await declare(connection, settings)).names
    name = policies(n.failed, {"delivery-limit": 3})
    _, found = run_doctor(settings)
    assert found["policies"]["status"] == "fail"
    assert f"{n.failed}: policy {name!r} sets delivery-limit=3 (" in found["policies"]["detail"]


async def test_tier_beyond_the_budget_holding_jobs_is_named(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """Retries lowered from 3 to 2 while tier 3 holds jobs: the tier and its binding are named."""
    earlier = make_settings(queue_name, max_retries=3, retry_delay_ms=60_000)
    n = (await declare(connection, earlier)).names
    await fill(channel, n.tier(3), 2)
    now = make_settings(queue_name, max_retries=2, retry_delay_ms=60_000)
    found = await doctor_finds(now, "stale tiers", "warn", f"{n.tier(3)} holds 2 jobs")
    unwanted = found["unwanted bindings"]
    assert unwanted["status"] == "fail"
    assert f"{n.dlx} -> queue {n.tier(3)} with key {n.attempt_key(2)}" in unwanted["detail"]


async def test_main_queue_without_consumer_is_named(
    connection: AbstractConnection, queue_name: str
) -> None:
    """No worker on the main queue: the consumers check fails."""
    settings = make_settings(queue_name)
    await declare(connection, settings)
    await doctor_finds(settings, "consumers", "fail", f"no worker consumes {queue_name}")


async def test_failed_queue_over_its_threshold_is_named(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """As many failed jobs as RICOCHET_ALERT_FAILED_THRESHOLD: the failed-jobs check fails."""
    settings = make_settings(queue_name, alert_failed_threshold=3)
    n = (await declare(connection, settings)).names
    await fill(channel, n.failed, 3)
    await doctor_finds(settings, "failed jobs", "fail", f"3 in {n.failed}")


async def test_dead_letters_held_past_the_second_reading_are_named(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """Jobs expired in a tier whose route back to Q is gone wait for their dead-letters: doctor
    reads them twice, some seconds apart, and names the tier and the broker's retry timeout."""
    settings = make_settings(queue_name, retry_delay_ms=100)
    n = (await declare(connection, settings)).names
    await unbind_exchange(channel, n.return_exchange, n.return_to_queue)
    for i in range(3):
        await publish(channel, n.tier(1), "{}", message_id=f"m{i}")

    async def held() -> bool:
        return (await api_queue(n.tier(1))).get("messages_dlx") == 3

    await wait_for(held, FIGURES_TIMEOUT_S, "the tier's jobs to wait for their dead-letters")
    found = await doctor_finds(
        settings, "stranded dead-letters", "warn", f"{n.tier(1)} holds 3 (3 read 15s earlier)"
    )
    assert (
        "dead_letter_worker_publisher_confirm_timeout" in found["stranded dead-letters"]["detail"]
    )


def test_unreachable_or_refusing_api_exits_2(queue_name: str) -> None:
    """No API at the URL, or wrong credentials: exit 2 with one line, and no password shown."""
    closed = run_cli(
        ["doctor"], ricochet_env(make_settings(queue_name, management_url="http://127.0.0.1:1/"))
    )
    assert closed.returncode == 2
    assert closed.stderr.startswith("ricochet: the management API at http://127.0.0.1:1/api/")
    assert "unreachable" in closed.stderr
    assert closed.stderr.count("\n") == 1

    parts = BROKER.management_url.split("://", 1)
    wrong = f"{parts[0]}://nobody:hunter2@{parts[1]}"
    refused = run_cli(["doctor"], ricochet_env(make_settings(queue_name, management_url=wrong)))
    assert refused.returncode == 2
    assert "refused the credentials (HTTP 401)" in refused.stderr
    assert "hunter2" not in refused.stdout + refused.stderr


def test_invalid_management_url_exits_2(queue_name: str) -> None:
    """RICOCHET_MANAGEMENT_URL that is no http(s) URL: exit 2 naming it, password scrubbed."""
    env = ricochet_env(make_settings(queue_name))
    env["RICOCHET_MANAGEMENT_URL"] = "ftp://admin:hunter2@broker/"
    result = run_cli(["doctor"], env)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "ricochet: RICOCHET_MANAGEMENT_URL='ftp://admin:***@broker/' is invalid: "
        "allowed an http:// or https:// URL"
    )


async def test_the_key_lanes_row_follows_the_queues_first_job_with_a_key(
    queue_name: str, start_worker: StartWorker, channel: AbstractChannel
) -> None:
    """Before any job with a key, the row says the lanes come with the first; once one ran,
    it counts them, each consumed; with the worker stopped and a job waiting in a lane, it
    warns that no worker consumes it."""
    settings = make_settings(queue_name, key_lanes=2)
    worker = await start_worker(lambda job: None, key_lanes=2)
    await doctor_finds(settings, "key lanes", "ok", "none yet: 2 are declared", expect_exit=0)
    async with Client(AMQP_URL, queue_name) as client:
        # The worker declares its 2 lanes with the job it sends on from the queue; the client's
        # job after it joins them (the first declaration fixes the count).
        await publish(channel, queue_name, "{}", headers={KEY: "k"}, message_id="first")
        await wait_for(lambda: worker.count("succeeded") == 1, 20, "the job with a key")
        await doctor_finds(settings, "key lanes", "ok", "2 lanes, 0 jobs", expect_exit=0)
        await worker.stop()
        await client.enqueue("sync", {}, key="k")
    # The exit: 1 once the API's figures show the queue without its worker, 0 before.
    await doctor_finds(settings, "key lanes", "warn", "no worker consumes", expect_exit=None)
