"""A queue's rate limits on this worker (SPEC 28): the tokens its jobs take, the limits it
announces, and, in the one process of the vhost that leads them, the refill.

Every process with limits for the queue announces them every HEARTBEAT_S. The process whose
connection holds the queue's rates lead (broker/lead.py) reads the announcements and refills
each limited type at the lowest rate announced for it: each token as it falls due is banked, up
to the burst, and wakes the oldest job waiting for one, which takes a token like any job
(broker/rate_store.py). A process that does not lead looks for the lead every LEAD_PROBE_S and
takes it once the broker has dropped it with the leader's connection; it takes the limits its
predecessor recorded for an announcement of that moment, so that a type only others limit is
refilled from the start, and released only if nobody announces it within FORGET_S.
"""

import asyncio
import contextlib
import os
import random
import socket
import time

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from ricochet import rates
from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.connection import is_lost, lost_or_cancelled
from ricochet.broker.lead import lead_is_held, take_lead
from ricochet.broker.publish import confirming_channel
from ricochet.broker.rate_store import (
    Applied,
    announce,
    announcement,
    bank_token,
    declare_rates,
    read_announcements,
    read_applied,
    take_token,
    waiting,
    wake_one,
    write_applied,
)
from ricochet.delivery.failed import copy_of, properties_of
from ricochet.log import get_logger
from ricochet.names import SHARED, Names
from ricochet.observe.metrics import Metrics

log = get_logger("ricochet.rates")

HEARTBEAT_S = 10.0
# An announcement older than this is a process gone: its limits no longer count.
FORGET_S = 3 * HEARTBEAT_S
LEAD_PROBE_S = 2.0
# The leader reads the announcements and the depths this often; it wakes at least this often.
ROUND_S = 1.0
RETRY_S = 1.0
# Whose limits a new leader reads from the register at its start (Q.rates.applied).
PREDECESSOR = "the leader before"


def due_tokens(next_at: float, now: float, limit: rates.Limit) -> tuple[int, float]:
    """(tokens due by now, when the next one is due after them) of a bucket whose next token
    was due at next_at (pure). A leader that fell behind hands out at most the burst at once:
    the time it fell behind was a bucket full, not more."""
    if now < next_at:
        return 0, next_at
    due = int((now - next_at) / limit.interval_s) + 1
    if due > limit.burst:
        return limit.burst, now + limit.interval_s
    return due, next_at + due * limit.interval_s


def applied(
    own: dict[str, rates.Limit],
    announced: dict[str, tuple[float, dict[str, rates.Limit]]],
    now: float,
) -> Applied:
    """The limit of each type the leader refills (pure): the lowest of its own and of those
    announced within FORGET_S; and the limits given for each type they differ on."""
    given: dict[str, list[rates.Limit]] = {t: [x] for t, x in own.items()}
    for seen, limits in announced.values():
        if now - seen <= FORGET_S:
            for job_type, limit in limits.items():
                given.setdefault(job_type, []).append(limit)
    differing = {
        t: sorted({x.text() for x in limits})
        for t, limits in given.items()
        if len({x.text() for x in limits}) > 1
    }
    return Applied({t: rates.lowest(limits) for t, limits in given.items()}, differing)


