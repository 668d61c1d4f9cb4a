"""Which failed copies a command acts on: the filters that replay, failed list, failed discard
and the console share (pure)."""

from collections import Counter
from dataclasses import dataclass, field

from ricochet.delivery.failed import FailureInfo


@dataclass(frozen=True)
class Selection:
    """Which failed copies to act on; None matches anything, and every filter given must match.

    reason is a substring of failed-reason (--reason); reason_is is the whole of it (a reason
    group of the console), whatever its line breaks are made of: a browser sends a form's as
    CRLF, and reads a page's CR as LF. type, kind and message_id are exact.
    """

    reason: str | None = None
    type: str | None = None
    message_id: str | None = None
    kind: str | None = None
    reason_is: str | None = None
    # The monitor's relaunch: copies of any of these kinds, replayed fewer times than this.
    kinds: frozenset[str] | None = None
    replays_below: int | None = None

    def matches(self, failure: FailureInfo) -> bool:
        return (
            (self.reason is None or self.reason in failure.reason)
            and (self.reason_is is None or _lines(self.reason_is) == _lines(failure.reason))
            and (self.type is None or self.type == failure.type)
            and (self.message_id is None or self.message_id == failure.message_id)
            and (self.kind is None or self.kind == failure.kind)
            and (self.kinds is None or failure.kind in self.kinds)
            and (self.replays_below is None or failure.replay_count < self.replays_below)
        )


def _lines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


@dataclass
class Outcome:
    """What a command over the failed queue selected (and removed, unless it only read), and how
    many copies the queue held when it started."""

    depth: int
    selected: list[FailureInfo] = field(default_factory=list)
    interrupted: bool = False

    @property
    def kept(self) -> int:
        return self.depth - len(self.selected)

    def count_by(self, attribute: str) -> Counter[str]:
        """Selected copies per value of a FailureInfo attribute (reason, type, kind)."""
        return Counter(str(getattr(f, attribute)) for f in self.selected)
