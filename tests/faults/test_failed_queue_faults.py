"""Faults of the failed-queue commands: `failed list|show|discard` and `replay` killed (-9), or
their connection dropped by the broker, in the middle of a scan. Every copy is accounted for
afterwards: none lost, none in two places, and only copies that match were taken."""

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.amqp import broker_version
from ricochet.broker.declare import declare
from ricochet.names import Names
from ricochet.ops import scan

from tests.breakage import add_policy, remove_policy
from tests.broker import BROKER, Broker
from tests.faults.harness import PUBLISH_BATCH, TALLIES, Tally, stopped_when, take_all
from tests.integration.failures import publish_failed
from tests.support import (
    api_queue,
    close_connections,
    consumers,
    delete_topology,
    depth,
    log_events,
    logged_ids,
    make_settings,
    ricochet_env,
    run_cli,
    spawn,
    wait_for,
)

# The matching half (every other copy) outnumbers a batch of scan.COMMIT_EVERY, so that discard
# and replay are seen under way (their first batch committed) with copies still to take; a
# command is held where it is seen under way (stopped_when), so it cannot end before its fault.
COPIES = 3 * scan.COMMIT_EVERY
MATCHING = "KeyError"  # every other copy; discard and replay take these

COMMANDS = {
    # command line, the connection's role, whether it takes the matching copies
    "failed list": (["failed", "list", "--json"], "failed"),
    "failed show": (["failed", "show", "no-such-copy"], "failed"),
    "failed discard": (["failed", "discard", "--reason", MATCHING, "--yes"], "failed"),
    "replay": (["replay", "--reason", MATCHING], "replay"),
}


async def make_copies(
    connection: AbstractConnection, channel: AbstractChannel, queue: str, url: str, qtype: str
) -> list[str]:
    await declare(connection, make_settings(queue, amqp_url=url, queue_type=qtype))
    ids = [f"c{i:05d}" for i in range(COPIES)]
    for start in range(0, COPIES, PUBLISH_BATCH):
        await asyncio.gather(
            *(
                publish_failed(channel, queue, i, KeyError("x") if n % 2 == 0 else ValueError("y"))
                for n, i in enumerate(ids[start : start + PUBLISH_BATCH], start=start)
            )
        )
    return ids


async def underway(
    connection: AbstractConnection, channel: AbstractChannel, names: Names, command: str, log: Path
) -> bool:
    """The command is in the middle of its scan: subscribed, and (for the ones that take copies)
    past its first commit."""
    if command == "replay":
        return await depth(channel, names.queue) > 0
    if command == "failed discard":
        return '"discarded"' in _text(log)
    return await consumers(connection, names.failed) > 0


@pytest.mark.parametrize("qtype", ["quorum", "classic"])
@pytest.mark.parametrize("fault", ["kill -9", "dropped connection"])
@pytest.mark.parametrize("command", list(COMMANDS))
async def test_fault_midway_loses_and_doubles_nothing(
    fault_broker: Broker,
    connection: AbstractConnection,
    queue_name: str,
    tmp_path: Path,
    command: str,
    fault: str,
    qtype: str,
) -> None:
    """Whatever the command had read goes back to the failed queue; what it took is gone from it
    (a replayed job in Q); no copy is lost or in two places; non-matching copies all stay."""
    names = Names(queue_name)
    channel = await connection.channel(publisher_confirms=True)
    ids = await make_copies(connection, channel, queue_name, fault_broker.amqp_url, qtype)
    matching = set(ids[::2])
    args, role = COMMANDS[command]
    settings = make_settings(queue_name, amqp_url=fault_broker.amqp_url, log_format="json")
    log = tmp_path / "command.log"
    proc = spawn(args, ricochet_env(settings), log)

    # Held at the point where it is seen under way, and held still while rabbitmqctl finds and
    # closes its connection, which takes a moment.
    await stopped_when(
        proc, lambda: underway(connection, channel, names, command, log), 60, f"{command} under way"
    )
    if fault == "kill -9":
        proc.kill()
    else:
        closed = await asyncio.to_thread(close_connections, queue_name, role, fault_broker)
        proc.send_signal(signal.SIGCONT)
        assert closed == 1
    code = await asyncio.to_thread(proc.wait, 60)
    assert code != 0, f"{command} finished before the fault: make COPIES larger"

    # The broker hands back what the command held once it notices the connection is gone.
    await wait_for(
        lambda: _no_consumer(connection, names.failed), 30, "the command's consumers to go"
    )
    in_failed = Counter(str(m.message_id) for m in await take_all(channel, names.failed))
    in_main = Counter(str(m.message_id) for m in await take_all(channel, names.queue))
    await channel.close()

    everywhere = in_failed + in_main
    duplicates = sum(n - 1 for n in everywhere.values())
    removed = set(ids) - set(everywhere)
    logged = logged_ids(log_events(log.read_text()), "discarded")
    lost = removed if command != "failed discard" else removed - matching
    TALLIES.append(
        Tally(
            fault=f"{command}, {fault} ({qtype})",
            published=len(ids),
            completed=len(in_main) + (len(removed) if command == "failed discard" else 0),
            failed=len(in_failed),
            lost=len(lost),
            duplicates=duplicates,
        )
    )
    assert duplicates == 0
    assert not lost, sorted(lost)[:10]
    assert not set(in_main) - matching  # only matching copies were replayed
    assert logged <= removed  # a copy logged as discarded is really gone
    if command in ("failed list", "failed show"):
        assert sorted(in_failed) == ids  # all there (the order may change)
    else:
        assert set(ids) - matching <= set(in_failed)  # every copy that does not match stays


