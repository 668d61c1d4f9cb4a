"""Settling on one channel: what one multiple ack may cover, a nack not yet written, copies."""

import asyncio

import aio_pika
import pytest
from aio_pika.exceptions import ChannelInvalidStateError
from ricochet.broker.topology import Names
from ricochet.delivery.retry import Action, Decision, Facts
from ricochet.worker.settler import Settler, plan_acks


@pytest.mark.parametrize(
    ("running", "finished", "multiple", "singles"),
    [
        (set(), [], None, []),
        (set(), [7], None, [7]),
        (set(), [3, 1, 2], 3, []),  # everything finished: one ack covers all
        ({5}, [1, 2, 3], 3, []),  # all below the oldest running delivery
        ({2}, [1, 3, 4], None, [1, 3, 4]),  # only one below it: single acks
        ({2, 9}, [1, 3, 4, 5], None, [1, 3, 4, 5]),
        ({4}, [1, 2, 3, 6, 5], 3, [5, 6]),  # those above a running one are acked singly
        ({1}, [2, 3], None, [2, 3]),  # a running (or not yet nacked) delivery is never covered
    ],
)
def test_plan_acks(
    running: set[int], finished: list[int], multiple: int | None, singles: list[int]
) -> None:
    """A multiple ack reaches exactly the finished deliveries below the oldest running one;
    every other finished delivery is acked on its own at once."""
    assert plan_acks(running, finished) == (multiple, singles)


class _Delivery:
    """A delivery of the one channel: its acks are recorded, its nack never gets written."""

    def __init__(self, tag: int, acked: list[tuple[int, bool]]) -> None:
        self.delivery_tag = tag
        self.message_id = f"m{tag}"
        self._acked = acked

    async def ack(self, multiple: bool = False) -> None:
        self._acked.append((self.delivery_tag, multiple))

    async def dead_letter(self) -> None:
        await asyncio.Event().wait()  # a stalled socket: the nack is never written


class _Channel:
    """A channel as a settler uses it for copies to queues: its default exchange."""

    def __init__(self, default: object) -> None:
        self.default_exchange = default


FIRST = Facts(attempt=1, max_attempts=4, original_routing_key="jobs")
ACK = Decision(Action.ACK)
RETRY = Decision(Action.RETRY, tier=1)


async def test_a_cancelled_nack_keeps_holding_back_multiple_acks() -> None:
    """A nack cancelled before it was written (a drain timeout on a stalled socket) still
    counts as running: the acks of the jobs around it never cover its delivery tag, so the job
    that failed is not settled as if it had succeeded."""
    acked: list[tuple[int, bool]] = []
    settler = Settler(_Channel(None), Names("jobs"), 131072)  # type: ignore[arg-type]
    deliveries = [_Delivery(tag, acked) for tag in (1, 2, 3)]
    for delivery in deliveries:
        settler.delivered(delivery)  # type: ignore[arg-type]
    nack = asyncio.create_task(settler.settle(deliveries[1], FIRST, RETRY))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    nack.cancel()
    with pytest.raises(asyncio.CancelledError):
        await nack
    await settler.settle(deliveries[0], FIRST, ACK)  # type: ignore[arg-type]
    await settler.settle(deliveries[2], FIRST, ACK)  # type: ignore[arg-type]
    await settler.drain()
    assert acked == [(1, False), (3, False)]


class _Exchange:
    """The default exchange of a channel: records which publishes of one id overlap."""

    def __init__(self) -> None:
        self.in_flight: dict[str | None, int] = {}
        self.overlaps: list[str | None] = []
        self.published: list[tuple[str | None, str]] = []

    async def publish(
        self,
        message: aio_pika.Message,
        routing_key: str,
        mandatory: bool,
        timeout: float | None,  # noqa: ASYNC109 - aio-pika's signature
    ) -> None:
        key = message.message_id
        if self.in_flight.get(key):
            self.overlaps.append(key)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        await asyncio.sleep(0.01)  # the confirm takes a while
        self.in_flight[key] -= 1
        self.published.append((key, routing_key))


async def test_copies_of_one_message_id_are_never_in_flight_together() -> None:
    """Two deliveries with one message_id failing together publish their copies (durable and
    notice) one after the other, since the broker's return is matched to a publish by that id;
    copies of other ids go out meanwhile."""
    acked: list[tuple[int, bool]] = []
    exchange = _Exchange()
    settler = Settler(_Channel(exchange), Names("jobs"), 131072)  # type: ignore[arg-type]
    deliveries = [_Delivery(tag, acked) for tag in (1, 2, 3)]
    for delivery in deliveries:
        settler.delivered(delivery)  # type: ignore[arg-type]
    ids = ["same", "same", "other"]
    await asyncio.gather(
        *(
            settler.copy_then_ack(
                delivery,  # type: ignore[arg-type]
                aio_pika.Message(b"{}", message_id=message_id),
                "jobs.failed",
                notify="jobs.failed.events",
            )
            for delivery, message_id in zip(deliveries, ids, strict=True)
        )
    )
    await settler.drain()
    assert exchange.overlaps == []
    assert sorted(exchange.published) == sorted(
        (key, queue) for key in ids for queue in ("jobs.failed", "jobs.failed.events")
    )
    covered = set()
    for tag, multiple in acked:
        covered |= set(range(1, tag + 1)) if multiple else {tag}
    assert covered == {1, 2, 3}


class _ClosedExchange:
    """The default exchange of a channel the broker closed (a connection lost meanwhile)."""

    async def publish(
        self,
        message: aio_pika.Message,
        routing_key: str,
        mandatory: bool,
        timeout: float | None,  # noqa: ASYNC109 - aio-pika's signature
    ) -> None:
        raise ChannelInvalidStateError("channel closed")


async def test_a_copy_goes_only_through_its_delivery_s_own_channel() -> None:
    """A settler publishes copies on the channel its deliveries came on: once that
    channel is gone (a reconnect made another), the copy is not made elsewhere and the
    original is not acked, so the broker hands it to the new channel whole, with one copy and
    one alert to come, not two."""
    acked: list[tuple[int, bool]] = []
    settler = Settler(_Channel(_ClosedExchange()), Names("jobs"), 131072)  # type: ignore[arg-type]
    delivery = _Delivery(1, acked)
    settler.delivered(delivery)  # type: ignore[arg-type]
    copied = await settler.copy_then_ack(
        delivery,  # type: ignore[arg-type]
        aio_pika.Message(b"{}", message_id="m"),
        "jobs.failed",
        notify="jobs.failed.events",
    )
    await settler.drain()
    assert copied is False
    assert acked == []
