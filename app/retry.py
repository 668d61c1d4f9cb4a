"""The retry decision: pure functions from delivery facts to what happens to the message."""

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# More unacked deliveries than this means the job keeps killing its worker.
POISON_DELIVERIES = 5


class Outcome(enum.Enum):
    """What a handler call came to."""

    SUCCEEDED = "succeeded"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class Action(enum.Enum):
    """What the consumer does with the delivery."""

    ACK = "ack"
    RETRY = "retry"
    FAIL = "fail"


class FailureKind(enum.StrEnum):
    """Why a job went to the failed queue (the failed-kind header)."""

    EXHAUSTED = "exhausted"
    PERMANENT = "permanent"
    POISON = "poison"


@dataclass(frozen=True)
class Decision:
    """The action, and for FAIL the kind of failure."""

    action: Action
    kind: FailureKind | None = None


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


def death_is_forged(headers: Mapping[str, Any]) -> bool:
    """True when an x-death header is present but is not what the broker writes."""
    if "x-death" not in headers:
        return False
    deaths = headers["x-death"]
    return not (isinstance(deaths, list) and deaths and all(map(_is_death_entry, deaths)))


def _rejection(headers: Mapping[str, Any], queue: str) -> Mapping[str, Any] | None:
    for entry in headers.get("x-death") or ():
        if entry["queue"] == queue and entry["reason"] == "rejected":
            return entry  # type: ignore[no-any-return]
    return None


def retries_so_far(headers: Mapping[str, Any], queue: str) -> int:
    """How often the main queue dead-lettered this message (headers must not be forged)."""
    entry = _rejection(headers, queue)
    return int(entry["count"]) if entry else 0


def original_routing_key(headers: Mapping[str, Any], queue: str, routing_key: str) -> str:
    """The routing key the job was first published with (tiers replace it on the way back)."""
    entry = _rejection(headers, queue)
    keys = entry.get("routing-keys") if entry else None
    if isinstance(keys, list) and keys and isinstance(keys[0], str):
        return keys[0]
    return routing_key


def max_attempts(headers: Mapping[str, Any], max_retries: int) -> int:
    """1 + the configured retries, lowered (never raised) by a max-retries header."""
    wanted = headers.get("max-retries")
    if isinstance(wanted, str) and wanted.isdigit():
        wanted = int(wanted)
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 0:
        return 1 + min(max_retries, wanted)
    return 1 + max_retries


def is_poison(headers: Mapping[str, Any], redelivered: bool) -> bool:
    """True when the broker counts more unacked deliveries than a healthy job would get.

    The broker sets its counts only on a message it delivers again, so a count on a first
    delivery was written by a publisher and says nothing.
    """
    counts = [headers.get("x-delivery-count"), headers.get("x-acquired-count")]
    return redelivered and any(isinstance(c, int) and c > POISON_DELIVERIES for c in counts)


def decide(outcome: Outcome, attempt: int, attempts_allowed: int) -> Decision:
    """Ack a success, retry a transient failure while attempts remain, else fail."""
    if outcome is Outcome.SUCCEEDED:
        return Decision(Action.ACK)
    if outcome is Outcome.PERMANENT:
        return Decision(Action.FAIL, FailureKind.PERMANENT)
    if attempt < attempts_allowed:
        return Decision(Action.RETRY)
    return Decision(Action.FAIL, FailureKind.EXHAUSTED)
