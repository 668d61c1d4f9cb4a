"""Acks of one channel, coalesced: one ack with multiple=True for the finished deliveries below
the oldest one still running, a single ack for each finished one above it."""

import asyncio
from collections.abc import Collection

import structlog

from ricochet.broker.amqp import CONNECTION_ERRORS, Delivery

log = structlog.get_logger("ricochet.acks")


def plan_acks(running: Collection[int], finished: Collection[int]) -> tuple[int | None, list[int]]:
    """(the tag to ack with multiple=True, or None; the tags to ack one by one).

    A multiple ack settles every unsettled delivery up to its tag, so it may only reach below
    the oldest delivery still running. A finished job above that one is acked on its own rather
    than kept waiting, so that a slow job does not hold the prefetch window shut.
    """
    oldest_running = min(running, default=None)
    below = [t for t in finished if oldest_running is None or t < oldest_running]
    above = sorted(t for t in finished if oldest_running is not None and t > oldest_running)
    if len(below) > 1:
        return max(below), above
    return None, sorted(below) + above


class Acks:
    """Tracks the deliveries of one channel and acks the finished ones at the next loop turn.

    A delivery counts as running from its arrival until it is acked here or released (after
    its nack was sent): a nack not yet written must never be overtaken by a multiple ack.
    """

    def __init__(self) -> None:
        self._running: set[int] = set()
        self._finished: dict[int, Delivery] = {}
        self._flushing: asyncio.Task[None] | None = None

    def delivered(self, message: Delivery) -> None:
        self._running.add(message.delivery_tag)

    def release(self, message: Delivery) -> None:
        """The delivery was settled otherwise (nacked): it no longer holds back the acks."""
        self._running.discard(message.delivery_tag)

    def ack_soon(self, message: Delivery) -> None:
        """Ack the delivery together with the others that finish in the same loop turn."""
        self._running.discard(message.delivery_tag)
        self._finished[message.delivery_tag] = message
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def drain(self) -> None:
        """Send every ack still pending (before the channel closes)."""
        if self._flushing is not None:
            await asyncio.wait({self._flushing})
        await self._flush()

    async def _flush(self) -> None:
        while self._finished:
            finished, self._finished = self._finished, {}
            multiple, singles = plan_acks(self._running, finished)
            try:
                if multiple is not None:
                    await finished[multiple].ack(multiple=True)
                for tag in singles:
                    await finished[tag].ack()
            except CONNECTION_ERRORS:
                log.warning(
                    "jobs not acked: channel closed, the broker delivers them again",
                    jobs=len(finished),
                )
                return
