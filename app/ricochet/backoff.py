"""Backoff for what ricochet retries on its own behalf (a connect, a copy the broker refused, a
declare, a webhook's alert): tenacity's AsyncRetrying, built one way. A job is never retried
here: its retries are the broker's."""

from collections.abc import Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never
from tenacity.stop import stop_base
from tenacity.wait import wait_base

Errors = type[BaseException] | tuple[type[BaseException], ...]


def backoff(
    errors: Errors,
    before_sleep: Callable[[RetryCallState], Any],
    *,
    wait: wait_base,
    stop: stop_base = stop_never,
) -> AsyncRetrying:
    """Try again on these errors (logged by before_sleep), waiting as wait says, until stop;
    then the last error is raised as itself. Any other error ends it at once."""
    return AsyncRetrying(
        stop=stop,
        wait=wait,
        retry=retry_if_exception_type(errors),
        before_sleep=before_sleep,
        reraise=True,
    )
