"""The decision: a delivery's facts read once from its headers, and what happens to it (pure)."""

import datetime as dt
import enum
import functools
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, overload

from ricochet import ladders
from ricochet.broker.plan import CANCELS_MAX_AGE_S
from ricochet.errors import InvalidRetryDelays
from ricochet.headers import DEATHS, DELIVERY_COUNTS, MAX_RETRIES, RETRIES, RETRY_DELAYS, RUN_AT
from ricochet.ladders import Ladder, is_int

# More unacked deliveries than this means the job keeps killing its worker.
POISON_DELIVERIES = 5
# A redelivery returned more often than this may be the job that cut its worker off: it runs
# with nothing else unacked beside it (see read_facts).
SUSPECT_RETURNS = 1


class Outcome(enum.Enum):
    """What a handler call came to."""

    SUCCEEDED = "succeeded"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    LATER = "later"  # a transient failure that asks for its next attempt no earlier than a time
    CANCELLED = "cancelled"  # a cancel covered the running job, and its handler stopped for it


class FailureKind(enum.StrEnum):
    """Why a job went to the failed queue (the failed-kind header)."""

    EXHAUSTED = "exhausted"
    PERMANENT = "permanent"
    POISON = "poison"


# What the consumer does with a delivery: one frozen type per action, so that a match over
# Decision (or Settlement, once the handler ran) that leaves one out fails the type check. Each
# names its action for the settle span (ACTION).


@dataclass(frozen=True, slots=True)
class Run:
    """The handler has not run yet: run it."""

    ACTION: ClassVar[str] = "run"


@dataclass(frozen=True, slots=True)
class Ack:
    """Done: ack it."""

    ACTION: ClassVar[str] = "ack"


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancelled while it waited: ack it, never run it."""

    ACTION: ClassVar[str] = "cancel"


@dataclass(frozen=True, slots=True)
class Sanitize:
    """A forged x-death: republish the job without it (a clean first attempt), then ack."""

    ACTION: ClassVar[str] = "sanitize"


@dataclass(frozen=True, slots=True)
class Retry:
    """Nack it: its queue dead-letters it into tier `tier`."""

    tier: int
    ACTION: ClassVar[str] = "retry"


@dataclass(frozen=True, slots=True)
class RetryByCopy:
    """A retry into tier `tier` of a job whose routing key does not lead there (it came back
    from the delays): publish a copy to the tier's route, carrying its `tier` retries, then
    ack."""

    tier: int
    ACTION: ClassVar[str] = "retry_by_copy"


@dataclass(frozen=True, slots=True)
class Delay:
    """Publish a copy to the delays, due in delay_ms and carrying the retries it made, then
    ack: a run-at ahead (no attempt spent), a RetryLater, or a retry on a ladder of its own (its
    type's or the job's)."""

    delay_ms: int
    retries: int
    ACTION: ClassVar[str] = "delay"


@dataclass(frozen=True, slots=True)
class Line:
    """A job with a key, from its queue: publish a copy, carrying the retries it made, to the end
    of its key's lane (ricochet.keys), then ack; it runs from there."""

    ACTION: ClassVar[str] = "line"


@dataclass(frozen=True, slots=True)
class Hold:
    """A job of a type over its rate limit (no token to take): publish
    a copy, carrying the retries it made, to wait for a token (broker/rate_store.py), then ack;
    no attempt spent."""

    job_type: str
    ACTION: ClassVar[str] = "hold"


@dataclass(frozen=True, slots=True)
class Fail:
    """Publish the failed copy of this kind, then ack."""

    kind: FailureKind
    ACTION: ClassVar[str] = "fail"


# What the settler carries out: every action but running the handler.
Settlement = Ack | Cancel | Sanitize | Line | Hold | Retry | RetryByCopy | Delay | Fail
Decision = Run | Settlement


class Facts(NamedTuple):
    """What a delivery says about its job, read once from its headers."""

    attempt: int
    max_attempts: int
    original_routing_key: str
    forged: bool = False
    poison: bool = False
    unreadable: bool = False
    cancelled: bool = False
    # Milliseconds until its run-at, when that is still ahead; bad_run_at: one that cannot be read,
    # or is too far ahead to hold.
    due_in_ms: int | None = None
    bad_run_at: bool = False
    # Whether a nack sends it to the tier of its attempt: its routing key says so.
    keyed_for_tier: bool = True
    # Whether it must run with no other delivery of its worker unacked beside it (see read_facts).
    alone: bool = False
    # The wait before its next attempt when its ladder is its own (the job's or its type's),
    # spread by the jitter: it waits in the delays, not in a tier. None: its ladder is the
    # worker's, or it has no retry left.
    wait_ms: int | None = None
    # Its key (SPEC 28), and whether it was delivered from its key's lane: a job with a key runs
    # only from there.
    key: str | None = None
    lined: bool = False


