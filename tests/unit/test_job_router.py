"""Job attributes and Router dispatch."""

import pytest
from pydantic import BaseModel

from app import Job, PermanentError, Router
from app.errors import InvalidPayload, UnknownJobType


def job(body: bytes, amqp_type: str | None = None) -> Job:
    return Job(body, headers={}, message_id="m", amqp_type=amqp_type, attempt=1, max_attempts=4)


def test_type_from_property_then_body() -> None:
    """type is the AMQP property, else the body's top-level "type" string, else None."""
    assert job(b'{"type": "a"}', "b").type == "b"
    assert job(b'{"type": "a"}').type == "a"
    assert job(b'{"type": 3}').type is None
    assert job(b"[1]").type is None
    assert job(b"\xff").type is None


def test_payload_errors_are_permanent() -> None:
    """A body that is not JSON raises a PermanentError when the payload is read."""
    with pytest.raises(PermanentError, match="not valid JSON"):
        job(b"not json").payload  # noqa: B018
    assert job(b'{"a": 1}').payload == {"a": 1}


class Order(BaseModel):
    order_id: int


def test_router_dispatch() -> None:
    """Handlers are found by type; models validate the payload; unknown types are permanent."""
    router = Router()

    @router.handler("plain")
    def plain(j: Job) -> None: ...

    @router.handler("order", model=Order)
    async def order(j: Job, o: Order) -> None: ...

    route, args = router.resolve(job(b"{}", "plain"))
    assert route.fn is plain
    assert not route.is_async
    assert args == (args[0],)
    route, args = router.resolve(job(b'{"order_id": 7}', "order"))
    assert route.is_async
    assert args[1] == Order(order_id=7)
    with pytest.raises(InvalidPayload, match="does not match Order"):
        router.resolve(job(b'{"order_id": "x"}', "order"))
    with pytest.raises(UnknownJobType, match="'nope'"):
        router.resolve(job(b"{}", "nope"))
    with pytest.raises(InvalidPayload):
        router.resolve(job(b"garbage"))
    with pytest.raises(ValueError, match="already registered"):
        router.handler("plain")(plain)
