"""`ricochet failed list|show|discard` against the real broker: what they print, what they take
(only what discard is told to), and what reading costs a copy."""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from ricochet.broker.amqp import broker_version, requeue_all
from ricochet.broker.declare import declare
from ricochet.delivery.retry import FailureKind
from ricochet.errors import RicochetError
from ricochet.names import Names
from ricochet.ops import scan
from ricochet.ops.failed_queue import list_failed
from ricochet.ops.selection import Selection

from tests.breakage import add_policy, remove_policy
from tests.broker import BROKER
from tests.integration.failures import publish_failed
from tests.support import (
    api_queue,
    depth,
    make_settings,
    ricochet_env,
    run_cli,
    take,
    wait_for,
)

# message_id -> (type, error, kind)
COPIES = {
    "m1": ("report", ValueError("no rows"), FailureKind.PERMANENT),
    "m2": ("mail", KeyError("address"), FailureKind.EXHAUSTED),
    "m3": ("report", KeyError("address"), FailureKind.PERMANENT),
    "m4": ("mail", TimeoutError("smtp"), FailureKind.EXHAUSTED),
}


async def make_copies(connection: AbstractConnection, channel: AbstractChannel, queue: str) -> None:
    await declare(connection, make_settings(queue))
    for message_id, (job_type, error, kind) in COPIES.items():
        await publish_failed(channel, queue, message_id, error, job_type=job_type, kind=kind)


async def failed_ids(channel: AbstractChannel, queue: str) -> list[str]:
    """Take every copy off the failed queue (at the end of a test) and give their ids in order."""
    failed = Names(queue).failed
    return [str(m.message_id) for m in await take(channel, failed, await depth(channel, failed))]


async def test_list_prints_every_copy_and_takes_none(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """One line per copy (message_id, type, kind, retry_count, failed_at, reason), or one JSON
    object per line; filters as replay's plus --kind; the queue keeps every copy, in order."""
    await make_copies(connection, channel, queue_name)
    env = ricochet_env(make_settings(queue_name))
    text = run_cli(["failed", "list"], env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["message_id", "type", "kind", "retry_count", "failed_at", "reason"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["m1", "report", "permanent", "0"],
        ["m2", "mail", "exhausted", "0"],
        ["m3", "report", "permanent", "0"],
        ["m4", "mail", "exhausted", "0"],
    ]
    assert lines[1].endswith("ValueError: no rows")
    assert "4 of 4 copies" in text.stderr

    as_json = run_cli(["failed", "list", "--json", "--kind", "exhausted"], env)
    assert as_json.returncode == 0, as_json.stderr
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["message_id"] for r in rows] == ["m2", "m4"]
    assert set(rows[0]) == {"message_id", "type", "kind", "retry_count", "failed_at", "reason"}
    assert rows[0]["reason"] == "KeyError: 'address'"

    for args, expected in [
        (["--reason", "KeyError"], ["m2", "m3"]),
        (["--type", "report"], ["m1", "m3"]),
        (["--message-id", "m4"], ["m4"]),
        (["--limit", "3"], ["m1", "m2", "m3"]),
        (["--reason", "KeyError", "--kind", "permanent"], ["m3"]),
        (["--reason", "nothing like it"], []),
    ]:
        done = run_cli(["failed", "list", "--json", *args], env)
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["message_id"] for line in done.stdout.splitlines()] == expected
    assert await failed_ids(channel, queue_name) == list(COPIES)


