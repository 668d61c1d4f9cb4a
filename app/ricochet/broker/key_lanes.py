"""A queue's key lanes in the broker (SPEC 28): declared by whoever meets the queue's first job
with a key (a client enqueueing it, or a worker that takes it from the queue), and found by
the workers that did not declare them."""

import contextlib

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelPreconditionFailed

from ricochet.broker.amqp import COMMAND_INVALID, CONNECTION_ERRORS, broker_version
from ricochet.broker.connection import close_quietly, connect, connection_name
from ricochet.broker.depth import queue_exists
from ricochet.broker.plan import Exchange, key_lanes_plan
from ricochet.broker.publish import confirming_channel
from ricochet.errors import ConfigError, TopologyConflict
from ricochet.names import Names

PLUGIN = "rabbitmq_consistent_hash_exchange"
# Lanes beyond a setting's count are looked for up to here (RICOCHET_KEY_LANES' upper bound).
MOST_LANES = 256


async def declare_key_lanes(
    connection: AbstractConnection, amqp_url: str, queue: str, count: int
) -> int:
    """Declare queue's key exchange, lanes and their bindings (idempotent): count lanes when it
    has none, else as many as it has (the first declaration fixes the count: a lane more would
    take some keys from the lanes that hold their earlier jobs). ConfigError when the broker
    lacks the consistent-hash exchange, TopologyConflict when it holds the exchange or a lane
    of other arguments. Returns how many lanes the queue has."""
    probes = await confirming_channel(connection)
    try:
        count = await lanes_found(probes, queue) or count
    finally:
        with contextlib.suppress(*CONNECTION_ERRORS):
            await probes.close()
    plan = key_lanes_plan(queue, count, broker_version(connection))
    await _declare_exchange(amqp_url, queue, plan.exchange)
    channel = await connection.channel(publisher_confirms=False)
    try:
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
            await lane.bind(plan.exchange.name, routing_key=binding.routing_key)
    finally:
        with contextlib.suppress(*CONNECTION_ERRORS):
            await channel.close()
    return count


async def _declare_exchange(amqp_url: str, queue: str, exchange: Exchange) -> None:
    """Declare the key exchange on a connection of its own (amqp_url's): a broker without the
    plugin closes the connection that asks for its exchange type, and every job in flight on it
    with it."""
    own = await connect(amqp_url, connection_name("key lanes", queue), 0)
    try:
        channel = await own.channel(publisher_confirms=False)
        await channel.declare_exchange(
            exchange.name, exchange.kind, durable=True, arguments=exchange.arguments
        )
    except COMMAND_INVALID as error:
        raise ConfigError(
            f"jobs with a key need the consistent-hash exchange, which the broker lacks "
            f"({error}): enable it with `rabbitmq-plugins enable {PLUGIN}`"
        ) from None
    except ChannelPreconditionFailed as error:
        raise TopologyConflict(
            f"exchange {exchange.name!r} conflicts with what ricochet declares ({error}): delete it"
        ) from None
    finally:
        await close_quietly(own)


async def lanes_found(channel: AbstractChannel, queue: str) -> int:
    """How many key lanes queue has (0: none yet), asked with probes that expire at once, on a
    confirming channel (broker/depth.py's queue_exists)."""
    names = Names(queue)
    found = 0
    while found < MOST_LANES and await queue_exists(channel, names.key_lane(found)):
        found += 1
    return found