def job_type(amqp_type: str | None, body: bytes) -> str | None:
    """The AMQP type property, else a top-level "type" field of a JSON object body."""
    if amqp_type:
        return amqp_type
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):  # nested past the parser's depth
        return None
    value = payload.get("type") if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


def _is_count(value: Any) -> bool:
    return is_int(value) and value > 0


def _is_death_entry(entry: Any) -> bool:
    return (
        isinstance(entry, (dict, Mapping))  # a dict, as the client reads one, without the ABC
        and isinstance(entry.get("queue"), str)
        and isinstance(entry.get("reason"), str)
        and _is_count(entry.get("count"))
    )


def _read_death(
    headers: Mapping[str, Any], queue: str, from_tier: bool
) -> tuple[bool, Mapping[str, Any] | None]:
    """(forged, the x-death entry of (queue, rejected)), the header scanned once.

    Forged when an x-death header is present but the broker did not write it for this ladder:
    not what the broker writes, or a rejection from the main queue on a job that did not come
    back from a tier (a publisher wrote it; RabbitMQ 4 would restart that count at the next
    dead-lettering, RabbitMQ 3 would go on from it). A forged header has no entry to count.
    """
    if DEATHS not in headers:
        return False, None
    deaths = headers[DEATHS]
    if not (isinstance(deaths, list) and deaths and all(map(_is_death_entry, deaths))):
        return True, None
    rejection = next((d for d in deaths if d["queue"] == queue and d["reason"] == "rejected"), None)
    if rejection is not None and not from_tier:
        return True, None
    return False, rejection


def _first_routing_key(rejection: Mapping[str, Any] | None) -> str | None:
    keys = rejection.get("routing-keys") if rejection else None
    return keys[0] if isinstance(keys, list) and keys and isinstance(keys[0], str) else None


# A max-retries of more digits than this lowers no budget: int() refuses past 4,300 of them.
_BUDGET_DIGITS = 9


def _header_retries(headers: Mapping[str, Any]) -> int | None:
    """The max-retries header when it is an integer >= 0 (a digit string counts), else None."""
    wanted = headers.get(MAX_RETRIES)
    if isinstance(wanted, str) and wanted.isascii() and wanted.isdigit():  # not "²", int() fails
        return int(wanted) if len(wanted) <= _BUDGET_DIGITS else None
    if is_int(wanted) and wanted >= 0:
        return wanted
    return None


def max_attempts(max_retries: int, type_max_retries: int | None, header_retries: int | None) -> int:
    """1 + the smallest retry budget of the ladder in force (max_retries: its length), the
    job's type and its header (if set).

    The type's and the header's can only lower the budget: a publisher or a handler cannot buy
    a job more retries than its ladder has delays for.
    """
    budget = max_retries
    for limit in (type_max_retries, header_retries):  # a loop: a generator costs more than this
        if limit is not None and limit < budget:
            budget = limit
    return 1 + budget


def _returns(headers: Mapping[str, Any], redelivered: bool, retries: int) -> int | None:
    """How often the broker counts the job returned unacked, its own retries taken off; None on a
    first delivery or when the broker keeps no count (classic queues on RabbitMQ 3).

    The broker sets its counts only on a message it delivers again, so a count on a first
    delivery was written by a publisher and says nothing. RabbitMQ 4.0 carries the count across
    dead-lettering, so a job's own retries are taken off it: on a broker that restarts the count,
    that only lets a job that crashes its worker run a few more times.
    """
    counts = [c for c in (headers.get(name) for name in DELIVERY_COUNTS) if is_int(c)]
    return max(counts) - retries if redelivered and counts else None


def _own_ladder(headers: Mapping[str, Any]) -> Ladder | None:
    """The job's own ladder, from its retry-delays-ms header (None without one);
    InvalidRetryDelays when the header cannot be read, which fails the job as permanent."""
    if RETRY_DELAYS not in headers:
        return None
    value = headers[RETRY_DELAYS]
    try:
        if not isinstance(value, str):
            raise ValueError(f"a {type(value).__name__}, not text")
        return ladders.parse(value)
    except ValueError as error:
        # The value is shown cut short: a header may be as large as the frame.
        raise InvalidRetryDelays(
            f"{RETRY_DELAYS} header {value!r:.100} cannot be read: {error}"
        ) from None


