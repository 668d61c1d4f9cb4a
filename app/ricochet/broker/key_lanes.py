"""A queue's key lanes in the broker (SPEC 28): declared by whoever meets the queue's first job
with a key (a client enqueueing it, or a worker that takes it from the queue), and found by
the workers that did not declare them."""

import contextlib

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelPreconditionFailed

from ricochet.broker.amqp import COMMAND_INVALID, CONNECTION_ERRORS, broker_version
from ricochet.broker.depth import queue_exists
from ricochet.broker.plan import key_lanes_plan
from ricochet.errors import ConfigError, TopologyConflict
from ricochet.names import Names

PLUGIN = "rabbitmq_consistent_hash_exchange"
# Lanes beyond a setting's count are looked for up to here (RICOCHET_KEY_LANES' upper bound).
MOST_LANES = 256


async def declare_key_lanes(connection: AbstractConnection, queue: str, count: int) -> None:
    """Declare queue's key exchange, count lanes and their bindings (idempotent), on a channel of
    its own; ConfigError when the broker lacks the consistent-hash exchange, TopologyConflict
    when it holds a lane of other arguments."""
    plan = key_lanes_plan(queue, count, broker_version(connection))
    channel = await connection.channel(publisher_confirms=False)
    try:
        try:
            exchange = await channel.declare_exchange(
                plan.exchange.name,
                plan.exchange.kind,
                durable=True,
                arguments=plan.exchange.arguments,
            )
        except COMMAND_INVALID as error:
            raise ConfigError(
                f"jobs with a key need the consistent-hash exchange, which the broker lacks "
                f"({error}): enable it with `rabbitmq-plugins enable {PLUGIN}`"
            ) from None
        except ChannelPreconditionFailed as error:
            raise TopologyConflict(
                f"exchange {plan.exchange.name!r} conflicts with what ricochet declares "
                f"({error}): delete it"
            ) from None
        for spec, binding in zip(plan.lanes, plan.bindings, strict=True):
            try:
                lane = await channel.declare_queue(
                    spec.name, durable=True, arguments=spec.arguments
                )
            except ChannelPreconditionFailed as error:
                raise TopologyConflict(
                    f"key lane {spec.name!r} conflicts with what ricochet declares ({error}): "
                    "delete it once it is empty"
                ) from None
            await lane.bind(exchange, routing_key=binding.routing_key)
    finally:
        with contextlib.suppress(*CONNECTION_ERRORS):
            await channel.close()


async def lanes_found(channel: AbstractChannel, queue: str, count: int) -> int:
    """How many key lanes queue has: 0 when its first is missing, else at least count (the
    lanes a setting declares), more when another setting declared more. Asked with probes that
    expire at once, on a confirming channel (broker/depth.py's queue_exists)."""
    names = Names(queue)
    if not await queue_exists(channel, names.key_lane(0)):
        return 0
    found = count
    while found < MOST_LANES and await queue_exists(channel, names.key_lane(found)):
        found += 1
    return found
