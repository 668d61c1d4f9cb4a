"""A job's priority, and how the broker honours it (pure).

A job carries its priority in the AMQP `priority` property: 0-9, higher first, DEFAULT when its
producer gives none, so that work can go below the default as well as above it. Among jobs
waiting in a queue's backlog the broker delivers by priority as it can (SPEC 28): what
`honouring()` says for a queue type, RICOCHET_MAX_PRIORITY and a broker version.
"""

from enum import StrEnum

from ricochet.ladders import is_int

LOWEST = 0
HIGHEST = 9
DEFAULT = 4
# RabbitMQ 4.0-4.2's quorum queues keep two bands: priorities above 4 before the others (2:1).
QUORUM_HIGH_BAND_FROM = 5
# The first RabbitMQ whose quorum queues order every priority, and the first that orders any.
QUORUM_STRICT_SINCE = (4, 3)
QUORUM_BANDS_SINCE = (4, 0)


def checked(value: object, what: str = "priority") -> int:
    """The priority, or ValueError naming what it is when it is not an int of 0-9."""
    if not is_int(value) or not LOWEST <= value <= HIGHEST:
        raise ValueError(f"{what} is {value!r}: an int of {LOWEST}-{HIGHEST} is allowed")
    return value


class Honouring(StrEnum):
    """How a queue's backlog is ordered by priority."""

    STRICT = "strict"  # every priority above the lower ones
    BANDS = "two bands"  # 5-9 before 0-4, served 2:1
    NONE = "none"  # first in, first out


def honouring(
    queue_type: str, max_priority: int, broker_version: tuple[int, ...] | None
) -> Honouring | None:
    """How the broker orders a queue's backlog by priority; None when it cannot be told (a
    quorum queue on a broker of an unknown version)."""
    if queue_type == "classic":
        return Honouring.STRICT if max_priority > 0 else Honouring.NONE
    if broker_version is None:
        return None
    if broker_version >= QUORUM_STRICT_SINCE:
        return Honouring.STRICT
    if broker_version >= QUORUM_BANDS_SINCE:
        return Honouring.BANDS
    return Honouring.NONE


def said(how: Honouring | None, queue_type: str, max_priority: int) -> str:
    """One sentence on how the backlog of a queue is ordered by priority, for doctor and for
    the worker's start."""
    match how:
        case Honouring.STRICT if queue_type == "classic":
            return (
                f"jobs are delivered by priority (x-max-priority {max_priority}: priorities"
                f" above it count as {max_priority})"
            )
        case Honouring.STRICT:
            return "jobs are delivered by priority (quorum queues of RabbitMQ 4.3+)"
        case Honouring.BANDS:
            return (
                f"jobs of priority {QUORUM_HIGH_BAND_FROM}-{HIGHEST} are delivered before those"
                f" of {LOWEST}-{QUORUM_HIGH_BAND_FROM - 1}, two to one (quorum queues of"
                " RabbitMQ 4.0-4.2: two bands)"
            )
        case Honouring.NONE if queue_type == "classic":
            return (
                "priority is not applied: the classic queue has no x-max-priority (set"
                " RICOCHET_MAX_PRIORITY to 5-9 on a queue declared new)"
            )
        case Honouring.NONE:
            return (
                "priority is not applied: quorum queues of RabbitMQ 3.x deliver first in, first"
                " out (4.0+ orders them)"
            )
        case None:
            return "how priority is applied depends on the broker's version, which was not read"
