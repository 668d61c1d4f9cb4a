"""OpenTelemetry tracing when opentelemetry-api is installed (ricochet[otel]); no-ops without it.

The trace context travels in the job's application headers (W3C traceparent and tracestate).
They survive dead-lettering through the tiers and are kept on the failed copy and its replay,
so every attempt of a job is a child of the context it was published in: one trace per job.
Without a tracer provider configured, the API's own no-op tracer is used.
"""

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from app.failed import Failure
from app.job import Job
from app.retry import Action, Decision

try:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, StatusCode

    ENABLED = True
    # A proxy that follows whichever provider is configured, even one set later.
    _TRACER = trace.get_tracer("ricochet")
except ImportError:  # pragma: no cover - exercised by patching ENABLED
    ENABLED = False

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
OUTCOMES = {Action.ACK: "succeeded", Action.RETRY: "retried", Action.FAIL: "failed"}


def _carrier(headers: Mapping[str, Any]) -> dict[str, str]:
    """The headers a propagator can read: text values only (AMQP may hand them over as bytes)."""
    text: dict[str, str] = {}
    for key, value in headers.items():
        if isinstance(value, bytes):
            with contextlib.suppress(UnicodeDecodeError):
                text[key] = value.decode()
        elif isinstance(value, str):
            text[key] = value
    return text


def _parent(headers: Mapping[str, Any]) -> "Context":
    return propagate.extract(_carrier(headers))


@contextlib.contextmanager
def attempt_span(queue: str, job: Job) -> Iterator[Any]:
    """A consumer span around one attempt of a job and its settling, a child of the context in
    its headers.

    Yields the span (None without OpenTelemetry) for record_outcome() and settle_span()."""
    if not ENABLED:
        yield None
        return
    span = _TRACER.start_span(
        f"{queue} process",
        context=_parent(job.headers),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": queue,
            "ricochet.attempt": job.attempt,
        },
    )
    if not span.get_span_context().is_valid:
        # No tracer configured and no trace in the headers to pass on: making the no-op span
        # current would change nothing, and cost most of what tracing costs when it is off.
        yield span
        return
    # An error escaping the attempt is not recorded: its text may hold a password or fail to
    # print (a handler's error is recorded, scrubbed, by record_outcome).
    with trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        if job.message_id is not None:
            span.set_attribute("messaging.message.id", job.message_id)
        if job.type is not None:
            span.set_attribute("ricochet.job.type", job.type)
        yield span


def record_outcome(span: Any, decision: Decision, failure: Failure | None) -> None:
    """What became of the attempt; an error status when the handler raised."""
    if span is None or not span.is_recording():  # no tracer configured: nothing to format
        return
    span.set_attribute("ricochet.outcome", OUTCOMES[decision.action])
    if decision.tier is not None:
        span.set_attribute("ricochet.tier", decision.tier)
    if failure is not None:
        # Not span.record_exception: str() of an error can fail or carry a password, and the
        # failed copy's scrubbed reason and traceback (the same, worked out once) have neither.
        span.add_event(
            "exception",
            {
                "exception.type": type(failure.exception).__qualname__,
                "exception.message": failure.reason,
                "exception.stacktrace": failure.traceback,
            },
        )
        span.set_status(StatusCode.ERROR, failure.reason)


@contextlib.contextmanager
def settle_span(queue: str, attempt: Any, decision: Decision) -> Iterator[None]:
    """A span around settling an attempt, a child of its span: the ack, the retry's nack, or
    the failed copy published until confirmed and then the ack.

    A span and not an event on the attempt's: a failed copy waits for the broker's confirms,
    which may take longer than the handler did, and only a span shows how long."""
    if attempt is None or not attempt.is_recording():  # no tracer: no span to be a child of
        yield
        return
    attributes: dict[str, str | int] = {"ricochet.action": decision.action.value}
    if decision.tier is not None:
        attributes["ricochet.tier"] = decision.tier
    if decision.kind is not None:
        attributes["ricochet.failed.kind"] = str(decision.kind)
    with _TRACER.start_as_current_span(
        f"{queue} settle",
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ):
        yield


@contextlib.contextmanager
def publish_span(queue: str, message_id: str, headers: MutableMapping[str, Any]) -> Iterator[None]:
    """A producer span around publishing a job, its context injected into the headers.

    A traceparent the caller put in the headers is kept: the span becomes its child instead."""
    if not ENABLED:
        yield
        return
    explicit = TRACEPARENT in headers
    with _TRACER.start_as_current_span(
        f"{queue} publish",
        context=_parent(headers) if explicit else None,
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": queue,
            "messaging.message.id": message_id,
        },
        record_exception=False,  # a publish error's text may hold the broker URL's password
        set_status_on_exception=False,
    ):
        if not explicit:
            propagate.inject(headers)
        yield


def inject_current(headers: MutableMapping[str, Any]) -> None:
    """Put the current trace context in the headers, only if there is a span in progress;
    otherwise the traceparent already there stays, and the job stays in its own trace."""
    if not ENABLED or not trace.get_current_span().get_span_context().is_valid:
        return
    headers.pop(TRACESTATE, None)  # the old one belongs to the old traceparent
    propagate.inject(headers)
