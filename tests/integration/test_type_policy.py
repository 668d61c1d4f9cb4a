"""Retry policy per job type: a type's retry budget and the exceptions it gives up on."""

import json

import pytest
from aio_pika.abc import AbstractChannel
from ricochet import Job, Router
from ricochet.names import Names

from tests.recorder import Recorder
from tests.support import StartWorker, depth, publish, take

QUEUE_TYPES = ["quorum", "classic"]


class OrderCancelled(Exception):
    """Raised by a handler whose job no longer makes sense: retrying cannot help."""


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_type_budget_bounds_attempts(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """With RICOCHET_MAX_RETRIES=2, a type with max_retries=1 gets two attempts and one with 0
    a single one, each failed by the worker as exhausted after its own last attempt (with
    the failed-* headers, which the broker's dead-lettering would not add); a type with
    max_retries=5 still gets only the setting's three, and a type without one gets three."""
    recorder = Recorder()
    router = Router()
    router.handler("brief", max_retries=1)(recorder)
    router.handler("once", max_retries=0)(recorder)
    router.handler("lavish", max_retries=5)(recorder)
    router.handler("plain")(recorder)
    await start_worker(router, queue_type=queue_type, max_retries=2, retry_delay_ms=20)
    for job_type in ("brief", "once", "lavish", "plain"):
        body = json.dumps({"fail": "always"})
        await publish(channel, queue_name, body, message_id=job_type, type=job_type)
    names = Names(queue_name)
    copies = {m.message_id: m for m in await take(channel, names.failed, 4)}
    expected = {"brief": 2, "once": 1, "lavish": 3, "plain": 3}
    for job_type, attempts in expected.items():
        assert recorder.attempts(job_type) == list(range(1, attempts + 1)), job_type
        assert {a.max_attempts for a in recorder.seen[job_type]} == {attempts}, job_type
        headers = copies[job_type].headers
        assert headers["failed-kind"] == "exhausted", job_type
        assert headers["retry-count"] == attempts - 1, job_type
        assert headers["failed-exception"] == "ConnectionError", job_type
        assert headers["original-routing-key"] == queue_name, job_type
    for queue in (names.queue, names.tier(1), names.tier(2)):
        assert await depth(channel, queue) == 0, queue


async def test_header_lowers_a_type_budget(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """A max-retries header lower than the type's budget wins: the smallest budget counts."""
    recorder = Recorder()
    router = Router()
    router.handler("brief", max_retries=2)(recorder)
    await start_worker(router, max_retries=3, retry_delay_ms=20)
    body = json.dumps({"fail": "always"})
    headers = {"max-retries": 0}
    await publish(channel, queue_name, body, message_id="j", type="brief", headers=headers)
    [copy] = await take(channel, Names(queue_name).failed, 1)
    assert recorder.attempts("j") == [1]
    assert copy.headers["failed-kind"] == "exhausted"


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_give_up_on_fails_at_once(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str, queue_type: str
) -> None:
    """An exception of a give_up_on class (or a subclass) fails the job on its first attempt as
    permanent, the copy naming the class and its message; other exceptions are still retried,
    and another type does not give up on that class."""
    seen: list[tuple[str | None, int]] = []
    router = Router()

    @router.handler("order", give_up_on=(OrderCancelled, LookupError))
    def order(job: Job) -> None:
        seen.append((job.message_id, job.attempt))
        errors = {"cancelled": OrderCancelled("order 7 was cancelled"), "missing": KeyError(7)}
        raise errors.get(job.message_id or "", ConnectionError("shop is down"))

    @router.handler("other")
    def other(job: Job) -> None:
        seen.append((job.message_id, job.attempt))
        raise OrderCancelled("not given up on here")

    await start_worker(router, queue_type=queue_type, max_retries=1, retry_delay_ms=20)
    for message_id, job_type in [
        ("cancelled", "order"),
        ("missing", "order"),
        ("down", "order"),
        ("elsewhere", "other"),
    ]:
        await publish(channel, queue_name, b"{}", message_id=message_id, type=job_type)
    copies = {m.message_id: m for m in await take(channel, Names(queue_name).failed, 4)}
    cancelled = copies["cancelled"].headers
    assert cancelled["failed-kind"] == "permanent"
    assert cancelled["failed-exception"] == f"{__name__}.OrderCancelled"
    assert cancelled["failed-reason"] == "OrderCancelled: order 7 was cancelled"
    assert cancelled["retry-count"] == 0
    missing = copies["missing"].headers
    assert (missing["failed-kind"], missing["failed-exception"]) == (
        "permanent",
        "KeyError",
    )
    for retried in ("down", "elsewhere"):
        assert copies[retried].headers["failed-kind"] == "exhausted", retried
        assert copies[retried].headers["retry-count"] == 1, retried
    assert sorted(seen) == [
        ("cancelled", 1),
        ("down", 1),
        ("down", 2),
        ("elsewhere", 1),
        ("elsewhere", 2),
        ("missing", 1),
    ]
