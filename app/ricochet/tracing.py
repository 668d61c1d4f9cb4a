"""OpenTelemetry tracing when opentelemetry-api is installed (ricochet[otel]); no-ops without it.

The trace context travels in the job's application headers (W3C traceparent and tracestate).
They survive dead-lettering through the tiers and are kept on the failed copy and its replay,
so every attempt of a job is a child of the context it was published in: one trace per job.
Without a tracer provider configured, the API's own no-op tracer is used.
"""

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    ENABLED = True
    # A proxy that follows whichever provider is configured, even one set later.
    TRACER = trace.get_tracer("ricochet")
except ImportError:  # pragma: no cover - exercised by patching ENABLED
    ENABLED = False

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


def carrier(headers: Mapping[str, Any]) -> dict[str, str]:
    """The headers a propagator can read: text values only (AMQP may hand them over as bytes)."""
    text: dict[str, str] = {}
    for key, value in headers.items():
        if isinstance(value, bytes):
            with contextlib.suppress(UnicodeDecodeError):
                text[key] = value.decode()
        elif isinstance(value, str):
            text[key] = value
    return text


def wanted(headers: Mapping[str, Any]) -> bool:
    """Whether a span can matter: a tracer provider is configured, or the headers carry a trace
    to pass on. Otherwise the API's proxy would make a span that records nothing and has no
    context to pass on, at the cost of most of what tracing costs when it is off."""
    return ENABLED and (
        TRACEPARENT in headers
        or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    )


def parent(headers: Mapping[str, Any]) -> "Context":
    """The trace context a job's headers carry."""
    return propagate.extract(carrier(headers))


@contextlib.contextmanager
def publish_span(queue: str, message_id: str, headers: MutableMapping[str, Any]) -> Iterator[None]:
    """A producer span around publishing a job, its context injected into the headers.

    A traceparent the caller put in the headers is kept: the span becomes its child instead."""
    if not wanted(headers):
        yield
        return
    explicit = TRACEPARENT in headers
    span = TRACER.start_span(
        f"{queue} publish",
        context=parent(headers) if explicit else None,
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": queue,
            "messaging.message.id": message_id,
        },
    )
    if not span.get_span_context().is_valid:
        # No tracer configured and no trace to pass on: there is nothing to inject, and making
        # the no-op span current would cost most of what tracing costs when it is off.
        yield
        return
    # record_exception=False: a publish error's text may hold the broker URL's password.
    with trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
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
