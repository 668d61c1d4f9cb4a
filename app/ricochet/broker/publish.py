"""Publishing with publisher confirms: a job to the main queue, and copies that must arrive.

Every publish goes out as mandatory on a channel with publisher confirms and on_return_raises,
so a message the broker cannot route or store raises instead of vanishing.
"""

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aio_pika.exceptions import DeliveryError, PublishError
from tenacity import RetryCallState, wait_exponential_jitter

from ricochet.backoff import backoff
from ricochet.broker.amqp import refusal
from ricochet.errors import MissingQueue
from ricochet.log import get_logger

log = get_logger("ricochet.publish")

# First pause before publishing again a copy the broker did not confirm; it doubles up to 30 s.
UNCONFIRMED_FIRST_WAIT_S = 0.5
UNCONFIRMED_MAX_WAIT_S = 30.0


def header_value(text: str) -> Any:
    """K=V values from the command line: integers become integers, the rest stay strings."""
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def is_json(payload: str) -> bool:
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True


async def confirming_channel(connection: AbstractConnection) -> AbstractChannel:
    """A channel whose publishes wait for the broker's confirm and raise when it returns them."""
    return await connection.channel(publisher_confirms=True, on_return_raises=True)


class OnePerMessageId:
    """One publish in flight per message_id on a channel.

    aiormq matches a basic.return to its publish by message_id: with two publishes of one id in
    flight, the return of one can fail the other, while the returned one counts as confirmed.
    """

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: Counter[str] = Counter()

    @contextlib.asynccontextmanager
    async def alone(self, message_id: str | None) -> AsyncIterator[None]:
        """Wait until no other publish of this id is in flight, and hold it off meanwhile.
        A message without an id gets a fresh one from aiormq, so it waits for nothing."""
        if message_id is None:
            yield
            return
        lock = self._locks.setdefault(message_id, asyncio.Lock())
        self._users[message_id] += 1
        try:
            async with lock:
                yield
        finally:
            self._users[message_id] -= 1
            if not self._users[message_id]:
                del self._users[message_id], self._locks[message_id]


async def publish_confirmed(
    exchange: AbstractExchange,
    message: aio_pika.Message,
    routing_key: str,
    timeout_s: float | None = None,
) -> None:
    """Publish and wait for the confirm; DeliveryError when the broker returns or nacks it,
    TimeoutError when it has not confirmed it within timeout_s (None: wait for as long as it
    takes). aiormq times every publish anyway: a timeout of our own around it would be a
    second timer for each one."""
    await exchange.publish(message, routing_key=routing_key, mandatory=True, timeout=timeout_s)


def _log_unconfirmed(state: RetryCallState) -> None:
    log.error(
        "copy not confirmed, the job stays in the queue",
        broker_said=refusal(state.outcome.exception() if state.outcome else None),
        attempt=state.attempt_number,
        next_try_s=round(state.upcoming_sleep, 2),
    )


async def publish_until_confirmed(
    exchange: AbstractExchange, message: aio_pika.Message, routing_key: str
) -> None:
    """Publish with a confirm, again with backoff for as long as the broker refuses it.

    Only a lost channel ends it early (with its error), which hands the original back anyway.
    """
    try:
        await publish_confirmed(exchange, message, routing_key)
    except DeliveryError:
        # Rare, so the retry machinery waits until it is needed (bench/README.md, failure path).
        wait = wait_exponential_jitter(
            multiplier=UNCONFIRMED_FIRST_WAIT_S, max=UNCONFIRMED_MAX_WAIT_S
        )
        async for attempt in backoff(DeliveryError, _log_unconfirmed, wait=wait):
            with attempt:
                await publish_confirmed(exchange, message, routing_key)


async def publish_to_queue(channel: AbstractChannel, queue: str, message: aio_pika.Message) -> None:
    """Publish to a queue through the default exchange, confirmed; a missing queue is an error."""
    try:
        await publish_confirmed(channel.default_exchange, message, queue)
    except PublishError:
        raise MissingQueue(queue) from None
