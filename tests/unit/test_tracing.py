"""ricochet.tracing: no-ops without OpenTelemetry, and a replay's trace context rules."""

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from ricochet import tracing
from ricochet.delivery.failed import Failure
from ricochet.delivery.retry import (
    Ack,
    Cancel,
    Delay,
    Fail,
    FailureKind,
    Retry,
    RetryByCopy,
    Settlement,
)
from ricochet.handlers.job import Job
from ricochet.observe import spans
from ricochet.ops.replay import replayed_headers

from tests.support import ROOT

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def a_job() -> Job:
    headers = {"traceparent": TRACEPARENT}
    return Job(b"{}", headers=headers, message_id="m1", amqp_type="mail", attempt=1, max_attempts=3)


def test_ricochet_imports_and_runs_without_the_api() -> None:
    """With opentelemetry not importable, ricochet.tracing says so and everything else imports."""
    script = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import ricochet.cli, ricochet.worker.consumer, ricochet.broker.publish\n"
        "import ricochet.ops.replay, ricochet.tracing\n"
        "assert not ricochet.tracing.ENABLED\n"
        "headers = {}\n"
        "with ricochet.tracing.publish_span('q', 'm1', headers): pass\n"
        "ricochet.tracing.inject_current(headers)\n"
        "assert headers == {}, headers\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True)


def test_without_a_tracer_provider_the_jobs_trace_is_passed_on() -> None:
    """With the API and no provider (a fresh process), what a handler publishes carries its
    job's trace on, and a job without one gives it none."""
    script = (
        "from ricochet.handlers.job import Job\n"
        "from ricochet.observe.spans import attempt_span\n"
        "from ricochet.tracing import inject_current\n"
        f"traced = {{'traceparent': {TRACEPARENT!r}}}\n"
        "for headers, expected in ((traced, '0af7651916cd43dd8448eb211c80319c'), ({}, None)):\n"
        "    job = Job(b'{}', headers=headers, message_id='m1', amqp_type=None,\n"
        "              attempt=1, max_attempts=3)\n"
        "    published = {}\n"
        "    with attempt_span('q', job):\n"
        "        inject_current(published)\n"
        "    trace_id = published['traceparent'][3:35] if published else None\n"
        "    assert trace_id == expected, published\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True)


def test_without_the_api_every_function_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "ENABLED", False)
    with spans.attempt_span("q", a_job()) as span:
        assert span is None
    spans.record_outcome(span, Retry(1), Failure(ValueError("x")))
    with spans.settle_span("q", span, Retry(1)):
        pass
    headers: dict[str, object] = {"tenant": "acme"}
    with tracing.publish_span("q", "m1", headers):
        pass
    with TracerProvider().get_tracer("tests").start_as_current_span("replaying"):
        tracing.inject_current(headers)
    assert headers == {"tenant": "acme"}


def test_publish_keeps_a_traceparent_the_caller_passed() -> None:
    headers: dict[str, object] = {"traceparent": TRACEPARENT}
    with TracerProvider().get_tracer("tests").start_as_current_span("caller"):  # noqa: SIM117
        with tracing.publish_span("q", "m1", headers):
            pass
    assert headers["traceparent"] == TRACEPARENT


def test_a_replay_outside_any_span_keeps_the_jobs_trace() -> None:
    headers = replayed_headers({"traceparent": TRACEPARENT, "tracestate": "k=v"})
    tracing.inject_current(headers)
    assert headers["traceparent"] == TRACEPARENT
    assert headers["tracestate"] == "k=v"


def test_a_replay_inside_a_span_joins_it() -> None:
    headers = replayed_headers({"traceparent": TRACEPARENT, "tracestate": "k=v"})
    with TracerProvider().get_tracer("tests").start_as_current_span("replaying") as span:
        tracing.inject_current(headers)
    context = span.get_span_context()
    assert str(headers["traceparent"]).startswith(
        f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    )
    assert "tracestate" not in headers


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_a_failed_attempt_is_an_error_with_the_scrubbed_reason() -> None:
    """The span gets the failed copy's reason: no password, and no crash on an unprintable
    error (which would leave the delivery unsettled)."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    errors = [ConnectionError("amqp://bob:hunter2@db/x refused"), Unprintable()]
    for error in errors:
        with provider.get_tracer("tests").start_as_current_span("attempt") as span:
            spans.record_outcome(span, Fail(FailureKind.PERMANENT), Failure(error))
    finished = exporter.get_finished_spans()
    assert [s.status.status_code for s in finished] == [StatusCode.ERROR, StatusCode.ERROR]
    assert [dict(s.attributes or {})["ricochet.outcome"] for s in finished] == ["failed", "failed"]
    assert "hunter2" not in str(finished[0].status.description)
    assert "hunter2" not in str(dict(finished[0].events[0].attributes or {}))
    assert finished[1].status.description == "Unprintable: <exception str() failed>"


def test_an_error_escaping_a_span_is_not_recorded_with_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error raised out of an attempt or its settling (a channel closing, say) is not
    written into the span: its text may hold a password, or fail to print."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "TRACER", provider.get_tracer("tests"))

    def settle_failing_with(error: Exception) -> None:
        with (
            spans.attempt_span("q", a_job()) as span,
            spans.settle_span("q", span, Ack()),
        ):
            raise error

    for error in (ConnectionError("amqp://bob:hunter2@mq/ closed"), Unprintable()):
        with pytest.raises(type(error)):
            settle_failing_with(error)
    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == ["q settle", "q process"] * 2
    assert all(not s.events and s.status.description is None for s in finished)


@pytest.mark.parametrize(
    ("decision", "outcome"),
    [
        (Delay(1500, retries=1), "retried"),  # a RetryLater
        (RetryByCopy(2), "retried"),
    ],
)
def test_an_attempt_that_waits_is_recorded_as_retried(decision: Settlement, outcome: str) -> None:
    """A RetryLater, and a retry of a job back from the delays, end their attempt as a retry."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tests").start_as_current_span("attempt") as span:
        spans.record_outcome(span, decision, Failure(ConnectionError("later")))
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes or {})["ricochet.outcome"] == outcome


def test_a_cancelled_attempt_is_recorded_as_cancelled() -> None:
    """A job cancelled while it ran ends its attempt as cancelled. With a tracer configured,
    recording it once raised KeyError, and the delivery stayed unsettled until the channel
    closed (the cancel-racing fault row, run after a test that had set up tracing)."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tests").start_as_current_span("attempt") as span:
        spans.record_outcome(span, Cancel(), None)
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes or {})["ricochet.outcome"] == "cancelled"
    assert not finished.events
