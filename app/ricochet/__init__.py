"""ricochet: background jobs from RabbitMQ with broker-side exponential backoff."""

from ricochet.client.client import Client
from ricochet.client.sync import SyncClient
from ricochet.errors import BrokerUnavailable, InvalidJob, NotConfirmed, PermanentError, RetryLater
from ricochet.handlers.job import Job
from ricochet.handlers.router import Router

__all__ = [
    "BrokerUnavailable",
    "Client",
    "InvalidJob",
    "Job",
    "NotConfirmed",
    "PermanentError",
    "RetryLater",
    "Router",
    "SyncClient",
]