def _wait_ms(ladder: Ladder | None, attempt: int, jitter: float, draw: float | None) -> int | None:
    """The wait after a failed attempt on a ladder of its own (None: on the worker's, or past
    the ladder's end), spread by the jitter; draw picks the spread (random when None)."""
    if ladder is None or attempt > len(ladder):
        return None
    delay_ms = ladder[attempt - 1]
    if not jitter:
        return delay_ms
    return ladders.spread(delay_ms, jitter, random.random() if draw is None else draw)


def _retries(rejection: Mapping[str, Any] | None) -> int:
    return int(rejection["count"]) if rejection else 0


def _copied_retries(headers: Mapping[str, Any]) -> int:
    value = headers.get(RETRIES)
    return value if is_int(value) and value > 0 else 0


def parse_run_at(value: Any) -> dt.datetime | None:
    """A run-at header's time: ISO-8601 with a UTC offset or Z (an AMQP timestamp counts as
    UTC); None when it cannot be read, a time without an offset included. RFC 3339's lower-case
    t and z are read too."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value.upper())
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


# A run-at further ahead cannot be held: a cancel is kept this long, and a job must not outwait
# its cancel. The client schedules 30 days ahead at most; the day more leaves room for clocks.
RUN_AT_MAX_AHEAD_MS = CANCELS_MAX_AGE_S * 1000


def due_in_ms(headers: Mapping[str, Any], now: dt.datetime | None) -> tuple[int | None, bool]:
    """(milliseconds until the run-at header's time when it is ahead, whether it is unreadable
    or too far ahead to hold); the clock (when no now is given) is read only for a job that has
    one. How long a job waits in the delays, whether a worker or the client sends it there."""
    if RUN_AT not in headers:
        return None, False
    when = parse_run_at(headers[RUN_AT])
    if when is None:
        return None, True
    ahead_ms = math.ceil((when - (now or dt.datetime.now(dt.UTC))).total_seconds() * 1000)
    if ahead_ms > RUN_AT_MAX_AHEAD_MS:
        return None, True
    return (ahead_ms if ahead_ms > 0 else None), False


def read_facts(
    headers: Mapping[str, Any],
    *,
    redelivered: bool,
    routing_key: str,
    from_tier: bool,
    queue: str,
    max_retries: int,
    from_delays: bool = False,
    type_max_retries: int | None,
    type_ladder: Ladder | None = None,
    jitter: float = 0.0,
    unreadable: bool = False,
    key_tier: int | None = None,
    cancelled: bool = False,
    now: dt.datetime | None = None,
    draw: float | None = None,
    key: str | None = None,
    lined: bool = False,
) -> Facts:
    """The facts of a delivery from the main queue; a forged one counts as a first attempt.

    from_tier: whether its routing key says it came back from a retry tier, from_delays: from the
    delays (the key that spelled its wait). Retries so far are the count of the x-death entry of
    (queue, rejected); its routing keys keep the one the job was first published with, which the
    tiers replace on the way back. type_max_retries: the budget the handler of the job's type sets,
    if any; type_ladder: its type's ladder, if any. max_retries: the worker's budget
    (RICOCHET_MAX_RETRIES, the length of its ladder). The ladder in force is the job's own (its
    retry-delays-ms header), else its type's, else the worker's; its length is the budget, which the
    type's max_retries and the job's max-retries header lower. jitter: the worker's
    RICOCHET_RETRY_JITTER, which spreads the waits of a ladder of its own (draw: where in the
    spread, random when None). unreadable: whether some of its message properties could not be
    decoded. key_tier: the k of its routing key Q.attempt.k, if it has one. cancelled: whether a
    cancel covers it (ricochet.broker.cancels): one back from a wait, or still in the backlog when
    it is delivered. now: the time its run-at is read against (the clock when None, read only if
    it has one). key: its key, if it has one; lined: delivered from its key's lane, where it
    runs (a lane never dead-letters: its retries go to their tier by a copy).

    A job ricochet published again carries the retries it had made (the RETRIES header:
    RabbitMQ 4 restarts x-death on a published copy); they add to the broker's count, and its
    routing key leads to the tier of its next retry only once a tier sent it back.

    alone: the broker counts a return against every delivery that is unacked when a worker
    dies, so a job that crashes its worker raises the count of every job held beside it. A job
    returned once was most likely cut off with the others (a dropped connection, a redeploy)
    and runs beside them. One returned more often may be the job that crashes its worker: it
    runs alone, each time, until it succeeds or the poison limit fails it. A poison or forged
    delivery is settled without running its handler, and without a count nothing can be judged
    poison: none of those is held back.
    """
    forged, rejection = _read_death(headers, queue, from_tier)
    # ricochet's count of retries is trusted only on a route that ricochet itself takes: back
    # from a tier or from the delays. On a job a producer sent straight to the queue it is forged.
    routed_by_ricochet = from_tier or from_delays
    forged = forged or (RETRIES in headers and not routed_by_ricochet)
    rejections = _retries(rejection)
    copied = _copied_retries(headers) if routed_by_ricochet else 0
    returns = _returns(headers, redelivered, rejections)
    attempt = 1 + copied + rejections
    due_in, bad_run_at = due_in_ms(headers, now)
    ladder = _own_ladder(headers) or type_ladder
    budget = max_retries if ladder is None else len(ladder)
    return Facts(
        attempt=attempt,
        max_attempts=max_attempts(budget, type_max_retries, _header_retries(headers)),
        original_routing_key=_first_routing_key(rejection) or routing_key,
        forged=forged,
        poison=not forged and returns is not None and returns > POISON_DELIVERIES,
        unreadable=unreadable,
        cancelled=cancelled,
        due_in_ms=due_in,
        bad_run_at=bad_run_at,
        keyed_for_tier=not lined
        and (not copied or (key_tier is not None and key_tier + 1 == attempt)),
        alone=not forged and returns is not None and SUSPECT_RETURNS < returns <= POISON_DELIVERIES,
        wait_ms=_wait_ms(ladder, attempt, jitter, draw),
        key=key,
        lined=lined,
    )


# The decisions that carry nothing of their own, made once: one of them is taken twice for every
# job.
RUN = Run()
ACK = Ack()
SANITIZE = Sanitize()
CANCEL = Cancel()
LINE = Line()
FAIL_POISON = Fail(FailureKind.POISON)
FAIL_PERMANENT = Fail(FailureKind.PERMANENT)
FAIL_EXHAUSTED = Fail(FailureKind.EXHAUSTED)


@overload
def decide(facts: Facts, outcome: None) -> Decision: ...


@overload
def decide(facts: Facts, outcome: Outcome, retry_after_ms: int | None = None) -> Settlement: ...


@overload
def decide(
    facts: Facts, outcome: Outcome | None, retry_after_ms: int | None = None
) -> Decision: ...


def decide(facts: Facts, outcome: Outcome | None, retry_after_ms: int | None = None) -> Decision:
    """What happens to a delivery: before its handler ran (outcome None), then after.

    A delivery with unreadable properties fails for good, a forged x-death is cleaned, a
    cancelled job is dropped and a poison job failed, all without running the handler; one
    whose run-at is ahead waits for it (spending no attempt), one whose run-at cannot be read
    fails for good, one with a key due now joins its key's line (spending no attempt). A success
    is acked, and so is a job its handler stopped for a cancel; a permanent failure fails at
    once; a transient one retries in the tier of its attempt while attempts remain (tier k sends
    it back as attempt k + 1), else it fails; a RetryLater waits retry_after_ms instead of the
    tier's delay, and a job whose ladder is its own (the job's or its type's) waits its ladder's
    delay (wait_ms) in the delays.
    """
    if facts.unreadable:
        # Before the clean copy of a forged x-death, which would read as a readable job.
        return FAIL_PERMANENT
    if facts.forged:
        return SANITIZE
    if facts.cancelled:
        return CANCEL
    if facts.poison:
        return FAIL_POISON
    if outcome is None:
        return _before_run(facts)
    return _after_run(facts, outcome, retry_after_ms)


def _before_run(facts: Facts) -> Decision:
    if facts.bad_run_at:
        return FAIL_PERMANENT
    if facts.due_in_ms is not None:
        return Delay(facts.due_in_ms, retries=facts.attempt - 1)
    if facts.key is not None and not facts.lined:
        return LINE
    return RUN


def _after_run(facts: Facts, outcome: Outcome, retry_after_ms: int | None) -> Settlement:
    if outcome is Outcome.SUCCEEDED:
        return ACK
    if outcome is Outcome.CANCELLED:
        return CANCEL
    if outcome is Outcome.PERMANENT:
        return FAIL_PERMANENT
    if facts.attempt >= facts.max_attempts:
        return FAIL_EXHAUSTED
    if outcome is Outcome.LATER:
        assert retry_after_ms is not None
        return Delay(retry_after_ms, retries=facts.attempt)
    if facts.wait_ms is not None:  # a ladder of its own: it waits in the delays
        return Delay(facts.wait_ms, retries=facts.attempt)
    if not facts.keyed_for_tier:
        return RetryByCopy(facts.attempt)
    return _retry(facts.attempt)


@functools.cache
def _retry(tier: int) -> Retry:
    """The nack into tier k, made once per tier as the decisions above: a decision is frozen."""
    return Retry(tier)
