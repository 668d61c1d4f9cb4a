"""The per-queue levels of the delays that earlier versions declared (Q.delay.0 to Q.delay.24),
replaced by the shared levels (SPEC 18).

They keep passing the jobs they hold on to Q, through Q's own return exchange, until they are
empty. Then, once no worker of an earlier version is connected for Q (only those publish to
them), they are retired all at once: one level removed while another still holds a job would
leave that job nowhere to go.
"""

from typing import Any
from urllib.parse import quote

from aio_pika.abc import AbstractConnection

from ricochet.broker.connection import SHARED_WAITING, connection_name
from ricochet.broker.depth import KeptChannel, exchange_exists, read_depth
from ricochet.broker.management import Api, open_api, vhost
from ricochet.errors import ManagementUnavailable
from ricochet.log import get_logger
from ricochet.names import DELAY_LEVELS, Names
from ricochet.settings import Settings

log = get_logger("ricochet.topology")

LEVEL_FIGURES = "messages,messages_dlx"


def older_workers(connections: list[dict[str, Any]], queue: str) -> int:
    """The connections of workers of Q that do not wait in the shared levels (pure)."""
    prefix = connection_name("worker", queue).rsplit(" ", 1)[0] + " "
    return sum(
        1
        for c in connections
        if str((c.get("client_properties") or {}).get("connection_name", "")).startswith(prefix)
        and not (c.get("client_properties") or {}).get(SHARED_WAITING)
    )


def held(figures: list[dict[str, Any] | None], ready: list[int | None]) -> int:
    """The jobs the levels hold, by the API's figures (messages, and those being dead-lettered)
    and the ready counts read just now (pure); a level that is gone holds none."""
    from_api = sum(
        (f.get("messages") or 0) + (f.get("messages_dlx") or 0) for f in figures if f is not None
    )
    return max(from_api, sum(r or 0 for r in ready))


async def retire_legacy_delays(connection: AbstractConnection, settings: Settings) -> None:
    """Remove Q's per-queue levels when they hold nothing and no older worker uses them; else
    say why they stay (they are looked at again at the next start)."""
    n = Names(settings.queue)
    channel = KeptChannel(connection)
    try:
        if not await exchange_exists(await channel.get(), n.delay_entry):
            return  # none: declared by this version, or retired already
        levels = [n.delay(k) for k in range(DELAY_LEVELS)]
        try:
            async with open_api(settings.management_url, settings.amqp_url) as api:
                reason = await _why_kept(api, channel, n, vhost(settings.amqp_url), levels)
        except ManagementUnavailable as error:
            reason = str(error)
        if reason is not None:
            log.info("earlier per-queue delay levels kept", queue=n.queue, reason=reason)
            return
        ch = await channel.get()
        await ch.exchange_delete(n.delay_entry)  # first: nothing enters from now on
        for name in levels:
            await ch.queue_delete(name)
        for name in levels[:-1]:
            await ch.exchange_delete(name)
        log.info("earlier per-queue delay levels retired", queue=n.queue)
    finally:
        await channel.close()


async def older_workers_connected(api: Api, vh: str, queue: str) -> int:
    """How many workers of an earlier version the management API lists as connected for
    queue."""
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
