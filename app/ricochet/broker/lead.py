"""Who leads a queue's schedules, or its rate limits: the process whose connection holds the
lead, an exclusive queue (broker/plan.py's lead_spec, named SHARED.schedules_lead(queue) or
SHARED.rates_lead(queue)) that the broker deletes the moment it closes that connection, whatever
killed the process.

The others look for the lead by publishing an empty probe to it: one the broker cannot route
comes back (mandatory), and then the lead is free to take. A probe costs a confirmed publish, no
channel error, and nothing in the broker's log; the lead holds nothing (x-max-length 0), so a
probe that reaches it is dropped. Two processes that find it free at once both declare it: the
broker gives it to one and refuses the other (RESOURCE_LOCKED, which closes that channel).
"""

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelClosed

from ricochet.broker.plan import lead_spec
from ricochet.broker.publish import publish_to_queue
from ricochet.errors import MissingQueue


async def lead_is_held(channel: AbstractChannel, lead: str) -> bool:
    """Whether another connection (or this one) holds the lead, on a confirming channel."""
    try:
        await publish_to_queue(channel, lead, aio_pika.Message(b""))
    except MissingQueue:
        return False
    return True


async def holds_lead(channel: AbstractChannel, lead: str) -> bool:
    """Whether channel's connection holds the lead, as the broker answers now (a passive
    declare: refused, closing the channel, when the lead is another connection's or gone).
    A leader asks before each enqueue: one whose connection the broker has closed learns it
    here, before it enqueues an occurrence its successor enqueues too."""
    try:
        await channel.declare_queue(lead, passive=True)
    except ChannelClosed:  # RESOURCE_LOCKED, or NOT_FOUND
        return False
    return True


async def take_lead(connection: AbstractConnection, lead: str) -> bool:
    """Declare the lead for this connection: True once it holds it, False when another
    connection got it first."""
    spec = lead_spec(lead)
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.declare_queue(spec.name, exclusive=True, arguments=spec.arguments)
    except ChannelClosed:  # RESOURCE_LOCKED: another connection declared it first
        return False
    # The lead is the connection's, not the channel's: it stays until the connection goes.
    await channel.close()
    return True
