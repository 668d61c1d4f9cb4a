"""In what basic.nacks a scan hands back deliveries it holds (pure).

A queue takes a handed-back message at its head, before everything it has not sent, and sends
messages on past their TTL from the head only: a message handed back before its time keeps the
ones behind it, due or not, until it leaves itself. So what goes back before its time goes back
in the order it leaves, a short span of it a nack; and a nack names no delivery the scan still
holds: one basic.nack(multiple) for the deliveries below every one still held, one each for the
rest (a delivery read twice, or out of its queue's order).
"""

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

Item = TypeVar("Item")


def nacks(tags: Iterable[int], kept_below: int | None) -> list[tuple[int, bool]]:
    """(delivery tag, multiple) of the nacks that hand back these deliveries and none other:
    kept_below is the lowest tag the scan still holds (None: it holds nothing else). The
    channel's other deliveries came later, so a multiple nack below it reaches only these."""
    chosen = sorted(tags)
    below = [tag for tag in chosen if kept_below is None or tag < kept_below]
    alone = [(tag, False) for tag in chosen[len(below) :]]
    return ([(below[-1], True)] if below else []) + alone


def spans(items: Sequence[Item], when: Callable[[Item], float], span_s: float) -> list[list[Item]]:
    """Items sorted by when(item), cut into runs that each cover span_s at most."""
    runs: list[list[Item]] = []
    for item in sorted(items, key=when):
        if runs and when(item) - when(runs[-1][0]) <= span_s:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs
