"""ricochet: background jobs from RabbitMQ with broker-side exponential backoff."""

from app.errors import PermanentError
from app.job import Job
from app.router import Router

__all__ = ["Job", "PermanentError", "Router"]
