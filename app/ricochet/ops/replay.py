"""Replay: moving failed copies back to the main queue, or listing them (--dry-run).

Every copy read is held unacked. A moved one is acked only after its replay is confirmed in the
main queue; the others go back to the failed queue when the channel closes, so they keep their
place as far as the broker allows and are never nacked (a requeue counts toward a quorum
queue's delivery limit on RabbitMQ 4). The scan reads at most the depth the failed queue had at
start, so a replayed job that fails again is not read a second time.
"""

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from ricochet.broker.depth import read_depth
from ricochet.broker.publish import confirming_channel, publish_to_queue
from ricochet.broker.topology import Names
from ricochet.delivery.failed import (
    FAILURE_HEADERS,
    FailureInfo,
    copied_headers,
    copy_of,
    properties_of,
    read_failure,
)
from ricochet.delivery.retry import is_int
from ricochet.errors import MissingQueue, RicochetError
from ricochet.service.process import stop_signals
from ricochet.tracing import inject_current

log = structlog.get_logger("ricochet.replay")

REPLAY_COUNT = "replay-count"
# The failed queue's own delivery counters: they say nothing about the job in the main queue.
DELIVERY_COUNTS = ("x-delivery-count", "x-acquired-count")


@dataclass(frozen=True)
class Selection:
    """Which failed copies to replay; None matches anything."""

    reason: str | None = None
    type: str | None = None
    message_id: str | None = None

    def matches(self, failure: FailureInfo) -> bool:
        """--reason is a substring of failed-reason; --type and --message-id are exact."""
        return (
            (self.reason is None or self.reason in failure.reason)
            and (self.type is None or self.type == failure.type)
            and (self.message_id is None or self.message_id == failure.message_id)
        )


def replayed_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The copy's headers without the failure's, with replay-count incremented."""
    kept = {
        k: v
        for k, v in copied_headers(headers).items()
        if k not in FAILURE_HEADERS and k not in DELIVERY_COUNTS
    }
    previous = headers.get(REPLAY_COUNT)
    if not is_int(previous) or previous < 0:
        previous = 0
    kept[REPLAY_COUNT] = previous + 1
    return kept


@dataclass
class ReplayResult:
    """What a replay did: the copies it moved (or would move), and how many it left."""

    depth: int
    selected: list[FailureInfo] = field(default_factory=list)
    interrupted: bool = False

    @property
    def kept(self) -> int:
        return self.depth - len(self.selected)

    def count_by(self, attribute: str) -> Counter[str]:
        """Selected copies per value of a FailureInfo attribute (reason, type, kind)."""
        return Counter(str(getattr(f, attribute)) for f in self.selected)


async def replay(
    connection: AbstractConnection,
    names: Names,
    selection: Selection,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    stop: asyncio.Event | None = None,
) -> ReplayResult:
    """Move (or, with dry_run, list) the selected copies; stops early when stop is set."""
    channel = await confirming_channel(connection)
    try:
        depth = await read_depth(channel, names.failed)
        if depth is None:
            raise MissingQueue(names.failed)
        failed = await channel.get_queue(names.failed, ensure=False)
        result = ReplayResult(depth=depth.messages)
        for _ in range(result.depth):
            if stop is not None and stop.is_set():
                result.interrupted = True
                break
            if limit is not None and len(result.selected) >= limit:
                break
            message = await failed.get(no_ack=False, fail=False)
            if message is None:  # someone else took copies meanwhile
                break
            failure = read_failure(
                dict(message.headers or {}), message.message_id, message.type, message.body
            )
            if not selection.matches(failure):
                continue  # held unacked: it goes back when the channel closes
            if not dry_run:
                await _move(channel, names.queue, message)
            result.selected.append(failure)
    finally:
        # Returns every copy held unacked to the failed queue; the acks sent before it are
        # processed first, as the broker handles a channel's frames in order.
        if not channel.is_closed:
            await channel.close()
    return result


async def _move(channel: AbstractChannel, queue: str, message: AbstractIncomingMessage) -> None:
    """Publish the job back to the main queue, confirmed, then ack its failed copy."""
    headers = replayed_headers(message.headers or {})
    inject_current(headers)  # a replay inside a span joins it; else the job keeps its own trace
    await publish_to_queue(channel, queue, copy_of(message.body, properties_of(message), headers))
    # A crash right here leaves the job in both queues: the only at-least-once window.
    await message.ack()
    log.info("replayed", message_id=message.message_id, type=message.type)


async def run_replay(
    connection: AbstractConnection,
    names: Names,
    selection: Selection,
    *,
    limit: int | None,
    dry_run: bool,
) -> ReplayResult:
    """replay() under Ctrl-C: a first signal finishes the copy in hand and stops cleanly."""
    with stop_signals() as lifecycle:
        result = await lifecycle.unless_forced(
            replay(
                connection,
                names,
                selection,
                limit=limit,
                dry_run=dry_run,
                stop=lifecycle.stopping,
            )
        )
    if result is None:
        raise RicochetError(
            "replay abandoned by a second signal: the job being moved, if any, may now be in "
            f"both {names.queue} and {names.failed}"
        )
    return result
