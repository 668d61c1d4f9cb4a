"""A queue's rate limits in the broker (SPEC 28, ricochet.rates): the tokens of each limited
type, the jobs that wait for one, and the limits each worker announces.

A worker runs a limited job once it takes a token (take_token); else it sends the job to wait
(its copy to the type's limited exchange, which keeps its routing key). The process that leads
the queue's limits (worker/rate_limits.py) banks each token as it falls due, up to the burst
(bank_token), and for each token banked sends the oldest waiting job back to the queue
(wake_one), where it takes a token like any other job. Only a token starts a job, so the
starts never pass the bucket, wherever the woken job is in the queue's backlog.
"""

import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from ricochet import rates
from ricochet.broker.amqp import broker_version
from ricochet.broker.depth import read_depth
from ricochet.broker.plan import rate_plan
from ricochet.broker.publish import publish_confirmed
from ricochet.broker.register import declare_register, read_register, write_register
from ricochet.names import Names

# An announcement's body is read up to this size: a producer may write anything there.
ANNOUNCEMENT_MAX_BYTES = 65_536


async def declare_rates(connection: AbstractConnection, queue: str, job_types: list[str]) -> None:
    """Declare the objects of queue's limited types (idempotent), on a channel of its own."""
    plan = rate_plan(queue, job_types, broker_version(connection))
    channel = await connection.channel(publisher_confirms=False)
    try:
        for x in plan.exchanges:
            await channel.declare_exchange(x.name, x.kind, durable=True, arguments=x.arguments)
        for spec in plan.queues:
            await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        for b in plan.bindings:
            bound = await channel.get_queue(b.destination, ensure=False)
            await bound.bind(b.source, routing_key=b.routing_key)
        await declare_register(channel, Names(queue).rates_applied)
    finally:
        await channel.close()


async def take_token(channel: AbstractChannel, names: Names, job_type: str, user: str) -> bool:
    """Whether a token of the type was there to take (it is gone then): one the broker vouches
    user published (its user_id). Another is a producer's forgery: taken away, and the next
    looked at."""
    tokens = await channel.get_queue(names.tokens(job_type), ensure=False)
    while (token := await tokens.get(no_ack=True, fail=False)) is not None:
        if token.user_id == user:
            return True
    return False


async def wake_one(
    channel: AbstractChannel,
    names: Names,
    job_type: str,
    copied: Callable[[AbstractIncomingMessage], aio_pika.Message],
) -> bool:
    """Send the oldest job waiting for a token of the type back to its queue (by the queue's
    return exchange, with its routing key, as a job back from a tier), as copied makes it from
    the waiting message, confirmed, then ack it: there it takes a token as any job does. False
    when none waits."""
    limited = await channel.get_queue(names.limited(job_type), ensure=False)
    held = await limited.get(no_ack=False, fail=False)
    if held is None:
        return False
    back = await channel.get_exchange(names.return_exchange, ensure=False)
    await publish_confirmed(back, copied(held), held.routing_key or names.queue)
    await held.ack()
    return True


async def bank_token(
    channel: AbstractChannel, names: Names, job_type: str, burst: int, user: str
) -> bool:
    """Put a token of the type in its queue unless burst of them wait there; whether it did."""
    depth = await read_depth(channel, names.tokens(job_type))
    if depth is None or depth.messages >= burst:
        return False
    token = aio_pika.Message(b"", user_id=user)  # the broker refuses it from any other user
    await publish_confirmed(channel.default_exchange, token, names.tokens(job_type))
    return True


async def waiting(channel: AbstractChannel, names: Names, job_type: str) -> int:
    """How many jobs of the type wait for a token."""
    depth = await read_depth(channel, names.limited(job_type))
    return 0 if depth is None else depth.messages


class Applied(NamedTuple):
    """What the leader of a queue's limits applies, and, for each type the workers disagree on,
    the limits they announce."""

    limits: dict[str, rates.Limit]
    differing: dict[str, list[str]]


def _body(
    process: str, limits: dict[str, rates.Limit], differing: dict[str, list[str]] | None = None
) -> bytes:
    limits_as_sent = {t: [x.count, x.period_s, x.burst] for t, x in limits.items()}
    body: dict[str, Any] = {"process": process, "limits": limits_as_sent}
    if differing:
        body["differing"] = differing
    return json.dumps(body).encode()


def announcement(process: str, limits: dict[str, rates.Limit], user: str) -> aio_pika.Message:
    """A worker process's limits, as it announces them every heartbeat, as user."""
    return aio_pika.Message(_body(process, limits), timestamp=time.time(), user_id=user)


async def write_applied(
    channel: AbstractChannel, names: Names, process: str, applied: Applied, user: str
) -> None:
    """Record what the leader (process) applies, as user, for `ricochet status`, `doctor` and
    the next leader."""
    body = _body(process, applied.limits, applied.differing)
    await write_register(channel, names.rates_applied, body, writer=user)


async def read_applied(channel: AbstractChannel, names: Names, user: str) -> Applied:
    """What the queue's leader applies, as user recorded it (nothing when nobody did, or
    another user wrote the register); ChannelNotFoundEntity when no worker with limits ever
    ran."""
    body = await read_register(channel, names.rates_applied, 0, writer=user)
    parsed = None if body is None else _announced(body)
    if body is None or parsed is None:
        return Applied({}, {})
    differing = json.loads(body).get("differing")
    return Applied(parsed[1], _texts(differing))


def _texts(value: Any) -> dict[str, list[str]]:
    """The differing limits as recorded, or none when a writer recorded something else."""
    if not isinstance(value, dict):
        return {}
    return {
        str(t): [str(x) for x in texts][:10]
        for t, texts in value.items()
        if isinstance(texts, list)
    }


async def announce(channel: AbstractChannel, names: Names, message: aio_pika.Message) -> None:
    await publish_confirmed(channel.default_exchange, message, names.rates)


async def read_announcements(
    channel: AbstractChannel, names: Names, user: str
) -> dict[str, dict[str, rates.Limit]]:
    """Take every announcement waiting: the limits of each process (the newest read wins); one
    that cannot be read, or that user did not publish, is dropped."""
    queue = await channel.get_queue(names.rates, ensure=False)
    found: dict[str, dict[str, rates.Limit]] = {}
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        parsed = _announced(message.body) if message.user_id == user else None
        if parsed is not None:
            found[parsed[0]] = parsed[1]
    return found


def _announced(body: bytes) -> tuple[str, dict[str, rates.Limit]] | None:
    if len(body) > ANNOUNCEMENT_MAX_BYTES:
        return None
    try:
        decoded = json.loads(body)
        process, limits = decoded["process"], decoded["limits"]
        units = {s: u for u, s in rates.PERIODS.items()}
        return str(process), {
            rates.checked_type(t): rates.limit(f"{count}/{units[period]}", burst)
            for t, (count, period, burst) in limits.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
