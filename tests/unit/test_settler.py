"""Settling on one channel: what one multiple ack may cover, nacks among acks, copies."""

import asyncio
import random

import aio_pika
import pytest
from aio_pika.exceptions import ChannelInvalidStateError
from ricochet.delivery.failed import Failure
from ricochet.delivery.retry import Ack, Facts, Retry
from ricochet.names import Names
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
    """A delivery of the one channel."""

    def __init__(self, tag: int) -> None:
        self.delivery_tag = tag
        self.message_id = f"m{tag}"


class _Frames:
    """The channel's frames: each settle() is written after a few turns of the loop, and what
    it settles is worked out as the AMQP spec has a channel's frames read, in order: a nack
    settles its tag, an ack with multiple=True every delivery up to its tag not settled yet."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self.unsettled: list[int] = []
        self.outcome: dict[int, str] = {}
        self.twice: list[int] = []

    async def settle(self, dead: list[int], multiple: int | None, acks: list[int]) -> None:
        for _ in range(self._random.randrange(3)):
            await asyncio.sleep(0)  # the writer's turn
        for tag in dead:
            self._settle(tag, "dead-lettered")
        if multiple is not None:
            for tag in [tag for tag in self.unsettled if tag <= multiple]:
                self._settle(tag, "acked")
        for tag in acks:
            self._settle(tag, "acked")

    def _settle(self, tag: int, outcome: str) -> None:
        if tag not in self.unsettled:
            self.twice.append(tag)
            return
        self.unsettled.remove(tag)
        self.outcome[tag] = outcome


class _Channel:
    """A channel as a settler uses it for copies to queues: its default exchange."""

    def __init__(self, default: object) -> None:
        self.default_exchange = default


FIRST = Facts(attempt=1, max_attempts=4, original_routing_key="jobs")
ACK = Ack()
RETRY = Retry(1)


def _settler(frames: object, exchange: object = None) -> Settler:
    return Settler(
        _Channel(exchange),  # type: ignore[arg-type]
        frames,  # type: ignore[arg-type]
        Names("jobs"),
        131072,
    )


@pytest.mark.parametrize("seed", range(20))
async def test_every_delivery_is_settled_once_as_decided(seed: int) -> None:
    """Jobs that finish in any order, some retried (dead-lettered) among the successes, over
    writes that take a while: each delivery is settled exactly once, and a multiple ack never
    covers one still running or one to be dead-lettered, so a failed job is never settled as
    if it had succeeded, a drain among them too."""
    chance = random.Random(seed)
    frames = _Frames(seed)
    settler = _settler(frames)
    failure = Failure(ConnectionError("down"))
    decisions = {tag: chance.choice([ACK, ACK, RETRY]) for tag in range(1, 41)}

    async def job(tag: int) -> None:
        for _ in range(chance.randrange(4)):
            await asyncio.sleep(0)  # the handler's time
        await settler.settle(_Delivery(tag), FIRST, decisions[tag], failure)  # type: ignore[arg-type]

    jobs = []
    for tag in decisions:
        frames.unsettled.append(tag)
        settler.delivered(_Delivery(tag))  # type: ignore[arg-type]
        jobs.append(asyncio.create_task(job(tag)))
        if chance.random() < 0.3:
            await asyncio.sleep(0)  # deliveries arrive while others finish
    early = asyncio.create_task(settler.drain())  # a stop's drain while jobs still settle
    await asyncio.gather(*jobs, early)
    await settler.drain()
    assert frames.twice == []
    assert frames.unsettled == []
    assert frames.outcome == {
        tag: "dead-lettered" if decision is RETRY else "acked"
        for tag, decision in decisions.items()
    }


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
    exchange = _Exchange()
    frames = _Frames(0)
    settler = _settler(frames, exchange)
    deliveries = [_Delivery(tag) for tag in (1, 2, 3)]
    for delivery in deliveries:
        frames.unsettled.append(delivery.delivery_tag)
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
    assert frames.outcome == {1: "acked", 2: "acked", 3: "acked"}


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
    frames = _Frames(0)
    settler = _settler(frames, _ClosedExchange())
    delivery = _Delivery(1)
    frames.unsettled.append(1)
    settler.delivered(delivery)  # type: ignore[arg-type]
    copied = await settler.copy_then_ack(
        delivery,  # type: ignore[arg-type]
        aio_pika.Message(b"{}", message_id="m"),
        "jobs.failed",
        notify="jobs.failed.events",
    )
    await settler.drain()
    assert copied is False
    assert frames.outcome == {}
