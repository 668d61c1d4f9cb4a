"""`ricochet migrate [--dry-run]`: move what earlier versions left in the vhost, once (SPEC 25).

Earlier versions kept, per queue, a cancel store (Q.cancels, a stream) and the levels of the
delays (Q.delay.0 to Q.delay.24). Until they are gone every worker's start reads each queue's
old store; migrate ends that:

- each old store's cancels made within the kept 31 days are appended to the shared store,
  marked as moved (they keep covering what they covered), and the old store is deleted, after
  they are confirmed: killed midway, a second run moves them again, which changes nothing;
- each queue's old levels are retired once empty (until then they pass their jobs on to Q by
  themselves); while one holds a job they stay, and migrate says so;
- the stream where earlier versions recorded each retry's reason (ricochet.retries; the
  journal holds them now) is deleted;
- once nothing is left, the register SHARED.migrated records it, and no start looks again.

It refuses while a worker of an earlier version is connected: it would write there again.
"""

import asyncio
import datetime as dt
import re
from dataclasses import asdict, dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from ricochet.broker.cancel_log import CancelLog
from ricochet.broker.cancels import OldStore, moved_cancel_record
from ricochet.broker.connection import close_quietly, connect, connection_name
from ricochet.broker.legacy import (
    levels_name,
    mark_migrated,
    old_levels,
    old_stores,
    older_workers_connected,
    retire_legacy_delays,
)
from ricochet.broker.management import Api, open_api, vhost
from ricochet.broker.plan import CANCELS_MAX_AGE_S
from ricochet.broker.publish import confirming_channel, publish_to_queue
from ricochet.broker.stream_log import read_up_to_now
from ricochet.errors import RicochetError
from ricochet.names import DELAY_LEVELS, SHARED, Names
from ricochet.settings import Settings

# A look at an old store that has not read up to now by then gives up (nothing is moved).
READ_TIMEOUT_S = 120.0
# Cancels appended at a time, each confirmed.
BATCH = 1000


class MigrationRefused(RicochetError):
    """A worker of an earlier version is connected: nothing was moved."""


@dataclass(frozen=True)
class Step:
    """One thing migrate found: what, its name, whether it is done (or, dry, would be), how."""

    what: str
    name: str
    done: bool
    detail: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


async def find_old(api: Api, vh: str) -> tuple[list[str], list[str], bool]:
    """(queues with an old cancel store, queues with old levels, whether the old record of the
    retries is there) in the vhost."""
    stores = await api.listing("queues", vh, r"\.cancels$", "name,type")
    entries = await api.listing("exchanges", vh, rf"\.delay\.{DELAY_LEVELS - 1}$", "name")
    retries = await api.listing("queues", vh, rf"^{re.escape(SHARED.retries)}$", "name")
    return old_stores(stores), old_levels(entries), bool(retries)


async def migrate(settings: Settings, dry_run: bool) -> list[Step]:
    """Move what earlier versions left in the vhost (dry: say what would be moved); the steps,
    the register's last when everything is gone. MigrationRefused while a worker of an earlier
    version is connected."""
    vh = vhost(settings.amqp_url)
    async with open_api(settings.management_url, settings.amqp_url) as api:
        older = await older_workers_connected(api, vh)
        if older:
            raise MigrationRefused(
                f"{older} worker(s) of an earlier ricochet are connected to {vh!r}: upgrade "
                "or stop them first (nothing was moved)"
            )
        stores, levels, retries = await find_old(api, vh)
    connection = await connect(settings.amqp_url, connection_name("migrate", settings.queue), 0)
    try:
        steps = [await move_cancels(connection, queue, dry_run) for queue in stores]
        for queue in levels:
            queue_settings = settings.model_copy(update={"queue": queue})
            steps.append(await retire_levels(connection, queue_settings, dry_run))
        if retries:
            steps.append(await delete_retries(connection, dry_run))
        if all(step.done for step in steps) and not dry_run:
            await mark_migrated(connection, {"at": dt.datetime.now(dt.UTC).isoformat()})
            steps.append(Step("register", SHARED.migrated, True, "written: starts look no more"))
        return steps
    finally:
        await close_quietly(connection)


async def move_cancels(connection: AbstractConnection, queue: str, dry_run: bool) -> Step:
    """Append the old store's cancels within the kept time to the shared store, confirmed, then
    delete the old store (dry: count them)."""
    name = Names(queue).cancels
    found = CancelLog(CANCELS_MAX_AGE_S)  # the worker's rule: stamps, their bound, the kept time
    if (
        await read_up_to_now(connection, name, OldStore(found, queue).read, "first", READ_TIMEOUT_S)
        is None
    ):
        return Step("cancel store", name, False, "not read up to now: nothing moved")
    if dry_run:
        return Step("cancel store", name, True, f"would move {len(found)} cancel(s) and delete it")
    channel = await confirming_channel(connection)
    try:
        records = [moved_cancel_record(queue, m, name, at) for _, m, _, at in found.entries()]
        for start in range(0, len(records), BATCH):
            await _append(channel, records[start : start + BATCH])
        # This version's workers read it too: each drops its reader when it goes.
        await channel.queue_delete(name)
    finally:
        await channel.close()
    return Step(
        "cancel store", name, True, f"{len(found)} cancel(s) moved to {SHARED.cancels}; deleted"
    )


async def _append(channel: AbstractChannel, records: list[aio_pika.Message]) -> None:
    """Append records to the shared store, each confirmed; MissingQueue when it is not declared
    (no worker of this version has started): then nothing is deleted."""
    await asyncio.gather(*(publish_to_queue(channel, SHARED.cancels, r) for r in records))


async def delete_retries(connection: AbstractConnection, dry_run: bool) -> Step:
    """Delete the stream of the retries' records of earlier versions (dry: say it would)."""
    if dry_run:
        return Step("record of retries", SHARED.retries, True, "would be deleted")
    channel = await connection.channel()
    try:
        await channel.queue_delete(SHARED.retries)
    finally:
        await channel.close()
    return Step("record of retries", SHARED.retries, True, "deleted: the journal holds retries")


async def retire_levels(connection: AbstractConnection, settings: Settings, dry_run: bool) -> Step:
    """Retire the queue's old levels when they are empty (dry: say whether they would be)."""
    name = levels_name(Names(settings.queue))
    kept = await retire_legacy_delays(connection, settings, dry_run=dry_run)
    if kept is None:
        return Step("delay levels", name, True, "would be retired" if dry_run else "retired")
    return Step("delay levels", name, False, f"kept: {kept}; run ricochet migrate again then")
