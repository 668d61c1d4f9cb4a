"""The monitor's relaunch of failed jobs on a timer (SPEC 22): every RICOCHET_RELAUNCH_INTERVAL_S,
the failed copies of RICOCHET_RELAUNCH_KINDS replayed fewer than RICOCHET_RELAUNCH_MAX times
(their replay-count) go back to the queue; the others stay for a person.

It is `ricochet replay` with a selection of its own (ops/replay.py and the scan it reads with):
each copy's publish to the queue and its ack are committed together, so a monitor killed midway
leaves every copy in exactly one of the two queues, and each copy moved is logged (`replayed`,
with its message_id, type and reason) and counted (ricochet_relaunched_total).
"""

import asyncio
import contextlib

from aio_pika.abc import AbstractConnection

from ricochet.broker.journal import now_ms, write_entries
from ricochet.errors import RicochetError
from ricochet.log import get_logger
from ricochet.names import Names
from ricochet.observe.metrics import Metrics
from ricochet.ops.jobs import moved_entries
from ricochet.ops.replay import replay
from ricochet.ops.selection import Selection
from ricochet.settings import Settings

log = get_logger("ricochet.monitor")


def relaunch_selection(settings: Settings) -> Selection:
    """The copies a relaunch moves: of the kinds chosen, replayed fewer times than the maximum."""
    return Selection(kinds=frozenset(settings.relaunch_kinds), replays_below=settings.relaunch_max)


async def relaunch_every(
    connection: AbstractConnection,
    names: Names,
    settings: Settings,
    metrics: Metrics,
    done: asyncio.Event,
) -> None:
    """Relaunch every interval until done is set (a relaunch under way then ends after the copy
    in hand, what it took committed)."""
    selection = relaunch_selection(settings)
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), settings.relaunch_interval_s)
        if done.is_set():
            return
        began_ms = now_ms()
        try:
            outcome = await replay(
                connection,
                names,
                selection,
                stop=done,
                management_url=settings.management_url,
            )
        except RicochetError as error:  # another reader holds the failed queue, say: next time
            log.warning("relaunch skipped", queue=names.queue, error=str(error))
            continue
        if outcome.selected:
            if settings.journal == "on":
                moved = moved_entries(names.queue, outcome.selected, "relaunched", began_ms)
                await write_entries(connection, moved)
            metrics.relaunched.labels(queue=names.queue).inc(len(outcome.selected))
            log.info(
                "failed jobs relaunched",
                queue=names.queue,
                jobs=len(outcome.selected),
                kinds=sorted(selection.kinds or ()),
                kept=outcome.kept,
            )
