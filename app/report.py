"""Plain-text tables for the commands' output."""

from collections.abc import Sequence

from app.status import QueueStatus
from app.topology import Plan


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(c) for c in header], *([("-" if c is None else str(c)) for c in r] for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def duration(delay_ms: int | None) -> str:
    """30000 -> '30s', 1500 -> '1.5s', 90 -> '90ms'."""
    if delay_ms is None:
        return ""
    if delay_ms < 1000:
        return f"{delay_ms}ms"
    return f"{delay_ms / 1000:g}s"


def plan_table(plan: Plan) -> str:
    """The queues (with arguments) and the bindings of a plan."""
    queues = table(
        ["queue", "delay", "arguments"],
        [
            (q.name, duration(q.delay_ms), ", ".join(f"{k}={v}" for k, v in q.arguments.items()))
            for q in [plan.queues[0], *plan.tiers, *plan.queues[1:]]
        ],
    )
    exchanges = table(
        ["exchange", "type", "arguments"],
        [
            (name, kind.value, ", ".join(f"{k}={v}" for k, v in args.items()))
            for name, kind, args in plan.exchanges
        ],
    )
    bindings = table(
        ["from exchange", "routing key", "to"],
        [
            (
                b.source,
                b.routing_key or "(any)",
                f"exchange {b.destination}" if b.to_exchange else b.destination,
            )
            for b in plan.bindings
        ],
    )
    return f"{queues}\n\n{exchanges}\n\n{bindings}"


def status_table(rows: Sequence[QueueStatus]) -> str:
    """Depth and consumers per queue; missing queues show as '-'."""
    return table(
        ["queue", "role", "delay", "messages", "consumers"],
        [(s.name, s.role, duration(s.delay_ms), s.messages, s.consumers) for s in rows],
    )
