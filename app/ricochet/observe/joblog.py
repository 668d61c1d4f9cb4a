"""The job's log line for each settled delivery (ricochet.delivery.events): the job's own
fields (message_id, type, attempt) are bound to the context it runs in already."""

from collections.abc import Callable
from typing import assert_never

from ricochet.broker.plan import Plan
from ricochet.delivery.events import Settled
from ricochet.delivery.retry import (
    Ack,
    Cancel,
    Delay,
    Fail,
    Hold,
    Line,
    Outcome,
    Retry,
    RetryByCopy,
    Sanitize,
)
from ricochet.errors import RetryLater
from ricochet.log import get_logger

log = get_logger("ricochet.jobs")


class JobLog:
    """Logs what became of each delivery: succeeded, retried (in which tier, or later),
    scheduled, cancelled, cleaned of a forged header, or failed (with the failed copy's fields)."""

    def __init__(self, applied: Callable[[], Plan]) -> None:
        self._applied = applied  # the queue's plan as the broker applies it now

    def attempted(self, outcome: Outcome, seconds: float) -> None:
        pass  # the settling says what the attempt came to

    def settled(self, event: Settled) -> None:
        failure = event.failure
        match event.decision:
            case Ack():
                log.info("job succeeded")
            case Retry(tier) | RetryByCopy(tier):
                assert failure is not None
                applied = self._applied()
                log.warning(
                    "job failed, retrying",
                    error=failure.reason,
                    tier=applied.tiers[tier - 1].name,
                    delay_ms=applied.tier_delay_ms(tier),
                )
            case Fail():
                assert event.failed_fields is not None
                log.error("job failed", **event.failed_fields)
            case Delay(delay_ms):
                if failure is None:
                    log.info("job scheduled", delay_ms=delay_ms)
                elif isinstance(failure.exception, RetryLater):
                    log.warning(
                        "job failed, retrying later", error=failure.reason, delay_ms=delay_ms
                    )
                else:  # the wait of a ladder of its own (its type's or the job's)
                    log.warning("job failed, retrying", error=failure.reason, delay_ms=delay_ms)
            case Cancel():
                log.info("job cancelled", message_id=event.message_id)
            case Sanitize():
                log.warning("forged x-death header removed", message_id=event.message_id)
            case Line() | Hold():
                log.info("job waits its turn", behind=_behind(event.decision))
            case _:
                assert_never(event.decision)


def _behind(decision: Line | Hold) -> str:
    """What a job sent to wait for its turn waits behind."""
    return "its key's line" if isinstance(decision, Line) else "its type's rate limit"
