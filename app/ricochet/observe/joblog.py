"""The job's log line for each settled delivery (ricochet.delivery.events): the job's own
fields (message_id, type, attempt) are bound to the context it runs in already."""

from collections.abc import Sequence

import structlog

from ricochet.broker.topology import QueueSpec
from ricochet.delivery.events import Settled
from ricochet.delivery.retry import Action, Outcome

log = structlog.get_logger("ricochet.jobs")


class JobLog:
    """Logs what became of each delivery: succeeded, retried (in which tier, or later),
    scheduled, cancelled, cleaned of a forged header, or failed (with the failed copy's fields)."""

    def __init__(self, tiers: Sequence[QueueSpec]) -> None:
        self._tiers = tiers

    def attempted(self, outcome: Outcome, seconds: float) -> None:
        pass  # the settling says what the attempt came to

    def settled(self, event: Settled) -> None:
        action, failure = event.decision.action, event.failure
        if action is Action.ACK:
            log.info("job succeeded")
        elif action is Action.RETRY or action is Action.RETRY_BY_COPY:
            assert failure is not None
            assert event.decision.tier is not None
            tier = self._tiers[event.decision.tier - 1]
            log.warning(
                "job failed, retrying", error=failure.reason, tier=tier.name, delay_ms=tier.delay_ms
            )
        elif action is Action.FAIL:
            assert event.failed_fields is not None
            log.error("job failed", **event.failed_fields)
        elif action is Action.DELAY:
            delay_ms = event.decision.delay_ms
            if failure is None:
                log.info("job scheduled", delay_ms=delay_ms)
            else:
                log.warning("job failed, retrying later", error=failure.reason, delay_ms=delay_ms)
        elif action is Action.CANCEL:
            log.info("job cancelled", message_id=event.message_id)
        else:
            log.warning("forged x-death header removed", message_id=event.message_id)
