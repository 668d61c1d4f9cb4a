"""Queue depths and consumers, read with passive declares (nothing is consumed)."""

from dataclasses import asdict, dataclass

from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity

from app.topology import Plan


@dataclass(frozen=True)
class QueueStatus:
    """One queue as the broker reports it; messages is None when the queue does not exist."""

    name: str
    role: str
    delay_ms: int | None
    messages: int | None
    consumers: int | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def roles(plan: Plan) -> list[tuple[str, str, int | None]]:
    """(name, role, delay_ms) of every queue in the plan, in the order a job meets them."""
    n = plan.names
    return [
        (n.queue, "main", None),
        *((spec.name, f"tier {k}", spec.delay_ms) for k, spec in enumerate(plan.tiers, start=1)),
        (n.failed, "failed", None),
        (n.events, "failed events", None),
    ]


async def read_status(connection: AbstractConnection, plan: Plan) -> list[QueueStatus]:
    """Depth and consumers of every queue of the plan."""
    result = []
    channel = await connection.channel(publisher_confirms=False)
    for name, role, delay_ms in roles(plan):
        try:
            declared = await channel.declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            channel = await connection.channel(publisher_confirms=False)
            result.append(QueueStatus(name, role, delay_ms, None, None))
            continue
        ok = declared.declaration_result
        result.append(QueueStatus(name, role, delay_ms, ok.message_count, ok.consumer_count))
    await channel.close()
    return result