async def test_show_prints_everything_about_one_copy(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """show: properties, every header, the traceback and the body (text when UTF-8, else
    base64, saying which); exit 1 when there is no such copy; the queue keeps its copies."""
    await make_copies(connection, channel, queue_name)
    exchange = await channel.get_exchange(Names(queue_name).failed, ensure=False)
    await exchange.publish(
        aio_pika.Message(
            b"\xff\xfe binary",
            message_id="raw",
            headers={"failed-reason": "E: raw", "tenant": "acme"},
            delivery_mode=2,
        ),
        routing_key="",
    )
    env = ricochet_env(make_settings(queue_name))
    shown = run_cli(["failed", "show", "m2", "--json"], env)
    assert shown.returncode == 0, shown.stderr
    copy = json.loads(shown.stdout)
    assert copy["message_id"] == "m2"
    assert copy["reason"] == "KeyError: 'address'"
    assert copy["body"] == '{"id": "m2"}'
    assert copy["body_encoding"] == "utf-8"
    assert copy["properties"]["type"] == "mail"
    assert copy["properties"]["content_type"] == "application/json"
    assert copy["headers"]["failed-kind"] == "exhausted"
    assert "KeyError: 'address'" in copy["headers"]["failed-traceback"]

    raw = json.loads(run_cli(["failed", "show", "raw", "--json"], env).stdout)
    assert (raw["body"], raw["body_encoding"]) == ("//4gYmluYXJ5", "base64")
    assert raw["headers"]["tenant"] == "acme"

    text = run_cli(["failed", "show", "m1"], env)
    assert text.returncode == 0, text.stderr
    for part in ["reason:      ValueError: no rows", "traceback:", "body (utf-8):", '{"id": "m1"}']:
        assert part in text.stdout

    missing = run_cli(["failed", "show", "nope"], env)
    assert missing.returncode == 1
    assert "no copy with message_id 'nope'" in missing.stderr
    assert await failed_ids(channel, queue_name) == [*COPIES, "raw"]


async def test_discard_removes_only_what_it_is_told_to(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Without --yes (and not --dry-run) discard removes nothing and exits 2 saying so;
    --dry-run lists; --yes removes the matching copies and logs each (message_id, reason, never
    the body); the others stay, in order."""
    await make_copies(connection, channel, queue_name)
    env = ricochet_env(make_settings(queue_name))
    refused = run_cli(["failed", "discard", "--reason", "KeyError"], env)
    assert refused.returncode == 2
    assert "--yes" in refused.stderr
    assert "removed nothing" in refused.stderr

    dry = run_cli(["failed", "discard", "--reason", "KeyError", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1] == "would discard 2, kept 2 (of 4)"
    assert await depth(channel, Names(queue_name).failed) == 4

    done = run_cli(["failed", "discard", "--reason", "KeyError", "--yes"], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "discarded 2, kept 2 (of 4)"
    logged = [json.loads(line) for line in done.stderr.splitlines() if "discarded" in line]
    assert [(e["message_id"], e["reason"]) for e in logged] == [
        ("m2", "KeyError: 'address'"),
        ("m3", "KeyError: 'address'"),
    ]
    # No body in the log ({"id": "m2"}): m2 is named once, as the message_id of its line.
    assert done.stderr.count("m2") == 1
    assert await failed_ids(channel, queue_name) == ["m1", "m4"]


async def test_reading_spends_no_copy(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Listing the failed queue more times than RabbitMQ 4.0's default quorum delivery limit (20)
    loses no copy and keeps their order; on a broker that counts only failed deliveries (4.3),
    reading leaves a copy's x-delivery-count where it was."""
    await make_copies(connection, channel, queue_name)
    names = Names(queue_name)
    for _ in range(25):
        outcome = await list_failed(connection, names, Selection())
        assert [f.message_id for f in outcome.selected] == list(COPIES)
    copies = await take(channel, names.failed, 4)
    assert [m.message_id for m in copies] == list(COPIES)
    counts = {(m.headers or {}).get("x-delivery-count") for m in copies}
    # 4.3 counts only failed deliveries (a basic.reject, a closed channel), not a basic.nack;
    # 3.10 and 4.0 count every return, and 4.0 has no limit on Q.failed (x-delivery-limit=-1).
    version = broker_version(connection)
    assert counts == ({None} if version and version >= (4, 3) else {25})


async def test_a_reader_waits_for_another_to_hand_its_copies_back(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """While another reader holds copies unacked (here, a consumer holding two), a list waits
    for them to come back instead of missing them, then sees all four."""
    await make_copies(connection, channel, queue_name)
    failed = Names(queue_name).failed
    other = await connection.channel()
    await other.set_qos(prefetch_count=2)
    held: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        held.append(message)

    queue = await other.get_queue(failed, ensure=False)
    await queue.consume(hold)
    await wait_for(lambda: len(held) == 2, 10, "the other reader holding two copies")

    listing = asyncio.ensure_future(list_failed(connection, Names(queue_name), Selection()))
    await asyncio.sleep(1.5)
    assert not listing.done()
    await other.close()  # the other reader goes: its copies are handed back
    outcome = await asyncio.wait_for(listing, 30)
    assert sorted(str(f.message_id) for f in outcome.selected) == ["m1", "m2", "m3", "m4"]
    assert sorted(await failed_ids(channel, queue_name)) == ["m1", "m2", "m3", "m4"]


@asynccontextmanager
async def delivery_limit(queue: str, limit: int) -> AsyncIterator[None]:
    """A delivery-limit policy on this one queue for the block, from when the management API
    shows it until it no longer does (it follows a few seconds after)."""
    name = add_policy(queue, {"delivery-limit": limit})

    async def shown() -> bool:
        return (await api_queue(queue, "policy")).get("policy") == name

    async def gone() -> bool:
        return not await shown()

    try:
        await wait_for(shown, 30, f"the management API to show policy {name}")
        yield
    finally:
        remove_policy(name)
        await wait_for(gone, 30, f"the management API to drop policy {name}")


async def read_repeatedly(connection: AbstractConnection, names: Names, times: int) -> list[object]:
    """List the failed queue this many times: each time the ids read, or the refusal's text."""
    seen: list[object] = []
    for _ in range(times):
        try:
            outcome = await list_failed(connection, names, Selection())
        except RicochetError as refusal:
            seen.append(str(refusal))
        else:
            seen.append([f.message_id for f in outcome.selected])
    return seen


async def test_reading_under_a_delivery_limit_policy_drops_no_copy(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Six lists in a row under a delivery-limit policy of 3 on Q.failed lose no copy. Where
    every copy a read hands back counts against the limit (before RabbitMQ 4.3) each list
    refuses before it reads, saying why, and the CLI exits 1 with that; on 4.3, where a hand-back
    by basic.nack costs nothing, each list reads all four."""
    await make_copies(connection, channel, queue_name)
    names = Names(queue_name)
    async with delivery_limit(names.failed, 3):
        seen = await read_repeatedly(connection, names, 6)
        listed = run_cli(["failed", "list"], ricochet_env(make_settings(queue_name)))
    assert await failed_ids(channel, queue_name) == list(COPIES)
    version = broker_version(connection)
    if version is not None and version >= (4, 3):
        assert seen == [list(COPIES)] * 6
        assert listed.returncode == 0, listed.stderr
    else:
        assert all(isinstance(s, str) and "delivery limit of 3" in s for s in seen), seen
        assert listed.returncode == 1
        assert "delivery limit of 3" in listed.stderr


async def test_a_delivery_limit_policy_set_a_moment_before_a_scan_is_honoured(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """SPEC 24: five copies in Q.failed, a delivery-limit policy of 3 set on it, and at once four
    lists, then `ricochet failed list --json`: every copy is still there after. A scan reads the
    policy definitions, which are current, not the queue's statistics, which show a new policy
    only after the stats interval (on 3.10 and 4.0 the fourth list used to leave Q.failed
    empty). Before 4.3 each list refuses, naming the limit; on 4.3 each reads all five."""
    await declare(connection, make_settings(queue_name))
    ids = [f"c{i}" for i in range(5)]
    for message_id in ids:
        await publish_failed(channel, queue_name, message_id, KeyError("address"))
    names = Names(queue_name)
    policy = add_policy(names.failed, {"delivery-limit": 3})
    try:
        seen = await read_repeatedly(connection, names, 4)
        listed = run_cli(["failed", "list", "--json"], ricochet_env(make_settings(queue_name)))
    finally:
        remove_policy(policy)
    assert await failed_ids(channel, queue_name) == ids
    version = broker_version(connection)
    if version is not None and version >= (4, 3):
        assert seen == [ids] * 4
        assert listed.returncode == 0, listed.stderr
        assert [json.loads(line)["message_id"] for line in listed.stdout.splitlines()] == ids
    else:
        assert all(isinstance(s, str) and "delivery limit of 3" in s for s in seen), seen
        assert listed.returncode == 1, listed.stdout
        assert "delivery limit of 3" in listed.stderr


async def test_a_failed_queue_with_rabbitmq_4s_default_limit_is_not_read_away(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """A Q.failed declared before ricochet lifted RabbitMQ 4's delivery limit keeps the default
    of 20: 22 lists in a row lose no copy. On 4.0 (where every hand-back counts) each refuses,
    naming the limit; 3.10 has no limit, and on 4.3 reading costs nothing, so each reads."""
    names = Names(queue_name)
    await channel.declare_queue(names.failed, durable=True, arguments={"x-queue-type": "quorum"})
    await make_copies(connection, channel, queue_name)
    seen = await read_repeatedly(connection, names, 22)
    assert await failed_ids(channel, queue_name) == list(COPIES)
    version = broker_version(connection)
    if version is not None and (4, 0) <= version < (4, 3):
        assert all(isinstance(s, str) and "delivery limit of 20" in s for s in seen), seen
    else:
        assert seen == [list(COPIES)] * 22


async def test_a_copy_near_its_delivery_limit_is_refused_and_kept(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Copies handed back twice by closed channels (x-delivery-count 2, which every broker
    counts) under a delivery-limit policy of 3: a list refuses rather than risk the last
    return, on every broker, as often as it is asked, and keeps every copy; once the limit is
    lifted, a list reads them all."""
    await make_copies(connection, channel, queue_name)
    names = Names(queue_name)
    async with delivery_limit(names.failed, 3):
        for _ in range(2):
            await hand_back_by_closing(connection, channel, names.failed, len(COPIES))
        seen = await read_repeatedly(connection, names, 3)
    assert all(isinstance(s, str) and "delivery limit of 3" in s for s in seen), seen
    outcome = await list_failed(connection, names, Selection())
    assert [f.message_id for f in outcome.selected] == list(COPIES)
    assert await failed_ids(channel, queue_name) == list(COPIES)


async def hand_back_by_closing(
    connection: AbstractConnection, channel: AbstractChannel, queue: str, n: int
) -> None:
    """Have a consumer hold all n messages of a queue, then close its channel: the broker hands
    them back, and every version counts that return in x-delivery-count."""
    reader = await connection.channel()
    await reader.set_qos(prefetch_count=n)
    held: list[AbstractIncomingMessage] = []

    async def hold(message: AbstractIncomingMessage) -> None:
        held.append(message)

    await (await reader.get_queue(queue, ensure=False)).consume(hold)
    await wait_for(lambda: len(held) == n, 10, "every message delivered")
    await reader.close()

    async def back() -> bool:
        return await depth(channel, queue) == n

    await wait_for(back, 10, "the messages back")


async def make_many_copies(
    connection: AbstractConnection,
    channel: AbstractChannel,
    queue: str,
    n: int,
    queue_type: str = "quorum",
) -> list[str]:
    """n failed copies, c0000 onwards, in order."""
    await declare(connection, make_settings(queue, queue_type=queue_type))
    ids = [f"c{i:04d}" for i in range(n)]
    for start in range(0, n, 500):
        batch = ids[start : start + 500]
        await asyncio.gather(*(publish_failed(channel, queue, i, KeyError("x")) for i in batch))
    return ids


async def listed_ids(connection: AbstractConnection, names: Names) -> list[str]:
    return [str(f.message_id) for f in (await list_failed(connection, names, Selection())).selected]


async def test_two_readers_started_together_each_see_every_copy(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """Two lists started at the same moment on connections of their own (a failed list beside
    a console page, say), three times over: each sees every copy, and the queue keeps
    them all. More copies than one consumer is given at once, so two readers subscribed side by
    side would split them."""
    names = Names(queue_name)
    ids = await make_many_copies(connection, channel, queue_name, scan.PER_CONSUMER + 100)
    async with (
        await aio_pika.connect(BROKER.amqp_url) as first,
        await aio_pika.connect(BROKER.amqp_url) as second,
    ):
        for _ in range(3):
            seen = await asyncio.gather(listed_ids(first, names), listed_ids(second, names))
            assert [len(s) for s in seen] == [len(ids)] * 2
            assert [sorted(s) for s in seen] == [ids, ids]
    assert sorted(await failed_ids(channel, queue_name)) == ids


async def test_a_reader_started_as_another_hands_back_sees_every_copy(
    queue_name: str,
    connection: AbstractConnection,
    channel: AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A list that starts while another is handing its copies back (held there for a moment,
    its consumers already gone: on a classic queue no consumer is counted any more) waits for
    them, and sees every copy."""
    names = Names(queue_name)
    ids = await make_many_copies(connection, channel, queue_name, 50, "classic")
    second: list[asyncio.Task[list[str]]] = []

    async def held_while_another_starts(ch: AbstractChannel) -> None:
        if not second:
            other = await aio_pika.connect(BROKER.amqp_url)
            second.append(asyncio.create_task(listed_ids(other, names)))
            second[0].add_done_callback(lambda _: asyncio.ensure_future(other.close()))
            await asyncio.sleep(0.5)
        await requeue_all(ch)

    monkeypatch.setattr(scan, "requeue_all", held_while_another_starts)
    assert await listed_ids(connection, names) == ids
    assert await asyncio.wait_for(second[0], 30) == ids
    assert await failed_ids(channel, queue_name) == ids


async def test_a_reader_gives_up_on_another_that_keeps_reading(
    queue_name: str,
    connection: AbstractConnection,
    channel: AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A list that finds another scan still reading once the wait is over says why, and takes
    nothing; the first scan ends normally and the queue keeps every copy."""
    await make_copies(connection, channel, queue_name)
    names = Names(queue_name)
    monkeypatch.setattr(scan, "OTHER_READER_WAIT_S", 1.0)
    other = await aio_pika.connect(BROKER.amqp_url)
    async with other, scan.scanning(connection, names) as first:
        async for _ in first.copies():
            pass
        with pytest.raises(RicochetError, match="still being read"):
            await list_failed(other, names, Selection())
    assert await failed_ids(channel, queue_name) == list(COPIES)
