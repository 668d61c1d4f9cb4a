"""In what basic.nacks a scan hands back deliveries it holds (pure).

A nack names no delivery the scan still holds: one basic.nack(multiple) for the deliveries below
every one still held, one each for the rest (a delivery read twice, or out of its queue's
order). What a read holds at its end goes back one nack a delivery, in the order it was first
read (ops/waiting_scan.py): a multiple nack comes back grouped by consumer, out of the queue's
order, and a queue sends messages on past their TTL from its head only.
"""

from collections.abc import Iterable


def nacks(tags: Iterable[int], kept_below: int | None) -> list[tuple[int, bool]]:
    """(delivery tag, multiple) of the nacks that hand back these deliveries and none other:
    kept_below is the lowest tag the scan still holds (None: it holds nothing else). The
    channel's other deliveries came later, so a multiple nack below it reaches only these."""
    chosen = sorted(tags)
    below = [tag for tag in chosen if kept_below is None or tag < kept_below]
    alone = [(tag, False) for tag in chosen[len(below) :]]
    return ([(below[-1], True)] if below else []) + alone
