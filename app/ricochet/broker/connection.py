"""Connecting to the broker, waiting for it with exponential backoff."""

import asyncio
import os
import socket

import aio_pika
from aio_pika.abc import AbstractConnection
from tenacity import RetryCallState, stop_after_delay, stop_never, wait_exponential_jitter

from ricochet.backoff import backoff
from ricochet.broker.amqp import read_properties_leniently
from ricochet.errors import BrokerUnavailable
from ricochet.log import get_logger, redact

log = get_logger("ricochet.connection")

# What connecting raises while the broker is down, refusing or slow: aio-pika's connection
# errors (AMQPConnectionError) are ConnectionErrors, and TimeoutError is an OSError too.
_UNREACHABLE = OSError


# One attempt's bound: a broker that takes the TCP connection but never answers the handshake.
ATTEMPT_TIMEOUT_S = 10.0
# A command asks once, and gives up sooner: its one line comes within 10 s of its start.
ONCE_TIMEOUT_S = 5.0

# A client property of this version's connections: its workers wait in the shared levels, so
# the per-queue levels of earlier versions may go once no connection without it is left.
SHARED_WAITING = "ricochet_shared_waiting"


def connection_name(role: str, queue: str) -> str:
    """How the broker (and rabbitmqctl list_connections) shows this process."""
    return f"ricochet {role} {queue} {socket.gethostname()}:{os.getpid()}"


def _log_attempt(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning(
        "broker unreachable, retrying",
        attempt=state.attempt_number,
        error=redact(str(error)),
        next_try_s=round(state.upcoming_sleep, 2),
    )


async def connect(url: str, name: str, timeout_s: float | None) -> AbstractConnection:
    """Connect, retrying with backoff for timeout_s (forever when None); BrokerUnavailable after.
    With timeout_s 0 it asks once, for at most ONCE_TIMEOUT_S: a command says at once that the
    broker does not answer, where a service waits for it (SPEC 6).

    Every delivery on it is read, whatever its properties' bytes: one that could kill the
    connection would come back to every worker, forever.
    """
    read_properties_leniently()
    retrying = backoff(
        _UNREACHABLE,
        _log_attempt,
        wait=wait_exponential_jitter(multiplier=0.2, max=5),
        stop=stop_never if timeout_s is None else stop_after_delay(timeout_s),
    )
    try:
        connection: AbstractConnection = await retrying(
            aio_pika.connect,
            url,
            client_properties={"connection_name": name, SHARED_WAITING: True},
            timeout=ATTEMPT_TIMEOUT_S if timeout_s != 0 else ONCE_TIMEOUT_S,
        )
    except _UNREACHABLE as error:
        waited = "does not answer" if timeout_s == 0 else f"unreachable after {timeout_s:g} s"
        raise BrokerUnavailable(f"broker {redact(url)} {waited}: {redact(str(error))}") from None
    log.debug("connected", broker=redact(url), connection_name=name)
    return connection


def is_lost(connection: AbstractConnection) -> bool:
    """Whether the connection is closed, by us or by the broker: aio-pika marks is_closed only
    for a close of ours, and clears `connected` when the broker closes it or the socket drops."""
    return connection.is_closed or not connection.connected.is_set()


def lost_or_cancelled(connection: AbstractConnection) -> bool:
    """Whether a retrying loop on this connection should end: the connection is lost, or the
    task running the loop was asked to stop. An await may swallow that cancel (aiormq raises a
    connection error in its place when the channel closes with it, and Python 3.11's wait_for
    drops one that lands as its call ends), and a loop that retries on errors would then
    outlive its session and hold the worker's stop for ever; the request itself stays counted."""
    task = asyncio.current_task()
    return is_lost(connection) or (task is not None and task.cancelling() > 0)


async def close_quietly(connection: AbstractConnection) -> None:
    """Close a connection that may already be broken."""
    if not connection.is_closed:
        try:
            await connection.close()
        except Exception as error:  # closing a broken connection may fail in many ways
            log.debug("close failed", error=str(error))
