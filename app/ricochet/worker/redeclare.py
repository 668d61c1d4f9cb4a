"""Declaring one queue's topology again until it is done: after the broker cancelled its consumer
(the queue deleted), after its channel was lost, or from the start when the queue was in
conflict. With backoff, and a conflict reported at each try, so that one queue's fault holds no
other queue of the worker back (SPEC 24)."""

import random
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractConnection
from tenacity import RetryCallState
from tenacity.wait import wait_base

from ricochet.backoff import backoff
from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.connection import is_lost
from ricochet.broker.plan import Plan
from ricochet.errors import TopologyConflict
from ricochet.log import get_logger
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings

log = get_logger("ricochet.worker")

FIRST_WAIT_S = 0.1
# A queue that keeps going away (a quorum queue without a leader) is declared again this often.
GONE_MAX_WAIT_S = 5.0
# A queue in conflict waits for an operator (or its other producer) to delete it: tried this
# often, each try an error line.
CONFLICT_MAX_WAIT_S = 30.0
JITTER_S = 0.1


def wait_s(tries: int, conflict: bool) -> float:
    """How long to wait, after `tries` failed declarations in a row, before the next (its jitter
    aside): FIRST_WAIT_S, doubling, up to GONE_MAX_WAIT_S, or CONFLICT_MAX_WAIT_S when the last
    try found the queue in conflict."""
    most = CONFLICT_MAX_WAIT_S if conflict else GONE_MAX_WAIT_S
    return min(FIRST_WAIT_S * 2.0 ** (tries - 1), most)


def exits_at_start(first_start: bool, queues: int, in_conflict: int) -> bool:
    """Whether a worker stops (exit 2) on the conflicts it found declaring its queues: only at its
    first start, and only when it can consume none of them (a worker of one queue, as before);
    once it has run, or while one queue can be consumed, it declares the others again."""
    return first_start and in_conflict == queues


class _Wait(wait_base):
    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        conflict = outcome is not None and isinstance(outcome.exception(), TopologyConflict)
        return wait_s(retry_state.attempt_number, conflict) + random.uniform(0, JITTER_S)


class Redeclare:
    """One queue's topology declared again until it is done."""

    def __init__(
        self,
        settings: Settings,
        lifecycle: Lifecycle,
        declare: Callable[[AbstractConnection], Awaitable[Plan]],
    ) -> None:
        self._settings = settings
        self._lifecycle = lifecycle
        self._declare = declare  # one declare of the queue's topology, recorded

    async def again(self, connection: AbstractConnection) -> Plan | None:
        """Declare until it is done, with backoff: the topology declared, or None if a stop was
        requested or the connection closed meanwhile."""
        retrying = backoff((*CONNECTION_ERRORS, TopologyConflict), self._retrying, wait=_Wait())
        return await self._lifecycle.unless_stopped(retrying(self._unless_closed, connection))

    async def _unless_closed(self, connection: AbstractConnection) -> Plan | None:
        return None if is_lost(connection) else await self._declare(connection)

    def _retrying(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        retry_in_s = round(state.next_action.sleep, 3) if state.next_action else None
        queue = self._settings.queue
        if isinstance(error, TopologyConflict):
            log.error(
                "queue in conflict, declaring it again",
                queue=queue,
                error=str(error),
                retry_in_s=retry_in_s,
            )
        else:
            log.warning(
                "declaring again failed, retrying",
                queue=queue,
                error=str(error),
                retry_in_s=retry_in_s,
            )
