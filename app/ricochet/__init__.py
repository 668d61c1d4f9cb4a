"""ricochet: background jobs from RabbitMQ with broker-side exponential backoff."""

from ricochet.client.client import Client
from ricochet.client.sync import SyncClient
from ricochet.errors import (
    BrokerUnavailable,
    ClientClosed,
    InvalidJob,
    JobCancelled,
    NotConfirmed,
    PermanentError,
    RetryLater,
)
from ricochet.handlers.job import Job
from ricochet.handlers.router import Router
from ricochet.ladders import exponential, fixed, linear

__all__ = [
    "BrokerUnavailable",
    "Client",
    "ClientClosed",
    "InvalidJob",
    "Job",
    "JobCancelled",
    "NotConfirmed",
    "PermanentError",
    "RetryLater",
    "Router",
    "SyncClient",
    "exponential",
    "fixed",
    "linear",
]
