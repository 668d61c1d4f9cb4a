"""The decision: a delivery's facts read once from its headers, and what happens to it (pure)."""

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

# More unacked deliveries than this means the job keeps killing its worker.
POISON_DELIVERIES = 5


class Outcome(enum.Enum):
    """What a handler call came to."""

    SUCCEEDED = "succeeded"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class Action(enum.Enum):
    """What the consumer does with the delivery."""

    RUN = "run"  # the handler has not run yet: run it
    ACK = "ack"
    RETRY = "retry"
    FAIL = "fail"
    SANITIZE = "sanitize"  # republish without the forged x-death, then ack


class FailureKind(enum.StrEnum):
    """Why a job went to the failed queue (the failed-kind header)."""

    EXHAUSTED = "exhausted"
    PERMANENT = "permanent"
    POISON = "poison"


@dataclass(frozen=True)
class Decision:
    """The action; for RETRY the tier the nack sends it to, for FAIL the kind of failure."""

    action: Action
    kind: FailureKind | None = None
    tier: int | None = None


class Facts(NamedTuple):
    """What a delivery says about its job, read once from its headers."""

    attempt: int
    max_attempts: int
    original_routing_key: str
    forged: bool = False
    poison: bool = False


def tier_delays_ms(first_ms: int, multiplier: float, cap_ms: int, tiers: int) -> list[int]:
    """Delay of each retry tier k = 1..tiers: first * multiplier^(k-1), capped, whole ms."""
    return [round(min(first_ms * multiplier ** (k - 1), cap_ms)) for k in range(1, tiers + 1)]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_death_entry(entry: Any) -> bool:
    return (
        isinstance(entry, Mapping)
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
    if "x-death" not in headers:
        return False, None
    deaths = headers["x-death"]
    if not (isinstance(deaths, list) and deaths and all(map(_is_death_entry, deaths))):
        return True, None
    rejection = next((d for d in deaths if d["queue"] == queue and d["reason"] == "rejected"), None)
    if rejection is not None and not from_tier:
        return True, None
    return False, rejection


def _first_routing_key(rejection: Mapping[str, Any] | None) -> str | None:
    keys = rejection.get("routing-keys") if rejection else None
    return keys[0] if isinstance(keys, list) and keys and isinstance(keys[0], str) else None


def _header_retries(headers: Mapping[str, Any]) -> int | None:
    """The max-retries header when it is an integer >= 0 (a digit string counts), else None."""
    wanted = headers.get("max-retries")
    if isinstance(wanted, str) and wanted.isascii() and wanted.isdigit():  # not "²", int() fails
        return int(wanted)
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 0:
        return wanted
    return None


def max_attempts(max_retries: int, type_max_retries: int | None, header_retries: int | None) -> int:
    """1 + the smallest retry budget of the settings, the job's type and its header (if set).

    Each can only lower the budget: a publisher or a handler cannot buy a job more retries
    than the topology has tiers for.
    """
    return 1 + min(r for r in (max_retries, type_max_retries, header_retries) if r is not None)


def _is_poison(headers: Mapping[str, Any], redelivered: bool, retries: int) -> bool:
    """True when the broker counts more unacked deliveries than a healthy job would get.

    The broker sets its counts only on a message it delivers again, so a count on a first
    delivery was written by a publisher and says nothing. RabbitMQ 4.0 carries the count across
    dead-lettering, so a job's own retries are taken off it: on a broker that restarts the count,
    that only lets a job that crashes its worker run a few more times.
    """
    counts = [headers.get("x-delivery-count"), headers.get("x-acquired-count")]
    return redelivered and any(
        isinstance(c, int) and not isinstance(c, bool) and c - retries > POISON_DELIVERIES
        for c in counts
    )


def read_facts(
    headers: Mapping[str, Any],
    *,
    redelivered: bool,
    routing_key: str,
    from_tier: bool,
    queue: str,
    max_retries: int,
    type_max_retries: int | None,
) -> Facts:
    """The facts of a delivery from the main queue; a forged one counts as a first attempt.

    from_tier: whether its routing key says it came back from a retry tier. Retries so far are
    the count of the x-death entry of (queue, rejected); its routing keys keep the one the job
    was first published with, which the tiers replace on the way back. type_max_retries: the
    budget the handler of the job's type sets, if any.
    """
    forged, rejection = _read_death(headers, queue, from_tier)
    retries = int(rejection["count"]) if rejection else 0
    return Facts(
        attempt=1 + retries,
        max_attempts=max_attempts(max_retries, type_max_retries, _header_retries(headers)),
        original_routing_key=_first_routing_key(rejection) or routing_key,
        forged=forged,
        poison=not forged and _is_poison(headers, redelivered, retries),
    )


# The decisions that carry no tier, made once: one of them is taken twice for every job.
RUN = Decision(Action.RUN)
ACK = Decision(Action.ACK)
SANITIZE = Decision(Action.SANITIZE)
FAIL_POISON = Decision(Action.FAIL, FailureKind.POISON)
FAIL_PERMANENT = Decision(Action.FAIL, FailureKind.PERMANENT)
FAIL_EXHAUSTED = Decision(Action.FAIL, FailureKind.EXHAUSTED)


def decide(facts: Facts, outcome: Outcome | None) -> Decision:
    """What happens to a delivery: before its handler ran (outcome None), then after.

    A forged x-death is cleaned and a poison job failed without running the handler; a success
    is acked; a permanent failure fails at once; a transient one retries in the tier of its
    attempt while attempts remain (tier k sends it back as attempt k + 1), else it fails.
    """
    if facts.forged:
        return SANITIZE
    if facts.poison:
        return FAIL_POISON
    if outcome is None:
        return RUN
    if outcome is Outcome.SUCCEEDED:
        return ACK
    if outcome is Outcome.PERMANENT:
        return FAIL_PERMANENT
    if facts.attempt < facts.max_attempts:
        return Decision(Action.RETRY, tier=facts.attempt)
    return FAIL_EXHAUSTED
