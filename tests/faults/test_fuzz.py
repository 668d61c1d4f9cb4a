"""Bad input fuzzed on real deliveries: random bodies and properties, header tables with odd value
types, x-death and delivery counts forged in every shape, headers and bodies near the frame limit.
The worker never crashes, and every message is completed or in the failed queue."""

import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aio_pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ricochet.broker.amqp import table_size

from tests.faults.harness import FaultRun
from tests.support import ForeignBytes

FRAME_MAX = 131_072  # RabbitMQ's default, which the private node keeps

keys = st.text(min_size=1, max_size=12)
not_utf8 = st.binary(max_size=20).map(lambda b: ForeignBytes(b"\xff" + b))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=32),  # tables carry 32-bit floats
    st.text(max_size=40),
    not_utf8,  # a long string
    st.binary(max_size=40).map(bytearray),  # a table carries bytes as a byte array
    st.decimals(min_value=-(10**6), max_value=10**6, places=3),
    st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1)),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
death_keys = st.sampled_from(["queue", "reason", "count", "exchange", "routing-keys", "time"])
plausible_death = st.fixed_dictionaries(
    {
        "queue": st.text(max_size=20) | values,
        "reason": st.sampled_from(["rejected", "expired", "maxlen"]) | values,
        "count": st.integers(-3, 5) | values,
    }
)
forged_death = values | st.lists(
    st.dictionaries(death_keys, values, max_size=6) | plausible_death | values, max_size=3
)
json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
).map(lambda v: json.dumps(v).encode())
bodies = st.one_of(
    st.binary(max_size=300),
    json_bodies,
    st.fixed_dictionaries({"type": st.sampled_from(["report", "x"])}).map(
        lambda v: json.dumps(v).encode()
    ),
    st.integers(FRAME_MAX - 64, FRAME_MAX + 64).map(lambda n: b"{" * n),
    st.just(b"[" * 5_000),  # valid JSON's start, nested past the parser's depth
)
# A short string that is not UTF-8 cannot be decoded: its delivery fails, the connection stays.
short_strings = st.none() | st.text(max_size=30) | not_utf8


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    """(body, headers, properties) of one message a careless or hostile publisher might send."""
    headers = draw(st.dictionaries(keys, values, max_size=5))
    for name, strategy in (
        ("x-death", forged_death),
        ("max-retries", values | st.integers(-2, 30) | st.just("9" * 5_000)),
        ("x-delivery-count", values | st.integers(0, 99)),
        ("ricochet-retries", values | st.integers(-2, 30)),
    ):
        if draw(st.booleans()):
            headers[name] = draw(strategy)
    if draw(st.integers(0, 7)) == 0:
        # As large as a publisher can send: the failed copy has to be cut to fit.
        room = FRAME_MAX - 1000 - table_size(headers)
        headers["big"] = "h" * draw(st.integers(room - 3000, room))
    properties = {
        "content_type": draw(short_strings),
        "content_encoding": draw(short_strings),
        "type": draw(st.none() | st.sampled_from(["report", "x"]) | st.text(max_size=20)),
        "correlation_id": draw(short_strings),
        "priority": draw(st.none() | st.integers(0, 255)),
    }
    return draw(bodies), headers, properties


@pytest.fixture
async def fuzz_run(fault_run: Callable[..., FaultRun]) -> AsyncIterator[FaultRun]:
    """One worker for every example; at the end every message is accounted for."""
    run = fault_run(
        "fuzzed deliveries", handler="tests.handlers:fuzzed", max_retries=1, retry_delay_ms=20
    )
    await run.start_worker()
    yield run
    await run.account(any_failed=True)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one worker serves every example, on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(batch=st.lists(deliveries(), min_size=1, max_size=12))
async def test_fuzzed_deliveries_end_completed_or_failed(
    fuzz_run: FaultRun, batch: list[tuple[bytes, dict[str, Any], dict[str, Any]]]
) -> None:
    """Whatever arrives, the worker keeps running and settles it: completed or failed."""
    first = len(fuzz_run.published)
    await fuzz_run.publish_messages(
        [
            aio_pika.Message(
                body,
                headers=headers,
                message_id=f"fuzz-{first + i}",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                **properties,
            )
            for i, (body, headers, properties) in enumerate(batch)
        ]
    )
    await fuzz_run.until_settled(timeout_s=30)
    worker = fuzz_run.workers[0]
    assert worker.alive, worker.output.read_text()[-3000:]
    assert worker.starts == 1
