"""The consumer: reads each delivery's facts once as it comes in, runs its job in a task of its
own, and hands it to its channel's settler (ricochet.worker.settler).

What happens to a delivery is ricochet.delivery.retry.decide's call on those facts; metrics,
the job's log lines and the pause window observe the handler call and the settling
(ricochet.delivery.events). The attempt's spans wrap them, since a handler's own spans must be
their children.
"""

import asyncio
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

import structlog

from ricochet.broker.amqp import Delivery
from ricochet.broker.cancels import CancelReader
from ricochet.broker.topology import Names, is_delay_key
from ricochet.delivery.events import Observer
from ricochet.delivery.failed import REASON_MAX_CHARS, Failure
from ricochet.delivery.retry import Action, Facts, decide, job_type, read_facts
from ricochet.errors import RetryLater
from ricochet.handlers.invoker import Invoker
from ricochet.handlers.job import bind_log_context, job_of
from ricochet.headers import FRESH_ID, INCARNATION
from ricochet.observe.metrics import QueueMetrics
from ricochet.observe.spans import attempt_span, record_outcome, settle_span
from ricochet.worker.settler import Settler

log = structlog.get_logger("ricochet.consumer")
# The longest incarnation token read (the client's are 16 characters).
TOKEN_MAX_CHARS = 64


# The endings after an attempt that leave the job waiting for another.
_WAITS = frozenset({Action.RETRY, Action.RETRY_BY_COPY, Action.DELAY})


def _token(delivery: Delivery) -> str | None:
    """The client's incarnation token of the job, if it has a readable one."""
    token = delivery.headers.get(INCARNATION)
    return token if isinstance(token, str) and 0 < len(token) <= TOKEN_MAX_CHARS else None


def _explicit_token(delivery: Delivery) -> str | None:
    """The token of a client's job whose message_id was given (not made up by the client)."""
    token = _token(delivery)
    return None if token == FRESH_ID or not delivery.message_id else token


class Arrival(NamedTuple):
    """A delivery with what was read of it once, as it came in."""

    delivery: Delivery
    facts: Facts
    kind: str | None  # the job's type: the budget and the Job both need it


class Consumer:
    """Runs the worker's jobs, on whichever channel they came (a lost channel's jobs run on)."""

    def __init__(
        self,
        names: Names,
        max_retries: int,
        invoker: Invoker,
        metrics: QueueMetrics,
        cancels: CancelReader,
        observers: Sequence[Observer],
    ):
        self._names = names
        self._queue = names.queue
        self._max_retries = max_retries
        self._invoker = invoker
        self._cancels = cancels
        self._observers = observers
        self.in_flight: set[asyncio.Task[None]] = set()
        # Counted at each scrape: the gauge's inc and dec each took a lock on every delivery.
        metrics.in_flight.set_function(lambda: float(len(self.in_flight)))

    def intake(self, delivery: Delivery) -> Arrival:
        """Read the delivery's facts: its type, budget, where it came from, whether it is
        forged, poison, cancelled, due later, or must run alone. Facts that cannot be read make
        it unreadable (it fails as permanent, saying why): no delivery stops the consumer."""
        try:
            return self._read(delivery)
        except Exception as error:  # what a hostile delivery may raise, foreseen or not
            delivery.unreadable = f"{type(error).__name__}: {error}"[:REASON_MAX_CHARS]
            facts = Facts(1, 1, delivery.routing_key, unreadable=True)
            return Arrival(delivery, facts, None)

    def _read(self, delivery: Delivery) -> Arrival:
        kind = job_type(delivery.type, delivery.body)
        names = self._names
        routing_key = delivery.routing_key
        key_tier = names.tier_of_key(routing_key)  # read once: it also says "from a tier"
        facts = read_facts(
            delivery.headers,
            redelivered=delivery.redelivered,
            routing_key=routing_key,
            from_tier=key_tier is not None,
            from_delays=is_delay_key(routing_key),
            queue=self._queue,
            max_retries=self._max_retries,
            type_max_retries=self._invoker.max_retries(kind),
            unreadable=delivery.unreadable is not None,
            key_tier=key_tier,
            cancelled=self._covered(delivery),
        )
        original = names.published_key(facts.original_routing_key)
        if original != facts.original_routing_key:  # back from the delays, now or before a tier
            facts = facts._replace(original_routing_key=original)
        return Arrival(delivery, facts, kind)

    def _covered(self, delivery: Delivery) -> bool:
        """Whether a cancel in the store covers the job (ricochet.broker.cancel_log)."""
        return self._cancels.cancelled.covers(
            self._queue, delivery.message_id, _token(delivery), delivery.published_s
        )

    def spawn(self, settler: Settler, arrival: Arrival) -> asyncio.Task[None]:
        """Run the job in a task of its own, so closing a channel never cancels a handler."""
        task = asyncio.get_running_loop().create_task(self._process(settler, arrival))
        self.in_flight.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery not settled", exc_info=task.exception())

    async def _process(self, settler: Settler, arrival: Arrival) -> None:
        delivery, facts, kind = arrival
        decision = decide(facts, None)
        # Unreadable properties, a forged x-death, a cancel, a poison job or a run-at ahead: no
        # attempt.
        if decision.action is Action.CANCEL and _explicit_token(delivery) is not None:
            # Dropped only once the store is read up to now: a wait this job recorded after the
            # cancel (on another worker, or at its enqueue) spares it.
            await self._cancels.current()
            if not self._covered(delivery):
                facts = facts._replace(cancelled=False)
                decision = decide(facts, None)
        if decision.action is not Action.RUN:
            if decision.action is not Action.SANITIZE:  # a forged header is not the job's yet
                bind_log_context(job_of(delivery, facts, kind))
            await settler.settle(delivery, facts, decision)
            return
        job = job_of(delivery, facts, kind)
        bind_log_context(job)
        with attempt_span(self._queue, job) as span:  # the attempt's span covers its settling
            started = time.perf_counter()
            outcome, error = await self._invoker(job)
            seconds = time.perf_counter() - started
            for observer in self._observers:
                observer.attempted(outcome, seconds)
            # Rounded up: the next attempt starts no earlier than after_s.
            later_ms = math.ceil(error.after_s * 1000) if isinstance(error, RetryLater) else None
            decision = decide(facts, outcome, later_ms)
            failure = None if error is None else Failure(error)
            record_outcome(span, decision, failure)
            if decision.action in _WAITS and (token := _explicit_token(delivery)) is not None:
                # Recorded before it waits: a cancel made while it waits comes after it.
                await self._cancels.note_wait(self._queue, str(delivery.message_id), token)
            with settle_span(self._queue, span, decision):
                await settler.settle(delivery, facts, decision, failure)
