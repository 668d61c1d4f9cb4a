"""The settings the topology was declared with, kept in the broker beside it.

`worker` and `topology` declare the topology from their settings and write them here. Every other
command (status, monitor, replay, doctor, failed, cancel) reads them back, so it needs only the
broker's URL and the queue's name: it neither needs the worker's retry settings nor redeclares
or deletes a tier the worker declared. AMQP cannot read a queue's arguments back, so the record is
a message: one persistent JSON object in a register (ricochet.broker.register), a classic queue of
length one, which counts no deliveries, so reading spends nothing.

The record also says which tiers the declaration found with an older delay and kept (they held
jobs), with the delay each really has, so that every tool shows the delay the broker applies; a
worker writes it again when it declares such a tier again.
"""

import json
from collections.abc import Mapping
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.exceptions import ChannelNotFoundEntity

from ricochet.broker.declare import declare
from ricochet.broker.plan import PLAN_FIELDS, Plan, plan
from ricochet.broker.publish import confirming_channel
from ricochet.broker.register import declare_register, read_register, write_register
from ricochet.ladders import is_int
from ricochet.log import get_logger
from ricochet.names import Names
from ricochet.settings import Settings

log = get_logger("ricochet.topology")

# The record's key for the tiers and lanes kept with an older delay, by name (Plan.kept).
KEPT = "kept_delays_ms"
# Another reader may hold the record for a moment (between its get and its hand-back).
READ_PATIENCE_S = 0.5


def record_of(settings: Settings, kept: Mapping[str, int | None]) -> bytes:
    """The record a declaration writes: the settings its plan is made of, and the tiers it kept
    with an older delay (pure)."""
    record = {**settings.model_dump(include=set(PLAN_FIELDS)), KEPT: dict(kept)}
    return json.dumps(record, sort_keys=True).encode()


def recorded_settings(settings: Settings, record: dict[str, Any] | None) -> Settings:
    """These settings with the plan's part taken from the record, when there is one (pure)."""
    if record is None:
        return settings
    return settings.model_copy(update={k: v for k, v in record.items() if k in PLAN_FIELDS})


def kept_of(record: dict[str, Any] | None) -> dict[str, int | None]:
    """The tiers a record says the broker keeps with an older delay (pure): none for a record of
    an earlier ricochet, and none of what is not a queue's name with a whole delay or none."""
    kept = None if record is None else record.get(KEPT)
    if not isinstance(kept, dict):
        return {}
    return {
        name: delay
        for name, delay in kept.items()
        if isinstance(name, str) and (delay is None or is_int(delay))
    }


async def write_record(channel: AbstractChannel, settings: Settings, declared: Plan) -> None:
    """Keep the settings the topology was just declared with and what the declaration kept;
    the record before is dropped.

    The channel must confirm publishes: the record is written before the worker consumes."""
    name = Names(settings.queue).record
    await declare_register(channel, name)
    body = record_of(settings, declared.kept)
    await write_register(channel, name, body, content_type="application/json")


async def declare_recorded(connection: AbstractConnection, settings: Settings) -> Plan:
    """Declare the topology (broker/declare.py), then record the settings it was declared with."""
    declared = await declare(connection, settings)
    await record_declared(connection, settings, declared)
    return declared


async def record_declared(
    connection: AbstractConnection, settings: Settings, declared: Plan
) -> None:
    """Write the record of a plan as the broker now applies it, on a channel of its own."""
    channel = await confirming_channel(connection)
    try:
        await write_record(channel, settings, declared)
    finally:
        await channel.close()


async def read_record(connection: AbstractConnection, queue: str) -> dict[str, Any] | None:
    """The record of the queue's topology, or None when nothing has declared it yet (or what
    its register holds is not a record: said in a warning)."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        name = Names(queue).record
        try:
            await channel.declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            return None
        body = await read_register(channel, name, READ_PATIENCE_S)
    finally:
        if not channel.is_closed:
            await channel.close()
    return None if body is None else parsed_record(name, body)


def parsed_record(name: str, body: bytes) -> dict[str, Any] | None:
    """The record a register's body holds, or None (in a warning) when it is not a JSON object:
    anyone who may publish in the vhost can write one (pure but for the warning)."""
    try:
        record = json.loads(body)
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        log.warning("topology record unreadable: the settings given are used", register=name)
        return None
    return record


async def declared_settings(connection: AbstractConnection, settings: Settings) -> Settings:
    """The settings the queue's topology was declared with, as far as its plan goes; these
    settings' own when nothing has declared it yet."""
    return recorded_settings(settings, await read_record(connection, settings.queue))


async def declared_plan(connection: AbstractConnection, settings: Settings) -> Plan:
    """The plan of the queue's topology as it was declared, with the delays the broker applies
    to its tiers: those kept with an older delay wait that one."""
    record = await read_record(connection, settings.queue)
    return plan(recorded_settings(settings, record)).keeping(kept_of(record))
