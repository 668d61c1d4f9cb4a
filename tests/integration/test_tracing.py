"""Tracing against the real broker: every attempt of a job, and its replay, in one trace."""

from collections.abc import Iterator
from typing import Any

import pytest
from aio_pika.abc import AbstractConnection
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from ricochet import Client, Job, tracing
from ricochet.names import Names
from ricochet.ops.replay import replay
from ricochet.ops.selection import Selection

from tests.recorder import Recorder
from tests.support import AMQP_URL, StartWorker, depth, wait_for


@pytest.fixture(scope="module")
def provider_exporter() -> InMemorySpanExporter:
    """The process's global tracer provider can be set only once: one exporter for the module."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@pytest.fixture
def exporter(provider_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    provider_exporter.clear()
    yield provider_exporter
    provider_exporter.clear()


def consumer_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    spans = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    return sorted(spans, key=lambda s: s.start_time or 0)


async def publish_job(queue: str, payload: str, **job: Any) -> None:
    """Enqueue one job with the Client, as an application does."""
    async with Client(AMQP_URL, queue) as client:
        await client.enqueue(job.pop("job_type", None), payload.encode(), **job)


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.trace_id
    return found


async def test_every_attempt_is_a_child_of_the_publisher(
    queue_name: str,
    connection: AbstractConnection,
    start_worker: StartWorker,
    exporter: InMemorySpanExporter,
) -> None:
    """A job failing twice then succeeding: three consumer spans in the publisher's trace."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=3, retry_delay_ms=100)
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("parent") as parent:
        await publish_job(queue_name, '{"fail": 2}', message_id="j1", job_type="mail")
    await wait_for(lambda: len(consumer_spans(exporter)) == 3, 20, "three attempts")

    spans = consumer_spans(exporter)
    publisher = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER)
    assert publisher.name == f"{queue_name} publish"
    assert trace_id(publisher) == parent.get_span_context().trace_id
    assert {trace_id(s) for s in spans} == {trace_id(publisher)}
    assert all(
        s.parent is not None and s.parent.span_id == publisher.context.span_id for s in spans
    )
    assert [s.name for s in spans] == [f"{queue_name} process"] * 3
    attributes = [dict(s.attributes or {}) for s in spans]
    assert [a["ricochet.attempt"] for a in attributes] == [1, 2, 3]
    assert [a["ricochet.outcome"] for a in attributes] == ["retried", "retried", "succeeded"]
    assert [a.get("ricochet.tier") for a in attributes] == [1, 2, None]
    for a in attributes:
        assert a["messaging.system"] == "rabbitmq"
        assert a["messaging.destination.name"] == queue_name
        assert a["messaging.message.id"] == "j1"
        assert a["ricochet.job.type"] == "mail"
    assert [s.status.status_code for s in spans] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.UNSET,
    ]


def attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def interval(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None
    assert span.end_time is not None
    return span.start_time, span.end_time


async def test_each_attempt_shows_how_it_was_settled(
    queue_name: str,
    connection: AbstractConnection,
    start_worker: StartWorker,
    exporter: InMemorySpanExporter,
) -> None:
    """A job retried then failed, and one that succeeds: each attempt span has a settle span
    inside it saying what was done (the nack to tier 1, the failed copy, the ack)."""
    await start_worker(Recorder(), max_retries=1, retry_delay_ms=100)
    await publish_job(queue_name, '{"fail": "always"}', message_id="fails")
    await publish_job(queue_name, "{}", message_id="works")
    channel = await connection.channel()
    await wait_for(lambda: depth(channel, Names(queue_name).failed), 20, "the failed copy")
    await wait_for(lambda: len(consumer_spans(exporter)) == 3, 20, "three attempts")

    settles = {
        s.parent.span_id: s
        for s in exporter.get_finished_spans()
        if s.name == f"{queue_name} settle" and s.parent is not None
    }
    steps: dict[object, list[dict[str, object]]] = {"fails": [], "works": []}
    for attempt in consumer_spans(exporter):
        settle = settles[attempt.context.span_id]
        assert trace_id(settle) == trace_id(attempt)
        (began, ended), (settling, settled) = interval(attempt), interval(settle)
        assert began <= settling <= settled <= ended
        steps[attributes(attempt)["messaging.message.id"]].append(attributes(settle))
    assert steps == {
        "fails": [
            {"ricochet.action": "retry", "ricochet.tier": 1},
            {"ricochet.action": "fail", "ricochet.failed.kind": "exhausted"},
        ],
        "works": [{"ricochet.action": "ack"}],
    }
    await channel.close()


async def test_a_replayed_job_stays_in_its_trace(
    queue_name: str,
    connection: AbstractConnection,
    start_worker: StartWorker,
    exporter: InMemorySpanExporter,
) -> None:
    """A job that failed to Q.failed and is replayed outside any span: the replayed attempt is
    in the trace it was first published in."""
    recorder = Recorder()
    broken = True  # a replay starts over at attempt 1: the fix comes between the two

    async def handler(job: Job) -> None:
        await recorder(job)
        if broken:
            raise ConnectionError("not fixed yet")

    await start_worker(handler, max_retries=0, retry_delay_ms=100)
    with trace.get_tracer("tests").start_as_current_span("parent") as parent:
        await publish_job(queue_name, "{}", message_id="j1")
    original = parent.get_span_context().trace_id
    names = Names(queue_name)
    channel = await connection.channel()
    await wait_for(lambda: depth(channel, names.failed), 20, "the failed copy")

    broken = False
    result = await replay(connection, names, Selection(message_id="j1"))
    assert len(result.selected) == 1
    await wait_for(lambda: len(recorder.seen["j1"]) == 2, 20, "the replayed attempt")
    await wait_for(lambda: len(consumer_spans(exporter)) == 2, 20, "both attempts' spans")

    first, replayed = consumer_spans(exporter)
    assert dict(first.attributes or {})["ricochet.outcome"] == "failed"
    assert dict(replayed.attributes or {})["ricochet.outcome"] == "succeeded"
    assert trace_id(first) == trace_id(replayed) == original
    assert recorder.seen["j1"][1].headers["replay-count"] == 1
    await channel.close()


async def test_an_explicit_traceparent_is_kept_on_publish(
    queue_name: str,
    connection: AbstractConnection,
    start_worker: StartWorker,
    exporter: InMemorySpanExporter,
) -> None:
    """An enqueue inside a span does not overwrite a traceparent the caller passed."""
    await start_worker(Recorder())
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("tests").start_as_current_span("parent"):
        await publish_job(queue_name, "{}", headers={"traceparent": given})
    await wait_for(lambda: len(consumer_spans(exporter)) == 1, 20, "the attempt")
    (span,) = consumer_spans(exporter)
    assert f"{trace_id(span):032x}" == "0af7651916cd43dd8448eb211c80319c"


async def test_the_worker_runs_jobs_without_opentelemetry(
    queue_name: str,
    connection: AbstractConnection,
    start_worker: StartWorker,
    exporter: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the API taken away, jobs publish, retry and succeed, and no span is made."""
    monkeypatch.setattr(tracing, "ENABLED", False)
    recorder = Recorder()
    await start_worker(recorder, max_retries=2, retry_delay_ms=100)
    await publish_job(queue_name, '{"fail": 1}', message_id="j1")
    await wait_for(lambda: recorder.succeeded == ["j1"], 20, "the job to succeed")
    assert recorder.attempts("j1") == [1, 2]
    assert "traceparent" not in recorder.seen["j1"][0].headers
    assert exporter.get_finished_spans() == ()
    channel = await connection.channel()
    assert await depth(channel, queue_name) == 0
    await channel.close()
