"""Delivering alerts to the webhook: a bounded queue drained by a task of its own.

Whoever raises an alert only puts it in the queue, so a dead, slow or erroring webhook can
delay or drop alerts but never the monitor's consumption or its log lines.
"""

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from app.metrics import Metrics

log = structlog.get_logger("ricochet.webhook")

QUEUE_SIZE = 1000
ATTEMPTS = 5
REQUEST_TIMEOUT_S = 10.0
_UNDELIVERED = (aiohttp.ClientError, asyncio.TimeoutError)


class Webhook:
    """POSTs alerts as JSON, retried with exponential backoff and jitter; drops on overflow."""

    def __init__(
        self,
        url: str | None,
        metrics: Metrics,
        *,
        first_retry_s: float = 0.5,
        max_retry_s: float = 30.0,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._url = url
        # Only the host is ever logged: webhook URLs often carry a token in their path.
        self._host = urlsplit(url).netloc.rpartition("@")[2] if url else None
        self._metrics = metrics
        self._wait = wait_exponential_jitter(
            multiplier=first_retry_s, max=max_retry_s, jitter=first_retry_s
        )
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None

    def send(self, alert: dict[str, Any]) -> None:
        """Queue an alert for delivery; never blocks (drops it with a warning when full)."""
        if self._url is None:
            return
        try:
            self._queue.put_nowait(alert)
        except asyncio.QueueFull:
            log.warning("alert dropped: delivery queue full", alert_event=alert["event"])

    def start(self) -> None:
        if self._url is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._deliver_all())

    async def close(self, timeout_s: float) -> None:
        """Give queued alerts up to timeout_s to go out, then stop delivering."""
        if self._task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)
        if self._queue.qsize():
            log.warning("alerts not delivered at shutdown", alerts=self._queue.qsize())
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _deliver_all(self) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                alert = await self._queue.get()
                try:
                    await self._deliver(session, alert)
                finally:
                    self._queue.task_done()

    async def _deliver(self, session: aiohttp.ClientSession, alert: dict[str, Any]) -> None:
        assert self._url is not None
        retrying = AsyncRetrying(
            stop=stop_after_attempt(ATTEMPTS),
            wait=self._wait,
            retry=retry_if_exception_type(_UNDELIVERED),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    async with session.post(self._url, json=alert) as response:
                        response.raise_for_status()
        except _UNDELIVERED as error:
            log.warning(
                "alert not delivered",
                alert_event=alert["event"],
                webhook=self._host,
                attempts=ATTEMPTS,
                error=_describe(error),
            )
            return
        self._metrics.alerts.labels(self._metrics.queue, alert["event"]).inc()
        log.info("alert delivered", alert_event=alert["event"], webhook=self._host)

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning(
            "webhook failed, retrying",
            webhook=self._host,
            attempt=state.attempt_number,
            error=_describe(error),
            next_try_s=round(state.upcoming_sleep, 2),
        )


def _describe(error: BaseException | None) -> str:
    # A ClientResponseError's text would include the full URL; the status is what matters.
    if isinstance(error, aiohttp.ClientResponseError):
        return f"HTTP {error.status}"
    return type(error).__name__ if error is None or not str(error) else str(error)
