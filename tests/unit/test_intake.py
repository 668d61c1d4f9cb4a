"""The consumer's intake reads any delivery, however formed (SPEC 24): its facts, or facts that
say it is unreadable and why; it never raises, so no message can stop a worker consuming."""

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from ricochet import ladders
from ricochet.broker.amqp import Delivery
from ricochet.delivery.retry import Fail, FailureKind, Run, decide
from ricochet.handlers.invoker import Invoker
from ricochet.headers import MAX_RETRIES, RETRIES, RETRY_DELAYS, RUN_AT
from ricochet.names import delay_key
from ricochet.observe.metrics import Metrics
from ricochet.service.process import Lifecycle
from ricochet.settings import Settings
from ricochet.worker.consumer import Consumer
from ricochet.worker.worker import Worker

from tests.unit.frames import delivered

QUEUE = "jobs"


async def noop(job: Any) -> None:
    pass


def make_consumer() -> Consumer:
    settings = Settings(queue=QUEUE)
    worker = Worker(
        settings, Invoker(noop, settings.handler_timeout_s), Metrics(QUEUE), Lifecycle()
    )
    return worker.queues[0].consumer()


def delivery(
    headers: dict[str, Any],
    body: bytes,
    routing_key: str = QUEUE,
    redelivered: bool = False,
    amqp_type: str | None = None,
) -> Delivery:
    raw = delivered(commands.Basic.Deliver("ctag", 1, redelivered, "", routing_key))
    made = Delivery(raw)
    # Set here: the frames could not carry every value drawn (an empty body, a naive datetime).
    made.headers, made.body, made.type = headers, body, amqp_type
    return made


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.text(alphabet="0123456789", min_size=4_000, max_size=5_000),
    st.binary(max_size=20),
    st.decimals(allow_nan=True),
    st.datetimes(),
    st.datetimes(timezones=st.timezones()),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
    max_leaves=12,
)
own_headers = st.sampled_from(
    ["x-death", "x-delivery-count", "x-acquired-count", MAX_RETRIES, RUN_AT, RETRIES, RETRY_DELAYS]
)
ladder_texts = st.lists(st.integers(0, 10**9), min_size=0, max_size=27).map(
    lambda delays: ",".join(map(str, delays))
)
headers = st.dictionaries(own_headers, values | ladder_texts, max_size=6) | st.dictionaries(
    st.text(max_size=8), values, max_size=4
)
bodies = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([1, 900, 6_000]).map(lambda n: b"[" * n),
    st.sampled_from([1, 900, 6_000]).map(lambda n: b'{"type": ' * n),
)
routing_keys = st.one_of(
    st.just(QUEUE),
    st.integers(0, 30).map(lambda k: f"{QUEUE}.attempt.{k}"),
    st.integers(0, 10**9).map(lambda ms: delay_key(ms, QUEUE)),
    st.integers(0, 10**9).map(lambda ms: delay_key(ms, QUEUE).removesuffix("." + QUEUE)),
    st.text(max_size=30),
)


@settings(max_examples=400, deadline=None)
@given(
    headers=headers,
    body=bodies,
    routing_key=routing_keys,
    redelivered=st.booleans(),
    amqp_type=st.none() | st.text(max_size=10),
)
def test_intake_reads_every_delivery(
    headers: dict[str, Any], body: bytes, routing_key: str, redelivered: bool, amqp_type: str | None
) -> None:
    """Whatever the headers, body, type and route, intake reads the facts as the contract says
    (never falling back to "unreadable" on properties it could decode; a job ladder that cannot
    be read is the contract's own reason), and decide takes them."""
    arrival = make_consumer().intake(delivery(headers, body, routing_key, redelivered, amqp_type))
    if _readable_ladder(headers.get(RETRY_DELAYS, "10")):
        assert arrival.delivery.unreadable is None
    else:
        assert str(arrival.delivery.unreadable).startswith(
            f"InvalidRetryDelays: {RETRY_DELAYS} header"
        )
        assert decide(arrival.facts, None) == Fail(FailureKind.PERMANENT)
    decide(arrival.facts, None)


def _readable_ladder(value: object) -> bool:
    try:
        ladders.parse(value)  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def test_a_delivery_whose_facts_cannot_be_read_fails_as_permanent_saying_why() -> None:
    """What the reading did not foresee (a header whose value breaks comparison, here) makes
    the delivery unreadable: it fails as permanent, its reason naming the error."""

    class Hostile(int):
        def __lt__(self, other: object) -> bool:
            raise ArithmeticError("no order here")

        __gt__ = __le__ = __ge__ = __lt__

    arrival = make_consumer().intake(delivery({MAX_RETRIES: Hostile(2)}, b"{}"))
    assert arrival.facts.unreadable
    assert decide(arrival.facts, None) == Fail(FailureKind.PERMANENT)
    assert arrival.delivery.unreadable == "ArithmeticError: no order here"


@pytest.mark.parametrize(
    ("headers", "max_attempts"),
    [
        ({MAX_RETRIES: "9" * 5_000}, 4),  # larger than any budget: lowers nothing
        ({MAX_RETRIES: "1"}, 2),
        ({MAX_RETRIES: 10**30}, 4),
    ],
)
def test_a_max_retries_header_of_any_size_is_read(
    headers: dict[str, Any], max_attempts: int
) -> None:
    """A budget header of thousands of digits (int() refuses past 4,300) reads as the contract
    says: it can only lower the worker's budget."""
    assert make_consumer().intake(delivery(headers, b"{}")).facts.max_attempts == max_attempts


def test_a_run_at_of_any_time_zone_is_read() -> None:
    """A run-at as an AMQP timestamp far in the past, with an offset, reads as a due job."""
    when = dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    facts = make_consumer().intake(delivery({RUN_AT: when}, b"{}")).facts
    assert isinstance(decide(facts, None), (Run, Fail))
