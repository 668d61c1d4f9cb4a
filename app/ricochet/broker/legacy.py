"""What earlier versions left in a vhost, and the register that says it was moved (SPEC 25).

The per-queue levels of the delays (Q.delay.0 to Q.delay.24), replaced by the shared levels
(SPEC 18), keep passing the jobs they hold on to Q, through Q's own return exchange, until they
are empty. Then, once no worker of an earlier version is connected for Q (only those publish to
them), `ricochet migrate` retires them all at once: one level removed while another still holds
a job would leave that job nowhere to go. The per-queue cancel stores (Q.cancels) are read by
every worker's start until `ricochet migrate` has moved their cancels (ricochet.broker.cancels).
Once nothing is left, the register SHARED.migrated says so, and no start looks for either.
"""

import json
from typing import Any
from urllib.parse import quote

from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import ChannelNotFoundEntity

from ricochet.broker.connection import SHARED_WAITING, connection_name
from ricochet.broker.depth import KeptChannel, exchange_exists, read_depth
from ricochet.broker.management import Api, open_api, vhost
from ricochet.broker.publish import confirming_channel
from ricochet.broker.register import declare_register, read_register, write_register
from ricochet.errors import ManagementUnavailable
from ricochet.log import get_logger
from ricochet.names import DELAY_LEVELS, SHARED, Names
from ricochet.settings import Settings

log = get_logger("ricochet.topology")

LEVEL_FIGURES = "messages,messages_dlx"
MIGRATED_PATIENCE_S = 0.5


def older_workers(connections: list[dict[str, Any]], queue: str | None = None) -> int:
    """The connections of workers of Q (of any queue: None) that do not wait in the shared
    levels: of an earlier version (pure)."""
    prefix = connection_name("worker", queue or "").rsplit(" ", 1)[0].rstrip() + " "
    return sum(
        1
        for c in connections
        if str((c.get("client_properties") or {}).get("connection_name", "")).startswith(prefix)
        and not (c.get("client_properties") or {}).get(SHARED_WAITING)
    )


def old_stores(queues: list[dict[str, Any]]) -> list[str]:
    """The queues whose per-queue cancel store (a stream named Q.cancels) the listing holds
    (pure)."""
    return [
        str(q["name"]).removesuffix(".cancels")
        for q in queues
        if q.get("type") == "stream"
        and str(q["name"]).endswith(".cancels")
        and q["name"] != SHARED.cancels
    ]


def old_levels(exchanges: list[dict[str, Any]]) -> list[str]:
    """The queues whose per-queue levels' entry (Q.delay.24) the listing holds (pure)."""
    suffix = f".delay.{DELAY_LEVELS - 1}"
    return [
        str(x["name"]).removesuffix(suffix)
        for x in exchanges
        if str(x["name"]).endswith(suffix) and x["name"] != SHARED.delay_entry
    ]


def levels_name(names: Names) -> str:
    """How the tools name a queue's per-queue levels, all 25 at once (pure)."""
    return f"{names.delay(0)}..{DELAY_LEVELS - 1}"


def held(figures: list[dict[str, Any] | None], ready: list[int | None]) -> int:
    """The jobs the levels hold, by the API's figures (messages, and those being dead-lettered)
    and the ready counts read just now (pure); a level that is gone holds none."""
    from_api = sum(
        (f.get("messages") or 0) + (f.get("messages_dlx") or 0) for f in figures if f is not None
    )
    return max(from_api, sum(r or 0 for r in ready))


async def retire_legacy_delays(
    connection: AbstractConnection, settings: Settings, *, dry_run: bool = False
) -> str | None:
    """Remove Q's per-queue levels when they hold nothing and no older worker uses them (dry:
    only look): None then (or when there are none), else why they stay."""
    n = Names(settings.queue)
    channel = KeptChannel(connection)
    try:
        if not await exchange_exists(await channel.get(), n.delay_entry):
            return None  # none: declared by this version, or retired already
        levels = [n.delay(k) for k in range(DELAY_LEVELS)]
        try:
            async with open_api(settings.management_url, settings.amqp_url) as api:
                reason = await _why_kept(api, channel, n, vhost(settings.amqp_url), levels)
        except ManagementUnavailable as error:
            reason = str(error)
        if reason is not None or dry_run:
            return reason
        ch = await channel.get()
        await ch.exchange_delete(n.delay_entry)  # first: nothing enters from now on
        for name in levels:
            await ch.queue_delete(name)
        for name in levels[:-1]:
            await ch.exchange_delete(name)
        log.info("earlier per-queue delay levels retired", queue=n.queue)
        return None
    finally:
        await channel.close()


async def older_workers_connected(api: Api, vh: str, queue: str | None = None) -> int:
    """How many workers of an earlier version the management API lists as connected for
    queue (for any queue: None)."""
    connections = await api.get(
        f"vhosts/{quote(vh, safe='')}/connections", columns="client_properties"
    )
    return older_workers(connections or [], queue)


async def _why_kept(
    api: Api, channel: KeptChannel, n: Names, vh: str, levels: list[str]
) -> str | None:
    older = await older_workers_connected(api, vh, n.queue)
    if older:
        return f"{older} worker(s) of an earlier version still connected for {n.queue}"
    ready = []
    for name in levels:
        depth = await read_depth(await channel.get(), name)
        ready.append(None if depth is None else depth.messages)
    figures = [await api.queue(vh, name, LEVEL_FIGURES) for name in levels]
    if any(f is not None and not (isinstance(f, dict) and "messages" in f) for f in figures):
        return "the management API has no figures for them yet"  # a new queue's come later
    jobs = held(figures, ready)
    if jobs:
        return f"they still hold {jobs} waiting job(s), each passed on to {n.queue} when due"
    return None


async def is_migrated(connection: AbstractConnection) -> bool:
    """Whether `ricochet migrate` has moved everything earlier versions left in the vhost. Not
    when the register is held by another reader the moment it is read: the old objects are then
    looked for, which is never wrong, only slower."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        try:
            await channel.declare_queue(SHARED.migrated, passive=True)
        except ChannelNotFoundEntity:
            return False
        return await read_register(channel, SHARED.migrated, MIGRATED_PATIENCE_S) is not None
    finally:
        if not channel.is_closed:
            await channel.close()


async def mark_migrated(connection: AbstractConnection, summary: dict[str, Any]) -> None:
    """Record, confirmed, that nothing earlier versions left is in the vhost any more."""
    channel = await confirming_channel(connection)
    try:
        await declare_register(channel, SHARED.migrated)
        body = json.dumps(summary, sort_keys=True).encode()
        await write_register(channel, SHARED.migrated, body, content_type="application/json")
    finally:
        await channel.close()
