"""Delivering alerts to the webhook: bounded queues, each drained by a task of its own.

Whoever raises an alert only puts it in a queue, so a dead, slow or erroring webhook can delay
or drop alerts but never stops the monitor. Job alerts and queue alerts have a queue each, so a
webhook that hangs on job alerts never holds back the failed queue's threshold alert.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from tenacity import RetryCallState, stop_after_attempt, wait_exponential_jitter

from ricochet.backoff import backoff
from ricochet.log import get_logger, url_host
from ricochet.observe.alerts import JOB_FAILED
from ricochet.observe.metrics import Metrics

log = get_logger("ricochet.webhook")

QUEUE_SIZE = 1000
ATTEMPTS = 5
REQUEST_TIMEOUT_S = 10.0
_UNDELIVERED = (aiohttp.ClientError, asyncio.TimeoutError)

# Called once an alert is out of the webhook's hands: delivered, given up or dropped.
Settle = Callable[[], Awaitable[None]]


async def _nothing_to_settle() -> None:
    return None


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
        self._host = url_host(url) if url else None
        self._metrics = metrics
        self._wait = wait_exponential_jitter(
            multiplier=first_retry_s, max=max_retry_s, jitter=first_retry_s
        )
        self._queue_size = queue_size
        self._lanes: dict[bool, asyncio.Queue[tuple[dict[str, Any], Settle]]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def send(self, alert: dict[str, Any], settle: Settle = _nothing_to_settle) -> None:
        """Queue an alert for delivery, and settle() once it is delivered or given up.

        Never waits for the webhook: without one, or with its queue full (the alert is dropped
        with a warning), settle() is awaited at once.
        """
        lane = self._lanes.get(alert["event"] == JOB_FAILED)
        if lane is None:
            await settle()
            return
        try:
            lane.put_nowait((alert, settle))
        except asyncio.QueueFull:
            log.warning("alert dropped: delivery queue full", alert_event=alert["event"])
            await settle()

    def start(self) -> None:
        if self._url is None or self._tasks:
            return
        loop = asyncio.get_running_loop()
        for is_job_alert in (True, False):
            lane = self._lanes[is_job_alert] = asyncio.Queue(maxsize=self._queue_size)
            self._tasks.append(loop.create_task(self._deliver_all(lane)))

    async def close(self, timeout_s: float) -> None:
        """Give queued alerts up to timeout_s to go out, then stop delivering (unsettled)."""
        if not self._tasks:
            return
        joined = asyncio.gather(*(lane.join() for lane in self._lanes.values()))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(joined, timeout_s)
        left = sum(lane.qsize() for lane in self._lanes.values())
        if left:
            log.warning("alerts not delivered at shutdown", alerts=left)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._lanes = {}

    async def _deliver_all(self, lane: asyncio.Queue[tuple[dict[str, Any], Settle]]) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                alert, settle = await lane.get()
                # An unexpected error costs this alert only: not the later ones, nor the exit code.
                try:
                    await self._deliver(session, alert)
                except Exception:
                    log.exception("alert not delivered", alert_event=alert.get("event"))
                try:
                    await settle()
                except Exception:
                    log.exception("alert not settled", alert_event=alert.get("event"))
                finally:
                    lane.task_done()

    async def _deliver(self, session: aiohttp.ClientSession, alert: dict[str, Any]) -> None:
        assert self._url is not None
        retrying = backoff(
            _UNDELIVERED, self._log_retry, wait=self._wait, stop=stop_after_attempt(ATTEMPTS)
        )
        try:
            async for attempt in retrying:
                with attempt:
                    # Not redirected: the body could be sent where its sender never meant.
                    async with session.post(
                        self._url, json=alert, allow_redirects=False
                    ) as response:
                        if response.status >= 300:
                            raise aiohttp.ClientResponseError(
                                response.request_info,
                                response.history,
                                status=response.status,
                                message=response.reason or "",
                            )
        except _UNDELIVERED as error:
            log.warning(
                "alert not delivered",
                alert_event=alert["event"],
                webhook=self._host,
                attempts=ATTEMPTS,
                error=_describe(error),
            )
            return
        self._metrics.alerts.labels(alert["queue"], alert["event"]).inc()
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
