"""The consumer: reads each delivery's facts once as it comes in, runs its job in a task of its
own, and hands it to its channel's settler (ricochet.worker.settler).

What happens to a delivery is ricochet.delivery.retry.decide's call on those facts; metrics,
the job's log lines and the pause window observe the handler call and the settling
(ricochet.delivery.events). The attempt's spans wrap them, since a handler's own spans must be
their children.
"""

import asyncio
import contextvars
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from aio_pika.exceptions import ChannelInvalidStateError

from ricochet.broker.amqp import CONNECTION_ERRORS, Delivery
from ricochet.broker.cancels import CancelReader
from ricochet.delivery.events import Observer
from ricochet.delivery.failed import REASON_MAX_CHARS, Failure
from ricochet.delivery.retry import (
    FAIL_PERMANENT,
    RUN,
    Cancel,
    Facts,
    Hold,
    Line,
    Outcome,
    Run,
    Sanitize,
    decide,
    job_type,
    read_facts,
)
from ricochet.errors import ConfigError, InvalidKey, RetryLater, TopologyConflict
from ricochet.handlers.invoker import Invoker
from ricochet.handlers.job import Job, bind_log_context, job_of
from ricochet.handlers.router import Route
from ricochet.headers import FRESH_ID, INCARNATION
from ricochet.keys import key_of
from ricochet.log import get_logger
from ricochet.names import Names, is_delay_key
from ricochet.observe.journal import JournalWatch
from ricochet.observe.metrics import QueueMetrics
from ricochet.observe.spans import attempt_span, record_outcome, settle_span
from ricochet.worker.rate_limits import RateLimits
from ricochet.worker.settler import Settler

log = get_logger("ricochet.consumer")
# The longest incarnation token read (the client's are 16 characters).
TOKEN_MAX_CHARS = 64


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
    # Why its key cannot be read, if it cannot: it fails rather than run without it.
    bad_key: InvalidKey | None = None


