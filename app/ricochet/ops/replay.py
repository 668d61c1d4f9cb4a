"""Replay: moving failed copies back to the main queue, or listing them (--dry-run).

It reads the failed queue with a scan (ricochet/ops/scan.py): a moved copy's publish to the main
queue and its ack are committed together, so a replay killed midway leaves every job in exactly
one of the two queues; the copies it does not move go back to the failed queue in their order.
The scan reads at most the depth the failed queue had at start, so a replayed job that fails
again is not read a second time.
"""

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection

from ricochet.delivery.failed import copied_headers, copy_of, properties_of
from ricochet.headers import DELIVERY_COUNTS, FAILURE_HEADERS, INCARNATION, REPLAY_COUNT
from ricochet.ladders import is_int
from ricochet.log import get_logger
from ricochet.names import Names
from ricochet.ops.scan import Copy, Removal, select
from ricochet.ops.selection import Outcome, Selection
from ricochet.tracing import inject_current

log = get_logger("ricochet.replay")

# The largest integer an AMQP header carries (a signed 64-bit one): a replay-count there stays.
COUNT_MAX = 2**63 - 1


def replayed_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The copy's headers without the failure's, with replay-count incremented (up to
    COUNT_MAX: a header past it could not be sent, and the replay would stop at that copy).

    Without the client's incarnation token too: a replayed job is published again by ricochet,
    stamped with the time of the replay, and a cancel covers it by that time (no wait of the
    token recorded since a cancel would spare it, and it would be dropped from the backlog)."""
    # The failed queue's own delivery counts say nothing of the job in the main queue.
    kept = {
        k: v
        for k, v in copied_headers(headers).items()
        if k not in FAILURE_HEADERS and k not in DELIVERY_COUNTS and k != INCARNATION
    }
    previous = headers.get(REPLAY_COUNT)
    if not is_int(previous) or previous < 0:
        previous = 0
    kept[REPLAY_COUNT] = min(previous + 1, COUNT_MAX)
    return kept


async def replay(
    connection: AbstractConnection,
    names: Names,
    selection: Selection,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    stop: asyncio.Event | None = None,
    management_url: str | None = None,
) -> Outcome:
    """Move (or, with dry_run, list) the selected copies; stops early when stop is set."""
    removal = None if dry_run else Removal("replayed", _replayed)
    return await select(
        connection,
        names,
        selection,
        removal=removal,
        limit=limit,
        stop=stop,
        management_url=management_url,
    )


def _replayed(copy: Copy) -> aio_pika.Message:
    """The job as it goes back to the main queue: the copy without its failure headers, stamped
    with the time of the replay, since it is published again: a cancel made before the replay
    (of a job that had already failed) does not cover it."""
    headers = replayed_headers(copy.message.headers or {})
    inject_current(headers)  # a replay inside a span joins it; else the job keeps its own trace
    properties = properties_of(copy.message) | {"timestamp": time.time()}
    return copy_of(copy.message.body, properties, headers)
