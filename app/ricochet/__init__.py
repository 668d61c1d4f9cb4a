"""ricochet: background jobs from RabbitMQ with broker-side exponential backoff."""

from ricochet.errors import PermanentError, RetryLater
from ricochet.handlers.job import Job
from ricochet.handlers.router import Router

__all__ = ["Job", "PermanentError", "RetryLater", "Router"]