class RateLimits:
    """One queue's limits on this worker, on each of its connections."""

    def __init__(
        self, queue: str, own: dict[str, rates.Limit], metrics: Metrics, user: str
    ) -> None:
        self._names = Names(queue)
        # The AMQP user of the workers: only what the broker vouches it published (tokens,
        # announcements, the register) counts.
        self._user = user
        self._own = own
        self._metrics = metrics
        self._process = f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        # Set while the limits are declared and their channel open on the current connection, or
        # once they could not be declared (unapplied: the jobs run without them, as logged).
        self._ready = asyncio.Event()
        self._unapplied = False
        # The types whose gauges this process sets, as the leader.
        self._reported: set[str] = set()

    def limits(self, job_type: str | None) -> bool:
        """Whether this worker limits the type."""
        return job_type in self._own

    async def take(self, job_type: str) -> bool:
        """Whether a token of the type was there to take (it is gone then); waits until the
        limits are declared on the connection (its first jobs may come before)."""
        await self._ready.wait()
        if self._unapplied:
            return True
        if self._channel is None or self._channel.is_closed:  # closed by the broker: again
            assert self._connection is not None
            self._channel = await self._connection.channel(publisher_confirms=False)
        return await take_token(self._channel, self._names, job_type, self._user)

    async def wait_for_token(self, job_type: str) -> None:
        """Take a token of the type, looking again every interval of this worker's limit (a
        second at most) until one is there."""
        pause_s = min(self._own[job_type].interval_s, 1.0)
        taken = await self.take(job_type)
        while not taken:
            await asyncio.sleep(pause_s)
            taken = await self.take(job_type)

    async def run(self, connection: AbstractConnection) -> None:
        """Declare the queue's limited types, take tokens, announce, and lead or wait to lead,
        for the connection's life."""
        if not self._own:
            return
        try:
            await declare_rates(connection, self._names.queue, list(self._own))
        except CONNECTION_ERRORS as error:
            if is_lost(connection):
                return
            # A queue of these names declared otherwise: the limits cannot hold, and no job may
            # wait for tokens that never come.
            log.error("rate limits not applied", queue=self._names.queue, error=str(error))
            self._unapplied = True
            self._ready.set()
            return
        self._unapplied = False
        self._connection = connection
        self._channel = await connection.channel(publisher_confirms=False)
        self._ready.set()
        tasks = [
            asyncio.get_running_loop().create_task(work)
            for work in (self._announce(connection), self._lead(connection))
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self._ready.clear()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, *CONNECTION_ERRORS):
                    await task

    async def _announce(self, connection: AbstractConnection) -> None:
        channel = await confirming_channel(connection)
        while not lost_or_cancelled(connection):
            await announce(channel, self._names, announcement(self._process, self._own, self._user))
            await asyncio.sleep(HEARTBEAT_S)

    async def _lead(self, connection: AbstractConnection) -> None:
        """Wait for the lead, then refill until the connection goes; start over after a
        failure of the leader's own while it lives."""
        lead = SHARED.rates_lead(self._names.queue)
        holding = False  # the lead is the connection's until it closes: never waited for again
        # Each process's limits as last announced, and when read: kept while this connection
        # leads, whatever starts the refill over.
        announced: dict[str, tuple[float, dict[str, rates.Limit]]] = {}
        try:
            while not lost_or_cancelled(connection):
                try:
                    channel = await confirming_channel(connection)
                    if not holding:
                        holding = await self._wait_for(connection, channel, lead)
                        if not holding:  # lost, or asked to stop
                            return
                        log.info("leading rate limits", queue=self._names.queue)
                        before = await read_applied(channel, self._names, self._user)
                        announced[PREDECESSOR] = (time.monotonic(), before.limits)
                    await self._refill(connection, channel, announced)
                except CONNECTION_ERRORS as error:
                    if is_lost(connection):
                        return
                    log.warning("rate limits: channel lost, starting over", error=str(error))
                except Exception:  # the leader's own failure must not stop the worker
                    log.exception("rate limits: leading failed, starting over")
                await asyncio.sleep(RETRY_S)
        finally:
            for job_type in list(self._reported):  # another process leads from now on
                self._forget(job_type)

    async def _wait_for(
        self, connection: AbstractConnection, channel: AbstractChannel, lead: str
    ) -> bool:
        """True once this connection holds the lead (free, then taken); False when the
        connection is lost or the task asked to stop first."""
        holding = False
        while not holding and not lost_or_cancelled(connection):
            if not await lead_is_held(channel, lead):
                holding = await take_lead(connection, lead)
            if not holding:
                await asyncio.sleep(LEAD_PROBE_S * (0.5 + random.random()))
        return holding

    async def _refill(
        self,
        connection: AbstractConnection,
        channel: AbstractChannel,
        announced: dict[str, tuple[float, dict[str, rates.Limit]]],
    ) -> None:
        """Hand out each type's tokens as they fall due, reading the announcements (into
        announced), and the jobs waiting for the gauges, every ROUND_S. A type nobody limits any
        more has its waiting jobs released."""
        next_at: dict[str, float] = {}
        limits: dict[str, rates.Limit] = {}
        recorded = Applied({}, {})
        read_at = 0.0
        stalled: set[str] = set()  # the types whose jobs waited for a token at the last round
        while not lost_or_cancelled(connection):
            now = time.monotonic()
            if now - read_at >= ROUND_S:
                read = await read_announcements(channel, self._names, self._user)
                for process, theirs in read.items():
                    announced[process] = (now, theirs)
                now_applied = applied(self._own, announced, now)
                if now_applied != recorded:
                    if now_applied.limits.keys() - recorded.limits.keys():  # another's types
                        await declare_rates(connection, self._names.queue, list(now_applied.limits))
                    await write_applied(
                        channel, self._names, self._process, now_applied, self._user
                    )
                    recorded = now_applied
                limits = now_applied.limits
                stalled = await self._report(channel, limits)
                read_at = now
            for job_type in [t for t in next_at if t not in limits]:
                await self._release(channel, job_type)
                del next_at[job_type]
            for job_type, limit in limits.items():
                due, next_at[job_type] = due_tokens(next_at.get(job_type, now), now, limit)
                await self._hand_out(channel, job_type, limit, due, stalled)
            wake = min([read_at + ROUND_S, *next_at.values()])
            await asyncio.sleep(max(0.0, wake - time.monotonic()))

    async def _hand_out(
        self,
        channel: AbstractChannel,
        job_type: str,
        limit: rates.Limit,
        due: int,
        stalled: set[str],
    ) -> None:
        """Bank the type's due tokens, up to the burst, each waking a waiting job. stalled: the
        types whose jobs waited at the round; a type's bucket found full wakes one of them
        anyway, once a round (the type leaves stalled)."""
        for _ in range(due):
            if await bank_token(channel, self._names, job_type, limit.burst, self._user):
                await wake_one(channel, self._names, job_type, _copied)
            elif job_type in stalled:
                # The bucket is full and jobs wait: the wake meant for one found none (it joined
                # the line a moment after, or the leader before was cut off between its bank
                # and its wake), and a full bucket wakes no more. It takes a token as any job.
                stalled.discard(job_type)
                await wake_one(channel, self._names, job_type, _copied)

    async def _release(self, channel: AbstractChannel, job_type: str) -> None:
        """A type no worker limits any more: the jobs that wait for its tokens all run."""
        released = 0
        while await wake_one(channel, self._names, job_type, _copied):
            released += 1
        log.info("rate limit lifted", queue=self._names.queue, type=job_type, released=released)
        self._forget(job_type)

    def _forget(self, job_type: str) -> None:
        """Export nothing more for the type: this process no longer applies its limit."""
        self._reported.discard(job_type)
        for gauge in (self._metrics.rate_limited, self._metrics.rate_limit):
            with contextlib.suppress(KeyError):
                gauge.remove(self._names.queue, job_type)

    async def _report(self, channel: AbstractChannel, limits: dict[str, rates.Limit]) -> set[str]:
        """Set each type's gauges; the types whose jobs wait for a token."""
        queue = self._names.queue
        stalled: set[str] = set()
        for job_type, limit in limits.items():
            held = await waiting(channel, self._names, job_type)
            self._metrics.rate_limited.labels(queue=queue, type=job_type).set(held)
            self._metrics.rate_limit.labels(queue=queue, type=job_type).set(limit.per_s)
            self._reported.add(job_type)
            if held:
                stalled.add(job_type)
        return stalled


def _copied(held: AbstractIncomingMessage) -> aio_pika.Message:
    """A job woken from its wait, as it goes back to its queue: as it waited."""
    return copy_of(held.body, properties_of(held), dict(held.headers or {}))