class Consumer:
    """Runs the worker's jobs, on whichever channel they came (a lost channel's jobs run on)."""

    def __init__(
        self,
        names: Names,
        max_retries: int,
        jitter: float,
        invoker: Invoker,
        metrics: QueueMetrics,
        cancels: CancelReader,
        observers: Sequence[Observer],
        journal: JournalWatch,
        lanes: Callable[[], Awaitable[None]],
        rates: RateLimits,
    ):
        self._names = names
        self._queue = names.queue
        self._max_retries = max_retries
        self._jitter = jitter
        self._invoker = invoker
        self._cancels = cancels
        self._observers = observers
        self._journal = journal
        # Makes sure the queue's key lanes are declared and consumed, before a job joins them.
        self._lanes = lanes
        self._rates = rates
        self.in_flight: set[asyncio.Task[None]] = set()
        # Counted at each scrape: the gauge's inc and dec each took a lock on every delivery.
        metrics.in_flight_when(lambda: len(self.in_flight))
        # The jobs whose handler runs now, by message_id, which a cancel read meanwhile may cover.
        self._running: dict[str, list[tuple[Job, Delivery]]] = {}
        self._checks: set[asyncio.Task[None]] = set()
        cancels.on_cancel(self._cancel_read)

    def intake(self, delivery: Delivery, *, lined: bool = False) -> Arrival:
        """Read the delivery's facts: its type, budget, key, where it came from (lined: from
        its key's lane), whether it is forged, poison, cancelled, due later, or must run alone.
        Facts that cannot be read make it unreadable (it fails as permanent, saying why): no
        delivery stops the consumer."""
        try:
            return self._read(delivery, lined)
        except Exception as error:  # what a hostile delivery may raise, foreseen or not
            delivery.unreadable = f"{type(error).__name__}: {error}"[:REASON_MAX_CHARS]
            facts = Facts(1, 1, delivery.routing_key, unreadable=True)
            return Arrival(delivery, facts, None)

    def _read(self, delivery: Delivery, lined: bool) -> Arrival:
        kind = job_type(delivery.type, delivery.body)
        names = self._names
        routing_key = delivery.routing_key
        key_tier = names.tier_of_key(routing_key)  # read once: it also says "from a tier"
        route = self._invoker.route(kind)
        key, bad_key = _key(delivery, route)
        facts = read_facts(
            delivery.headers,
            redelivered=delivery.redelivered,
            routing_key=routing_key,
            from_tier=key_tier is not None,
            from_delays=is_delay_key(routing_key),
            queue=self._queue,
            max_retries=self._max_retries,
            type_max_retries=None if route is None else route.max_retries,
            type_ladder=None if route is None else route.retry_delays_ms,
            jitter=self._jitter,
            unreadable=delivery.unreadable is not None,
            key_tier=key_tier,
            cancelled=self._covered(delivery),
            key=key,
            lined=lined,
        )
        if names.tier_of_key(facts.original_routing_key) is not None:
            # A copy (to a lane, to wait for a token, to its tier) kept the tier's key, in its
            # routing key or its first rejection's: the key it was published with was the queue's.
            facts = facts._replace(original_routing_key=self._queue)
        original = names.published_key(facts.original_routing_key)
        if original != facts.original_routing_key:  # back from the delays, now or before a tier
            facts = facts._replace(original_routing_key=original)
        return Arrival(delivery, facts, kind, bad_key)

    def _covered(self, delivery: Delivery) -> bool:
        """Whether a cancel in the store covers the job (ricochet.broker.cancel_log)."""
        return self._cancels.cancelled.covers(
            self._queue, delivery.message_id, _token(delivery), delivery.published_s
        )

    def _cancel_read(self, queue: str, message_id: str) -> None:
        """A cancel was read: the jobs of that id running here are checked against it."""
        if queue != self._queue or message_id not in self._running:
            return
        # A context of its own: the lines it logs are no job's.
        check = asyncio.get_running_loop().create_task(
            self._cancel_running(message_id), context=contextvars.Context()
        )
        self._checks.add(check)
        check.add_done_callback(self._checks.discard)

    async def _cancel_running(self, message_id: str) -> None:
        """Cancel the running jobs of message_id that a cancel in the store covers. A job of the
        client is judged once the store is read up to now: its wait (recorded as it was enqueued)
        may come after the cancel just read."""
        running = self._running.get(message_id, [])
        if any(_explicit_token(delivery) is not None for _, delivery in running):
            try:
                await self._cancels.current()
            except ChannelInvalidStateError as error:  # the worker reconnects and reads it again
                log.warning("running job not checked against a cancel", error=str(error))
                return
        for job, delivery in self._running.get(message_id, []):
            if not job.cancelled and self._covered(delivery):
                job.cancel()
                log.info(
                    "running job cancelled",
                    message_id=message_id,
                    type=job.type,
                    attempt=job.attempt,
                )

    async def _gate(self, settler: Settler, arrival: Arrival) -> Run | Hold | None:
        """What comes of a job about to run: it runs, or waits for its type's rate limit (Hold),
        or nothing more here (None): its key could not be read (failed at once), or its channel
        was lost while it waited for a token (the broker hands it out again)."""
        delivery, facts, kind, bad_key = arrival
        if bad_key is not None:
            bind_log_context(job_of(delivery, facts, kind, self._queue))
            await settler.settle(delivery, facts, FAIL_PERMANENT, Failure(bad_key), kind)
            return None
        if kind is None:  # limited types have a name
            return RUN
        over = await self._over_limit(facts, kind)
        if settler.closed:
            return None
        return Hold(kind) if over else RUN

    async def _over_limit(self, facts: Facts, kind: str) -> bool:
        """Whether the job's type is over its rate limit: it is limited here, and there is no
        token to take. A job from its key's lane waits for a token where it is instead: sent to
        wait, it would come back behind the next jobs of its key. A token that cannot be taken
        (its queue deleted, the channel lost) lets the job run, said in the log: a job never
        stays unsettled for it."""
        try:
            if facts.lined:
                await self._rates.wait_for_token(kind)
                return False
            return not await self._rates.take(kind)
        except CONNECTION_ERRORS as error:
            log.warning(
                "rate limit not applied to the job: no token could be taken", error=str(error)
            )
            return False

    async def _lines_up(self, settler: Settler, arrival: Arrival) -> bool:
        """Whether the job can join its key's line: the queue's lanes are declared (now, for
        its first job with a key) and consumed. Lanes the broker refuses fail it at once,
        saying why: run without them it could run beside a job of its key."""
        try:
            await self._lanes()
        except (TopologyConflict, ConfigError) as error:
            delivery, facts, kind, _ = arrival
            bind_log_context(job_of(delivery, facts, kind, self._queue))
            await settler.settle(delivery, facts, FAIL_PERMANENT, Failure(error), kind)
            return False
        return True

    def _start(self, job: Job, delivery: Delivery) -> None:
        """The job's handler starts: a cancel read from now on reaches it, and one read since it
        was delivered is checked now."""
        if delivery.message_id is None:
            return
        self._running.setdefault(delivery.message_id, []).append((job, delivery))
        if self._covered(delivery):
            self._cancel_read(self._queue, delivery.message_id)

    def _end(self, job: Job, delivery: Delivery) -> None:
        """The handler returned: a cancel read from now on changes nothing."""
        message_id = delivery.message_id
        if message_id is None:
            return
        running = self._running[message_id]
        running.remove((job, delivery))
        if not running:
            del self._running[message_id]

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
        delivery, facts, kind, bad_key = arrival
        decision = decide(facts, None)
        if isinstance(decision, Run) and (bad_key is not None or self._rates.limits(kind)):
            gated = await self._gate(settler, arrival)
            if gated is None:
                return
            decision = gated
        # Unreadable properties, a forged x-death, a cancel, a poison job or a run-at ahead: no
        # attempt.
        if isinstance(decision, Cancel) and _explicit_token(delivery) is not None:
            # Dropped only once the store is read up to now: a wait recorded at its enqueue
            # after the cancel (by a client this worker has not read yet) spares it.
            await self._cancels.current()
            if not self._covered(delivery):
                facts = facts._replace(cancelled=False)
                decision = decide(facts, None)
        if isinstance(decision, Line) and not await self._lines_up(settler, arrival):
            return
        if not isinstance(decision, Run):
            if not isinstance(decision, Sanitize):  # a forged header is not the job's yet
                bind_log_context(job_of(delivery, facts, kind, self._queue))
            await settler.settle(delivery, facts, decision, kind=kind)
            return
        job = job_of(delivery, facts, kind, self._queue)
        bind_log_context(job)
        with attempt_span(self._queue, job) as span:  # the attempt's span covers its settling
            started = time.perf_counter()
            self._journal.started(job)
            self._start(job, delivery)
            try:
                outcome, error = await self._invoker(job)
            finally:
                self._end(job, delivery)
            seconds = time.perf_counter() - started
            for observer in self._observers:
                observer.attempted(outcome, seconds)
            # Rounded up: the next attempt starts no earlier than after_s.
            later_ms = math.ceil(error.after_s * 1000) if isinstance(error, RetryLater) else None
            decision = decide(facts, outcome, later_ms)
            failure = None if error is None or outcome is Outcome.CANCELLED else Failure(error)
            record_outcome(span, decision, failure)
            self._journal.ended(job)
            with settle_span(self._queue, span, decision):
                await settler.settle(
                    delivery, facts, decision, failure, kind, seconds=seconds, result=job.returned
                )


def _key(delivery: Delivery, route: Route | None) -> tuple[str | None, InvalidKey | None]:
    """(the job's key, None), or (None, why it cannot be read): its header's, else what its
    type's key function gives for its payload."""
    function = None if route is None else route.key
    derive = None if function is None else (lambda: function(json.loads(delivery.body)))
    try:
        return key_of(delivery.headers, derive), None
    except Exception as error:  # a key function may raise anything
        why = f"its key cannot be read: {type(error).__name__}: {error}"
        return None, InvalidKey(why[:REASON_MAX_CHARS])
