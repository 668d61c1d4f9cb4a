"""The Job a handler receives."""

import json
import math
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

from ricochet.broker.amqp import Delivery
from ricochet.delivery.events import Returned
from ricochet.delivery.retry import Facts, job_type
from ricochet.errors import InvalidPayload, JobCancelled
from ricochet.log import bind_job_fields

# A job writes its progress this often at most.
PROGRESS_EVERY_S = 1.0
PROGRESS_MOST_BYTES = 1024


def check_progress(value: Any) -> None:
    """ValueError unless value is a number from 0 to 100 or a JSON object of at most 1 KB."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 <= value <= 100:
            raise ValueError(f"progress {value!r} is not between 0 and 100")
        return
    if not isinstance(value, dict):
        raise ValueError(f"progress must be a number from 0 to 100 or a dict, not {value!r:.80}")
    try:
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as error:
        raise ValueError(f"progress is not a JSON object: {error}") from None
    if size > PROGRESS_MOST_BYTES:
        raise ValueError(f"progress takes {size} bytes of JSON, over {PROGRESS_MOST_BYTES}")


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
        priority: int | None = None,
        key: str | None = None,
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
        self.priority = priority  # the AMQP priority property (None: its producer set none)
        self.key = key  # its key: no other job of it runs meanwhile (None: it has none)
        self._amqp_type = amqp_type
        self._cancelled = False
        self._interrupt: Callable[[], object] | None = None
        # What the handler returned (the invoker sets it when its type keeps results).
        self.returned: Returned | None = None
        # Where progress goes (the journal), the last one written and the one held back.
        self._note_progress: Callable[[Any], object] | None = None
        self._progress_at = -math.inf
        self.held_progress: Returned | None = None

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

    def progress(self, value: Any) -> None:
        """Record the job's progress in the journal: a number from 0 to 100, or a JSON object of
        at most 1 KB. A plain method, safe from a sync handler's thread; one entry a second at
        most (the last value is written when the job ends). ValueError for another value."""
        check_progress(value)
        now = time.monotonic()
        if now - self._progress_at < PROGRESS_EVERY_S:
            self.held_progress = Returned(value)
            return
        self._progress_at, self.held_progress = now, None
        if self._note_progress is not None:
            self._note_progress(value)

    def note_progress_with(self, note: Callable[[Any], object] | None) -> None:
        """Where progress() writes (None: nowhere, the journal is off)."""
        self._note_progress = note

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
        priority=delivery.priority(),
        key=facts.key,
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
