"""What a worker tells its observers (metrics, the job's log lines, the pause window): that a
handler call ended, and that a delivery was settled."""

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from ricochet.delivery.failed import Failure
from ricochet.delivery.retry import Facts, Outcome, Settlement


class Settled(NamedTuple):
    """A delivery the broker has taken back: acked, nacked into its tier, or acked after its
    copy (failed, cleaned, delayed) was confirmed. A tuple: two are made for every retried job,
    and a frozen dataclass takes about half as long again to build."""

    message_id: str | None
    facts: Facts
    decision: Settlement
    failure: Failure | None = None
    # The "job failed" line's fields, when it went to the failed queue.
    failed_fields: Mapping[str, Any] | None = None
    kind: str | None = None  # the job's type
    seconds: float | None = None  # how long its handler ran, when it ran
    # What its handler returned, when it succeeded and its type keeps results.
    result: "Returned | None" = None


class Returned(NamedTuple):
    """A handler's return value (None is a value too)."""

    value: Any


class Observer(Protocol):
    """Sees every handler call and every settled delivery; never changes what happens."""

    def attempted(self, outcome: Outcome, seconds: float) -> None:
        """A handler call ended (how, how long it took)."""

    def settled(self, event: Settled) -> None:
        """A delivery was settled; a channel lost first settles nothing and tells nothing."""
