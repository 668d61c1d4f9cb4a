"""The consumer's spans: one around each attempt of a job, one around its settling.

They are children of the trace context in the job's headers (ricochet.tracing), so every
attempt of a job joins the trace it was enqueued in. No-ops without OpenTelemetry.
"""

import contextlib
from collections.abc import Iterator
from typing import Any, assert_never

from ricochet import tracing
from ricochet.delivery.failed import Failure
from ricochet.delivery.retry import (
    Ack,
    Cancel,
    Delay,
    Fail,
    Hold,
    Line,
    Retry,
    RetryByCopy,
    Sanitize,
    Settlement,
)
from ricochet.handlers.job import Job

if tracing.ENABLED:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, StatusCode


def outcome(decision: Settlement) -> str:
    """What an attempt came to, by what its delivery's settling does after the handler ran: a
    RetryLater waits in the delays, a retry back from them goes to its tier by a copy. (A
    forged header is cleaned before any attempt: no attempt comes to it.)"""
    match decision:
        case Ack():
            return "succeeded"
        case Cancel():
            return "cancelled"
        case Retry() | RetryByCopy() | Delay():
            return "retried"
        case Fail():
            return "failed"
        case Sanitize():
            return "sanitized"
        case Line():
            return "lined"
        case Hold():
            return "held"
        case _:
            assert_never(decision)


# What a span's place holds when there is no span to make: a generator's context manager costs
# about 1.5 us to enter and leave, this one a fifth of that, and an attempt passes two.
NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def attempt_span(queue: str, job: Job) -> contextlib.AbstractContextManager[Any]:
    """A consumer span around one attempt of a job and its settling, a child of the context in
    its headers.

    Yields the span (None when there is none to make) for record_outcome() and settle_span()."""
    return _attempt_span(queue, job) if tracing.wanted(job.headers) else NO_SPAN


@contextlib.contextmanager
def _attempt_span(queue: str, job: Job) -> Iterator[Any]:
    span = tracing.TRACER.start_span(
        f"{queue} process",
        context=tracing.parent(job.headers),
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


def record_outcome(span: Any, decision: Settlement, failure: Failure | None) -> None:
    """What became of the attempt; an error status when the handler raised."""
    if span is None or not span.is_recording():  # no tracer configured: nothing to format
        return
    span.set_attribute("ricochet.outcome", outcome(decision))
    if isinstance(decision, (Retry, RetryByCopy)):
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


def settle_span(
    queue: str, attempt: Any, decision: Settlement
) -> contextlib.AbstractContextManager[None]:
    """A span around settling an attempt, a child of its span: the ack, the retry's nack, or
    the failed copy published until confirmed and then the ack.

    A span and not an event on the attempt's: a failed copy waits for the broker's confirms,
    which may take longer than the handler did, and only a span shows how long."""
    if attempt is None or not attempt.is_recording():  # no tracer: no span to be a child of
        return NO_SPAN
    return _settle_span(queue, decision)


@contextlib.contextmanager
def _settle_span(queue: str, decision: Settlement) -> Iterator[None]:
    attributes: dict[str, str | int] = {"ricochet.action": decision.ACTION}
    match decision:
        case Retry(tier) | RetryByCopy(tier):
            attributes["ricochet.tier"] = tier
        case Fail(kind):
            attributes["ricochet.failed.kind"] = str(kind)
    with tracing.TRACER.start_as_current_span(
        f"{queue} settle",
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ):
        yield
