"""The Job a handler receives."""

import json
from collections.abc import Callable
from functools import cached_property
from typing import Any

from ricochet.broker.amqp import Delivery
from ricochet.delivery.retry import Facts, job_type
from ricochet.errors import InvalidPayload, JobCancelled
from ricochet.log import bind_job_fields


class Job:
    """One delivery of a job, as the handler sees it."""

    def __init__(
        self,
        body: bytes,
        *,
        headers: dict[str, Any],
        message_id: str | None,
        amqp_type: str | None,
        attempt: int,
        max_attempts: int,
        routing_key: str = "",
        correlation_id: str | None = None,
        content_type: str | None = None,
        queue: str = "",
    ) -> None:
        self.body = body
        self.queue = queue  # the queue the job was consumed from
        self.headers = headers
        self.message_id = message_id
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.routing_key = routing_key
        self.correlation_id = correlation_id
        self.content_type = content_type
        self._amqp_type = amqp_type
        self._cancelled = False
        self._interrupt: Callable[[], object] | None = None

    @property
    def cancelled(self) -> bool:
        """True once a cancel covers this job while it runs (within a second of the cancel, on
        whichever worker process runs it)."""
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        """Raise JobCancelled when a cancel covers the job: call it where the handler can stop
        cleanly, and the job ends cancelled (acked, never retried nor failed)."""
        if self._cancelled:
            raise JobCancelled(f"job {self.message_id!r} was cancelled while it ran")

    def cancel(self) -> None:
        """Mark the job cancelled (the worker does, when a cancel covers it) and interrupt its
        handler if it asked to be (router.handler's interrupt)."""
        self._cancelled = True
        if self._interrupt is not None:
            self._interrupt()

    def interrupt_with(self, interrupt: Callable[[], object] | None) -> None:
        """What cancel() calls to stop the handler at once (None: nothing, it reads the flag)."""
        self._interrupt = interrupt

    @cached_property
    def payload(self) -> Any:
        """The body decoded as JSON; InvalidPayload (a PermanentError) when it is not JSON."""
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, ValueError) as error:
            raise InvalidPayload(f"body is not valid JSON: {error}") from None
        except RecursionError:
            raise InvalidPayload("body is not JSON this worker reads: nested too deeply") from None

    @cached_property
    def type(self) -> str | None:
        """The AMQP type property, else a top-level "type" field of a JSON object body."""
        return job_type(self._amqp_type, self.body)

    @property
    def is_last_attempt(self) -> bool:
        """True when a transient failure now sends the job to the failed queue."""
        return self.attempt >= self.max_attempts

    def __repr__(self) -> str:
        return (
            f"Job(message_id={self.message_id!r}, type={self.type!r}, "
            f"attempt={self.attempt}/{self.max_attempts})"
        )


def job_of(delivery: Delivery, facts: Facts, resolved_type: str | None, queue: str) -> Job:
    """The Job a handler receives for a delivery of queue, with the attempt its facts give and
    the type job_type() already read (so a type from the body is not parsed out of it again)."""
    job = Job(
        delivery.body,
        headers=delivery.headers,
        message_id=delivery.message_id,
        amqp_type=resolved_type,
        attempt=facts.attempt,
        max_attempts=facts.max_attempts,
        routing_key=delivery.routing_key,
        correlation_id=delivery.correlation_id,
        content_type=delivery.content_type,
        queue=queue,
    )
    job.__dict__["type"] = resolved_type  # Job.type's cache: None, once read, is the answer too
    return job


def bind_log_context(job: Job) -> None:
    """Tag every line logged from now on in the current context with the job's message id,
    type, attempt and queue.

    Each job runs in a task of its own, with its own copy of the context: binding there tags
    every line logged for this job (an async handler's too) and leaks into no other.
    """
    bind_job_fields(
        message_id=job.message_id,
        type=job.type,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        queue=job.queue,
    )