def _text(path: Path) -> str:
    return path.read_text()


async def _no_consumer(connection: AbstractConnection, queue: str) -> bool:
    return await consumers(connection, queue) == 0


async def _copies(channel: AbstractChannel, queue: str, n: int) -> list[str]:
    """n failed copies in a declared topology, every other one matching MATCHING."""
    ids = [f"c{i:05d}" for i in range(n)]
    for start in range(0, n, PUBLISH_BATCH):
        batch = enumerate(ids[start : start + PUBLISH_BATCH], start=start)
        await asyncio.gather(
            *(
                publish_failed(channel, queue, i, KeyError("x") if k % 2 == 0 else ValueError("y"))
                for k, i in batch
            )
        )
    return ids


def _listed(output: str) -> Counter[str]:
    """The message_ids a `failed list --json` printed, each as often as it printed it."""
    return Counter(
        json.loads(line)["message_id"] for line in output.splitlines() if line.startswith("{")
    )


async def _account(
    connection: AbstractConnection, names: Names, ids: list[str], fault: str
) -> Counter[str]:
    """Take every copy left in Q.failed (and anything in Q), tally the row, and give what Q.failed
    held: nothing may be lost, doubled or moved by a command that only reads."""
    channel = await connection.channel()
    in_failed = Counter(str(m.message_id) for m in await take_all(channel, names.failed))
    in_main = Counter(str(m.message_id) for m in await take_all(channel, names.queue))
    await channel.close()
    everywhere = in_failed + in_main
    lost = set(ids) - set(everywhere)
    TALLIES.append(
        Tally(
            fault=fault,
            published=len(ids),
            completed=len(in_main),
            failed=len(in_failed),
            lost=len(lost),
            duplicates=sum(n - 1 for n in everywhere.values()),
        )
    )
    assert not lost, sorted(lost)[:10]
    assert in_failed == Counter(ids)
    return in_failed


async def test_reads_under_a_delivery_limit_lose_no_copy(queue_name: str) -> None:
    """Under a delivery-limit policy of 3 on Q.failed, five `failed list` processes in a row
    (the fourth read emptied the queue once) leave every copy in it: before RabbitMQ 4.3, where
    each copy a read hands back counts, each exits 1 saying so, having read none; on 4.3, where a
    hand-back by nack costs nothing, each lists them all. On the broker under test, whose
    management API tells the limit (the fault suite's own node has none)."""
    names = Names(queue_name)
    async with await aio_pika.connect(BROKER.amqp_url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        await declare(connection, make_settings(queue_name))
        ids = await _copies(channel, queue_name, 10)
        policy = add_policy(names.failed, {"delivery-limit": 3})
        try:
            await wait_for(lambda: _policy_shown(names.failed, policy), 30, "the policy")
            env = ricochet_env(make_settings(queue_name))
            command = ["failed", "list", "--json"]
            runs = [await asyncio.to_thread(run_cli, command, env) for _ in range(5)]
        finally:
            remove_policy(policy)
        version = broker_version(connection)
        await _account(connection, names, ids, "failed list x5 under a delivery limit of 3")
        await delete_topology(connection, queue_name)
    if version is not None and version >= (4, 3):
        assert [(r.returncode, _listed(r.stdout)) for r in runs] == [(0, Counter(ids))] * 5
    else:
        assert [r.returncode for r in runs] == [1] * 5
        assert all("delivery limit of 3" in r.stderr for r in runs), runs[0].stderr


async def _policy_shown(queue: str, policy: str) -> bool:
    return (await api_queue(queue, "policy")).get("policy") == policy


@pytest.mark.parametrize("fault", ["started together", "the first killed -9 as the other waits"])
async def test_two_lists_at_once_each_see_every_copy(
    fault_broker: Broker, connection: AbstractConnection, queue_name: str, fault: str
) -> None:
    """Two `failed list` processes on more copies than one consumer is given at once: each lists
    every copy, whether they start together or the first is killed while the second waits for
    it (a killed scan holds nothing), and the queue keeps them all."""
    names = Names(queue_name)
    channel = await connection.channel(publisher_confirms=True)
    await declare(connection, make_settings(queue_name, amqp_url=fault_broker.amqp_url))
    ids = await _copies(channel, queue_name, scan.PER_CONSUMER + 100)
    env = ricochet_env(make_settings(queue_name, amqp_url=fault_broker.amqp_url))
    command = ["failed", "list", "--json"]
    first = spawn(command, env)
    if fault != "started together":
        await wait_for(lambda: consumers(connection, names.failed), 30, "the first to read")
        first.send_signal(signal.SIGSTOP)  # held with the lock and the copies it read
    second = spawn(command, env)
    if fault != "started together":
        await asyncio.sleep(1)
        assert second.poll() is None  # waiting for the first
        first.kill()
    outputs = [await asyncio.to_thread(p.communicate, timeout=60) for p in (first, second)]
    await _account(connection, names, ids, f"two failed lists, {fault}")
    if fault == "started together":
        assert [p.returncode for p in (first, second)] == [0, 0], outputs
        assert [_listed(out) for out, _ in outputs] == [Counter(ids)] * 2
    else:
        assert second.returncode == 0, outputs[1]
        assert _listed(outputs[1][0]) == Counter(ids)
